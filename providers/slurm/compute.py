"""The Slurm provider's Compute: a run's nodes are ONE gang allocation (`Compute.gang`), one
Slurm job of N whole nodes per attempt, reached through the login host (`login.py`).

Where a run's files live on the cluster's shared filesystem (every node sees `workdir` at the
same path):

    <workdir>/stack/<tag>/                  the node stack: one venv per pin set, shared by
                                            every run (stack.py)
    <workdir>/runs/<run id>/                the run's folder (its `job-folder` resource)
        a<k>/                               attempt k's allocation, made at its submission
            batch.sh                        the batch script: `srun` one task per node
            rank-<r>.sh                     node r's startup script (jobs/startup.sh.j2)
            nodes                           `<node name> <instance type>` per line, rank order
            job                             the Slurm job id sbatch answered
            rank-<r>.out                    node r's console (its script's stdout and stderr)
            work-<r>/                       node r's work folder (CT_WORK)
            rank-<r>.ended                  node r's script's exit status, once it has ended

What a node is here: the task of rank r of the run's live job. Pending while the job waits,
running while it runs, terminated once its script has ended (the task is gone though the job
may run on: an agent that crashed leaves its node terminated, as a VM whose agent ended powers
off); a job that has left the controller's queue has no nodes. Deleting any node cancels the
job (`scancel`): a gang's nodes go together. The job's time limit is the run's deadline, so
Slurm itself ends the allocation at the deadline, laptop or not (the dead-man switch).

Sources: sbatch(1) (the submit folder is the job's working folder, SLURM_SUBMIT_DIR),
srun(1) (`--output` with `%t`, the task id; `--kill-on-bad-exit=0`: a task that fails does not
end the others; a step gets the job's GRES, so CUDA_VISIBLE_DEVICES is set in each task),
squeue(1), scancel(1). What comes back from the cluster is untrusted: names are matched, counts
bounded.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import tarfile
import time
from collections.abc import Callable

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
    parse_node_name,
)
from cloudtrain.providers.slurm import jobs
from cloudtrain.providers.slurm.jobs import Allocation, Job
from cloudtrain.providers.slurm.login import LoginHost, run_on_login
from cloudtrain.providers.slurm.stack import check_bucket, ensure_stack
from cloudtrain.providers.slurm.times import shown

PROVIDER = "slurm"
FOLDER_KIND = "job-folder"
CANCEL_WAIT_S = 120.0  # until a cancelled job has left the queue (it may be COMPLETING a while)
CANCEL_POLL_S = 1.0
CONSOLE_BYTES = 64 * 1024
_RANK_ENDED = re.compile(r"^rank-(\d{1,5})\.ended$")
_NODE_LINE = re.compile(r"^(ct-[a-z0-9-]{1,120}) ([A-Za-z0-9._:+-]{1,64})$")

# the batch script: one task per node, each its rank's startup script in its own work folder,
# then the script's exit status in rank-<r>.ended (the controller's sign that the node is gone)
BATCH_SCRIPT = """\
#!/bin/bash
# cloudtrain: run {run_id}, attempt {attempt}: one task per node, each its rank's startup script
cd "$SLURM_SUBMIT_DIR" || exit 1
{python_line}exec srun --kill-on-bad-exit=0 --output='rank-%t.out' bash -c '
r=$SLURM_PROCID
mkdir -p "work-$r"
CT_WORK="$PWD/work-$r" bash "rank-$r.sh"
echo $? >"rank-$r.ended"'
"""

# on the login host: make attempt k's folder (never an existing one), unpack the scripts from
# stdin, submit, and keep the job id beside them
_SUBMIT_SH = """\
set -eu
command -v sbatch >/dev/null || exit 127
d=$1
shift
mkdir -m 700 "$d"
cd "$d"
tar -xf -
id=$(sbatch --parsable "$@" batch.sh)
printf '%s\\n' "$id" >job
printf '%s\\n' "$id"
"""

# on the login host: the names of attempt $2's nodes and which of them have ended
_ATTEMPT_SH = """\
cd "$1/a$2" 2>/dev/null || exit 0
cat nodes 2>/dev/null
echo ---
for f in rank-*.ended; do [ -e "$f" ] && printf '%s\\n' "$f"; done
exit 0
"""

# the end of a script asking accounting (`sacct "$@"`): the accounting database, else the job
# completion log (`sacct -c`) where the cluster keeps none
_SACCT_SH = """\
sacct "$@" 2>/dev/null | grep -q . && exec sacct "$@"
exec sacct -c "$@" 2>/dev/null
"""

# on the login host: the run's latest attempt's node list and how its job ended, as accounting
# says (`sacct -c`, the completion log, where the cluster keeps no accounting database)
_ENDED_SH = """\
cd "$1" 2>/dev/null || exit 0
k=$(ls -d a[0-9]* 2>/dev/null | sed 's/^a//' | sort -n | tail -n 1)
[ -n "$k" ] && [ -r "a$k/job" ] || exit 0
id=$(head -c 32 "a$k/job")
case "$id" in ''|*[!0-9]*) exit 0 ;; esac
cat "a$k/nodes" 2>/dev/null
echo ---
set -- -X -n -P -j "$id" -o JobIDRaw,State
""" + _SACCT_SH

# on the login host: every attempt's job of the run (its folder's `job` files) as accounting
# says, `<job id>|<elapsed seconds>` per line (`sacct -c` where the cluster keeps no database)
_ACCOUNTED_SH = """\
cd "$1" 2>/dev/null || exit 0
ids=$(for f in a[0-9]*/job; do [ -r "$f" ] && head -c 32 "$f"; done | grep -E '^[0-9]+$' |
  head -n 1000 | paste -sd, -)
