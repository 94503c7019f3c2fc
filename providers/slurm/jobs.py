"""A run's allocations as Slurm jobs, through the login host: submit one gang allocation of N
whole nodes, read its state (and why it waits), cancel it, and find every job cloudtrain left.

A job is cloudtrain's when its name is `cloudtrain-<run id>-a<attempt>` and its comment holds
the same marker (`sbatch --job-name`, `--comment`): `down` and `gc` find them by both. Jobs
are submitted with `--no-requeue`: cloudtrain recovers a lost node itself by submitting the
next attempt, which resumes from the latest checkpoint; a job Slurm requeued would run the
same attempt's script again beside it. A node failure therefore ends the job as NODE_FAIL, and
a preemption (PreemptMode=REQUEUE or CANCEL) as PREEMPTED: both are `lost`.

Sources: sbatch(1) (`--parsable`: "jobid[;cluster]"; the script on stdin when no file is
named; `--no-requeue`), squeue(1) (`-o` fields %i %j %T %r %N %S %k; a job the controller
no longer holds is "Invalid job id specified"), sacct(1) (`-X -n -P`; `-c` reads the job
completion log where there is no slurmdbd: "Slurm accounting storage is disabled"), scancel(1).
Slurm 22.05. What the commands print is untrusted: bounded, matched, never evaluated.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.slurm.login import LoginHost, run_on_login, run_unless_said
from cloudtrain.providers.slurm.times import in_utc, utc_time

NAME_PREFIX = "cloudtrain-"
# squeue -o: id, name, state, reason, nodes, start (expected, for a pending job), submitted,
# comment (last: free text, it may hold a "|")
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%S|%V|%k"
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING"})
LOST_STATES = frozenset({"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", *LOST_STATES}
)
_JOB_ID = re.compile(r"^\d{1,12}$")
# what Slurm's commands write to stderr when they answer rather than fail (squeue(1), scancel(1),
# sacct(1) as Slurm 22.05 prints them)
NO_SUCH_JOB = "Invalid job id specified"
ENDED = "Job/step already completing or completed"
NO_ACCOUNTING = "accounting storage is disabled"
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_NAME = re.compile(rf"^{NAME_PREFIX}([a-z0-9][a-z0-9-]{{0,62}})-a(\d{{1,4}})$")


@dataclass(frozen=True)
class Allocation:
    """What one attempt asks Slurm for: `nodes` whole nodes, one task each, for `minutes`."""

    run_id: str
    attempt: int
    nodes: int
    minutes: int
    script: str  # the batch script (its first line a #! line), sent on stdin
    partition: str | None = None
    gpus_per_node: int = 0
    account: str | None = None
    qos: str | None = None

    @property
    def name(self) -> str:
        return job_name(self.run_id, self.attempt)


@dataclass(frozen=True)
class Job:
    """A job as squeue (or, once it has left the controller, sacct) shows it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, NODE_FAIL, ... (Slurm's base state)
    reason: str = ""  # why it waits (Resources, Priority, ...), "" or "None" otherwise
    nodes: str = ""
    start: datetime.datetime | None = None  # Slurm's expected start of a pending job (UTC)
    name: str = ""
    comment: str = ""
    # when it was submitted, by the cluster's clock (squeue %V, read in UTC: times.py)
    submitted: datetime.datetime | None = None

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def lost(self) -> bool:
        """Ended by the cluster, not by the job: a node failed, or it was preempted."""
        return self.state in LOST_STATES

    @property
    def run(self) -> tuple[str, int] | None:
        """(run id, attempt) when the name is cloudtrain's."""
        match = _NAME.match(self.name)
        return (match[1], int(match[2])) if match else None


def job_name(run_id: str, attempt: int) -> str:
    """`cloudtrain-<run id>-a<attempt>`. ValueError for a run id Slurm could not keep as is."""
    if not _RUN_ID.match(run_id) or not 1 <= attempt <= 9999:
        raise ValueError(f"not a run id and attempt: {run_id!r}, {attempt!r}")
    return f"{NAME_PREFIX}{run_id}-a{attempt}"


def _comment(name: str) -> str:
    return f"{name} (cloudtrain)"


def sbatch_options(allocation: Allocation) -> list[str]:
    """The sbatch options of the allocation (no `--parsable`, no script): its name and
    comment, N whole nodes of one task each, its time limit (none when `minutes` is 0: the
    partition's default), `--no-requeue`, and the partition, GPUs, account and QOS when given.
    Pure."""
    a = allocation
    options = [
        f"--job-name={a.name}", f"--comment={_comment(a.name)}", f"--nodes={a.nodes}",
        "--ntasks-per-node=1", "--no-requeue", "--exclusive",
    ]  # fmt: skip
    if a.minutes > 0:
        options.append(f"--time={a.minutes}")
    if a.partition:
        options.append(f"--partition={a.partition}")
    if a.gpus_per_node:
        options.append(f"--gpus-per-node={a.gpus_per_node}")
    if a.account:
        options.append(f"--account={a.account}")
    if a.qos:
        options.append(f"--qos={a.qos}")
    return options


def job_id_of(login: LoginHost, out: str) -> str:
    """The job id in `sbatch --parsable`'s answer ("jobid[;cluster]"). ProviderError when it
    holds none. Pure."""
    job_id = out.strip().split(";", 1)[0]
    if not _JOB_ID.match(job_id):
        raise ProviderError(f"{login.where}: sbatch answered no job id: {out[:200]!r}")
    return job_id


def submit(login: LoginHost, allocation: Allocation) -> str:
    """Submit the allocation, its script on stdin; its job id. Blocks (one ssh). Not
    idempotent: a caller records the run's job name first and, after an unclear failure, looks
    for it (`find`) before submitting again. Raises ProviderError with Slurm's reason when it
    refuses the job."""
    command = ["sbatch", "--parsable", *sbatch_options(allocation)]
    return job_id_of(login, run_on_login(login, command, stdin=allocation.script.encode()))


def parse_squeue(text: str) -> list[Job]:
    """`squeue -h -o SQUEUE_FORMAT` lines as jobs; a line that does not parse is skipped.
    Pure."""
    jobs = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 8 or not _JOB_ID.match(fields[0]):
            continue
        job_id, name, state, reason, nodes, start, submitted = (f.strip() for f in fields[:7])
        comment = "|".join(fields[7:]).strip()[:300]  # free text: it may hold a "|"
        base = state.split()[0].upper()[:40] if state.strip() else "UNKNOWN"
        jobs.append(
            Job(
                job_id, base, reason[:200], nodes[:200], utc_time(start), name[:200], comment,
                utc_time(submitted),
            )
        )  # fmt: skip
    return jobs


def state(login: LoginHost, job_id: str) -> Job | None:
    """The job's state: from squeue while the controller holds it, then from accounting
    (sacct; `sacct -c`, the completion log, where the cluster keeps no accounting). None when
    Slurm knows no such job. Blocks (one to three ssh calls); read-only."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    command = in_utc(["squeue", "-h", "-j", job_id, "-o", SQUEUE_FORMAT])
    out = run_unless_said(login, command, [NO_SUCH_JOB]) or ""  # a job the queue forgot
    found = [j for j in parse_squeue(out) if j.job_id == job_id]
    if found:
        return found[0]
    return _accounted(login, job_id)


def _accounted(login: LoginHost, job_id: str) -> Job | None:
    fields = ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobIDRaw,State,JobName,NodeList"]
    out = run_unless_said(login, fields, [NO_ACCOUNTING])
    if out is None:  # no slurmdbd: the job completion log
        out = run_on_login(login, ["sacct", "-c", *fields[1:]])
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0].strip() == job_id:
            base = (parts[1].split() or ["UNKNOWN"])[0].upper()[:40]
            return Job(job_id, base, "", parts[3][:200], None, parts[2][:200])
    return None


def cancel(login: LoginHost, job_id: str) -> None:
    """Cancel the job. Idempotent: a job that has ended, or that Slurm no longer knows, is
    done. Blocks (one ssh)."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    run_unless_said(login, ["scancel", job_id], [NO_SUCH_JOB, ENDED])


def find(login: LoginHost, run_id: str | None = None) -> list[Job]:
    """The jobs of this user that the controller holds and cloudtrain made (name and comment
    both marked), of `run_id` only when given. Blocks (one ssh); read-only."""
    out = run_on_login(login, in_utc(["squeue", "-h", "--me", "-o", SQUEUE_FORMAT]))
    ours = []
    for job in parse_squeue(out):
        if job.run is None or job.comment != _comment(job.name):
            continue
        if run_id is None or job.run[0] == run_id:
            ours.append(job)
    return ours
