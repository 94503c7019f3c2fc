"""A Slurm run whose bucket is in an object store the cluster reaches (issue 33): `checkpoint:
s3://...` on the box's real Slurm (tests/fakes/slurm_box.py), the store being moto's S3 on the
box's bridge, which both this machine and the compute hosts reach.

The cluster's side is set up as a user sets up their account on a cluster: an AWS config and
credentials file in their home on the shared filesystem (the SSH sessions name them, as a
user's profile would, and sbatch passes them on to the jobs). The controller uses its own. The
nodes open the bucket by its URI with what they find on the cluster; nothing of the controller's
credentials is sent to the cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Env, assert_clean
from tests.fakes.moto_server import MotoServer, clear_aws_caches, start_moto, use_moto
from tests.fakes.slurm_box import SlurmBox, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
BUCKET = "ct-slurm-team"
SECRET = "slurm-side-secret-key"  # the cluster user's own key: must never reach the controller


@pytest.fixture(scope="module")
def cluster_aws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the cluster user's AWS files live (written once the store's address is known)."""
    return tmp_path_factory.mktemp("cluster-home") / ".aws"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, cluster_aws: Path) -> Iterator[SlurmBox]:
    # two compute hosts of one GPU each; the jobs may train on the CPU (a test harness's
    # variable); the user's AWS files, as their shell profile on the cluster names them
    harness = {
        "CT_ALLOW_NO_GPU": "1",
        "AWS_CONFIG_FILE": str(cluster_aws / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(cluster_aws / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance metadata: a cluster, not EC2
    }
    with slurm_cluster(tmp_path_factory, computes=2, gpus=1, login_env=harness) as box:
        yield box


@pytest.fixture(scope="module")
def store(cluster: SlurmBox) -> Iterator[MotoServer]:
    """moto's S3 on the box's bridge: this machine and every host of the cluster reach it."""
    assert cluster.network is not None
    server = start_moto(cluster.network.host_ip)
    try:
        yield server
    finally:
        server.stop()
        clear_aws_caches()


@pytest.fixture
def slurm(
    ct: Env,
    cluster: SlurmBox,
    store: MotoServer,
    cluster_aws: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Env]:
    """`ct` pointed at the store with this machine's credentials, config.yaml naming the box's
    login host, and the cluster user's own AWS files."""
    store.reset()
    use_moto(monkeypatch, store)
    clear_aws_caches()
    ct.env.update({k: v for k, v in os.environ.items() if k.startswith(("AWS_", "NO_PROXY"))})
    write_cluster_aws(cluster_aws, store.url)
    slurm = {
        "host": cluster.login_ip,
        "user": cluster.user,
        "key": str(cluster.key),
        "known_hosts": str(cluster.known_hosts),
        "workdir": str(tmp_path / "shared"),
        "python": sys.executable,  # the cluster's Python, with the pinned TensorFlow
    }
    (ct.home / "config.yaml").write_text(yaml.safe_dump({"providers": {"slurm": slurm}}))
    yield ct
    cluster.cancel_all()


def write_cluster_aws(folder: Path, endpoint: str) -> None:
    """The cluster user's ~/.aws: region, the store's endpoint and their own key."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config").write_text(f"[default]\nregion = us-east-1\nendpoint_url = {endpoint}\n")
    (folder / "credentials").write_text(
        f"[default]\naws_access_key_id = slurmuser\naws_secret_access_key = {SECRET}\n"
    )


def job(env: Env) -> Path:
    return env.job(
        "digits-multiworker",
        "python train.py --epochs 2",
        provider="slurm",
        checkpoint=f"s3://{BUCKET}/team-a",
        cluster={"strategy": "multi_worker_mirrored", "workers": 2, "accelerator": "T4:1"},
    )


def objects(store: MotoServer, prefix: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=store.url, region_name="us-east-1")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_a_run_keeps_its_bucket_in_s3_and_the_nodes_reach_it_with_the_clusters_credentials(
    slurm: Env, cluster: SlurmBox, store: MotoServer, tmp_path: Path
) -> None:
    proc = slurm.cli("run", str(job(slurm)), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    (run_id,) = slurm.run_ids()
    logs = slurm.cli("logs", run_id).stdout
    assert "final accuracy=" in logs, logs[-3000:]
    assert_clean(slurm, run_id)
    # the run's files are in S3, under the spec's prefix, the nodes' own among them
    keys = objects(store, f"team-a/cloudtrain/runs/{run_id}/")
    assert any("/checkpoints/" in k for k in keys), keys[:50]
    assert any(k.endswith("/bootstrap/worker-1.log") for k in keys), keys[:50]
    # nothing on the cluster's filesystem but the shared node stack: no folder bucket, no run
    shared = tmp_path / "shared"
    assert sorted(p.name for p in shared.iterdir()) == ["runs", "stack"], list(shared.iterdir())
    assert list((shared / "runs").iterdir()) == []
    assert cluster.ssh("squeue", "-h").strip() == ""
    # the cluster user's key stayed on the cluster: not in anything this machine printed
    assert SECRET not in proc.stdout + proc.stderr + logs


def test_a_cluster_that_cannot_open_the_bucket_is_told_before_anything_is_submitted(
    slurm: Env, cluster: SlurmBox, cluster_aws: Path, tmp_path: Path
) -> None:
    (cluster_aws / "credentials").unlink()  # the user never set up AWS on the cluster
    proc = slurm.cli("run", str(job(slurm)), timeout=600)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"opening the run's bucket s3://{BUCKET}/team-a on the cluster" in out, out[-3000:]
    assert "credentials" in out.lower(), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    (run_id,) = slurm.run_ids()
    assert_clean(slurm, run_id)
    # never submitted: Slurm's accounting has no job of the run
    jobs = cluster.ssh("sacct", "-c", "-X", "-n", "-P", "-o", "JobName")
    assert f"cloudtrain-{run_id}" not in jobs, jobs
