"""Cloud in a box: boot each VM an emulated cloud creates by running its startup script locally.

A `BootHarness` polls the emulator (through a `discover` callback that returns the VMs it knows)
and, for every new live VM, runs the VM's own startup script (its UserData / startup-script /
custom_data) with bash in a fresh process session and folder, as the cloud would at first boot.
The VM's environment is what a real one gets from its image and metadata service: its own
loopback port, its work folder, the emulator's endpoint (as an SDK honours AWS_ENDPOINT_URL and
friends), and its image (tests/fakes/box_images.py, from `Vm.image`): the image's
/etc/os-release, and its `python3`, a real interpreter of the image's Python version with nothing
of the controller's environment. The script makes its own venv from it, as on a cloud; with
`bare=False` (the default) the interpreter has the pinned stack baked in (a custom image), with
`bare=True` it is the stock image and the script pip-installs TensorFlow itself. Stock Ubuntu
and Debian have no ensurepip until apt installs python3-venv: the box's `python3` refuses
`-m venv` until its `apt-get` shim has "installed" that package.

Boots follow cloud-init (cloudinit.readthedocs.io, "Boot stages"): user data runs once per
instance; after a reboot only the scripts in the VM's per-boot folder run (and, on GCE, whose
guest agent runs startup-script on every boot, `Vm.every_boot`, the startup script again).
`reboot(vm)` reboots a VM: every process of it is killed, the boot id changes, and only that
runs. With `gpu=True` every VM has an NVIDIA device (a fake /sys/bus/pci and lspci); the driver
is there if the image ships it, else an apt-get install of it "installs" it, and the module loads
only after a reboot when `module_needs_reboot` is set; nvidia-smi answers once it is loaded. A VM
with `Vm.driver_extension` (Azure's NvidiaGpuDriverLinux) gets its driver from the "extension"
`extension_s` seconds after its first boot, which then reboots the VM, as the extension may: the
module it installed loads only at that next boot.

Safety: `shutdown`, `poweroff`, `halt`, `reboot`, `apt-get`, `modprobe` and the GPU tools are
shims first on PATH. They never touch this machine; they record the call, and `shutdown now` is
reported to `on_power_off` (the test then terminates the VM in the emulator, as
InstanceInitiatedShutdownBehavior=terminate would) while the VM's session is killed; `reboot`
(or `shutdown -r`) kills the session and the harness boots the VM again.

A VM the emulator reports terminated, or no longer lists at all (GCE forgets a deleted
instance), is shut down as a cloud shuts a deleted or preempted VM down: its guest gets an ACPI
power-button event, so systemd sends SIGTERM to every process, and the power is cut when the
guest is done or a grace period has passed. The harness sends SIGTERM to every process of the
VM's session, waits up to `shutdown_grace_s` (5 s; a VM's own `Vm.shutdown_grace_s` where its
box sets one: GCE's on-demand VMs, 30 s) for them to end, then SIGKILLs what is left (in a
thread of its own: the poll goes on meanwhile). A process that deletes its own VM (the
controller node, last) finishes its final step in that window. The clouds' real windows:
- AWS: a default TerminateInstances is a "normal instance shutdown with attempted graceful OS
  shutdown" (docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-terminate-methods.html); the
  instance is `shutting-down` meanwhile; spot interruptions come 2 minutes after the notice;
- GCE: a stop or delete gives the guest 90 s (on-demand), a preemption 30 s, before the VM is
  forced off (cloud.google.com/compute/docs/shutdownscript, "Limitations");
- Azure: deallocate and delete shut the VM down (learn.microsoft.com/rest/api/compute/
  virtualmachines/deallocate); a Spot eviction comes at least 30 s after its Scheduled Events
  `Preempt` notice (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events).
`kill(vm_id)` instead cuts the power at once (SIGKILL): a VM that dies (a host failure, a crash)
while its cloud still lists it running. A VM the cloud deleted never boots again: a reboot it
asked for (power.log, `reboot()`, the driver extension) that comes after the deletion is refused,
and one that started before it is the boot the power cut kills.

For a failure message, `describe(vm_id)` tells what happened to a VM: its boots (with their
session ids), each change in what the emulator said of it (alive, dead, absent), its power calls,
its shutdown and whether the power cut found it still running, with times since `start()`.

The VM's environment carries what the cloud SDKs of a program on it need to reach the box's
emulators, as on a cloud its metadata service and identity would: the endpoints and dummy
credentials of `env` (AWS_ENDPOINT_URL and AWS_* keys; CLOUDTRAIN_GCE_ENDPOINT,
CLOUDTRAIN_IAM_ENDPOINT, STORAGE_EMULATOR_HOST, GOOGLE_CLOUD_PROJECT; CLOUDTRAIN_ARM_ENDPOINT and
its CA file CLOUDTRAIN_ARM_CA, AZURE_SUBSCRIPTION_ID, the Azurite connection string), so a
controller node on a VM drives EC2/IAM/S3, Compute Engine/IAM/GCS and ARM/Blob as the laptop
does. Nothing of the laptop's own state goes along: no CLOUDTRAIN_HOME (the VM's cloudtrain
keeps its state under its own HOME, the VM's /root: `vm_dir(id)/root`), no pyenv or venv.

Namespace mode (`network=`, tests/fakes/netns.py): every VM is its own host. At its first boot
it gets `network.add_host(<vm id>)`, `before_boot(vm, host)` runs (a test compiles the cloud's
firewall into the host there), and its session runs inside the host's namespace: it has its own
address and no CLOUDTRAIN_NODE_HOST/PORT, so its startup script asks the instance metadata
service for its address and the agent listens on the job's port, as on a cloud. The harness
serves 169.254.169.254:80 (and metadata.google.internal) to the namespaces from a fake metadata
service on the network's host address (tests/fakes/metadata_server.py), which answers each VM
its own address. The emulators' endpoints in `env` must then be on `network.host_ip`. A VM's
namespace is removed when the VM is gone for good (terminated, deleted) and at `stop()`; the
Network itself is the test's to close. The compiled firewalls filter inbound only: a VM reaches
the emulators on `network.host_ip` (moto serves EC2, IAM, STS and S3 there), as a cloud VM
reaches its cloud's APIs.

Every VM's pip has the box's package index on this disk instead of PyPI (PIP_FIND_LINKS,
PIP_NO_INDEX; the bridge has no route beyond this machine anyway): the wheels the cloudtrain
wheel needs with each cloud's SDK extra for the image's Python (`box_images.sdk_wheelhouse`:
what a controller node's plain venv installs, `cloudtrain[<provider>]`, in ~5 s), and on a bare
image the whole stack its node downloads (`box_images.wheelhouse`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cloudtrain.providers.local import free_port, kill_session, session_pids, start_session
from tests.fakes.bootstrap_shims import OS_RELEASES, T4_LSPCI, VGA_LSPCI
from tests.fakes.box_images import facts, image_python, sdk_wheelhouse, wheelhouse
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.netns import Host, Network

POWER = """#!/usr/bin/env bash
# cloud-in-a-box shim: never acts on the test machine
echo "$HARNESS_VM_ID $(basename "$0") $*" >> "$HARNESS_DIR/power.log"
case "$(basename "$0") $* " in
  reboot* | *" -r "* | *" now "*) kill -KILL -- "-$(ps -o sid= -p $$ | tr -d ' ')" ;;
