"""The images of the cloud in a box: what each default image of each cloud is, as a VM sees it.

`FACTS` says, per image identifier the adapters send (AWS: the public SSM parameter; GCP: the
image family path; Azure: the URN), what boots: the OS (its /etc/os-release), the `python3`
version, and whether the NVIDIA driver is on the image. These are stated here from the clouds'
sources, independently of cloudtrain's own table (providers/*/images.py); a unit test checks
that the two agree.

An image's `python3` in the box is a real interpreter of that version (pyenv's: these machines
have 3.10, 3.11 and 3.12), never the controller's environment:
- `bare`: the interpreter as pyenv built it, nothing installed: the startup script must make its
  venv and pip-install the pinned TensorFlow itself, as on the stock image;
- `stack`: a copy of it with the pinned TensorFlow, tf-keras, scikit-learn and cloudtrain's
  node-side dependencies preinstalled: what a user's custom image with the stack baked in is. It
  is built once per machine (`python -m tests.fakes.box_images 3.10`, which tests/run.sh calls)
  under $CLOUDTRAIN_BOX_CACHE (default ~/.cache/cloudtrain-box), keyed by the pins.
Neither has cloudtrain itself: the node installs the bundle's wheel into its own venv.

`wheelhouse(version)` caches the wheels a bare image's node downloads (the same stack), built
once per machine beside the images: the harness points a bare VM's pip at it alone
(PIP_FIND_LINKS, PIP_NO_INDEX), so each such boot installs TensorFlow from this disk rather than
fetching 600 MB again (pip's own HTTP cache stores nothing from this workplace's registry).
`sdk_wheelhouse(version)` caches only what the cloudtrain wheel itself depends on with every
cloud's SDK extra ([aws], [gcp], [azure]; no TensorFlow, ~100 MB): what a controller node's
venv installs (`cloudtrain[<provider>]`), for VMs that reach no index (namespace mode).
Both images' `python3` can install those offline: `stack` has them installed already, `bare`
gets them from either wheelhouse.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.run.startup import TF_KERAS_VERSION, TF_VERSION

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("CLOUDTRAIN_BOX_CACHE", "~/.cache/cloudtrain-box")).expanduser()
SKLEARN = "scikit-learn==1.7.2"  # the last release for Python 3.10, and the examples' pin


@dataclass(frozen=True)
class ImageFacts:
    """One image as it boots."""

    os: str  # a key of tests/fakes/bootstrap_shims.OS_RELEASES
    python: str  # X.Y of its python3
    driver: bool  # the NVIDIA driver is on the image (else the bootstrap or an extension)
    source: str


_DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-{}/latest/ami-id"
_DLVM = (
    "projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-{}-nvidia-580"
)
FACTS: dict[str, ImageFacts] = {
    # AWS DLAMI release notes, "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)":
    # python_location /usr/bin/python3.10, NVIDIA driver 570/580 on the image; 24.04: python3.12
    "aws:" + _DLAMI.format("22.04"): ImageFacts("ubuntu-22.04", "3.10", True, "DLAMI notes"),
    "aws:" + _DLAMI.format("24.04"): ImageFacts("ubuntu-24.04", "3.12", True, "DLAMI notes"),
    # Canonical's images: Ubuntu 22.04's python3 is 3.10, 24.04's is 3.12 (packages.ubuntu.com)
    "aws:/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id": (
        ImageFacts("ubuntu-22.04", "3.10", False, "packages.ubuntu.com jammy python3")
    ),
    "aws:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id": (
        ImageFacts("ubuntu-24.04", "3.12", False, "packages.ubuntu.com noble python3")
    ),
    # GCP Deep Learning VM "Choose an image": common-cu129-ubuntu-2204-nvidia-580 is Python 3.10,
    # -2404- is 3.12; the driver comes with the image (installed at first boot)
    "gcp:" + _DLVM.format("2204"): ImageFacts("ubuntu-22.04", "3.10", True, "DLVM images"),
    "gcp:" + _DLVM.format("2404"): ImageFacts("ubuntu-24.04", "3.12", True, "DLVM images"),
    "gcp:projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts": ImageFacts(
        "ubuntu-22.04", "3.10", False, "packages.ubuntu.com jammy python3"
    ),
    "gcp:projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64": ImageFacts(
        "ubuntu-24.04", "3.12", False, "packages.ubuntu.com noble python3"
    ),
    "gcp:projects/debian-cloud/global/images/family/debian-12": ImageFacts(
        "debian-12", "3.11", False, "packages.debian.org bookworm python3"
    ),
    # Azure: Canonical's Ubuntu images (the driver from the NvidiaGpuDriverLinux extension or the
    # bootstrap); Ubuntu-HPC 22.04 ships the driver (Azure/azhpc-images versions.json)
    "azure:Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest": ImageFacts(
        "ubuntu-22.04", "3.10", False, "packages.ubuntu.com jammy python3"
    ),
    "azure:Canonical:ubuntu-24_04-lts:server:latest": ImageFacts(
        "ubuntu-24.04", "3.12", False, "packages.ubuntu.com noble python3"
    ),
    "azure:microsoft-dsvm:ubuntu-hpc:2204:latest": ImageFacts(
        "ubuntu-22.04", "3.10", True, "Azure/azhpc-images ubuntu-hpc 22.04"
    ),
}

# Images a job can name (an AMI id) that no adapter chooses by default, so not in FACTS (whose
# keys a unit test holds equal to cloudtrain's default images).
# Debian's own AMI: Debian publishes its AMI ids as public SSM parameters under
# /aws/service/debian/release/<release>/latest/<arch> (wiki.debian.org/Cloud/AmazonEC2Image/
# Bookworm); a job names the AMI id (`image: ami-...`). Booted by tests/fakes/debian_boot.py as
# a real Debian 12 root, whose python3 is 3.11.
DEBIAN_12_AMI_PARAM = "/aws/service/debian/release/12/latest/amd64"
NAMED_ONLY: dict[str, ImageFacts] = {
    "aws:" + DEBIAN_12_AMI_PARAM: ImageFacts(
        "debian-12", "3.11", False, "packages.debian.org bookworm python3"
    ),
}


class UnknownImage(LookupError):
    """The box does not know the image a VM was created with: it will not boot it."""


def facts(image: str) -> ImageFacts:
    """The facts of `image` (`<cloud>:<identifier>`), a default image or one of NAMED_ONLY.
    Raises UnknownImage."""
    try:
        return FACTS[image] if image in FACTS else NAMED_ONLY[image]
    except KeyError:
        raise UnknownImage(f"the box knows no image {image!r}") from None


def base_python(version: str) -> Path:
    """pyenv's interpreter of `version` (X.Y). Raises FileNotFoundError: never a fallback to
    another version."""
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    for candidate in sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}")):
        return Path(candidate)
    found = shutil.which(f"python{version}")
    if found:
        return Path(found)
    raise FileNotFoundError(f"no Python {version} on this machine (pyenv install {version})")


def _sdk_requirements() -> list[str]:
    """What the cloudtrain wheel depends on with every cloud's extra (pyproject.toml)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["aws"], *extras["gcp"], *extras["azure"]]


