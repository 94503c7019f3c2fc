"""A TPU VM boots in the GCP box: a node created through google-cloud-tpu runs its startup script
in the runtime's image, with its identity, and stops when the node is deleted or preempted.

The script asks what a TPU VM's program sees: the installed TensorFlow (the runtime's,
tests/fakes/tpu_images.py), the metadata server's `accelerator-type` and the node's service
account (tests/fakes/tpu_node_identity.py). Heavy (an image interpreter, the GCS emulator, real
process sessions): run it under the shared lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

tpu_v2 = pytest.importorskip("google.cloud.tpu_v2")

from tests.fakes.boot_harness import BootHarness  # noqa: E402
from tests.fakes.gce_instances import default_service_account  # noqa: E402
from tests.fakes.gcp_cloud import gcp_cloud, gcs_emulator, gcs_emulator_session  # noqa: E402
from tests.fakes.tpu_cloud import TpuCloud, discover_tpu_vms, power_off_tpu, tpu_cloud  # noqa: E402
from tests.fakes.tpu_images import NoTensorFlowRuntime, runtime_requirements  # noqa: E402
from tests.fakes.tpu_node_identity import TpuNodeIdentities  # noqa: E402
from tests.fakes.tpu_testkit import FAST, RUNTIME  # noqa: E402

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session", "tpu_cloud"]  # fixtures
ZONE = "us-west4-a"
PARENT = f"projects/{{project}}/locations/{ZONE}"
SCRIPT = """#!/bin/bash
python3 - >{out}.tmp <<'EOF'
import importlib.metadata, os, urllib.request
def meta(path):
    url = "http://" + os.environ["GCE_METADATA_HOST"] + "/computeMetadata/v1/" + path
    request = urllib.request.Request(url, headers={{"Metadata-Flavor": "Google"}})
    return urllib.request.urlopen(request, timeout=10).read().decode()
print(importlib.metadata.version("tensorflow"), meta("instance/attributes/accelerator-type"),
      meta("instance/service-accounts/default/email"))
EOF
mv {out}.tmp {out}
sleep 600
"""


def _until(what: Callable[[], bool], timeout_s: float = 180) -> None:
    """Wait (polling every 0.2 s) until `what()` holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


class TpuBoot:
    """The TPU fake beside the GCP box, its VMs booted by a harness."""

    def __init__(self, cloud: TpuCloud, harness: BootHarness, root: Path) -> None:
        self.cloud, self.harness, self.root = cloud, harness, root
        self.client = tpu_v2.TpuClient(**cloud.tpu.client_kwargs())
        self.parent = PARENT.format(project=cloud.gcp.project)

    def create(self, node_id: str, spot: bool = False) -> Path:
        """Create a READY node whose script writes its answers to the returned file."""
        out = self.root / f"{node_id}.out"
        node = tpu_v2.Node(
            accelerator_type="v5litepod-8",
            runtime_version=RUNTIME,
            metadata={"startup-script": SCRIPT.format(out=out)},
            labels={"cloudtrain-role": "worker"},
            scheduling_config=tpu_v2.SchedulingConfig(spot=spot),
        )
        self.client.create_node(parent=self.parent, node_id=node_id, node=node).result(polling=FAST)
        return out

    def vm_id(self, node_id: str) -> str:
        return str(self.client.get_node(name=f"{self.parent}/nodes/{node_id}").id)


@pytest.fixture
def boot(tpu_cloud: TpuCloud, tmp_path: Path) -> Iterator[TpuBoot]:
    identities = TpuNodeIdentities(tpu_cloud.gcp, tpu_cloud.tpu).start()
    harness = BootHarness(
        tmp_path / "box",
        lambda: discover_tpu_vms(tpu_cloud.tpu, identities),
        {},
        on_power_off=lambda vm_id: power_off_tpu(tpu_cloud.tpu, vm_id),
        shutdown_grace_s=2.0,
    ).start()
    try:
        yield TpuBoot(tpu_cloud, harness, tmp_path)
    finally:
        harness.stop()
        identities.close()


def test_a_ready_tpu_node_boots_its_script_in_the_runtime_image_and_stops_when_deleted(
    boot: TpuBoot,
) -> None:
    out = boot.create("ct-tpu-a")
    _until(out.exists)
    project = boot.cloud.gcp.project
    assert out.read_text().split() == ["2.16.1", "v5litepod-8", default_service_account(project)]
    vm_id = boot.vm_id("ct-tpu-a")
    assert boot.harness.live_sessions() == [vm_id]
    boot.client.delete_node(name=f"{boot.parent}/nodes/ct-tpu-a").result(polling=FAST)
    _until(lambda: boot.harness.live_sessions(settle_s=0) == [])
    assert boot.harness.boots[vm_id] == 1


def test_a_preempted_spot_tpu_vm_stops_and_a_powered_off_one_turns_stopped(
    boot: TpuBoot,
) -> None:
    spot, plain = boot.create("ct-tpu-s", spot=True), boot.create("ct-tpu-p")
    _until(lambda: spot.exists() and plain.exists())
    spot_vm, plain_vm = boot.vm_id("ct-tpu-s"), boot.vm_id("ct-tpu-p")
    boot.cloud.tpu.preempt("ct-tpu-s")
    _until(lambda: boot.harness.live_sessions(settle_s=0) == [plain_vm])
    assert power_off_tpu(boot.cloud.tpu, plain_vm) and not power_off_tpu(boot.cloud.tpu, "1")
    node = boot.client.get_node(name=f"{boot.parent}/nodes/ct-tpu-p")
    assert node.state == tpu_v2.Node.State.STOPPED
    _until(lambda: boot.harness.live_sessions(settle_s=0) == [])
    assert spot_vm != plain_vm


def test_the_image_of_a_runtime_has_its_tensorflow_and_a_base_runtime_has_none() -> None:
    reqs = runtime_requirements("tpu-vm-tf-2.15.1-se")
    assert reqs[:2] == ["tensorflow==2.15.1", "tf-keras~=2.15.0"]
    with pytest.raises(NoTensorFlowRuntime):
        runtime_requirements("v2-alpha-tpuv5-lite")
