"""Cloud in a box: boot each VM an emulated cloud creates by running its startup script locally.

A `BootHarness` polls the emulator (through a `discover` callback that returns the VMs it knows)
and, for every new live VM, runs the VM's own startup script (its UserData / startup-script /
custom_data) with bash in a fresh process session and folder, as the cloud would at first boot.
The VM's environment is what a real one gets from its image and metadata service: its own
loopback port, its work folder, the machine's Python (an image with the stack installed), and
the emulator's endpoint (as an SDK honours AWS_ENDPOINT_URL and friends).

Safety: `shutdown`, `poweroff`, `halt` and `reboot` are shims first on PATH. They never touch this
machine; they record the call, and `shutdown now` is reported to `on_power_off` (the test then
terminates the VM in the emulator, as InstanceInitiatedShutdownBehavior=terminate would) while
the VM's session is killed. A VM the emulator reports terminated, or no longer lists at all
(GCE forgets a deleted instance), has its session killed too.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.providers.local import kill_session, session_pids, start_session

SHIM = """#!/usr/bin/env bash
# cloud-in-a-box shim: never acts on the test machine
echo "$HARNESS_VM_ID $(basename "$0") $*" >> "$HARNESS_DIR/power.log"
case " $* " in
  *" now "*) kill -KILL -- "-$(ps -o sid= -p $$ | tr -d ' ')" ;;
esac
exit 0
"""


@dataclass(frozen=True)
class Vm:
    """What the emulator says about one VM."""

    id: str
    name: str
    alive: bool
    script: Callable[[], str]  # fetched once, when the VM boots


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BootHarness:
    """Boots VMs as local process sessions. Start with `start()`, always `stop()`."""

    def __init__(
        self,
        root: Path,
        discover: Callable[[], list[Vm]],
        env: dict[str, str],
        on_power_off: Callable[[str], None] = lambda _vm: None,
        poll_s: float = 0.3,
    ) -> None:
        self.root, self.discover, self.env = root, discover, env
        self.on_power_off, self.poll_s = on_power_off, poll_s
        self.sessions: dict[str, int] = {}  # vm id -> session id
        self.booted: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="boot-harness")
        self._shims = root / "shims"
        self._shims.mkdir(parents=True, exist_ok=True)
        for name in ("shutdown", "poweroff", "halt", "reboot"):
            (self._shims / name).write_text(SHIM)
            (self._shims / name).chmod(0o755)
        self._power_seen = 0
        # VMs for which this returns True are not booted (yet): a VM slow to come up
        self.hold: Callable[[Vm], bool] = lambda _vm: False
        # the instance metadata service the VMs' agents poll for preemption notices: each VM
        # gets `<metadata_url>/vm/<id>` (tests/fakes/metadata_server.py); None = nothing
        # listens (the discard port), never the real link-local address
        self.metadata_url: str | None = None

    def start(self) -> BootHarness:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the emulator may be mid-reset; keep going, but record
                self.errors.append(repr(exc))
            self._stop.wait(self.poll_s)

    def _tick(self) -> None:
        vms = self.discover()
        for vm in vms:
            if vm.alive and vm.id not in self.sessions and not self.hold(vm):
                self.boot(vm)
            elif not vm.alive and vm.id in self.sessions:
                self.kill(vm.id)
        known = {vm.id for vm in vms}
        for vm_id in [v for v in self.sessions if v not in known]:  # deleted from the cloud
            self.kill(vm_id)
        log = self.root / "power.log"
        if log.exists():
            lines = log.read_text().splitlines()
            for line in lines[self._power_seen :]:
                vm_id, _cmd, *args = line.split()
                if "now" in args:
                    self.on_power_off(vm_id)
            self._power_seen = len(lines)

    def boot(self, vm: Vm) -> None:
        """Run the VM's startup script in its own session and folder."""
        work = self.root / "vms" / vm.id
        work.mkdir(parents=True, exist_ok=True)
        script = work / "startup.sh"
        script.write_text(vm.script())
        env = dict(self.env)
        env.update(
            PATH=f"{self._shims}{os.pathsep}{env.get('PATH', os.environ.get('PATH', ''))}",
            CT_WORK=str(work),
            CT_PYTHON=sys.executable,
            CLOUDTRAIN_NODE_HOST="127.0.0.1",
            CT_ALLOW_NO_GPU="1",  # GPU nodes boot on this machine, which has no GPU
            CLOUDTRAIN_NODE_PORT=str(_free_port()),
            CLOUDTRAIN_METADATA_URL=(
                f"{self.metadata_url}/vm/{vm.id}" if self.metadata_url else "http://127.0.0.1:9"
            ),
            HARNESS_VM_ID=vm.id,
            HARNESS_DIR=str(self.root),
        )
        proc = start_session(script, work, env)
        self.sessions[vm.id] = proc.pid
        self.booted.append(vm.name)

    def kill(self, vm_id: str) -> None:
        """End every process of a VM's session (the VM is gone)."""
        sid = self.sessions.get(vm_id)
        if sid is not None:
            kill_session(sid)

    def live_sessions(self, settle_s: float = 5.0) -> list[str]:
        """VMs whose session still has a process, after giving the poll loop up to `settle_s`
        to notice VMs deleted just now."""
        deadline = time.monotonic() + settle_s
        while True:
            live = [vm for vm, sid in self.sessions.items() if session_pids(sid)]
            if not live or time.monotonic() >= deadline:
                return live
            time.sleep(0.1)

    def console(self, vm_id: str) -> str:
        path = self.root / "vms" / vm_id / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop polling and kill every VM session."""
        self._stop.set()
        self._thread.join(timeout=5)
        for vm_id in list(self.sessions):
            self.kill(vm_id)
