"""The box's Horovod stack: strategy horovod's legacy node stack (cloudtrain/run/startup.py:
HOROVOD_STACK), built once per machine like the box's images (tests/fakes/box_images.py).

- `wheelhouse(version)`: a folder a box VM's pip uses as its whole index (PIP_FIND_LINKS,
  PIP_NO_INDEX) for a horovod job on a bare image: the stack's TensorFlow and tf-keras wheels
  (all they pull in), Horovod's run-time dependencies, scikit-learn (the example's data), and
  horovod 0.28.1 COMPILED here from its sdist with the stack's build environment
  (HOROVOD_STACK.build_env: Gloo, no MPI, PyTorch or MXNet) against that TensorFlow: ~3 min on
  2 cores. A node's `pip wheel horovod==0.28.1` then finds this wheel rather than compiling
  again (pip prefers a wheel to an sdist on any index): the compile itself is what this set-up
  does, once per machine.
- `python(version)`: an interpreter (a copy of pyenv's) with that stack, horovod included,
  installed from the wheelhouse: what the node-side tests that need horovod itself run under.

Both live under $CLOUDTRAIN_BOX_CACHE (default ~/.cache/cloudtrain-box), keyed by the base
interpreter and the pins, so a warm machine spends ~0 s here. `python -m tests.fakes.
horovod_stack 3.10` (tests/run.sh) builds both; building blocks, one build at a time.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cloudtrain.run.startup import HOROVOD_STACK
from tests.fakes.box_images import CACHE, SKLEARN, _built_once, base_python

TF = f"tensorflow=={HOROVOD_STACK.tf_version}"
TF_KERAS = f"tf-keras=={HOROVOD_STACK.tf_keras_version}"
# horovod 0.28.1's setup.py: require_list (what a built wheel depends on at run time)
RUNTIME = ["cloudpickle", "psutil", "pyyaml", "packaging"]


def _pip(python: Path, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [str(python), "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
        check=True,
        env=env,
    )


def _key(base: Path) -> str:
    parts = [str(base), TF, TF_KERAS, HOROVOD_STACK.build, SKLEARN, *RUNTIME]
    parts += [f"{k}={v}" for k, v in HOROVOD_STACK.build_env]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _check_python(version: str) -> Path:
    if version not in HOROVOD_STACK.pythons:
        raise SystemExit(
            f"tensorflow {HOROVOD_STACK.tf_version} has no wheel for Python {version}"
            f" (it has {', '.join(HOROVOD_STACK.pythons)})"
        )
    return base_python(version)


def wheelhouse(version: str) -> Path:
    """The folder of every wheel a bare image's horovod node installs, the compiled horovod
    among them (built on first use: downloads ~600 MB and compiles for minutes; blocks)."""
    base = _check_python(version)

    def build(home: Path) -> None:
        home.mkdir(parents=True)
        _pip(base, "download", "--only-binary=:all:", "-d", str(home), TF, TF_KERAS, SKLEARN,
             *RUNTIME)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
            venv = Path(tmp) / "venv"
            subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
            python = venv / "bin" / "python"
            _pip(python, "install", "--no-index", "--find-links", str(home), TF)
            _pip(python, "download", "--no-deps", "--no-binary=:all:", "-d", tmp,
                 HOROVOD_STACK.build)  # fmt: skip
            (sdist,) = glob.glob(f"{tmp}/horovod-*.tar.gz")
            env = {**os.environ, **dict(HOROVOD_STACK.build_env)}
            env["MAKEFLAGS"] = f"-j{os.cpu_count() or 1}"
            # as the node builds it (jobs/wheelhouse.sh.j2: build_stack_module)
            _pip(python, "wheel", "--no-deps", "--no-build-isolation", "-w", str(home), sdist,
                 env=env)  # fmt: skip

    return _built_once(CACHE / "horovod" / f"py{version}-wheels-{_key(base)}", build)


def python(version: str) -> Path:
    """An interpreter of `version` with the stack and horovod installed (built on first use
    from `wheelhouse(version)`; blocks)."""
    base = _check_python(version)
    wheels = wheelhouse(version)

    def build(home: Path) -> None:
        shutil.copytree(base.parent.parent, home, symlinks=True)  # pyenv's tree is relocatable
        exe = home / "bin" / f"python{version}"
        _pip(exe, "install", "--no-index", "--find-links", str(wheels), TF, TF_KERAS, SKLEARN,
             HOROVOD_STACK.build)  # fmt: skip

    home = _built_once(CACHE / "horovod" / f"py{version}-image-{_key(base)}", build)
    return home / "bin" / f"python{version}"


if __name__ == "__main__":  # tests/run.sh: build the stack for the given Pythons
    for wanted in sys.argv[1:] or ["3.10"]:
        print(f"box horovod wheelhouse for python {wanted}: {wheelhouse(wanted)}")
        print(f"box horovod python {wanted}: {python(wanted)}")
