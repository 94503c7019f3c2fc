"""providers/slurm/cluster.py: the partitions and GPUs a cluster has, free and in all, and
Slurm's start estimate, read from a real Slurm (tests/fakes/slurm_box.py) and from sinfo lines
of the forms real clusters print."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.slurm.cluster import (
    Partition,
    gpu_count,
    parse_estimate,
    parse_partitions,
    read_partitions,
    start_estimate,
)
from cloudtrain.providers.slurm.login import LoginHost
from tests.fakes.slurm_box import SlurmBox, slurm_cluster, wait_for

pytestmark = pytest.mark.timeout(300)
UTC = datetime.timezone.utc


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:2", 2),
        ("gpu:0", 0),
        ("(null)", 0),
        ("", 0),
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:a100:1(IDX:0),gpu:v100:2(IDX:1-2)", 3),
        ("gpu:tesla_v100-sxm2:8(S:0,1)", 8),
        ("shard:8,gpu:2", 2),
        ("mps:100", 0),
    ],
)
def test_gpu_count(gres: str, count: int) -> None:
    assert gpu_count(gres) == count


def test_partitions_from_the_lines_real_clusters_print() -> None:
    text = "\n".join(
        [
            "g1|gpu*|gpu:a100:4(S:0-1)|gpu:a100:4(IDX:0-3)|allocated|2-00:00:00|",
            "g2|gpu*|gpu:a100:4(S:0-1)|gpu:a100:1(IDX:0)|mixed|2-00:00:00|",
            "g3|gpu*|gpu:a100:4(S:0-1)|gpu:a100:0|drained|2-00:00:00|",
            "g4|gpu*|gpu:a100:4(S:0-1)|gpu:a100:0|idle*|2-00:00:00|",
            # a CPU job holds every CPU: its GPUs are idle, and no job can have them
            "g5|gpu*|gpu:a100:4(S:0-1)|gpu:a100:0|allocated|2-00:00:00|",
            "g6|gpu*|gpu:a100:4(S:0-1)|gpu:a100:0|completing|2-00:00:00|",
            "c1|cpu|(null)|gpu:0|idle|infinite|",
            "garbage without fields",
            "bad name;rm|cpu|(null)|gpu:0|idle|infinite|",
        ]
    )
    assert parse_partitions(text) == [
        Partition("gpu", True, 6, 4, 4, 24, 3, "2-00:00:00", gpu_type="a100"),
        Partition("cpu", False, 1, 1, 0, 0, 0, "infinite"),
    ]


def test_partitions_come_default_first_then_by_name_whatever_sinfo_s_order() -> None:
    lines = ["c1|small|gpu:2|gpu:0|idle|infinite|", "c1|gpu*|gpu:2|gpu:0|idle|infinite|",
             "c2|big|gpu:2|gpu:0|idle|infinite|"]  # fmt: skip
    for text in ("\n".join(lines), "\n".join(reversed(lines))):
        assert [p.name for p in parse_partitions(text)] == ["gpu", "big", "small"]


def test_an_estimate_from_sbatch_test_only() -> None:
    line = (
        "sbatch: Job 3 to start at 2026-11-29T15:03:13 using 2 processors on nodes c[1-2]"
        " in partition gpu\n"
    )
    estimate = parse_estimate(line)
    assert estimate is not None
    # printed under TZ=UTC0 (times.in_utc): UTC
    assert estimate.start == datetime.datetime(2026, 11, 29, 15, 3, 13, tzinfo=UTC)
    assert (estimate.processors, estimate.nodes, estimate.partition) == (2, "c[1-2]", "gpu")
    assert parse_estimate("sbatch: error: something else\n") is None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    partitions = {"gpu": ["c1", "c2", "c3"], "small": ["c1"]}
    # a cluster in India: its shells' zone is 5 h 30 min ahead of this machine's (UTC)
    zone = {"TZ": "IST-5:30"}
    with slurm_cluster(tmp_path_factory, partitions=partitions, login_env=zone) as box:
        yield box


def login_of(box: SlurmBox) -> LoginHost:
    return LoginHost(box.login_ip, box.user, box.key, known_hosts=box.known_hosts)


def test_partitions_and_free_gpus_of_a_real_slurm(cluster: SlurmBox) -> None:
    login = login_of(cluster)
    assert read_partitions(login) == [
        Partition("gpu", True, 3, 3, 2, 6, 6, "infinite"),
        Partition("small", False, 1, 1, 2, 2, 2, "infinite"),
    ]
    job = cluster.ssh(
        "sbatch", "--parsable", "-w", "c1", "--gpus-per-node=1", "--wrap", "sleep 300"
    )
    job = job.strip()
    try:
        deadline = time.monotonic() + 60
        while read_partitions(login)[0].gpus_free != 5:
            assert time.monotonic() < deadline, read_partitions(login)
            time.sleep(0.3)
        cluster.set_state("c3", "DRAIN")
        gpu, small = read_partitions(login)
        assert (gpu.nodes_taking_jobs, gpu.gpus_free) == (2, 3), gpu
        assert (small.nodes_taking_jobs, small.gpus_free) == (1, 1), small
    finally:
        cluster.ssh("scancel", job)
        cluster.set_state("c3", "RESUME")


def test_gpus_of_a_node_whose_cpus_a_cpu_job_holds_are_not_free(cluster: SlurmBox) -> None:
    # every CPU of c2 (the box gives each host 2), no GPU: sinfo says ALLOCATED, gpu:0 used
    login = login_of(cluster)
    job = cluster.ssh("sbatch", "--parsable", "-w", "c2", "-c", "2", "--wrap", "sleep 300")
    job = job.strip()
    try:
        wait_for(
            "the CPU job running",
            lambda: cluster.ssh("squeue", "-h", "-o", "%T", "-j", job).strip(),
            lambda state: state == "RUNNING",
        )
        gpu, _ = read_partitions(login)
        assert (gpu.nodes_taking_jobs, gpu.gpus_free) == (3, 4), gpu  # c2's two are held
    finally:
        cluster.ssh("scancel", job)


def test_slurms_start_estimate_submits_nothing(cluster: SlurmBox) -> None:
    login = login_of(cluster)
    before = datetime.datetime.now(UTC)
    estimate = start_estimate(login, "gpu", nodes=2, gpus_per_node=1, minutes=30)
    assert estimate.partition == "gpu" and estimate.processors >= 2, estimate
    assert estimate.start is not None
    # now, though the login host's shells live 5 h 30 min ahead (the box's TZ)
    assert before - datetime.timedelta(seconds=5) <= estimate.start, estimate
    assert estimate.start <= datetime.datetime.now(UTC) + datetime.timedelta(minutes=1)
    assert cluster.ssh("squeue", "-h") == ""
    with pytest.raises(ProviderError, match="Requested node configuration is not available"):
        start_estimate(login, "gpu", nodes=1, gpus_per_node=3, minutes=30)
    with pytest.raises(ProviderError, match="Invalid partition name specified"):
        start_estimate(login, "nosuch", nodes=1, gpus_per_node=1, minutes=30)
