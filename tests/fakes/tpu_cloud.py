"""Cloud TPU in the GCP box: the TPU API fake beside `gcp_cloud`, and its TPU VMs booted.

    from tests.fakes.tpu_cloud import tpu_cloud  # noqa: F401  (with gcp_cloud's fixtures)

    identities = TpuNodeIdentities(tpu_cloud.gcp, tpu_cloud.tpu).start()
    harness = BootHarness(root, lambda: [*gce_vms(), *discover_tpu_vms(tpu_cloud.tpu,
                          identities)], env, on_power_off=lambda vm: power_off_tpu(...) or ...)

The `tpu_cloud` fixture starts a TPU API fake (tests/fakes/tpu_fake.py) on the GCP box's GCE
fake (its account, its IAM) and sets CLOUDTRAIN_TPU_ENDPOINT to it for this process and its
children; `tpu_cloud.account` scripts TPU quotas, sold-out zones, denied permissions and the
API's enablement (tests/fakes/tpu_account.py).

`discover_tpu_vms` answers the boot harness (tests/fakes/boot_harness.py) a `Vm` per TPU node:
alive while the node is READY (a node CREATING has no VM yet; STOPPED, PREEMPTED, DELETING or
gone: the harness shuts its guest down as a cloud does), its script the node's `startup-script`
metadata, run on every boot (a TPU VM is a Compute Engine VM whose guest agent runs it at each
boot; `Node.metadata`: "Can set startup-script and shutdown-script", TPU API v2 discovery
document), its environment its node's identity (TpuNodeIdentities) and its image the runtime's
(tests/fakes/tpu_images.py: Ubuntu 22.04's facts, `python3` with the runtime's TensorFlow; a
runtime without TensorFlow boots the bare Python 3.10). The Vm id is the node's `id`, so a node
re-created under the same node id (a preempted spot node's replacement) is a new VM.
`power_off_tpu` is the harness's `on_power_off` for a TPU VM (`shutdown -h now` on it): the node
turns STOPPED (the box's reading: Google documents a TPU VM's own power-off nowhere in reach;
STOPPED is the TPU API's state of a VM that is off).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.fakes.boot_harness import Vm
from tests.fakes.box_images import base_python
from tests.fakes.gce_node_identity import NodeIdentities
from tests.fakes.gcp_cloud import GcpCloud
from tests.fakes.tpu_account import TpuAccount
from tests.fakes.tpu_catalog import tf_version_of
from tests.fakes.tpu_fake import TpuFake, start_tpu_fake
from tests.fakes.tpu_images import PYTHON, UBUNTU_2204, runtime_python

__all__ = ["ENDPOINT_ENV", "TpuCloud", "discover_tpu_vms", "power_off_tpu", "tpu_cloud"]
ENDPOINT_ENV = "CLOUDTRAIN_TPU_ENDPOINT"
ALIVE = ("READY",)


@dataclass
class TpuCloud:
    """The offline Cloud TPU of one test, on its offline GCP."""

    gcp: GcpCloud
    tpu: TpuFake

    @property
    def account(self) -> TpuAccount:
        """The account's TPU quotas, capacity, the caller's TPU rights and the API's state."""
        return self.tpu.account


@pytest.fixture
def tpu_cloud(gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[TpuCloud]:
    """A fresh TPU API fake beside `gcp_cloud`'s GCE fake, CLOUDTRAIN_TPU_ENDPOINT pointed at it."""
    pytest.importorskip("google.cloud.tpu_v2", reason="pip install 'cloudtrain[gcp]'")
    fake = start_tpu_fake(gcp_cloud.gce)
    monkeypatch.setenv(ENDPOINT_ENV, fake.url)
    try:
        yield TpuCloud(gcp_cloud, fake)
    finally:
        fake.stop()


def discover_tpu_vms(tpu: TpuFake, identities: NodeIdentities) -> list[Vm]:
    """The TPU fake's nodes as the boot harness's VMs (module docstring). Blocks the first time
    a runtime's image is built (tests/fakes/tpu_images.py)."""
    vms = []
    for node in tpu.nodes():
        runtime = str(node.get("runtimeVersion") or "")
        python = runtime_python(runtime) if tf_version_of(runtime) else base_python(PYTHON)
        vm_id, name = str(node["id"]), node["name"].rsplit("/", 1)[-1]
        role = (node.get("labels") or {}).get("cloudtrain-role")
        env = {**identities.vm_env(vm_id, role), "BOX_IMAGE_PYTHON": str(python)}
        script = str((node.get("metadata") or {}).get("startup-script") or "")
        alive = node.get("state") in ALIVE
        vms.append(
            Vm(vm_id, name, alive, lambda s=script: s, UBUNTU_2204, every_boot=True, env=env)
        )
    return vms


def power_off_tpu(tpu: TpuFake, vm_id: str) -> bool:
    """The TPU VM `vm_id` powered itself off: its node turns STOPPED. False if `vm_id` is no
    TPU node's (another cloud's VM: the caller's own `on_power_off` handles it)."""
    for node in tpu.nodes():
        if str(node["id"]) == vm_id:
            tpu.set_node_state(node["name"].rsplit("/", 1)[-1], "STOPPED")
            return True
    return False
