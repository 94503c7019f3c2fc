"""The node stack on a Slurm cluster: ONE venv on the shared filesystem per pin set, built on the
login host and reused by every later run with the same pins, never built by a node.

    <workdir>/stack/<tag>/          a venv: the pins (TensorFlow, tf-keras, a strategy's own
                                    build) and the cloudtrain wheel; `.complete` once whole
    <workdir>/stack/.build-XXXXXX/  a build under way (renamed onto <tag>/ when done)

Why the login host: it is where a user's own installs happen on a cluster (sites commonly give
compute nodes no route to the internet, while the login nodes reach the package index), and one
build serves every node of every run; N nodes installing TensorFlow at once would be N builds
racing on the shared filesystem.

The tag is the first 16 hex digits of the sha256 of the `python` option, the pins (one a line),
the cloudtrain wheel's sha256 and its extra (a bucket in S3 needs `cloudtrain[aws]`, boto3): a
change of any makes a new venv, never a changed one (a
running job's venv is never written to). How it is made: when the cluster's Python imports the
pinned TensorFlow and tf-keras already (a site module or a conda environment), a venv over it
(`--system-site-packages`, as a Deep Learning image is used on the clouds); else a plain venv
into which pip installs the pins from the index. Then the wheel (its own copy, whatever the
base has), then its dependencies (satisfied by the base where it has them).

Concurrency: a build happens in a fresh folder, then one `mv -T` renames it onto the tag: rename
is atomic on a POSIX filesystem (NFS included), so two runs building at once both finish, one
folder wins and the other is deleted. A venv works after its folder is renamed when it is run
as `<venv>/bin/python -m ...` (the interpreter finds its pyvenv.cfg beside bin/), which is how
the nodes run it; its console scripts keep the old path and are not used.
"""

from __future__ import annotations

import hashlib
import re
import tarfile

from cloudtrain.core.errors import ProviderError
from cloudtrain.jobs.protocol_keys import cluster_key
from cloudtrain.providers.base import NodeStack
from cloudtrain.providers.slurm.login import LoginHost, run_on_login

STACK_DIR = "stack"
BUILD_TIMEOUT_S = 3600.0  # pip installing TensorFlow with its CUDA wheels from the index
MAX_WHEEL_BYTES = 64 * 1024 * 1024
_PYTHON_PATH = re.compile(r"^/[A-Za-z0-9_.@+/-]{1,500}/bin/python$")
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,200}\.whl$")
_EXTRA = re.compile(r"^([a-z0-9][a-z0-9-]{0,40})?$")  # a pip extra's name, or none

# on the login host: $1 workdir, $2 tag, $3 the cluster's python, $4 the wheel's file name,
# $5 its extra (or empty), $6.. the pins; the wheel on stdin (read only when building). Prints
# the venv's python, absolute; `found` or `built` on stderr's last line. A login host without
# sbatch is no Slurm login node: said first, as the submission would say it (exit 127).
_ENSURE_SH = """\
set -eu
command -v sbatch >/dev/null || { echo "sh: sbatch: not found" >&2; exit 127; }
top=$1 tag=$2 py=$3 wheel=$4 extra=$5
shift 5
mkdir -p -m 700 "$top/stack"
cd "$top/stack"
here=$(pwd)
if [ -e "$tag/.complete" ] && [ -x "$tag/bin/python" ]; then
  cat >/dev/null
  echo "$here/$tag/bin/python"
  echo found >&2
  exit 0
fi
command -v "$py" >/dev/null 2>&1 || { echo "the cluster has no $py" >&2; exit 3; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  { echo "$py is older than Python 3.10" >&2; exit 3; }
build=$(mktemp -d "$here/.build-XXXXXX")
trap 'rm -rf "$build"' EXIT
cat >"$build/$wheel"
want_tf=""
want_keras=""
for pin in "$@"; do
  case "$pin" in
    tensorflow==*|tensorflow\\[*\\]==*) want_tf=${pin##*==} ;;
    tf-keras==*) want_keras=${pin##*==} ;;
  esac
done
if [ -n "$want_tf" ] && "$py" - "$want_tf" "$want_keras" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("tensorflow") == sys.argv[1]
assert not sys.argv[2] or version("tf-keras") == sys.argv[2]
EOF
then
  "$py" -m venv --system-site-packages "$build/venv"
  v="$build/venv/bin/python"
else
  "$py" -m venv "$build/venv"
  v="$build/venv/bin/python"
  "$v" -m pip install -q --disable-pip-version-check "$@" >&2
fi
"$v" -m pip install -q --disable-pip-version-check --no-deps --ignore-installed \
  "$build/$wheel" >&2
"$v" -m pip install -q --disable-pip-version-check "$build/$wheel${extra:+[$extra]}" >&2
touch "$build/venv/.complete"
if ! mv -T "$build/venv" "$tag" 2>/dev/null; then
  [ -e "$tag/.complete" ] || { echo "cannot make $here/$tag" >&2; exit 1; }
fi
echo "$here/$tag/bin/python"
echo built >&2
"""


