"""Strategy tpu in the GCP box (issue 32): the real `cloudtrain plan/run/down/gc --provider gcp`
against the GCE fake, the GCS emulator and the TPU API fake, through google-cloud-tpu.

A TPU job (digits-mirrored's code under `strategy: tpu`, `accelerator: v5litepod-8`) is planned
with its price, its TPU VM created through the TPU API (on demand: a node; spot: a queued
resource), booted by the harness from its `startup-script` on the runtime's image
(tests/fakes/tpu_images.py: Python 3.10 with the runtime's TensorFlow, CPU; no TPU, no
libtpu.so), trains to success on that CPU under the strategy's fallback ("no TPU on this VM"),
and is torn down with nothing left. A spot TPU preempted mid-run (the TPU API's PREEMPTED, its
queued resource SUSPENDED) is recreated and the run resumes from its checkpoint. A run killed
with SIGKILL right after its creates leaves a TPU VM that `gc` names and `down` deletes.

What is not run here: a TPU. TPUStrategy itself never gets chips in the box; what the TPU VM's
bootstrap exports for TPUClusterResolver(tpu="local") is checked in its log, not used.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core.crashpoints import CRASH_ENV
from cloudtrain.jobs.protocol import checkpoints_prefix
from tests.e2e.conftest import Env, checkpoint_synced
from tests.e2e.test_gcp_in_a_box import GcpBox, _discover
from tests.fakes.boot_harness import BootHarness
from tests.fakes.gce_node_identity import LAPTOP_ENV
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.fakes.tpu_cloud import TpuCloud, discover_tpu_vms, power_off_tpu, tpu_cloud
from tests.fakes.tpu_node_identity import TpuNodeIdentities

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session", "tpu_cloud"]  # fixtures
pytestmark = pytest.mark.e2e
REGION = "us-west4"  # sells v5litepod-8 (tpu_types: us-west4-a)
ZONE = "us-west4-a"
TYPE = "v5litepod-8"
EPOCHS = 3
NO_TPU = "no TPU on this VM"  # jobs/tf_strategies.py's one line when TF finds no TPU
DONE_RE = rf"cloudtrain: epoch (\d)/{EPOCHS} done"


class TpuBox(GcpBox):
    """The GCP box with its TPU API fake and TPU VMs booted."""

    tpu: TpuCloud

    @property
    def bucket(self) -> str:  # the default bucket of this test's region
        return f"cloudtrain-{self.cloud.project}-{REGION}"

    def text(self, key: str) -> str:
        """An object of the run's bucket, as text (the emulator, anonymous)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(credentials=AnonymousCredentials(), project=self.cloud.project)
        return str(client.bucket(self.bucket).blob(key).download_as_text())

    def assert_nothing_left(self, run_id: str) -> None:
        assert self.tpu.tpu.nodes() == [], self.tpu.tpu.nodes()
        assert self.tpu.tpu.queued_resources() == []
        super().assert_nothing_left(run_id)


@pytest.fixture
def tpu_box(ct: Env, gcp_cloud: GcpCloud, tpu_cloud: TpuCloud, tmp_path: Path) -> Iterator[TpuBox]:
    names = (
        "CLOUDTRAIN_GCE_ENDPOINT",
        "CLOUDTRAIN_IAM_ENDPOINT",
        "CLOUDTRAIN_TPU_ENDPOINT",
        "STORAGE_EMULATOR_HOST",
        "GOOGLE_CLOUD_PROJECT",
    )
    ct.env.update({k: os.environ[k] for k in (*names, "NO_PROXY") if k in os.environ})
    ct.env.update(LAPTOP_ENV)
    ct.env["COLUMNS"] = "200"
    tpu = tpu_cloud.tpu

    def power_off(vm_id: str) -> None:  # a TPU VM's own power-off: its node STOPPED
        power_off_tpu(tpu, vm_id)

    identities = TpuNodeIdentities(gcp_cloud, tpu).start()
    harness = BootHarness(
        tmp_path / "box",
        lambda: [*_discover(gcp_cloud, identities), *discover_tpu_vms(tpu, identities)],
        dict(ct.env),
        on_power_off=power_off,
    ).start()
    box = TpuBox(ct, harness, gcp_cloud, identities)
    box.tpu = tpu_cloud
    try:
        yield box
    finally:
        harness.stop()
        identities.close()


