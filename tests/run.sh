#!/usr/bin/env bash
# Install everything the test suite needs, then run the whole suite. CI runs exactly this.
#   pip extras (.[dev]: TensorFlow, tf-keras, the cloud SDKs, tensorboard, matplotlib, moto, the
#   GCS emulator, pytest, pytest-xdist, ruff),
#   Azurite (the Azure Blob emulator) from npm into tests/.azurite; from Debian: shellcheck,
#   chromium (the report's browser check, tests/e2e/browser_kit.py), and
#   iproute2, nftables and debootstrap for the box's machines (a network namespace per node, each
#   cloud's firewall as nftables rules, a Debian 12 root booted as root: tests/fakes/netns.py,
#   debian_root.py; the suite runs as root, as CI does); Slurm 22.05 (slurmctld, slurmd,
#   slurm-client), munge and OpenSSH for the box's real Slurm cluster (tests/fakes/slurm_box.py);
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

# Debian packages the suite needs, by the command each provides
missing=()
for pair in shellcheck:shellcheck ip:iproute2 nft:nftables debootstrap:debootstrap chromium:chromium \
  slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge sshd:openssh-server \
  ssh:openssh-client; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) ||
      { echo "tests/run.sh: could not install ${missing[*]}; their tests would fail" >&2; exit 1; }
  else
    echo "tests/run.sh: install ${missing[*]} (Debian packages) and run as root" >&2
    exit 1
  fi
fi

python3 -m ruff check .
# The node-side tests under the other Pythons the clouds' images ship (the suite below is 3.11's)
# side by side (each mostly waits on its fakes), each drawing node ports from its own half of
# the node-port range (CLOUDTRAIN_LOCAL_PORTS, tests/fakes/port_slices.py), each one's output printed
# whole when both have ended
if [ "$#" -eq 0 ]; then
  slices=$(python3 -m tests.fakes.port_slices 2) # two LOW-HIGH lines; a failure ends the script
  slice310=${slices%%$'\n'*} && slice312=${slices##*$'\n'}
  node_logs=$(mktemp -d)
  CLOUDTRAIN_LOCAL_PORTS="$slice310" bash tests/node_pythons.sh 3.10 >"$node_logs/3.10" 2>&1 &
  pid310=$!
  CLOUDTRAIN_LOCAL_PORTS="$slice312" bash tests/node_pythons.sh 3.12 >"$node_logs/3.12" 2>&1 &
  pid312=$!
  rc310=0 && wait "$pid310" || rc310=$?
  rc312=0 && wait "$pid312" || rc312=$?
  cat "$node_logs/3.10" "$node_logs/3.12" && rm -rf "$node_logs"
  if [ "$rc310" -ne 0 ] || [ "$rc312" -ne 0 ]; then
    echo "tests/run.sh: the node-side tests failed (3.10: exit $rc310, 3.12: exit $rc312)" >&2
    exit 1
  fi
fi
# The box's custom-image interpreter (Python 3.10 with the pinned stack), built once per machine
python3 -m tests.fakes.box_images 3.10
# strategy horovod's stack (tensorflow 2.15.1, horovod 0.28.1 compiled with Gloo: ~3 min), once
python3 -m tests.fakes.horovod_stack 3.10
# a Cloud TPU VM's image in the GCP box: its runtime's TensorFlow (CPU build; no TPU, no libtpu), once
python3 -m tests.fakes.tpu_images tpu-vm-tf-2.16.1-pjrt
# The Debian 12 root (debootstrap, ~1 min) that tests/e2e/test_debian_boot.py boots as root, once
python3 -m tests.fakes.debian_root
# Three workers (pytest-xdist), whole files each, on this 2-core machine: with two, the CPUs sat
# idle a sixth of the time (a sampled run of the two longest files: 833 CPU-s in 496 s), as
# much of the suite waits on processes, clouds' fakes and polls; every test keeps to its own
# CLOUDTRAIN_HOME, ports (a slice per worker), namespaces (claimed per process:
# tests/fakes/netns.py) and fakes, so files run side by side. CT_TEST_WORKERS=0 runs it in this
# one process. The 30 slowest tests are listed at the end: where the suite's 40 minutes go.
exec python3 -m pytest -q -n "${CT_TEST_WORKERS:-3}" --dist loadfile --durations=30 "$@"
