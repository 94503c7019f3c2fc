"""What a Slurm cluster has and when it could start a job, read through its login host: the
partitions with their nodes and GPUs, free and in all (`sinfo`), and Slurm's own start estimate
for an allocation (`sbatch --test-only`, which submits nothing).

Sources: sinfo(1) (`--Format`/`-O` with a `|` suffix per field; the default partition's name
ends in `*`; a state's suffix `*` is "not responding"), gres.conf(5) and sinfo's Gres and
GresUsed fields (`gpu:2`, `gpu:a100:4(S:0-1)`, `gpu:a100:1(IDX:0)`, `(null)`), sbatch(1)
`--test-only` ("sbatch: Job N to start at TIME using N processors on nodes LIST in partition P",
on stderr). Slurm 22.05. Everything read is untrusted: a line that does not parse is skipped,
names are bounded, counts are whole numbers.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.slurm.login import LoginHost, run_on_login, run_on_login_both
from cloudtrain.providers.slurm.times import in_utc, utc_time

SINFO_FORMAT = "NodeList:|,Partition:|,Gres:|,GresUsed:|,StateLong:|,Time:|"
# a node in these states (the long names, lower case, without a suffix) takes new jobs
TAKING_JOBS = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
# ... but in these, every CPU is allocated (sinfo(1): ALLOCATED; COMPLETING, its jobs still
# hold theirs): a GPU that no job holds there cannot be given to a new job (a CPU job that
# holds the whole node), so it is not free
ALL_CPUS_HELD = frozenset({"allocated", "completing"})
_GPU = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")
_GPU_TYPE = re.compile(r"(?:^|,)gpu:([A-Za-z][A-Za-z0-9_.-]{0,40}):\d+")
_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\],]{1,200}$")
_TEST_ONLY = re.compile(
    r"Job \d+ to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)"
)


@dataclass(frozen=True)
class Partition:
    """One partition: its nodes, how many take jobs now, and their GPUs (free: not allocated,
    on nodes that take jobs and have a CPU free)."""

    name: str
    default: bool
    nodes: int
    nodes_taking_jobs: int
    gpus_per_node: int  # the most GPUs one of its nodes has
    gpus: int
    gpus_free: int
    time_limit: str  # as sinfo shows it: "infinite", "1-00:00:00", ...
    gpu_type: str | None = None  # as gres.conf names it ("a100"), None: untyped


@dataclass(frozen=True)
class Estimate:
    """Slurm's answer to `sbatch --test-only`: when and where the job would start."""

    start: datetime.datetime | None  # UTC; None: Slurm named no time it could parse
    processors: int
    nodes: str
    partition: str


def gpu_count(gres: str) -> int:
    """The GPUs in a Gres or GresUsed field (`gpu:2`, `gpu:a100:4(S:0-1)`, several types
    comma-separated; `(null)`: 0). Pure."""
    text = re.sub(r"\([^)]*\)", "", gres)  # the (S:0-1) / (IDX:0-1) parts hold commas too
    return sum(int(n) for n in _GPU.findall(text))


def gpu_type(gres: str) -> str | None:
    """The first GPU type a Gres field names (`gpu:a100:4` -> "a100"), None for untyped GPUs
    (`gpu:2`) or none. Pure."""
    match = _GPU_TYPE.search(re.sub(r"\([^)]*\)", "", gres))
    return match[1] if match else None


def _base_state(state: str) -> str:
    """sinfo's long state without its suffix (`*`, `~`, `#`, `+`, ...), lower case. Pure."""
    return re.sub(r"[^a-z]+$", "", state.lower())


def _taking_jobs(state: str) -> bool:
    if state.endswith("*"):  # not responding
        return False
    return _base_state(state) in TAKING_JOBS


def _free_gpus(gpus: int, used: int, state: str) -> int:
    """The GPUs a new job could get on a node: none where it takes no jobs or every CPU is
    held, else those no job holds. Pure."""
    if not _taking_jobs(state) or _base_state(state) in ALL_CPUS_HELD:
        return 0
    return max(0, gpus - used)


def parse_partitions(text: str) -> list[Partition]:
    """`sinfo -h -N -O SINFO_FORMAT`'s output as partitions, the default first, then by name
    (sinfo's node-by-node lines give a node's partitions in no fixed order). A
    line that does not parse is skipped. Pure."""
    rows: dict[str, list[tuple[int, int, bool]]] = {}
    types: dict[str, str] = {}
    defaults: set[str] = set()
    limits: dict[str, str] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 6:
            continue
        node, partition, gres, used, state, limit = fields[:6]
        if partition.endswith("*"):
            partition = partition[:-1]
            defaults.add(partition)
        if not (_NAME.match(node) and _NAME.match(partition)):
            continue
        gpus = gpu_count(gres)
        rows.setdefault(partition, []).append(
            (gpus, _free_gpus(gpus, gpu_count(used), state), _taking_jobs(state))
        )
        limits.setdefault(partition, limit[:40])
        typed = gpu_type(gres)
        if typed:
            types.setdefault(partition, typed)
    return [
        Partition(
            name=name,
            default=name in defaults,
            nodes=len(nodes),
            nodes_taking_jobs=sum(1 for _, _, up in nodes if up),
            gpus_per_node=max(g for g, _, _ in nodes),
            gpus=sum(g for g, _, _ in nodes),
            gpus_free=sum(free for _, free, _ in nodes),
            time_limit=limits[name],
            gpu_type=types.get(name),
        )
        for name, nodes in sorted(rows.items(), key=lambda row: (row[0] not in defaults, row[0]))
    ]


def read_partitions(login: LoginHost) -> list[Partition]:
    """The cluster's partitions (every one, hidden too). Blocks (one ssh); read-only."""
    return parse_partitions(run_on_login(login, ["sinfo", "-a", "-h", "-N", "-O", SINFO_FORMAT]))


def parse_estimate(stderr: str) -> Estimate | None:
    """`sbatch --test-only`'s answer, None when it gave none. Pure."""
    match = _TEST_ONLY.search(stderr)
    if match is None:
        return None
    when, processors, nodes, partition = match.groups()
    return Estimate(utc_time(when), int(processors), nodes[:200], partition[:100])


def start_estimate(
    login: LoginHost, partition: str, nodes: int, gpus_per_node: int, minutes: int
) -> Estimate:
    """When Slurm would start `nodes` nodes of `partition` with `gpus_per_node` GPUs each
    for `minutes` (`sbatch --test-only`: nothing is submitted). Blocks (one ssh). Raises
    ProviderError with Slurm's reason when no node could ever run it."""
    command = ["sbatch", "--test-only", f"--partition={partition}", f"--nodes={nodes}"]
    if gpus_per_node:
        command.append(f"--gpus-per-node={gpus_per_node}")
    command += [f"--time={minutes}", "--wrap", "true"]
    _, stderr = run_on_login_both(login, in_utc(command), what="sbatch --test-only")
    estimate = parse_estimate(stderr)
    if estimate is None:
        raise ProviderError(f"{login.where}: sbatch --test-only gave no start estimate")
    return estimate