[ -n "$ids" ] || exit 0
set -- -X -n -P -j "$ids" -o JobIDRaw,ElapsedRaw
""" + _SACCT_SH
_ACCOUNTED_LINE = re.compile(r"^(\d{1,12})\|(\d{1,12})$")

# on the login host: the end of the console of node $2 in the run's latest attempt holding it
_CONSOLE_SH = """\
cd "$1" 2>/dev/null || exit 0
k=$(ls -d a[0-9]* 2>/dev/null | sed 's/^a//' | sort -n | tail -n 1)
[ -n "$k" ] || exit 0
r=$(awk -v n="$2" '$1 == n {{ print NR - 1 }}' "a$k/nodes" 2>/dev/null)
[ -n "$r" ] && tail -c {bytes} "a$k/rank-$r.out" 2>/dev/null
exit 0
"""

# the compute node's address for its peers: the first of its own (hostname -I)
_METADATA = """\
if [ -z "${CLOUDTRAIN_NODE_HOST:-}" ]; then
  ct_host="$(hostname -I 2>/dev/null | awk '{print $1}')" || ct_host=""
  if ! [[ "$ct_host" =~ ^([0-9]{1,3}\\.){3}[0-9]{1,3}$ ]]; then
    fail "metadata: this compute node has no IPv4 address (hostname -I: '${ct_host:0:80}')"
  fi
  CLOUDTRAIN_NODE_HOST=$ct_host
fi
export CLOUDTRAIN_NODE_HOST"""


def _sh(script: str, *args: str) -> list[str]:
    """A POSIX shell script with its arguments, as one remote command's words. Pure."""
    return ["/bin/sh", "-c", script, "sh", *args]