def _job(ct: Env, spot: bool, epoch_seconds: float = 0) -> Path:
    entry = f"python train.py --epochs {EPOCHS}"
    if epoch_seconds:
        entry += f" --epoch-seconds {epoch_seconds}"
    cluster = {"strategy": "tpu", "workers": 1, "accelerator": TYPE, "spot": spot}
    # a v5litepod-8 is $9.60/h on demand: the example's $2 budget would refuse it
    return ct.job("digits-mirrored", entry, cluster=cluster, max_hours=0.5, max_cost_usd=10)


def test_tpu_job_is_priced_created_trained_on_the_cpu_and_leaves_nothing(tpu_box: TpuBox) -> None:
    job = _job(tpu_box.ct, spot=False)
    plan = tpu_box.run("plan", "--provider", "gcp", "--region", REGION, str(job))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert TYPE in plan.stdout and re.search(r"\$\d+\.\d\d", plan.stdout), plan.stdout
    proc = tpu_box.run("run", "--provider", "gcp", "--region", REGION, str(job), timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    (run_id,) = tpu_box.ct.run_ids()
    # created through the TPU API, on demand: a node create, no queued resource
    posts = [r for r in tpu_box.tpu.tpu.requests if r.startswith("POST ")]
    creates = [r for r in posts if "/nodes?" in r]
    assert len(creates) == 1 and f"/locations/{ZONE}/" in creates[0], posts
    assert not [r for r in posts if "/queuedResources" in r], posts
    # the bootstrap took the image's TensorFlow (the runtime's 2.16.1), not the GPU nodes' pin,
    # and said so; it looked for no GPU, and found no libtpu.so (the box has no TPU)
    boot = tpu_box.text(f"cloudtrain/runs/{run_id}/bootstrap/chief-0.log")
    assert "using the image's tensorflow 2.16.1 (TPU runtime tpu-vm-tf-2.16.1-pjrt)" in boot, boot
    assert "installing tensorflow" not in boot and "GPU(s) expected" not in boot, boot
    assert "no /lib/libtpu.so on this TPU VM" in boot, boot
    assert NO_TPU in out and f"epoch {EPOCHS}/{EPOCHS} done" in out, out[-4000:]
    keys = tpu_box.keys(f"cloudtrain/runs/{run_id}/")
    assert f"cloudtrain/runs/{run_id}/model/saved_model/saved_model.pb" in keys
    tpu_box.assert_nothing_left(run_id)


def test_a_preempted_spot_tpu_is_recreated_and_the_run_resumes(tpu_box: TpuBox) -> None:
    ct, fake = tpu_box.ct, tpu_box.tpu.tpu
    job = _job(ct, spot=True, epoch_seconds=8)
    cli = ct.start("run", "--provider", "gcp", "--region", REGION, str(job))
    try:
        done = int(ct.wait_for(DONE_RE, timeout=200)[1])
        (run_id,) = ct.run_ids()
        # the finished epoch's checkpoint (index and data) is in the bucket: then preempt
        epoch = f"{checkpoints_prefix(run_id)}ckpt/epoch-{done:03d}."
        deadline = time.monotonic() + 60
        while not checkpoint_synced(tpu_box.keys, epoch):
            assert time.monotonic() < deadline, f"no {epoch}index/data in the bucket in 60 s"
            time.sleep(0.2)
        (node,) = [n for n in fake.nodes() if n.get("state") == "READY"]
        fake.preempt(str(node["name"]).rsplit("/", 1)[-1])
        assert cli.wait(timeout=240) == 0, ct.output()[-4000:]
    finally:
        cli.kill()
    out = ct.output()
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and rec.outcome == "succeeded", out[-4000:]
    # attempt 2 restored the bucket's checkpoint and went on after the epochs already done (the
    # CLI's epoch line lags the node's: `done` is a lower bound), not from the start
    assert "attempt 2" in out and "checkpoint files from the bucket" in out, out[-4000:]
    resumed = {int(k) for k in re.findall(r"cloudtrain: resumed at epoch (\d)", out)}
    assert len(resumed) == 1 and done < resumed.pop() <= EPOCHS, out[-4000:]
    assert f"epoch {EPOCHS}/{EPOCHS} done" in out, out[-4000:]
    created = [e.message for e in ct.ledger().events(run_id) if e.message.startswith("created ")]
    assert len(created) == 2, created  # the spot node, then its replacement
    queued = [r for r in fake.requests if r.startswith("POST ") and "/queuedResources?" in r]
    assert len(queued) == 2, fake.requests  # each a spot queued resource
    tpu_box.assert_nothing_left(run_id)


def test_gc_and_down_find_a_tpu_vm_after_kill_9(tpu_box: TpuBox) -> None:
    ct = tpu_box.ct
    job = _job(ct, spot=False)
    proc = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", "run", "--provider", "gcp",
         "--region", REGION, str(job)],
        env=dict(ct.env, **{CRASH_ENV: "after-creates"}),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_id,) = ct.run_ids()
    (node,) = tpu_box.tpu.tpu.nodes()
    name = str(node["name"]).rsplit("/", 1)[-1]
    assert name == f"ct-{run_id}-chief-0"  # one node: the chief
    # gc from a machine whose ledger never saw the run: an unknown run's TPU VM, named
    other = dict(ct.env, CLOUDTRAIN_HOME=str(ct.home / "other-machine"))
    gc = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", "gc", "--provider", "gcp",
         "--region", REGION],
        env=other, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert gc.returncode == 0 and name in gc.stdout, gc.stdout + gc.stderr
    assert "pass --yes to delete" in gc.stdout, gc.stdout
    down = tpu_box.run("down", run_id)
    assert down.returncode == 0, down.stdout + down.stderr
    tpu_box.assert_nothing_left(run_id)