# run by the node stack's python on the login host: $1 the bucket's URI, $2 a key of the run.
# Prints how many objects it lists under that key; a failure, its one line on stderr (exit 3)
_OPENS_PY = """\
import sys
try:
    from cloudtrain.providers import open_store
    found = open_store(sys.argv[1]).list(sys.argv[2])
except Exception as exc:
    print(type(exc).__name__ + ": " + " ".join(str(exc).split())[:400], file=sys.stderr)
    sys.exit(3)
print(len(found))
"""
OPENS_TIMEOUT_S = 300.0  # the store's own retries of a store it cannot reach


def wheel_of(stack: NodeStack) -> bytes:
    """The cloudtrain wheel in the run's bundle (`wheel/<name>`). Raises ProviderError when the
    bundle lacks it or it is larger than MAX_WHEEL_BYTES. Blocks (reads the bundle)."""
    try:
        with tarfile.open(stack.bundle_path, "r:gz") as tar:
            member = tar.getmember(f"wheel/{stack.wheel_name}")
            if not member.isfile() or member.size > MAX_WHEEL_BYTES:
                raise ProviderError(f"the bundle's wheel {stack.wheel_name} is not a small file")
            data = tar.extractfile(member)
            assert data is not None
            return data.read()
    except (OSError, KeyError, tarfile.TarError) as exc:
        raise ProviderError(f"cannot read the cloudtrain wheel of the bundle: {exc}") from exc


def stack_tag(python: str, pins: tuple[str, ...], wheel: bytes, extra: str = "") -> str:
    """The stack's folder name: 16 hex digits of the sha256 of `python`, the pins, the
    wheel's sha256 and its extra when any (module docstring). Pure."""
    lines = (python, *pins, hashlib.sha256(wheel).hexdigest(), *([extra] if extra else []))
    text = "".join(f"{line}\n" for line in lines)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_stack(login: LoginHost, workdir: str, python: str, stack: NodeStack) -> str:
    """The absolute path of the python of the run's node stack on the cluster, built first on
    the login host when no earlier run built it (module docstring). Idempotent; blocks (one
    ssh; a build installs with pip: minutes). Raises ProviderError with pip's or the shell's
    last lines when the build fails (nothing half-made is left under the tag)."""
    if not _WHEEL_NAME.fullmatch(stack.wheel_name):
        raise ProviderError(f"not a wheel's file name: {stack.wheel_name[:200]!r}")
    if not _EXTRA.fullmatch(stack.extra):
        raise ProviderError(f"not a pip extra's name: {stack.extra[:200]!r}")
    wheel = wheel_of(stack)
    tag = stack_tag(python, stack.pins, wheel, stack.extra)
    command = [
        "/bin/sh", "-c", _ENSURE_SH, "sh", workdir, tag, python, stack.wheel_name, stack.extra
    ]  # fmt: skip
    out = run_on_login(
        login,
        [*command, *stack.pins],
        stdin=wheel,
        timeout_s=BUILD_TIMEOUT_S,
        what=f"building the node stack ({' '.join(stack.pins)}"
        + (f", cloudtrain[{stack.extra}]" if stack.extra else "")
        + f") with {python}",
    )
    path = out.strip().splitlines()[-1] if out.strip() else ""
    if not _PYTHON_PATH.fullmatch(path):
        raise ProviderError(f"the node stack's build answered no python path ({path[:200]!r})")
    return path


def check_bucket(login: LoginHost, python: str, store_uri: str, run_id: str) -> None:
    """That the cluster reaches the run's bucket in an object store as the controller does: the
    node stack's `python` opens `store_uri` on the login host with what it finds there (the
    cluster's credentials, region and endpoint) and sees the run's cluster.json, which the
    controller wrote before its first submission (one key listed, however much the run holds).
    Raises ProviderError naming what failed, before anything is submitted. Blocks (one ssh;
    the store's retries when it cannot reach it)."""
    key = cluster_key(run_id)
    out = run_on_login(
        login,
        [python, "-c", _OPENS_PY, store_uri, key],
        timeout_s=OPENS_TIMEOUT_S,
        what=f"opening the run's bucket {store_uri} on the cluster",
    )
    count = out.strip().splitlines()[-1] if out.strip() else ""
    if not count.isdigit() or int(count) == 0:
        raise ProviderError(
            f"the cluster opens {store_uri} but does not see this run's files in it"
            f" ({key}): it reaches another store than this machine does",
            hint="give the cluster the endpoint and credentials this machine uses",
        )
