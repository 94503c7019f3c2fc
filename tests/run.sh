#!/usr/bin/env bash
# Install everything the test suite needs, then run the whole suite. CI runs exactly this.
#   pip extras (.[dev]: TensorFlow, tf-keras, the cloud SDKs, moto, the GCS emulator, pytest, ruff),
#   Azurite (the Azure Blob emulator) from npm into tests/.azurite, and shellcheck from Debian;
#   venvs for Python 3.10 and 3.12 (pyenv's) in tests/.venvs, for the node-side tests; and the
#   cloud-in-a-box's image interpreter with the stack baked in (tests/fakes/box_images.py, cached
#   in ~/.cache/cloudtrain-box).
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[dev]'

if [ ! -x tests/.azurite/node_modules/.bin/azurite-blob ]; then
  npm install --silent --no-audit --no-fund --prefix tests/.azurite azurite@3.35.0
fi

if ! command -v shellcheck >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq shellcheck >/dev/null) ||
      { echo "tests/run.sh: shellcheck could not be installed; its checks would fail" >&2; exit 1; }
  else
    echo "tests/run.sh: install shellcheck for the bootstrap-script checks" >&2
  fi
fi

python3 -m ruff check .
# The node-side tests under the other Pythons the clouds' images ship (the suite below is 3.11's)
if [ "$#" -eq 0 ]; then
  bash tests/node_pythons.sh 3.10
  bash tests/node_pythons.sh 3.12
fi
# The box's custom-image interpreter (Python 3.10 with the pinned stack), built once per machine
python3 -m tests.fakes.box_images 3.10
# The Debian 12 root (debootstrap, ~1 min) that tests/e2e/test_debian_boot.py boots as root, once
if [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null 2>&1; then python3 -m tests.fakes.debian_root; fi
exec python3 -m pytest -q "$@"
