"""Boot a VM of the box as a real Debian 12 machine: its own disk over the cached Debian root,
its startup script run inside it as root, as cloud-init runs user data.

`DebianBootHarness` is a `BootHarness` (tests/fakes/boot_harness.py) whose VMs are not process
sessions on this machine's filesystem but chroots into a Debian 12 root (tests/fakes/
debian_root.py), one copy-on-write disk per VM:

- the disk: an overlayfs whose lower layer is the cached root (never written) and whose upper and
  work layers are the VM's own, on a tmpfs (a venv with TensorFlow is GBs of small files: an
  unmount frees them at once, where deleting them took a minute), all under
  `<harness root>/disks/ctb-<vm id>/` (the "/ctb-" in the path lets the suite's leftover check,
  tests/conftest.py, see any mount left behind);
- mounted into it: /proc, /sys, /dev (a bind of this machine's), /dev/pts and a fresh /run;
  /etc/resolv.conf is this machine's, and so is the CA bundle: this machine reaches deb.debian.org
  and PyPI through an egress proxy whose CA only its own bundle has (PIP_CERT points pip at it,
  as on this host);
- the first boot does what cloud-init's scripts-user does with a user-data script: it is
  written to /var/lib/cloud/instances/<id>/scripts/part-001 (/var/lib/cloud/instance links
  there), made executable and executed by its shebang, as root, with cwd /, once per instance
  (the semaphore /var/lib/cloud/instance/sem/config_scripts_user); later boots run only
  /var/lib/cloud/scripts/per-boot/* (cloudinit.readthedocs.io, "Boot stages" and
  "Modules: Scripts per boot / Scripts user");
- everything else is Debian's own: apt-get (against deb.debian.org), python3 3.11, `python3 -m
  venv`, pip (against PyPI), curl, tar, sha256sum. Shims stand only for what a VM without a GPU
  or a machine of its own cannot have: `nvidia-smi` and `modprobe` (the kernel module: answered
  as on a VM without NVIDIA's driver, never loading anything into this machine's kernel), and
  `shutdown`/`poweroff`/`halt`/`reboot`, which the harness performs (boot_harness.POWER). They
  are written into the VM's upper layer (/usr/local/sbin), never into the cached root.

The node runs in this machine's network namespace: apt and pip need the internet, and the
emulators' 127.0.0.1 endpoints then work as they do for the process-session VMs. Its address is
127.0.0.1 and its port a free one (CLOUDTRAIN_NODE_HOST/PORT, which the AWS block reads instead
of the instance metadata service).

A VM's processes are those whose root directory is its disk: `kill` and `stop` end them all
(also ones that left the boot's session), then unmount, in reverse order, lazily as a last
resort. `kill` (the VM is gone) keeps the layers' tmpfs, so a test can read what the VM wrote;
`stop()` unmounts that too and removes the disks' folders once nothing is mounted there. A
reboot keeps the mounts (its /run and /tmp are not emptied).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.fakes.boot_harness import POWER, BootHarness, Vm, _free_port
from tests.fakes.debian_root import debian_root

SCRIPT = "/var/lib/cloud/instance/scripts/part-001"
PER_BOOT = "/var/lib/cloud/scripts/per-boot"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's root PATH
# What a VM without a GPU answers (the messages of NVIDIA's tools and kmod without the driver).
_NVIDIA_SMI = """#!/bin/sh
# cloud-in-a-box shim: this VM has no NVIDIA driver
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""
_MODPROBE = """#!/bin/sh
# cloud-in-a-box shim: never loads a module into the host's kernel
case "$*" in *-r*) exit 0 ;; esac
echo "modprobe: FATAL: Module $* not found in directory /lib/modules/$(uname -r)" >&2
exit 1
"""
# cloud-init's per-boot stage after a reboot (run-parts semantics: executable files, in order)
_PER_BOOT_RUNNER = f"""for script in {PER_BOOT}/*; do
  if [ -f "$script" ] && [ -x "$script" ]; then "$script"; fi
done
"""
# the endpoints and credentials of the emulated cloud (what a real VM gets from its role and
# region), passed through from the harness's environment
_PASSED = ("AWS_", "CLOUDTRAIN_", "NO_PROXY", "no_proxy", "PIP_CERT")
# the tmpfs of a VM's upper layer: room for the venv (~2 GB with TensorFlow) and a wheelhouse
# build (~1.3 GB); memory is used only as far as it is filled
LAYERS_SIZE = "8g"


class DiskError(RuntimeError):
    """A VM's disk could not be mounted (what was mounted is unmounted again)."""


