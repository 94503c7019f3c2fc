#!/usr/bin/env bash
# Run the node-side tests (tests/node-side-tests.txt) under another Python: `bash tests/node_pythons.sh 3.10`.
# The interpreter comes from pyenv (these machines have 3.10, 3.11 and 3.12); a missing one is an
# error, never a skip. Its venv (tests/.venvs/pyX.Y: cloudtrain, on the node-test extras' packages
# installed once per machine, no TensorFlow) is made once and remade when pyproject.toml changes.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: tests/node_pythons.sh X.Y [pytest args]}
shift

python=""
for candidate in "$(pyenv root 2>/dev/null)"/versions/"$version".*/bin/python"$version" \
  "$(command -v "python$version" || true)"; do
  if [ -n "$candidate" ] && "$candidate" -c 'import sys' >/dev/null 2>&1; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "tests/node_pythons.sh: no Python $version found (pyenv versions, python$version on PATH);" \
    "the node-side tests must run under it" >&2
  exit 1
fi

venv="tests/.venvs/py$version"
stamp="$venv/.pyproject.sha256"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
# The node-test extras' packages (the SDKs, moto, the emulators, pytest; setuptools and wheel
# for the editable install: ~45 s of pip a Python) are installed once per machine, keyed by
# pyproject.toml, under the box cache as the box images are; a clone's venv is a bare one that
# adds that folder as a site dir (a .pth line) and holds cloudtrain alone, installed editable
# from the clone (~2 s). Runs at once (helpers, CI shards, clones) take turns to make either:
# two that both saw a stale stamp used to rm -rf each other's venv mid-install, leaving a stamp
# and no pytest. Then they share both (shared locks), so a remake also waits for the runs still
# using the old one. Locks: the clone's, then the cache's.
mkdir -p tests/.venvs
exec 9>"tests/.venvs/.py$version.lock"
flock 9
cache=${CLOUDTRAIN_BOX_CACHE:-$HOME/.cache/cloudtrain-box}/venvs
deps="$cache/py$version-${want:0:16}"
mkdir -p "$cache"
exec 8>"$cache/.py$version.lock"
flock 8
if [ ! -f "$deps/.complete" ]; then
  echo "tests/node_pythons.sh: installing the node-test packages for $version in $deps (once)" >&2
  for old in "$deps" "$cache/py$version-"*; do rm -rf "$old"; done # older keys: nobody uses them
  "$python" -m venv "$deps"
  "$deps/bin/python" -m pip install --quiet --disable-pip-version-check '.[node-test]' setuptools wheel
  "$deps/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y cloudtrain
  touch "$deps/.complete"
fi
flock -s 8
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "tests/node_pythons.sh: making $venv from $python on $deps" >&2
  rm -rf "$venv"
  "$python" -m venv --without-pip "$venv"
  purelib='import sysconfig; print(sysconfig.get_path("purelib"))'
  echo "import site; site.addsitedir('$("$deps/bin/python" -c "$purelib")')" \
    >"$("$venv/bin/python" -c "$purelib")/cloudtrain-node-test-packages.pth"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation -e .
  echo "$want" >"$stamp"
fi
flock -s 9

mapfile -t files < <(grep -v -e '^#' -e '^$' tests/node-side-tests.txt)
echo "node-side tests under $("$venv/bin/python" -V)" >&2
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}" "$@"
