"""providers/slurm/compute.py against a real Slurm (tests/fakes/slurm_box.py): a run's nodes as
one gang allocation, each rank running its own startup script on its own compute host with
the GPUs Slurm gave it; created once however often asked; a node whose script ended is seen
terminated; deleting cancels the whole job; the run's folder is its one resource."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import Node, NodeRequest, Resource, RunInfo
from cloudtrain.providers.slurm.compute import FOLDER_KIND, SlurmCompute
from cloudtrain.providers.slurm.login import LoginHost
from tests.fakes.slurm_box import SlurmBox, slurm_cluster, wait_for

pytestmark = pytest.mark.timeout(300)
RUN = "digits-0a1b2c"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    # the login host's shells live in another zone than this machine (UTC): 5 h 30 min ahead
    with slurm_cluster(tmp_path_factory, login_env={"TZ": "IST-5:30"}) as box:
        yield box


@pytest.fixture
def compute(cluster: SlurmBox, tmp_path: Path) -> Iterator[SlurmCompute]:
    login = LoginHost(cluster.login_ip, cluster.user, cluster.key, known_hosts=cluster.known_hosts)
    compute = SlurmCompute(login, str(tmp_path / "shared"), partition="gpu")
    yield compute
    cluster.cancel_all()


def run_info(deadline_s: float = 600) -> RunInfo:
    return RunInfo(RUN, None, None, (20000, 20100), deadline=time.time() + deadline_s)


def requests(script: str, roles: tuple[tuple[str, int], ...]) -> list[NodeRequest]:
    return [
        NodeRequest(RUN, role, index, "gpu", script, accelerator_count=2) for role, index in roles
    ]


def report_script(out: Path, then: str = "sleep 300") -> str:
    """A startup script that writes what its task sees (host, rank, GPUs, work folder, the
    address the provider's metadata block found), then runs `then`."""
    return f"""#!/bin/bash
set -u
fail() {{ echo "FAILED: $*"; exit 1; }}
{{metadata}}
printf '%s %s %s %s %s\\n' "$(hostname)" "$SLURM_PROCID" "${{CUDA_VISIBLE_DEVICES:-none}}" \\
  "$CT_WORK" "$CLOUDTRAIN_NODE_HOST" >{shlex.quote(str(out))}/"rank-$SLURM_PROCID"
{then}
"""


def wait_nodes(
    compute: SlurmCompute, check: Callable[[list[Node]], bool], timeout: float = 90
) -> list[Node]:
    return wait_for(f"run {RUN}'s nodes", lambda: compute.list_nodes(RUN), check, timeout)


def with_metadata(compute: SlurmCompute, script: str, run: RunInfo) -> str:
    blocks = compute.startup_blocks(run, requests("", (("chief", 0),))[0])
    return script.replace("{metadata}", blocks.metadata)


def test_one_allocation_runs_each_rank_on_its_own_host_and_is_cancelled_whole(
    cluster: SlurmBox, compute: SlurmCompute, tmp_path: Path
) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    run = run_info()
    script = with_metadata(compute, report_script(out), run)
    asked = requests(script, (("chief", 0), ("worker", 0), ("worker", 1)))
    assert [r.name for r in asked] == [n.name for n in compute.create_nodes(run, asked)]
    # asked again while the job is queued: the same allocation, nothing more submitted
    compute.create_nodes(run, asked)
    assert len(cluster.ssh("squeue", "-h", "-o", "%i").split()) == 1

    nodes = wait_nodes(compute, lambda ns: len(ns) == 3 and all(n.state == "running" for n in ns))
    assert [(n.role, n.index) for n in nodes] == [("chief", 0), ("worker", 0), ("worker", 1)]
    wait_for("every rank's report", lambda: sorted(out.iterdir()), lambda f: len(f) == 3)
    seen = [(out / f"rank-{r}").read_text().split() for r in range(3)]
    assert sorted(s[0] for s in seen) == ["c1", "c2", "c3"]  # each rank on its own host
    assert [s[1] for s in seen] == ["0", "1", "2"]
    assert all(s[2] == "0,1" for s in seen), seen  # the node's two GPUs, as Slurm sets them
    folder = compute.run_dir(RUN)
    assert [s[3] for s in seen] == [f"{folder}/a1/work-{r}" for r in range(3)]
    assert {s[4] for s in seen} == {cluster.hosts[s[0]].ip for s in seen}  # its own address
    tagged = [t for t in compute.inventory() if t.kind == "node" and t.run_id == RUN]
    assert tagged and all(t.created is not None for t in tagged), tagged
    # submitted a moment ago by the cluster's clock, whatever its shells' zone (gc's age)
    assert all(abs(time.time() - (t.created or 0)) < 120 for t in tagged), tagged

    compute.delete_listed(nodes[:1])  # any node of the gang: the whole job goes
    assert cluster.ssh("squeue", "-h").strip() == ""
    assert compute.list_nodes(RUN) == []


def test_a_rank_whose_script_ended_is_terminated_and_a_new_allocation_is_the_next_attempt(
    cluster: SlurmBox, compute: SlurmCompute, tmp_path: Path
) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    run = run_info()
    # rank 1 ends at once, the others stay
    then = 'if [ "$SLURM_PROCID" = 1 ]; then exit 3; fi; sleep 300'
    script = with_metadata(compute, report_script(out, then), run)
    roles = (("chief", 0), ("worker", 0), ("worker", 1))
    compute.create_nodes(run, requests(script, roles))
    one_ended = ["running", "terminated", "running"]
    nodes = wait_nodes(compute, lambda ns: [n.state for n in ns] == one_ended)
    assert nodes[1].name == f"ct-{RUN}-worker-0"
    assert "FAILED" not in compute.console_output(nodes[0])

    compute.delete_nodes(RUN, [nodes[1].name])  # the gang goes with its lost node
    assert compute.list_nodes(RUN) == []
    # the next attempt: a new allocation of every node, in its own folder
    compute.create_nodes(run, requests(with_metadata(compute, report_script(out), run), roles))
    names = cluster.ssh("squeue", "-h", "-o", "%j").split()
    assert names == [f"cloudtrain-{RUN}-a2"]
    wait_nodes(compute, lambda ns: len(ns) == 3 and all(n.state == "running" for n in ns))
    assert (Path(compute.run_dir(RUN)) / "a2" / "job").read_text().strip().isdigit()


def test_the_run_folder_is_its_one_resource_and_goes_with_it(
    cluster: SlurmBox, compute: SlurmCompute
) -> None:
    run = run_info()
    planned = compute.planned_network(run)
    assert [r.kind for r in planned] == [FOLDER_KIND]
    assert compute.list_resources(RUN) == []
    assert compute.ensure_network(run) == planned
    assert compute.list_resources(RUN) == planned
    assert any(t.kind == FOLDER_KIND and t.run_id == RUN for t in compute.inventory())
    with pytest.raises(ProviderError, match="refusing to delete"):
        compute.delete_resources([Resource("slurm", FOLDER_KIND, "/", None, RUN)])
    compute.delete_resources(planned)
    compute.delete_resources(planned)  # idempotent
    assert compute.list_resources(RUN) == []
    assert not Path(planned[0].id).exists()


def test_slurm_s_refusal_is_one_error_and_nothing_is_queued(
    cluster: SlurmBox, compute: SlurmCompute
) -> None:
    compute.partition = "no-such-partition"
    asked = requests("#!/bin/bash\ntrue\n", (("chief", 0),))
    with pytest.raises(ProviderError) as refused:
        compute.create_nodes(run_info(), asked)
    assert str(refused.value) == (
        f"{compute.login.where}: `sbatch` exited 1: sbatch: error: Batch job submission failed: "
        "Invalid partition name specified"
    )
    assert cluster.ssh("squeue", "-h").strip() == ""
    with pytest.raises(ProviderError, match="one allocation"):
        compute.create_node(run_info(), asked[0])