class SlurmCompute(Compute):
    """A cluster's nodes as one Slurm job per attempt (module docstring). Thread-safe: every
    call is its own ssh."""

    provider_name = PROVIDER
    gang = True

    def __init__(
        self,
        login: LoginHost,
        workdir: str,
        python: str = "python3",
        partition: str | None = None,
        account: str | None = None,
        qos: str | None = None,
    ) -> None:
        self.login = login
        self.workdir = workdir.removeprefix("~/")  # ssh starts in the home folder
        self.python = python
        self.partition, self.account, self.qos = partition, account, qos

    # --- the run's folder ---------------------------------------------------------------------

    def run_dir(self, run_id: str) -> str:
        """`<workdir>/runs/<run id>`. ValueError for a run id Slurm could not keep as is."""
        jobs.job_name(run_id, 1)  # checks the run id's shape
        return f"{self.workdir}/runs/{run_id}"

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """The run's folder on the shared filesystem: its only resource. Pure."""
        return [Resource(PROVIDER, FOLDER_KIND, self.run_dir(run.run_id), None, run.run_id)]

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """Make the run's folder (private to the user). Idempotent; blocks (one ssh)."""
        run_on_login(self.login, ["mkdir", "-p", "-m", "700", self.run_dir(run.run_id)])
        return self.planned_network(run)

    def list_resources(self, run_id: str) -> list[Resource]:
        """The run's folder, if it exists. Blocks (one ssh); read-only."""
        folder = self.run_dir(run_id)
        out = run_on_login(self.login, _sh('[ -d "$1" ] && echo yes; exit 0', folder))
        if out.strip() != "yes":
            return []
        return [Resource(PROVIDER, FOLDER_KIND, folder, None, run_id)]

    def delete_resources(self, resources: list[Resource]) -> None:
        """Delete the runs' folders (only a folder that is its run's `run_dir`: a ledger's id
        naming anything else is refused). Idempotent; blocks (one ssh each)."""
        for resource in resources:
            if resource.kind != FOLDER_KIND:
                continue
            folder = self.run_dir(resource.run_id)
            if resource.id != folder:
                raise ProviderError(
                    f"refusing to delete {resource.id!r}: run {resource.run_id}'s folder is "
                    f"{folder}"
                )
            run_on_login(self.login, ["rm", "-rf", "--", folder])

    # --- the allocation -----------------------------------------------------------------------

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Never: a gang's node is made only with all the others (`create_allocation`)."""
        raise ProviderError(
            f"{request.name}: a Slurm run's nodes are one allocation; none is created alone"
        )

    def create_allocation(
        self,
        run: RunInfo,
        requests: list[NodeRequest],
        on_created: Callable[[str, float, float], None] | None = None,
    ) -> list[Node]:
        """Submit one job holding every request's node, rank r running request r's startup
        script; its nodes, pending. Idempotent per run: while a job of the run is in the queue,
        its nodes are returned and nothing is submitted. Blocks (two or three ssh calls), not
        until the job starts. Raises ProviderError with Slurm's reason when it refuses the job
        (the attempt's folder stays, holding what was sent)."""
        if not requests:
            return []
        live = self._live_job(run.run_id)
        if live is not None:
            return self._nodes_of(run.run_id, live)
        start = time.time()
        folder = self.run_dir(run.run_id)
        attempt = self._next_attempt(folder)
        allocation = Allocation(
            run_id=run.run_id,
            attempt=attempt,
            nodes=len(requests),
            minutes=_minutes_until(run.deadline),
            script=BATCH_SCRIPT.format(
                run_id=run.run_id, attempt=attempt, python_line=self._python_line(run)
            ),
            partition=self.partition,
            gpus_per_node=max(r.accelerator_count for r in requests),
            account=self.account,
            qos=self.qos,
        )
        payload = _tar(allocation, requests)
        command = _sh(_SUBMIT_SH, f"{folder}/a{attempt}", *jobs.sbatch_options(allocation))
        out = run_on_login(self.login, command, stdin=payload, what="sbatch")
        job_id = jobs.job_id_of(self.login, out)
        if on_created is not None:
            for request in requests:
                on_created(request.name, start, time.time())
        return [
            Node(r.name, run.run_id, r.role, r.index, "pending", cloud_id=job_id,
                 zone=self.region, instance_type=_type(r))
            for r in requests
        ]  # fmt: skip

    def _python_line(self, run: RunInfo) -> str:
        """The batch script's line that names the node stack's python to every task (srun
        passes the environment on; jobs/startup.sh.j2 takes CT_PYTHON from it), built first
        when no run built it (stack.py), and which must open a bucket in an object store
        (`check_bucket`); none for a run without a node stack (an adopted run: the `python`
        option then runs the agent as it is). Blocks (one or two ssh; a build: minutes)."""
        if run.node_stack is None:
            return ""
        python = ensure_stack(self.login, self.workdir, self.python, run.node_stack)
        if run.store_uri and not run.store_uri.startswith(f"{PROVIDER}:"):
            check_bucket(self.login, python, run.store_uri, run.run_id)  # an object store
        return f"export CT_PYTHON={shlex.quote(python)}\n"

    def _next_attempt(self, folder: str) -> int:
        """One more than the run's highest attempt folder (made or not: a refused submit
        keeps its number). Blocks (one ssh)."""
        out = run_on_login(self.login, _sh('mkdir -p -m 700 "$1" && ls -1 "$1"', folder))
        numbers = [int(m[1]) for m in re.finditer(r"(?m)^a(\d{1,4})$", out)]
        attempt = max(numbers, default=0) + 1
        if attempt > 9999:
            raise ProviderError(f"run folder {folder} holds 9999 attempts already")
        return attempt

    def _live_job(self, run_id: str) -> Job | None:
        """The run's job in the queue (the latest attempt's, if there are several). Blocks."""
        live = [j for j in jobs.find(self.login, run_id) if not j.ended and j.run]
        return max(live, key=lambda j: j.run[1] if j.run else 0, default=None)

    def list_nodes(self, run_id: str) -> list[Node]:
        """The nodes of the run's job in the queue: pending while it waits, running while it
        runs, terminated once a node's script has ended; when the run has no job in the queue,
        those of its latest job if Slurm preempted it (`preempted`), else none. Blocks (two
        ssh calls); read-only."""
        job = self._live_job(run_id)
        return self._preempted(run_id) if job is None else self._nodes_of(run_id, job)

    def allocation_seconds(self, run_id: str) -> dict[str, float]:
        """Every attempt's job of the run with its run time as Slurm's accounting says
        (ElapsedRaw: from its start, queue time not counted, to its end or now), by job id.
        Lines that do not parse are skipped. Blocks (one ssh); read-only."""
        out = run_on_login(self.login, _sh(_ACCOUNTED_SH, self.run_dir(run_id)))
        found = (_ACCOUNTED_LINE.match(line.strip()) for line in out.splitlines())
        return {m[1]: float(m[2]) for m in found if m}

    def _preempted(self, run_id: str) -> list[Node]:
        """The nodes of the run's latest job, `preempted`, when Slurm preempted it (a job of a
        higher priority tier took its nodes: as the job may not be requeued, Slurm cancelled
        it); none for a job that ended any other way. Blocks (one ssh); read-only."""
        out = run_on_login(self.login, _sh(_ENDED_SH, self.run_dir(run_id)))
        names_part, _, states = out.partition("---\n")
        if not any(
            line.split("|")[1:2] == ["PREEMPTED"] for line in states.splitlines()[:100]
        ):
            return []
        return [
            Node(name, run_id, role, index, "preempted", zone=self.region,
                 instance_type=instance_type, detail="PREEMPTED by Slurm")
            for _, name, instance_type, role, index in _listed(names_part, run_id)
        ]  # fmt: skip

    def _nodes_of(self, run_id: str, job: Job) -> list[Node]:
        """The nodes of `job`, the run's job in the queue, as `list_nodes` says. Blocks (one
        ssh: the attempt's node list and ended ranks)."""
        if job.run is None:
            return []
        out = run_on_login(self.login, _sh(_ATTEMPT_SH, self.run_dir(run_id), str(job.run[1])))
        names_part, _, ended_part = out.partition("---\n")
        ended = {int(m[1]) for line in ended_part.splitlines() if (m := _RANK_ENDED.match(line))}
        nodes = []
        for rank, name, instance_type, role, index in _listed(names_part, run_id):
            state = "pending" if job.pending else "terminated" if rank in ended else "running"
            nodes.append(
                Node(name, run_id, role, index, state, cloud_id=job.job_id,  # type: ignore[arg-type]
                     zone=self.region, instance_type=instance_type, detail=_waiting(job))
            )  # fmt: skip
        return nodes

    @property
    def region(self) -> str:
        """Where a node is, as `gc` and the ledger say it: the partition (or "default")."""
        return self.partition or "default"

    def delete_node(self, node: Node) -> None:
        """Cancel the node's allocation: a gang's nodes go together. Idempotent; blocks until
        the run has no job in the queue."""
        self._cancel_run(node.run_id)

    def delete_listed(self, nodes: list[Node]) -> None:
        """Cancel the allocation of each run among `nodes`, once per run. Idempotent; blocks
        until none of those runs has a job in the queue."""
        for run_id in sorted({n.run_id for n in nodes}):
            self._cancel_run(run_id)

    def _cancel_run(self, run_id: str) -> None:
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            queued = [j for j in jobs.find(self.login, run_id) if not j.ended]
            if not queued:
                return
            for job in queued:
                if job.state != "COMPLETING":
                    jobs.cancel(self.login, job.job_id)
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"run {run_id}: job(s) {', '.join(j.job_id for j in queued)} still in the "
                    f"queue {CANCEL_WAIT_S:.0f} s after scancel",
                    hint="an administrator may need to look at the node (scontrol show job)",
                )
            time.sleep(CANCEL_POLL_S)

    def inventory(self) -> list[Tagged]:
        """Every node of every cloudtrain job of this user in the queue, and every run folder
        under the workdir. Blocks (one ssh per run with a job, plus two); read-only."""
        out: list[Tagged] = []
        live = [j for j in jobs.find(self.login) if j.run and not j.ended]
        for run_id in sorted({j.run[0] for j in live if j.run}):
            submitted = [j.submitted for j in live if j.run and j.run[0] == run_id and j.submitted]
            created = max(submitted).timestamp() if submitted else None
            out += [
                Tagged(run_id, "node", n.name, created, n.instance_type, self.region)
                for n in self.list_nodes(run_id)
            ]
        listing = run_on_login(self.login, _sh('ls -1 "$1/runs" 2>/dev/null; exit 0', self.workdir))
        for name in listing.splitlines()[:10000]:
            try:
                folder = self.run_dir(name)
            except ValueError:
                continue
            out.append(Tagged(name, FOLDER_KIND, folder, None, region=self.region))
        return out

    def console_output(self, node: Node) -> str:
        """The end of the node's console in its run's latest attempt (64 KiB). Best effort."""
        script = _CONSOLE_SH.format(bytes=CONSOLE_BYTES)
        return run_on_login(self.login, _sh(script, self.run_dir(node.run_id), node.name))

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """The cluster's Python (`python`; the batch script names the node stack's venv in
        CT_PYTHON instead, which the script prefers), no install (the stack is built once on
        the login host, never by a node), the compute node's address, no dead-man switch of
        its own (the job's time limit is the deadline) and no power-off (the task ends). Pure."""
        return StartupBlocks(python=self.python, metadata=_METADATA, install_stack=False)