esac
exit 0
"""
# The machine below the script: each records `<name> <args>` in the VM's calls.log.
_RECORD = 'echo "$(basename "$0") $*" >>"$BOX_VM/calls.log"\n'
MACHINE = {
    # stock Ubuntu/Debian: no ensurepip until python3-venv is installed
    "python3": """if [ "${1:-}" = -m ] && [ "${2:-}" = venv ] &&
  [ ! -e "$BOX_VM/state/python3-venv" ]; then
  echo "The virtual environment was not created successfully because ensurepip is not available." \\
    "On Debian/Ubuntu systems, you need to install the python3-venv package" >&2
  exit 1
fi
exec "$BOX_IMAGE_PYTHON" "$@"
""",
    "apt-get": """case "$*" in
  *install*python3-venv*) touch "$BOX_VM/state/python3-venv" ;;
  *install*nvidia-driver-* | *install*cuda-drivers*)
    echo "$CT_BOOT_ID" >"$BOX_VM/state/driver-installed" ;;
esac
""",
    "apt-cache": "exit 0\n",
    "dpkg": "exit 0\n",
    "lspci": 'if [ "$BOX_GPU" = 1 ]; then echo "$BOX_LSPCI_GPU"; fi\necho "$BOX_LSPCI_OTHER"\n',
    # the module is loaded on this boot: by modprobe, or at boot by a driver installed earlier
    "nvidia-smi": """loaded() {
  [ "$BOX_IMAGE_DRIVER" = 1 ] && return 0
  [ "$(cat "$BOX_VM/state/driver-loaded" 2>/dev/null)" = "$CT_BOOT_ID" ] && return 0
  [ -e "$BOX_VM/state/driver-installed" ] &&
    [ "$(cat "$BOX_VM/state/driver-installed")" != "$CT_BOOT_ID" ]
}
if ! loaded; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
  exit 9
