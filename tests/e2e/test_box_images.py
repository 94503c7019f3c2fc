"""Nodes that boot as the clouds' real images do (issue 13): the box boots each VM as the image
the adapter chose (tests/fakes/box_images.py), so these runs show

- on each cloud's DEFAULT GPU image as it ships (Python 3.10, no TensorFlow), the startup script
  makes its venv from the image's python3 (apt's python3-venv first, as stock Ubuntu has no
  ensurepip), pip-installs the pinned TensorFlow itself, and the training runs on Python 3.10;
- a reboot in the middle of the driver phase resumes the boot and finishes it, whether the
  bootstrap reboots for its own driver install or Azure's NvidiaGpuDriverLinux extension
  reboots the VM while the bootstrap waits for it (cloud-init runs user data once per instance:
  only the per-boot copy the script registered brings it back).

Real TensorFlow, one node (digits-mirrored) each, to keep CI's time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cloudtrain.run.startup import TF_VERSION
from tests.e2e.conftest import Env
from tests.e2e.test_aws_in_a_box import REGION as AWS_REGION
from tests.e2e.test_aws_in_a_box import AwsBox, aws
from tests.e2e.test_azure_in_a_box import AzureBox, azure, azure_cloud, azurite, azurite_session
from tests.e2e.test_gcp_in_a_box import GcpBox, gcp, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.fakes.boot_harness import BootHarness

__all__ = [  # fixtures, for pytest
    "aws",
    "azure",
    "azure_cloud",
    "azurite",
    "azurite_session",
    "gcp",
    "gcp_cloud",
    "gcs_emulator",
    "gcs_emulator_session",
]

EPOCHS = "cloudtrain: epoch 2/2 done"


def _job(ct: Env) -> Path:
    return ct.job("digits-mirrored", "python train.py --epochs 2")


def _only_vm(harness: BootHarness) -> Path:
    (vm_id,) = harness.boots
    return harness.vm_dir(vm_id)


def _assert_trained_on_a_bare_310_image(proc: object, harness: BootHarness) -> None:
    out = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == 0, out[-5000:]  # type: ignore[attr-defined]
    vm = _only_vm(harness)
    boot_log = (vm / "opt" / "bootstrap.log").read_text()
    # the image's python3 is 3.10 and had no TensorFlow: the script installed it into its venv
    assert "python3 is Python 3.10." in boot_log, boot_log[-3000:]
    assert f"installing tensorflow=={TF_VERSION}" in boot_log, boot_log[-3000:]
    cfg = (vm / "opt" / "venv" / "pyvenv.cfg").read_text()
    assert "version = 3.10." in cfg and "include-system-site-packages = false" in cfg, cfg
    calls = harness.calls(next(iter(harness.boots)))
    assert any("install" in c and "python3-venv" in c for c in calls), calls
    assert EPOCHS in out, out[-3000:]


def _assert_trained_after_one_reboot(proc: Any, harness: BootHarness, before: str) -> None:
    """The run succeeded on one VM that booted twice; its log has `before`, then the resume."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    (vm_id,) = harness.boots
    assert harness.boots[vm_id] == 2, "exactly one reboot"
    boot_log = (harness.vm_dir(vm_id) / "opt" / "bootstrap.log").read_text()
    assert before in boot_log, boot_log[-3000:]
    assert boot_log.index(before) < boot_log.index("continuing after a reboot")
    assert EPOCHS in out


def test_aws_default_image_installs_tensorflow_and_trains_on_310(aws: AwsBox) -> None:
    aws.harness.bare = True
    proc = aws.run(
        "run", "--provider", "aws", "--region", AWS_REGION, str(_job(aws.ct)), timeout=900
    )
    _assert_trained_on_a_bare_310_image(proc, aws.harness)


def test_gcp_default_image_installs_tensorflow_and_trains_on_310(gcp: GcpBox) -> None:
    gcp.harness.bare = True
    proc = gcp.run("run", "--provider", "gcp", str(_job(gcp.ct)), timeout=900)
    _assert_trained_on_a_bare_310_image(proc, gcp.harness)


def test_azure_default_image_installs_tensorflow_and_trains_on_310(azure: AzureBox) -> None:
    azure.harness.bare = True
    proc = azure.run("run", "--provider", "azure", str(_job(azure.ct)), timeout=900)
    _assert_trained_on_a_bare_310_image(proc, azure.harness)


def test_the_bootstraps_own_driver_reboot_resumes_the_boot(aws: AwsBox) -> None:
    # plain Ubuntu on a GPU: the bootstrap installs the driver, whose module loads only after a
    # reboot; cloud-init then runs only the per-boot copy, which finishes the boot
    aws.harness.gpu = True
    aws.harness.module_needs_reboot = True
    job = aws.ct.job(
        "digits-mirrored",
        "python train.py --epochs 2",
        cluster={
            "strategy": "mirrored",
            "workers": 1,
            "accelerator": "T4:1",
            "image": "ubuntu-22.04",
        },
    )
    proc = aws.run("run", "--provider", "aws", "--region", AWS_REGION, str(job), timeout=600)
    _assert_trained_after_one_reboot(
        proc, aws.harness, "phase driver: rebooting once to load the nvidia module"
    )


def test_the_azure_extensions_reboot_during_the_driver_wait_resumes_the_boot(
    azure: AzureBox,
) -> None:
    # NCasT4_v3 on Ubuntu 22.04 gets NvidiaGpuDriverLinux, which installs the driver beside the
    # bootstrap and then reboots the VM: before, nothing ran again and the node was lost
    azure.harness.gpu = True
    azure.harness.extension_s = 4.0
    azure.harness.hold = lambda vm: not vm.driver_extension  # boot once the extension exists
    proc = azure.run("run", "--provider", "azure", str(_job(azure.ct)), timeout=600)
    _assert_trained_after_one_reboot(
        proc, azure.harness, "driver: waiting for the NvidiaGpuDriverLinux extension"
    )
