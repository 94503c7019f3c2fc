"""The boot harness never lets a VM its cloud deleted run again (tests/fakes/boot_harness.py).

The VMs' boots here are real process sessions (`sleep`), launched through the harness's `launch`
hook instead of a startup script in an image's environment (whose interpreter and wheelhouse are
built on first use); the polls are the harness's own `_tick()`, driven by hand in a fixed order.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.boot_harness import BootHarness, Vm

IMAGE = "gcp:projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[BootHarness, list[Vm]]]:
    """A harness (not polling) whose cloud lists the VMs of the returned list."""
    cloud: list[Vm] = []
    harness = BootHarness(tmp_path, lambda: list(cloud), {}, shutdown_grace_s=2.0)
    procs: list[subprocess.Popen[bytes]] = []

    def launch(_vm: Vm, _script: Path) -> int:
        procs.append(subprocess.Popen(["sleep", "600"], start_new_session=True))
        return procs[-1].pid

    harness.launch = launch
    try:
        yield harness, cloud
    finally:
        harness.stop()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_deleted_vm_is_not_booted_again_by_a_reboot(
    box: tuple[BootHarness, list[Vm]],
) -> None:
    harness, cloud = box
    vm = Vm("17", "ct-c-stop-0a1b2c-worker-0", True, lambda: "exit 0\n", IMAGE, every_boot=True)
    cloud.append(vm)
    harness._tick()  # the cloud lists it running: its first boot
    assert harness.live_sessions(settle_s=0) == ["17"]
    assert "ct-c-stop-0a1b2c-worker-0 (vm 17)" in harness.describe("17")
    assert "never shut down" in harness.describe("17")
    cloud.clear()  # the cloud deletes it: the next poll shuts its guest down
    harness._tick()
    harness.shutdowns["17"].join(timeout=30)
    assert harness.live_sessions(settle_s=0) == []
    # a reboot asked for before the deletion comes now (the driver extension's timer, a
    # `reboot` line the poll reads after the deletion): a deleted VM stays down
    harness.reboot("17")
    assert harness.live_sessions(settle_s=0) == []
    assert harness.boots["17"] == 1
    assert "reboot refused" in harness.describe("17")


def test_a_vm_is_live_until_its_power_cut_has_cleaned_up(
    box: tuple[BootHarness, list[Vm]],
) -> None:
    """A subclass's kill() cleans up after the VM (the Debian box unmounts its root): the VM's
    processes may be gone at SIGTERM while that cleanup still runs. `live_sessions()` waits for
    it, so a test that then checks what the VM left (mounts) does not race the shutdown thread."""
    harness, cloud = box
    cut, release = threading.Event(), threading.Event()
    power_cut = harness.kill

    def slow_kill(vm_id: str) -> None:
        power_cut(vm_id)
        cut.set()
        release.wait(30)  # the cleanup (an unmount) takes its time

    harness.kill = slow_kill  # type: ignore[method-assign]
    vm = Vm("18", "ct-c-stop-0a1b2c-worker-0", True, lambda: "exit 0\n", IMAGE, every_boot=True)
    cloud.append(vm)
    harness._tick()
    cloud.clear()
    harness._tick()  # SIGTERM: `sleep` ends at once, then the power cut's cleanup runs
    assert cut.wait(30)
    assert harness.live_sessions(settle_s=0.3) == ["18"]
    release.set()
    assert harness.live_sessions(settle_s=30) == []