def _run(args: list[str]) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DiskError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first."""
    prefix = str(path)
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def pids_in_root(root: Path, dev: int | None = None) -> list[int]:
    """Processes whose root directory is `root` (the VM's processes, whatever their session),
    or, with `dev`, any directory of that filesystem: a process whose root was detached by a
    lazy unmount reads as "/" but still has the VM's device."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                link = f"/proc/{entry}/root"
                if os.readlink(link) == str(root) or (
                    dev is not None and os.stat(link).st_dev == dev
                ):
                    pids.append(int(entry))
    return pids


class Disk:
    """One VM's copy-on-write disk over the Debian root, and the filesystems mounted in it."""

    def __init__(self, folder: Path, lower: Path) -> None:
        self.folder, self.lower = folder, lower
        self.layers, self.root = folder / "layers", folder / "root"
        self.upper, self.work = self.layers / "upper", self.layers / "work"
        self.dev: int | None = None  # the overlay's device, once mounted

    def mount(self) -> None:
        """Mount the layers' tmpfs, the overlay and /proc, /sys, /dev, /dev/pts, /run in it.
        Blocking; on failure unmounts what it mounted and raises DiskError."""
        for folder in (self.layers, self.root):
            folder.mkdir(parents=True, exist_ok=True)
        r = str(self.root)
        opts = f"lowerdir={self.lower},upperdir={self.upper},workdir={self.work}"
        try:
            # the VM's writes (a venv with TensorFlow: GBs) in memory: gone at once at unmount
            _run(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"size={LAYERS_SIZE},mode=700",
                    "tmpfs",
                    str(self.layers),
                ]
            )
            self.upper.mkdir()
            self.work.mkdir()
            _run(["mount", "-t", "overlay", "overlay", "-o", opts, r])
            self.dev = os.stat(r).st_dev
            # private: nothing mounted below propagates to this machine's own /dev or /sys
            _run(["mount", "--make-private", r])
            _run(["mount", "-t", "proc", "proc", f"{r}/proc"])
            _run(["mount", "-t", "sysfs", "sysfs", f"{r}/sys"])
            _run(["mount", "--bind", "/dev", f"{r}/dev"])
            _run(["mount", "--make-private", f"{r}/dev"])
            _run(["mount", "--bind", "/dev/pts", f"{r}/dev/pts"])
            _run(["mount", "-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "tmpfs", f"{r}/run"])
        except DiskError:
            self.unmount()
            raise

    def pids(self) -> list[int]:
        """The VM's processes: those whose root is this disk (also after a lazy unmount)."""
        return pids_in_root(self.root, self.dev)

    def kill_all(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process running in this disk's root; True when none is left."""
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() >= deadline:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def unmount(self, keep_layers: bool = False) -> list[str]:
        """Unmount everything at or under the root, deepest first (lazily when busy), then,
        unless `keep_layers`, the layers' tmpfs (what the VM wrote is then gone). Idempotent;
        returns what is still mounted of what was to go (nothing, normally)."""
        self.kill_all()
        # the root's mounts (the overlay last), then the layers below the overlay
        points = mounts_under(self.root) + ([] if keep_layers else mounts_under(self.layers))
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        return mounts_under(self.root if keep_layers else self.folder)

    def remove(self) -> None:
        """Delete the VM's layers. Refuses (DiskError) while anything is mounted there: a
        removal through a bind of /dev would delete this machine's device nodes."""
        left = mounts_under(self.folder)
        if left:
            raise DiskError(f"still mounted, not removing {self.folder}: {left}")
        shutil.rmtree(self.folder, ignore_errors=True)

    def write(self, path: str, text: str, mode: int = 0o644) -> Path:
        """Write a file into the VM's filesystem (through the overlay: into the upper layer).
        A symlink at `path` is replaced; a parent that resolves outside the VM (an absolute
        symlink seen from this machine) is refused with DiskError."""
        target = self.root / path.lstrip("/")
        if not target.parent.resolve().is_relative_to(self.root.resolve()):
            raise DiskError(f"{path}: its folder leads out of the VM's root")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_text(text)
        target.chmod(mode)
        return target


class DebianBootHarness(BootHarness):
    """A BootHarness whose VMs boot the Debian 12 root as root (see the module docstring).
    Needs root; the root is built on first use (minutes). Always `stop()`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lower = debian_root()
        self.disks: dict[str, Disk] = {}
        self._rebooting: set[str] = set()

    def disk(self, vm_id: str) -> Disk:
        """The VM's disk (its root folder is `disk(vm_id).root`)."""
        return self.disks[vm_id]

    def _start(self, vm: Vm, script: Path) -> None:
        first = vm.id not in self.disks
        if first:
            self._make_disk(vm, script)
        disk = self.disks[vm.id]
        self.boots[vm.id] = self.boots.get(vm.id, 0) + 1
        sem = f"/var/lib/cloud/instances/{vm.id}/sem/config_scripts_user"
        if (disk.root / sem.lstrip("/")).exists():  # user data ran: only the per-boot scripts
            argv = ["/bin/bash", "-c", _PER_BOOT_RUNNER]
        else:
            disk.write(sem, "ran\n")
            argv = [SCRIPT]
        with open(self.vm_dir(vm.id) / "console.log", "ab") as console:
            proc = subprocess.Popen(
                ["chroot", str(disk.root), *argv],
                cwd="/",
                env=self._env(vm),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.sessions[vm.id] = proc.pid

    def _make_disk(self, vm: Vm, script: Path) -> None:
        disk = Disk(self.root / "disks" / f"ctb-{vm.id}", self.lower)
        self.disks[vm.id] = disk
        disk.mount()
        disk.write("/etc/resolv.conf", Path("/etc/resolv.conf").read_text())
        # this machine's CA bundle: its egress proxy re-signs TLS (see the docstring)
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        disk.write(bundle, Path(bundle).read_text())
        disk.write("/etc/hostname", f"{vm.name}\n")
        instance = f"/var/lib/cloud/instances/{vm.id}"
        disk.write(f"{instance}/scripts/part-001", script.read_text(), 0o700)
        # relative, as cloud-init makes it: an absolute link would lead out of the VM from here
        (disk.root / "var/lib/cloud/instance").symlink_to(f"instances/{vm.id}")
        (disk.root / PER_BOOT.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for name in ("shutdown", "poweroff", "halt", "reboot"):
            disk.write(f"/usr/local/sbin/{name}", POWER, 0o755)
        disk.write("/usr/local/sbin/nvidia-smi", _NVIDIA_SMI, 0o755)
        disk.write("/usr/local/sbin/modprobe", _MODPROBE, 0o755)
        # the harness folder, for the power shims' log (boot_harness reads power.log there)
        harness = disk.root / "run" / "box-harness"
        harness.mkdir(parents=True, exist_ok=True)
        _run(["mount", "--bind", str(self.root), str(harness)])

    def _env(self, vm: Vm) -> dict[str, str]:
        """The boot's environment: cloud-init's (root, Debian's PATH), the cloud's endpoints and
        the node's address; nothing of this machine's Python or the controller's paths."""
        env = {k: v for k, v in self.env.items() if k.startswith(_PASSED)}
        env.update(
            PATH=_PATH,
            HOME="/root",
            LANG="C.UTF-8",
            CT_BOOT_ID=self.boot_id(vm.id),
            CLOUDTRAIN_NODE_HOST="127.0.0.1",
            CLOUDTRAIN_NODE_PORT=str(_free_port()),
            CLOUDTRAIN_METADATA_URL=(
                f"{self.metadata_url}/vm/{vm.id}" if self.metadata_url else "http://127.0.0.1:9"
            ),
            CT_ALLOW_NO_GPU="1",  # this machine has no GPU for TensorFlow to see
            HARNESS_VM_ID=vm.id,
            HARNESS_DIR="/run/box-harness",
        )
        if "PIP_CERT" in os.environ:  # the host's egress CA (see the docstring)
            env["PIP_CERT"] = "/etc/ssl/certs/ca-certificates.crt"
        return env

    def reboot(self, vm_id: str) -> None:
        """Reboot the VM now (its disk and mounts stay); blocks until the new boot started."""
        self._rebooting.add(vm_id)
        try:
            super().reboot(vm_id)
        finally:
            self._rebooting.discard(vm_id)

    def kill(self, vm_id: str) -> None:
        """End every process of the VM; unless it is rebooting, unmount its root too (its
        layers, what it wrote, stay readable in `disk(vm_id).upper` until `stop()`)."""
        super().kill(vm_id)
        disk = self.disks.get(vm_id)
        if disk is not None:
            disk.kill_all()
            if vm_id not in self._rebooting:
                disk.unmount(keep_layers=True)

    def stop(self) -> None:
        """Stop polling, end every VM, unmount every disk and delete its layers. Idempotent;
        raises DiskError if something could not be unmounted (after trying all)."""
        try:
            super().stop()
        finally:
            stuck: list[str] = []
            for disk in self.disks.values():
                stuck += disk.unmount()
                if not mounts_under(disk.folder):
                    disk.remove()
            if stuck:
                raise DiskError(f"could not unmount: {stuck}")
