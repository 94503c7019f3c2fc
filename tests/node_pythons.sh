#!/usr/bin/env bash
# Run the node-side tests (tests/node-side-tests.txt) under another Python: `bash tests/node_pythons.sh 3.10`.
# The interpreter comes from pyenv (these machines have 3.10, 3.11 and 3.12); a missing one is an
# error, never a skip. Its venv (tests/.venvs/pyX.Y, the node-test extras, no TensorFlow) is made
# once and remade when pyproject.toml changes. Extra arguments go to pytest.
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
# Runs at once (helpers, CI shards) take turns to remake the venv: two that both saw a stale
# stamp used to rm -rf each other's venv mid-install, leaving a stamp and no pytest. Then they
# share it (a shared lock), so a remake also waits for the runs still using the old one.
mkdir -p tests/.venvs
exec 9>"tests/.venvs/.py$version.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "tests/node_pythons.sh: making $venv from $python" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[node-test]'
  echo "$want" >"$stamp"
fi
flock -s 9

mapfile -t files < <(grep -v -e '^#' -e '^$' tests/node-side-tests.txt)
echo "node-side tests under $("$venv/bin/python" -V)" >&2
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}" "$@"
