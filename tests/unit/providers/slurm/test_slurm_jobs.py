"""providers/slurm/jobs.py against a real Slurm (tests/fakes/slurm_box.py): one gang allocation
of whole nodes per attempt, its state and why it waits, a node failure seen as lost (not
requeued), cancel idempotent, and cloudtrain's jobs found by name and comment."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.slurm.jobs import (
    Allocation,
    Job,
    cancel,
    find,
    job_name,
    parse_squeue,
    state,
    submit,
)
from cloudtrain.providers.slurm.login import LoginHost
from tests.fakes.slurm_box import SlurmBox, slurm_cluster, wait_for

pytestmark = pytest.mark.timeout(300)
UTC = datetime.timezone.utc
SLEEP = "#!/bin/bash\nsrun bash -c 'echo $(hostname) $SLURM_PROCID; sleep 300'\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    with slurm_cluster(tmp_path_factory) as box:
        yield box


@pytest.fixture
def login(cluster: SlurmBox) -> Iterator[LoginHost]:
    yield LoginHost(cluster.login_ip, cluster.user, cluster.key, known_hosts=cluster.known_hosts)
    cluster.cancel_all()


def until(login: LoginHost, job_id: str, check: Callable[[Job], bool], timeout: float = 60) -> Job:
    return wait_for(  # type: ignore[return-value]
        f"job {job_id}", lambda: state(login, job_id), lambda j: j is not None and check(j), timeout
    )


def test_one_allocation_of_whole_nodes_runs_is_found_and_cancelled(
    cluster: SlurmBox, login: LoginHost
) -> None:
    job_id = submit(
        login, Allocation("r-abc1", 1, nodes=3, minutes=10, script=SLEEP, gpus_per_node=2)
    )
    job = until(login, job_id, lambda j: j.state == "RUNNING")
    assert (job.nodes, job.name, job.run) == ("c[1-3]", "cloudtrain-r-abc1-a1", ("r-abc1", 1))
    assert not (job.pending or job.ended or job.lost)
    assert [j.job_id for j in find(login)] == [job_id]
    assert [j.job_id for j in find(login, "r-abc1")] == [job_id]
    assert find(login, "r-other") == []
    cancel(login, job_id)
    job = until(login, job_id, lambda j: j.ended)
    assert job.state == "CANCELLED" and not job.lost
    cancel(login, job_id)  # idempotent
    assert find(login) == []


def test_a_job_that_waits_says_why_and_when(cluster: SlurmBox, login: LoginHost) -> None:
    blocker = submit(login, Allocation("r-first", 1, nodes=2, minutes=20, script=SLEEP))
    until(login, blocker, lambda j: j.state == "RUNNING")
    waiting = submit(login, Allocation("r-second", 1, nodes=2, minutes=10, script=SLEEP))
    job = until(
        login, waiting, lambda j: j.pending and j.reason == "Resources" and j.start is not None
    )
    assert job.state == "PENDING" and not job.ended
    assert {j.run for j in find(login)} == {("r-first", 1), ("r-second", 1)}
    cancel(login, waiting)  # Ctrl-C while pending: nothing of it ever ran
    assert until(login, waiting, lambda j: j.ended).state == "CANCELLED"


def test_a_node_failure_ends_the_attempt_as_lost_not_requeued(
    cluster: SlurmBox, login: LoginHost
) -> None:
    job_id = submit(login, Allocation("r-lost", 2, nodes=3, minutes=10, script=SLEEP))
    until(login, job_id, lambda j: j.state == "RUNNING")
    try:
        cluster.set_state("c2", "DOWN")
        job = until(login, job_id, lambda j: j.ended)
    finally:
        cluster.set_state("c2", "RESUME")
    assert (job.state, job.lost) == ("NODE_FAIL", True), job
    assert cluster.ssh("squeue", "-h").strip() == "", "not requeued: the next attempt is ours"


def test_refusals_and_unknown_jobs(cluster: SlurmBox, login: LoginHost) -> None:
    with pytest.raises(ProviderError, match="Requested node configuration is not available"):
        submit(login, Allocation("r-big", 1, nodes=1, minutes=5, script=SLEEP, gpus_per_node=3))
    with pytest.raises(ProviderError, match="Invalid partition name specified"):
        submit(login, Allocation("r-big", 1, nodes=1, minutes=5, script=SLEEP, partition="nosuch"))
    assert state(login, "987654") is None
    cancel(login, "987654")  # nothing to cancel: done
    assert find(login) == []


def test_a_job_not_marked_as_cloudtrains_is_never_found(
    cluster: SlurmBox, login: LoginHost
) -> None:
    # the same name without the comment (someone else's job, or a name collision)
    cluster.ssh("sbatch", "--job-name=cloudtrain-r-abc1-a1", "--wrap", "sleep 300")
    assert find(login) == []


def test_job_names_and_squeue_lines() -> None:
    assert job_name("r-abc1", 3) == "cloudtrain-r-abc1-a3"
    for bad in (("R-ABC", 1), ("r;rm", 1), ("r", 0)):
        with pytest.raises(ValueError):
            job_name(*bad)
    text = "\n".join(
        [
            "12|cloudtrain-r-x-a1|PENDING|Priority|(null)|2026-11-29T16:00:00|"
            "2026-11-29T15:59:58|c|omment",
            "13|n|RUNNING|None|c[1-2]|N/A|2026-11-29T15:00:00|",
            "x|junk",
            "abc|n|RUNNING|None|c1|N/A|N/A|",
        ]
    )
    jobs = parse_squeue(text)
    assert [(j.job_id, j.state, j.reason, j.comment) for j in jobs] == [
        ("12", "PENDING", "Priority", "c|omment"),
        ("13", "RUNNING", "None", ""),
    ]
    assert jobs[0].run == ("r-x", 1) and jobs[1].run is None
    assert jobs[0].start is not None and jobs[1].start is None
    assert jobs[0].submitted == datetime.datetime(2026, 11, 29, 15, 59, 58, tzinfo=UTC)
