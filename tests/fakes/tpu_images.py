"""The box's TPU VM image: the interpreter a Cloud TPU runtime boots, with its TensorFlow.

A TPU VM boots the image its runtime version names ("TPU software versions",
cloud.google.com/tpu/docs/runtimes: "the software environment that is pre-installed on your TPU
VM. This includes the Ubuntu operating system ..."); a `tpu-vm-tf-X.Y.Z[-pod][-pjrt|-se]`
runtime ships TensorFlow X.Y.Z. In the box that is:

- the OS: Ubuntu 22.04 (box_images' `ubuntu-2204-lts` facts: its /etc/os-release and Python
  3.10), standing in for the runtime's own Ubuntu image;
- `python3`: a copy of pyenv's 3.10 with `tensorflow==X.Y.Z` from PyPI installed (the
  distribution named `tensorflow`, as the runtime's is; a CPU run of it here: the box has no
  TPU, no libtpu.so and no PJRT plugin), plus `tf-keras` of the same minor (cloudtrain's node
  runs Keras 2 through it, TF_USE_LEGACY_KERAS=1) and the examples' scikit-learn. Not
  cloudtrain's SDK extras, unlike the GPU stack image (box_images): they cannot share one
  environment with TensorFlow 2.16's `protobuf<5` pin (pip: "Cannot install
  google-cloud-compute==1.49.0 ... 1.57.0 and tensorflow==2.16.1 because these package versions
  have conflicting dependencies"), as on a real runtime image, where they are not either; the
  node installs what it needs into its own venv from the box's wheelhouse.

What differs from Google's image, exactly: the TensorFlow build (PyPI's CPU-capable wheel, not
Google's TPU build linked with libtpu), no `/lib/libtpu.so`, the Ubuntu release (22.04 for every
runtime), and tf-keras and scikit-learn being there already (Google's pages in reach do not say
whether its TensorFlow runtimes ship tf-keras).

`runtime_python(runtime)` builds it once per machine and TensorFlow version under
$CLOUDTRAIN_BOX_CACHE (box_images' cache and build lock), keyed by the interpreter and the pins:
a few minutes the first time (under the heavy lock: `flock /tmp/heavy.lock python -m
tests.fakes.tpu_images tpu-vm-tf-2.16.1-pjrt`), instant after.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.fakes.box_images import (
    CACHE,
    SKLEARN,
    _built_once,
    _key,
    base_python,
)
from tests.fakes.tpu_catalog import tf_version_of

PYTHON = "3.10"
# box_images' Ubuntu 22.04 image facts (os-release, Python 3.10), standing in for the runtime's
UBUNTU_2204 = "gcp:projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"


class NoTensorFlowRuntime(LookupError):
    """A runtime version that ships no TensorFlow: the box has no image for it."""


def runtime_requirements(runtime: str) -> list[str]:
    """What the box's image of `runtime` has installed (module docstring). NoTensorFlowRuntime
    for a runtime without TensorFlow. Pure."""
    version = tf_version_of(runtime)
    if version is None:
        raise NoTensorFlowRuntime(f"runtime {runtime!r} ships no TensorFlow: the box has no image")
    minor = ".".join(version.split(".")[:2])
    return [f"tensorflow=={version}", f"tf-keras~={minor}.0", SKLEARN]


def runtime_python(runtime: str) -> Path:
    """The `python3` of the box's image of `runtime` (built on first use: blocks minutes then;
    concurrent callers wait for one build). NoTensorFlowRuntime, FileNotFoundError (no Python
    3.10 here)."""
    reqs = runtime_requirements(runtime)
    base = base_python(PYTHON)
    python = f"python{PYTHON}"

    def build(home: Path) -> None:
        shutil.copytree(base.parent.parent, home, symlinks=True)  # relocatable, as box_images
        pip = [str(home / "bin" / python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "--disable-pip-version-check", *reqs], check=True)

    tf = reqs[0].split("==")[1]
    home = _built_once(CACHE / "images" / f"py{PYTHON}-tf{tf}-{_key(base, reqs)}", build)
    return home / "bin" / python


if __name__ == "__main__":  # build the images of the given runtimes (tests/run.sh's set-up)
    for wanted in sys.argv[1:] or ["tpu-vm-tf-2.16.1-pjrt"]:
        print(f"box TPU image {wanted}: {runtime_python(wanted)}")