def _waiting(job: Job) -> str | None:
    """Why a pending job waits, as Slurm says it (`Resources`, `Priority`, ...), with Slurm's
    expected start when it names one; None for a job that does not wait. Pure."""
    if not job.pending:
        return None
    reason = f" ({job.reason})" if job.reason and job.reason != "None" else ""
    when = f", start {shown(job.start)}" if job.start else ""
    return f"{job.state}{reason}{when}"


def _minutes_until(deadline: float | None) -> int:
    """Whole minutes from now to the deadline, at least 1; 0 without one (the partition's
    default limit). Pure but for the clock."""
    if deadline is None:
        return 0
    return max(1, math.ceil((deadline - time.time()) / 60))


def _listed(nodes_file: str, run_id: str) -> list[tuple[int, str, str, str, int]]:
    """(rank, name, instance type, role, index) of each node of run `run_id` in an attempt's
    `nodes` file, its rank being its line's; other lines are skipped but keep their rank.
    Pure."""
    out = []
    lines = [m for line in nodes_file.splitlines()[:10000] if (m := _NODE_LINE.match(line))]
    for rank, match in enumerate(lines):
        parsed = _parse(match[1], run_id)
        if parsed is not None:
            out.append((rank, match[1], match[2], *parsed))
    return out


def _parse(name: str, run_id: str) -> tuple[str, int] | None:
    """(role, index) of a node name of run `run_id`, None for any other line. Pure."""
    parsed = parse_node_name(name)
    if parsed is None or parsed[0] != run_id:
        return None
    return parsed[1], parsed[2]


def _type(request: NodeRequest) -> str:
    """The request's instance type as the nodes file keeps it (one word). Pure."""
    kept = re.sub(r"[^A-Za-z0-9._:+-]", "_", request.instance_type)[:64]
    return kept or PROVIDER


def _tar(allocation: Allocation, requests: list[NodeRequest]) -> bytes:
    """The attempt's files as a tar: batch.sh, rank-<r>.sh per request and `nodes`. Pure."""
    files = {
        "batch.sh": allocation.script.encode(),
        "nodes": "".join(f"{r.name} {_type(r)}\n" for r in requests).encode(),
    }
    for rank, request in enumerate(requests):
        files[f"rank-{rank}.sh"] = request.startup_script.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o700, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