fi
case "$*" in
  *driver_version*) echo "580.95.05" ;;
  *) echo "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |" ;;
esac
""",
    "modprobe": """case "$*" in *-r*) exit 0 ;; esac
if [ ! -e "$BOX_VM/state/driver-installed" ]; then
  echo "modprobe: FATAL: Module nvidia not found" >&2
  exit 1
fi
installed_on="$(cat "$BOX_VM/state/driver-installed")"
if [ "$BOX_MODULE_NEEDS_REBOOT" = 1 ] && [ "$installed_on" = "$CT_BOOT_ID" ]; then
  echo "modprobe: ERROR: could not insert 'nvidia': No such device (nouveau holds it)" >&2
  exit 1
fi
echo "$CT_BOOT_ID" >"$BOX_VM/state/driver-loaded"
""",
}
# A VM's boot after a reboot: cloud-init's per-boot scripts (run-parts), and on GCE the startup
# script again, beside them.
REBOOT_RUNNER = """#!/usr/bin/env bash
if [ "${BOX_EVERY_BOOT:-}" = 1 ]; then bash "$BOX_VM/startup.sh" & fi
for script in "$BOX_VM"/per-boot/*; do
  if [ -f "$script" ] && [ -x "$script" ]; then "$script"; fi
done
wait
"""
# the host's PATH without pyenv: a VM has its image's Pythons only
_VM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the laptop's own state and Python, never a VM's (the module docstring)
_NOT_PASSED = ("PYENV", "VIRTUAL_ENV", "PYTHON", "CLOUDTRAIN_HOME")
# how long a deleted VM's guest has between SIGTERM and the power cut (the module docstring)
SHUTDOWN_GRACE_S = 5.0
# ... and an on-demand GCE VM's: GCE gives a deleted or stopped on-demand VM 90 s (a preempted
# spot VM 30 s) before it forces it off (cloud.google.com/compute/docs/shutdownscript,
# "Limitations"). The box gives it a third of that: the controller node deletes its own VM and
# then its identity in that window, ~1 s alone, and more than 5 s in the suite's busiest minutes
# (the official CI of stop 40), which is no fault on GCE
ON_DEMAND_GCE_GRACE_S = 30.0


def _cmds(pids: list[int]) -> str:
    """What processes `pids` run, for a harness event (`pid: cmdline`, each cut at 160 chars)."""
    shown = []
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        shown.append(f"{pid}: {cmdline[:160]}")
    return "; ".join(shown) or "(gone)"


@dataclass(frozen=True)
class Vm:
    """What the emulator says about one VM."""

    id: str
    name: str
    alive: bool
    script: Callable[[], str]  # fetched once, when the VM boots
    image: str = ""  # `<cloud>:<identifier>` (tests/fakes/box_images.FACTS)
    every_boot: bool = False  # the cloud runs the startup script on every boot (GCE)
    driver_extension: bool = False  # Azure's NvidiaGpuDriverLinux is on the VM
    # what the VM's identity changes in its environment, applied last (None: the variable is
    # removed): a node VM whose SDK must take its credentials from the metadata service, as on
    # the cloud, drops the box's full-rights credentials of `env` here
    env: Mapping[str, str | None] = field(default_factory=dict)
    # this VM's time between SIGTERM and the power cut when its cloud deletes it (None: the
    # harness's `shutdown_grace_s`): a box whose cloud gives a kind of VM a longer window says so
    shutdown_grace_s: float | None = None


_free_port = free_port  # below the ephemeral range (providers/local.py)


class BootHarness:
    """Boots VMs as local process sessions. Start with `start()`, always `stop()`."""

    def __init__(
        self,
        root: Path,
        discover: Callable[[], list[Vm]],
        env: dict[str, str],
        on_power_off: Callable[[str], None] = lambda _vm: None,
        poll_s: float = 0.3,
        *,
        bare: bool = False,
        gpu: bool = False,
        module_needs_reboot: bool = False,
        extension_s: float = 3.0,
        network: Network | None = None,
        shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    ) -> None:
        self.root, self.discover, self.env = root, discover, env
        self.on_power_off, self.poll_s = on_power_off, poll_s
        # the machine's knobs (see the module docstring); a test may set them before VMs boot
        self.bare, self.gpu, self.module_needs_reboot = bare, gpu, module_needs_reboot
        self.extension_s = extension_s
        self.shutdown_grace_s = shutdown_grace_s
        self.sessions: dict[str, int] = {}  # vm id -> session id
        # VMs the cloud deleted, whose guest is shutting down or down: vm id -> its thread;
        # `forced`: those whose processes were still running when the grace ended
        self.shutdowns: dict[str, threading.Thread] = {}
        self.forced: list[str] = []
        self.booted: list[str] = []
        self.boots: dict[str, int] = {}  # vm id -> boots so far
        self.errors: list[str] = []
        self._vms: dict[str, Vm] = {}
        # what happened to each VM, in order: (seconds since start, vm id, event); see describe()
        self.events: list[tuple[float, str, str]] = []
        self._said: dict[str, str] = {}  # vm id -> what discover() said of it last
        self._t0 = time.monotonic()
        # a deleted VM's shutdown and a reboot of it never interleave (see shut_down)
        self._power = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="boot-harness")
        self._shims = root / "shims"
        self._shims.mkdir(parents=True, exist_ok=True)
        for name in ("shutdown", "poweroff", "halt", "reboot"):
            (self._shims / name).write_text(POWER)
            (self._shims / name).chmod(0o755)
        for name, body in MACHINE.items():
            (self._shims / name).write_text("#!/usr/bin/env bash\n" + _RECORD + body)
            (self._shims / name).chmod(0o755)
        self._power_seen = 0
        # VMs for which this returns True are not booted (yet): a VM slow to come up
        self.hold: Callable[[Vm], bool] = lambda _vm: False
        # the instance metadata service the VMs' agents poll for preemption notices: each VM
        # gets `<metadata_url>/vm/<id>` (tests/fakes/metadata_server.py); None = nothing
        # listens (the discard port), never the real link-local address
        self.metadata_url: str | None = None
        # namespace mode (see the module docstring): vm id -> its host, and the hook that runs
        # once per VM between the host's creation and the VM's first boot
        self.network = network
        self.hosts: dict[str, Host] = {}
        self.before_boot: Callable[[Vm, Host], None] = lambda _vm, _host: None
        # how a boot of `vm` runs `script`: returns its session id (the leader's pid), no wait
        self.launch: Callable[[Vm, Path], int] = self._launch
        self._imds: MetadataServer | None = None

    def start(self) -> BootHarness:
        """Start polling (a daemon thread); in namespace mode serve 169.254.169.254 first."""
        if self.network is not None and self._imds is None:
            self._imds = MetadataServer(host=self.network.host_ip)
            self.network.serve_link_local(int(self._imds.url.rsplit(":", 1)[1]))
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def host_of(self, vm_id: str) -> Host:
        """The host (namespace, address) of a VM booted in namespace mode; KeyError if none."""
        return self.hosts[vm_id]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the emulator may be mid-reset; keep going, but record
                self.errors.append(repr(exc))
            self._stop.wait(self.poll_s)

    def _event(self, vm_id: str, what: str) -> None:
        self.events.append((round(time.monotonic() - self._t0, 2), vm_id, what))

    def _tick(self) -> None:
        vms = self.discover()
        said = {vm.id: "alive" if vm.alive else "dead" for vm in vms}
        for vm_id in said.keys() | self._said.keys():
            if said.get(vm_id, "absent") != self._said.get(vm_id, "absent"):
                self._event(vm_id, f"the cloud lists it {said.get(vm_id, 'absent')}")
        self._said = said
        for vm in vms:
            if vm.alive and vm.id not in self.sessions and not self.hold(vm):
                self.boot(vm)
            elif not vm.alive and vm.id in self.sessions:
                self.shut_down(vm.id)
        known = {vm.id for vm in vms}
        for vm_id in [v for v in self.sessions if v not in known]:  # deleted from the cloud
            self.shut_down(vm_id)
        log = self.root / "power.log"
        if log.exists():
            lines = log.read_text().splitlines()
            for line in lines[self._power_seen :]:
                vm_id, cmd, *args = line.split()
                self._event(vm_id, f"ran {cmd} {' '.join(args)}")
                if cmd == "reboot" or "-r" in args:
                    self._boot_again(vm_id)
                elif "now" in args:
                    self.on_power_off(vm_id)
            self._power_seen = len(lines)

    def vm_dir(self, vm_id: str) -> Path:
        """The VM's disk: its script, state, per-boot folder and work folder."""
        return self.root / "vms" / vm_id

    def boot(self, vm: Vm) -> None:
        """First boot: run the VM's startup script in its own session and folder, as its
        image boots it. An image the box does not know is an error, never a default."""
        image = facts(vm.image)
        work = self.vm_dir(vm.id)
        for folder in (work / "state", work / "per-boot"):
            folder.mkdir(parents=True, exist_ok=True)
        (work / "startup.sh").write_text(vm.script())
        (work / "os-release").write_text(OS_RELEASES[image.os])
        pci = work / "pci"
        devices = {"0000:00:02.0": "0x1234", **({"0000:00:04.0": "0x10de"} if self.gpu else {})}
        for slot, vendor in devices.items():
            (pci / slot).mkdir(parents=True, exist_ok=True)
            (pci / slot / "vendor").write_text(vendor + "\n")
        self._vms[vm.id] = vm
        self.booted.append(vm.name)
        if self.network is not None:
            host = self.hosts[vm.id] = self.network.add_host(vm.id)
            self.before_boot(vm, host)
        self._start(vm, work / "startup.sh")
        if vm.driver_extension and self.gpu:
            threading.Timer(self.extension_s, self._extension_done, (vm.id,)).start()

    def _env(self, vm: Vm) -> dict[str, str]:
        image = facts(vm.image)
        work = self.vm_dir(vm.id)
        env = dict(self.env)
        for key in [k for k in env if k.startswith(_NOT_PASSED)]:
            del env[key]
        (work / "root").mkdir(exist_ok=True)
        env.update(
            PATH=f"{self._shims}{os.pathsep}{_VM_PATH}",
            HOME=str(work / "root"),  # root's home on the VM, not this machine's
            CT_WORK=str(work / "opt"),
            CT_PYTHON=str(work / "opt" / "venv" / "bin" / "python"),
            CT_OS_RELEASE=str(work / "os-release"),
            CT_SYS_PCI=str(work / "pci"),
            CT_PERBOOT_DIR=str(work / "per-boot"),
            CT_BOOT_ID=self.boot_id(vm.id),
            CLOUDTRAIN_NODE_HOST="127.0.0.1",
            CT_ALLOW_NO_GPU="1",  # this machine has no GPU for TensorFlow to see
            CLOUDTRAIN_NODE_PORT=str(_free_port()),
            CLOUDTRAIN_METADATA_URL=(
                f"{self.metadata_url}/vm/{vm.id}" if self.metadata_url else "http://127.0.0.1:9"
            ),
            BOX_VM=str(work),
            BOX_IMAGE_PYTHON=str(image_python(image.python, stack=not self.bare)),
            BOX_IMAGE_DRIVER="1" if image.driver else "0",
            BOX_MODULE_NEEDS_REBOOT="1" if self.module_needs_reboot else "0",
            BOX_GPU="1" if self.gpu else "0",
            BOX_LSPCI_GPU=T4_LSPCI,
            BOX_LSPCI_OTHER=VGA_LSPCI,
            BOX_EVERY_BOOT="1" if vm.every_boot else "0",
            HARNESS_VM_ID=vm.id,
            HARNESS_DIR=str(self.root),
        )
        # the box's package index, on this disk (the module docstring): what the cloudtrain
        # wheel needs with its SDK extras (a controller node's plain venv), and for a stock
        # image the stack its node downloads
        links = [str(sdk_wheelhouse(image.python))]
        if self.bare:
            links.append(str(wheelhouse(image.python)))
        env.update(PIP_FIND_LINKS=" ".join(links), PIP_NO_INDEX="1")
        if self.network is not None:  # its own host: its address and the job's port, as on a cloud
            del env["CLOUDTRAIN_NODE_HOST"], env["CLOUDTRAIN_NODE_PORT"]
        for key, value in vm.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def boot_id(self, vm_id: str) -> str:
        """The kernel's boot id of the VM's current boot (a new one at every boot)."""
        return f"{vm_id}-boot-{self.boots.get(vm_id, 0)}"

    def _start(self, vm: Vm, script: Path) -> None:
        """Run `script` as this boot of `vm`: a new session (its id is the VM's), in the VM's
        namespace in namespace mode. No wait."""
        self.boots[vm.id] = self.boots.get(vm.id, 0) + 1
        sid = self.sessions[vm.id] = self.launch(vm, script)
        self._event(vm.id, f"boot {self.boots[vm.id]} ({script.name}): session {sid}")

    def _launch(self, vm: Vm, script: Path) -> int:
        host = self.hosts.get(vm.id)
        if host is None:
            proc = start_session(script, self.vm_dir(vm.id), self._env(vm))
        else:  # `ip netns exec` execs bash in place: the session leader stays the same process
            with open(self.vm_dir(vm.id) / "console.log", "ab") as console:
                proc = subprocess.Popen(
                    [*host.prefix(), "bash", str(script)],
                    cwd=self.vm_dir(vm.id),
                    env=self._env(vm),
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        return proc.pid

    def _drop_host(self, vm_id: str) -> None:
        """The VM is gone for good: remove its namespace (killing what is left in it)."""
        if self.network is not None and self.hosts.pop(vm_id, None) is not None:
            self.network.remove_host(vm_id)

    def reboot(self, vm_id: str) -> None:
        """Reboot a VM now, as its cloud or an extension would: kill all it runs, then boot it
        again with cloud-init's per-boot semantics. Blocks until the new boot has started."""
        self.kill(vm_id)
        self._boot_again(vm_id)

    def _boot_again(self, vm_id: str) -> None:
        vm = self._vms.get(vm_id)
        if vm is None or self._stop.is_set():
            return
        sid = self.sessions.get(vm_id)
        deadline = time.monotonic() + 10
        while sid is not None and session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.05)  # the old boot is going down
        runner = self.vm_dir(vm_id) / "reboot-runner.sh"
        runner.write_text(REBOOT_RUNNER)
        with self._power:  # no shutdown registers meanwhile: its power cut sees this boot
            if vm_id in self.shutdowns:  # the cloud deleted it: a deleted VM never boots
                self._event(vm_id, "reboot refused: the cloud deleted the VM")
                return
            self._start(vm, runner)

    def _extension_done(self, vm_id: str) -> None:
        """NvidiaGpuDriverLinux finished: the driver is installed, and the extension reboots."""
        if self._stop.is_set() or vm_id not in self.sessions:
            return
        # installed on this boot: its module loads at the next boot (hence the reboot)
        (self.vm_dir(vm_id) / "state" / "driver-installed").write_text(self.boot_id(vm_id))
        self.reboot(vm_id)

    def kill(self, vm_id: str) -> None:
        """Cut a VM's power now: SIGKILL every process of its session, no shutdown. Blocks
        (briefly); idempotent. The emulator still lists the VM as it did (a VM that died)."""
        sid = self.sessions.get(vm_id)
        if sid is not None:
            kill_session(sid)

    def shut_down(self, vm_id: str) -> None:
        """The cloud deleted (or preempted) the VM: shut its guest down as a cloud does, in a
        thread (SIGTERM to every process of its session, `shutdown_grace_s` to end, then
        SIGKILL), then remove its namespace. No wait; once per VM (a later call is a no-op).
        From then on the VM never boots again (a reboot is refused)."""
        thread = threading.Thread(
            target=self._acpi_shutdown, args=(vm_id,), daemon=True, name=f"shutdown-{vm_id}"
        )
        with self._power:
            if vm_id in self.shutdowns:
                return
            self.shutdowns[vm_id] = thread
        self._event(vm_id, "shutdown: SIGTERM to its session")
        thread.start()

    def _acpi_shutdown(self, vm_id: str) -> None:
        sid = self.sessions.get(vm_id)
        if sid is not None and not self._stop.is_set():
            for pid in session_pids(sid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            began = time.monotonic()
            grace = self._grace(vm_id)
            deadline = began + grace
            while session_pids(sid) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = session_pids(sid)
            if left:  # the guest was not done: what it ran last is cut short
                self.forced.append(vm_id)
                self._event(vm_id, f"shutdown: still running when the grace ended: {_cmds(left)}")
            else:
                self._event(vm_id, f"shutdown: done {time.monotonic() - began:.1f} s after SIGTERM")
        # the power cut (a subclass's kill cleans up after the VM too), of the boot current now:
        # a reboot that began before the shutdown registered may have replaced the one above
        self.kill(vm_id)
        if sid is not None and sid != self.sessions.get(vm_id):
            kill_session(sid)
        self._event(vm_id, "shutdown: power cut")
        self._drop_host(vm_id)

    def _grace(self, vm_id: str) -> float:
        """VM `vm_id`'s time between SIGTERM and the power cut (its own, else the harness's)."""
        vm = self._vms.get(vm_id)
        return vm.shutdown_grace_s if vm and vm.shutdown_grace_s else self.shutdown_grace_s

    def live_sessions(self, settle_s: float | None = None) -> list[str]:
        """VMs whose session still has a process, or whose shutdown has not yet cut the power
        and cleaned up after it (a subclass's kill(): the Debian box unmounts the VM's root
        there, after its processes may already have ended at the SIGTERM), after giving the
        poll loop up to `settle_s` (default: the shutdown grace + 5 s) to notice VMs deleted
        just now and shut them down."""
        if settle_s is None:  # the longest grace of a VM the harness booted
            graces = [vm.shutdown_grace_s or 0.0 for vm in list(self._vms.values())]
            settle_s = max([self.shutdown_grace_s, *graces]) + 5.0
        deadline = time.monotonic() + settle_s
        while True:
            with self._power:
                going = {
                    vm
                    for vm, thread in self.shutdowns.items()
                    if thread.ident is None or thread.is_alive()  # registered, not yet started
                }
            live = [
                vm for vm, sid in list(self.sessions.items()) if vm in going or session_pids(sid)
            ]
            if not live or time.monotonic() >= deadline:
                return live
            time.sleep(0.1)

    def describe(self, vm_id: str) -> str:
        """What happened to VM `vm_id`, for a failure message: its name, its session and the
        pids left in it, then its events (see the module docstring), one a line. Read-only."""
        vm = self._vms.get(vm_id)
        sid = self.sessions.get(vm_id)
        left = session_pids(sid) if sid is not None else []
        head = f"{vm.name if vm else '?'} (vm {vm_id}): session {sid}, processes left {left}"
        lines = [f"  {at:8.2f}s {what}" for at, who, what in list(self.events) if who == vm_id]
        if vm_id not in self.shutdowns:
            lines.append("  (never shut down: the cloud never deleted it, as the harness saw)")
        return "\n".join([head, *lines])

    def vm_ids(self, name: str) -> list[str]:
        """The ids of every VM named `name` the harness booted, in boot order (a node the cloud
        replaced under the same name has one id per incarnation)."""
        return [vm_id for vm_id, vm in list(self._vms.items()) if vm.name == name]

    def console(self, vm_id: str) -> str:
        path = self.vm_dir(vm_id) / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def calls(self, vm_id: str) -> list[str]:
        """What the VM ran of the machine's tools (apt-get, modprobe, python3, ...), in order."""
        path = self.vm_dir(vm_id) / "calls.log"
        return path.read_text().splitlines() if path.exists() else []

    def stop(self) -> None:
        """Stop polling and kill every VM session; in namespace mode remove every VM's namespace
        and stop the metadata service. Blocks; idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for vm_id in list(self.sessions):
            self.kill(vm_id)
        for thread in list(self.shutdowns.values()):  # their sessions are gone: they end now
            thread.join(timeout=self.shutdown_grace_s + 10)
        for vm_id in list(self.hosts):
            self._drop_host(vm_id)
        if self._imds is not None:
            self._imds.close()
            self._imds = None