def test_a_caller_without_tpu_rights_is_told_by_check_and_run_creates_nothing(
    tpu_box: TpuBox,
) -> None:
    # the rights a TPU run uses are asked of a TPU run only: a GPU run's caller needs none
    tpu_box.tpu.tpu.account.deny("tpu.queuedResources.create")
    job = _job(tpu_box.ct, spot=True)
    line = "the GCP credentials lack 1 right(s) a run needs: tpu.queuedResources.create"
    check = tpu_box.run("check", "--provider", "gcp", "--region", REGION, str(job))
    assert check.returncode == 1 and line in check.stdout, check.stdout + check.stderr
    proc = tpu_box.run("run", "--provider", "gcp", "--region", REGION, str(job))
    assert proc.returncode != 0
    assert line in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-2000:]
    writes = [r for r in tpu_box.tpu.tpu.requests if r.startswith(("POST", "DELETE"))]
    assert writes == [] and tpu_box.tpu.tpu.nodes() == [], writes
    assert tpu_box.cloud.gce.service_accounts() == [] and tpu_box.cloud.gce.firewalls() == []
    # the TPU API switched off is said by check, as the GPU APIs are
    tpu_box.tpu.tpu.account.allow("tpu.queuedResources.create")
    tpu_box.tpu.tpu.account.disable()
    check = tpu_box.run("check", "--provider", "gcp", "--region", REGION, str(job))
    assert check.returncode == 1, check.stdout + check.stderr
    assert "gcloud services enable tpu.googleapis.com" in check.stdout, check.stdout


def test_a_tpu_run_is_not_handed_to_a_controller_node(tpu_box: TpuBox) -> None:
    # its controller would need TPU rights over the whole project: refused before anything
    job = _job(tpu_box.ct, spot=False)
    proc = tpu_box.run("run", "--detach", "--provider", "gcp", "--region", REGION, str(job))
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot be handed to a controller node" in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not [r for r in tpu_box.tpu.tpu.requests if r.startswith(("POST", "DELETE"))]
    assert tpu_box.cloud.gce.service_accounts() == [] and tpu_box.cloud.gce.firewalls() == []
    assert tpu_box.ct.run_ids() == []
