"""Runs on a Slurm cluster (issue 33), through the real `cloudtrain` CLI and the box's real
Slurm (tests/fakes/slurm_box.py): planned from the cluster's partitions and Slurm's own start
estimate, one gang allocation whose ranks each boot the agent on their own compute host, real
distributed TensorFlow between them, and nothing of the run left in the queue or on the
shared filesystem afterwards."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Env, assert_clean
from tests.fakes.slurm_box import SlurmBox, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    # four compute hosts of one GPU each (a parameter-server job needs four); the box has no
    # GPU behind its GRES devices, so its jobs may train on the CPU (a test harness's variable)
    with slurm_cluster(
        tmp_path_factory, computes=4, gpus=1, login_env={"CT_ALLOW_NO_GPU": "1"}
    ) as box:
        yield box


@pytest.fixture
def slurm(ct: Env, cluster: SlurmBox, tmp_path: Path) -> Iterator[Env]:
    """`ct` with config.yaml naming the box's login host, as a user's would."""
    shared = tmp_path / "shared"  # the cluster's shared filesystem (every host sees this one)
    config = {
        "providers": {
            "slurm": {
                "host": cluster.login_ip,
                "user": cluster.user,
                "key": str(cluster.key),
                "known_hosts": str(cluster.known_hosts),
                "workdir": str(shared),
                "python": sys.executable,  # the cluster's Python with the node stack
                "gpu_hour_usd": 0.5,
            }
        }
    }
    (ct.home / "config.yaml").write_text(yaml.safe_dump(config))
    yield ct
    cluster.cancel_all()


def test_a_multiworker_job_plans_from_the_cluster_and_trains_on_three_hosts(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    cluster_spec = {"strategy": "multi_worker_mirrored", "workers": 3, "accelerator": "T4:1"}
    job = slurm.job(
        "digits-multiworker",
        "python train.py --epochs 2",
        provider="slurm",
        cluster=cluster_spec,
    )
    plan = slurm.cli("plan", str(job))
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert "Slurm partition gpu: 4 of 4 GPUs free, 4 of 4 nodes taking jobs" in plan.stdout
    assert "Slurm's estimate: the job would start at" in plan.stdout, plan.stdout

    proc = slurm.cli("run", str(job), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    (run_id,) = slurm.run_ids()
    logs = slurm.cli("logs", run_id).stdout
    assert "final accuracy=" in logs, logs[-3000:]
    assert_clean(slurm, run_id)
    assert_on_own_hosts(cluster, tmp_path / "shared", run_id, 3)
    assert_nothing_left(cluster, tmp_path / "shared", run_id)
    slurm_cost = slurm.ledger().billed_cost(run_id)
    assert slurm_cost > 0  # GPU-hours at the configured rate


def assert_on_own_hosts(cluster: SlurmBox, shared: Path, run_id: str, count: int) -> None:
    """Every node of attempt 1 published the address of a compute host of its own."""
    folder = shared / "bucket" / "cloudtrain" / "runs" / run_id / "attempt-1" / "nodes"
    addresses = [json.loads(p.read_text())["address"] for p in sorted(folder.glob("*.json"))]
    ips = [a.rsplit(":", 1)[0] for a in addresses]
    computes = {cluster.hosts[c].ip for c in cluster.computes}
    assert len(ips) == count and len(set(ips)) == count and set(ips) <= computes, addresses


def assert_nothing_left(cluster: SlurmBox, shared: Path, run_id: str) -> None:
    """No job in the queue, no process of the run on any host, no run folder."""
    assert cluster.ssh("squeue", "-h").strip() == ""
    marker = f"CT_RUN_ID={run_id}".encode()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                pytest.fail(f"process {proc.name} of run {run_id} is left")
    assert not (shared / "runs" / run_id).exists()
