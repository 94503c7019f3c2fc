"""A Debian 12 (bookworm) root filesystem shaped like Debian's own cloud image, for the box.

`debian_root()` returns the folder of a root made with debootstrap from deb.debian.org: the
packages of Debian's official debian-12 cloud images that a cloudtrain boot touches, and nothing
of ours. It is built once per machine when missing, outside the repo, in
$CLOUDTRAIN_BOX_CACHE/debian-12-root/<key> (default ~/.cache/cloudtrain-box), keyed by the
suite, the mirror and the package list: a changed list builds a new root beside the old one.
Builds take a lock (concurrent callers wait for one build), run in a temporary folder and are
renamed into place when complete, so a killed build leaves no half root behind.

What the image has, from Debian's cloud image build (the package lists in
salsa.debian.org/cloud-team/debian-cloud-images, config_space/bookworm/package_config): among
much else curl, ca-certificates, iproute2, procps and cloud-init, whose dependencies bring
python3, 3.11.2 in bookworm (packages.debian.org/bookworm/python3); and what it lacks:
python3-venv (ensurepip), which the bootstrap must apt-get install, and pip. Only the packages a
boot touches are installed here (PACKAGES). cloud-init itself is not in the
root: the harness (tests/fakes/debian_boot.py) does its one job here, running user data once
per instance from /var/lib/cloud/instance/scripts. apt's sources are the cloud image's (bookworm,
bookworm-updates, bookworm-security) and its package lists are empty, as after the image build,
so a boot's `apt-get install` first runs a real `apt-get update`.

`python3 -m tests.fakes.debian_root` builds it (tests/run.sh calls it) and prints the folder.
Blocks for a few minutes on the first call; needs root and debootstrap.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fakes.box_images import CACHE

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# The debian-12 cloud image's packages a boot uses (see the docstring for the source). minbase
# already has bash, coreutils (sha256sum), tar, gzip, sed, grep, apt and dpkg.
PACKAGES = ("ca-certificates", "curl", "iproute2", "procps", "python3", "netbase")
# Never in the root: the bootstrap installs them, as on the real image.
NOT_ON_THE_IMAGE = ("python3-venv", "python3-pip")
_SOURCES = f"""\
deb {MIRROR} {SUITE} main
deb {MIRROR} {SUITE}-updates main
deb {SECURITY_MIRROR} {SUITE}-security main
"""
_BUILD_STEPS = "2"  # bump when the steps below change what a root holds


class DebianRootError(RuntimeError):
    """The root could not be built (no debootstrap, not root, no mirror)."""


def root_key() -> str:
    """What a built root depends on: suite, mirror, package list and the build steps."""
    text = "\n".join([SUITE, MIRROR, _BUILD_STEPS, *sorted(PACKAGES)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def root_dir() -> Path:
    """Where the root for the current key lives (it may not exist yet)."""
    return CACHE / "debian-12-root" / root_key()


def debian_root() -> Path:
    """The cached Debian 12 root folder, built first when missing. Blocks (minutes) for a build;
    idempotent; safe to call from several processes at once. Raises DebianRootError."""
    home = root_dir()
    if (home / ".complete").exists():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".complete").exists():
            _build(home)
    return home


def _build(home: Path) -> None:
    if os.geteuid() != 0:
        raise DebianRootError("building the Debian 12 root needs root (debootstrap, chroot)")
    if shutil.which("debootstrap") is None:
        raise DebianRootError("debootstrap is not installed (apt-get install debootstrap)")
    tmp = home.parent / f".build-{home.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        proc = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(tmp),
                MIRROR,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise DebianRootError(f"debootstrap failed ({proc.returncode}): {' | '.join(tail)}")
        (tmp / "etc" / "apt" / "sources.list").write_text(_SOURCES)
        # empty package lists and cache, as Debian's image build leaves them
        for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for entry in (tmp / folder).glob("*"):
                if entry.is_file():
                    entry.unlink()
        for name in NOT_ON_THE_IMAGE:
            found = subprocess.run(
                ["chroot", str(tmp), "dpkg-query", "-W", "-f=${Status}", name],
                capture_output=True,
                text=True,
                check=False,
            )
            if "installed" in found.stdout.split():
                raise DebianRootError(f"{name} is in the root, but the cloud image lacks it")
        (tmp / "etc" / "hostname").write_text("debian\n")
        (tmp / ".packages").write_text("\n".join(sorted(PACKAGES)) + "\n")
        (tmp / ".complete").write_text("built\n")
        os.rename(tmp, home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        print(f"Debian 12 root: {debian_root()}")
    except DebianRootError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