def _stack_requirements() -> list[str]:
    """The stack a custom image bakes in: the pins, the examples' scikit-learn, and what the
    cloudtrain wheel depends on for every cloud (so the node's wheel install downloads nothing)."""
    tf = [f"tensorflow=={TF_VERSION}", f"tf-keras=={TF_KERAS_VERSION}", SKLEARN]
    return [*tf, *_sdk_requirements()]


def _key(base: Path, reqs: list[str] | None = None) -> str:
    """What a cached image or wheelhouse depends on: the interpreter and the pins."""
    reqs = _stack_requirements() if reqs is None else reqs
    return hashlib.sha256("\n".join([str(base), *reqs]).encode()).hexdigest()[:12]


def image_python(version: str, *, stack: bool) -> Path:
    """The `python3` of an image with Python `version`: bare, or with the stack baked in (built
    on first use; blocks for a few minutes then; concurrent callers wait for one build)."""
    base = base_python(version)
    if not stack:
        return base
    reqs, key = _stack_requirements(), _key(base)
    python = f"python{version}"

    def build(home: Path) -> None:
        # pyenv's tree is relocatable: sys.prefix follows the executable
        shutil.copytree(base.parent.parent, home, symlinks=True)
        subprocess.run(
            [
                str(home / "bin" / python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                *reqs,
            ],
            check=True,
        )

    return _built_once(CACHE / "images" / f"py{version}-stack-{key}", build) / "bin" / python


def _built_once(home: Path, build: Callable[[Path], None]) -> Path:
    """`home`, made by `build(home)` unless a complete one is there; one build at a time."""
    if (home / ".complete").exists():
        return home
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".complete").exists():
            shutil.rmtree(home, ignore_errors=True)
            build(home)
            (home / ".complete").write_text("built\n")
    return home


def wheelhouse(version: str) -> Path:
    """A folder with every wheel a bare image's node installs (built on first use: blocks)."""
    base = base_python(version)
    reqs = _stack_requirements()
    return _built_once(CACHE / "wheels" / f"py{version}-{_key(base)}", _downloader(base, reqs))


def sdk_wheelhouse(version: str) -> Path:
    """A folder with the wheels `cloudtrain[aws,gcp,azure]` needs on Python `version` (no
    TensorFlow; built on first use, ~15 s here: blocks)."""
    base = base_python(version)
    reqs = _sdk_requirements()
    key = _key(base, reqs)
    return _built_once(CACHE / "wheels" / f"py{version}-sdk-{key}", _downloader(base, reqs))


def _downloader(base: Path, reqs: list[str]) -> Callable[[Path], None]:
    """A build step that `pip download`s the wheels of `reqs` for `base` into its folder."""

    def build(home: Path) -> None:
        subprocess.run(
            [
                str(base),
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "-d",
                str(home),
                *reqs,
            ],
            check=True,
        )

    return build


if __name__ == "__main__":  # build the images and wheels of the given versions (tests/run.sh)
    for wanted in sys.argv[1:] or ["3.10"]:
        print(f"box image python {wanted} with the stack: {image_python(wanted, stack=True)}")
        print(f"box wheelhouse for python {wanted}: {wheelhouse(wanted)}")
        print(f"box SDK wheelhouse for python {wanted}: {sdk_wheelhouse(wanted)}")
