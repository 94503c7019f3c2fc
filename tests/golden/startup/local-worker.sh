#!/usr/bin/env bash
# cloudtrain node bootstrap for ct-golden-run-worker-1 (run golden-run), cloudtrain 0.1.0.
# Runs as root at first boot (as the user on `local`). Every phase logs a timestamped line; a failure
# before the agent starts uploads this log through a presigned PUT URL so the controller can say why.
set -Eeuo pipefail
umask 077

CT_RUN_ID='golden-run'
CT_ROLE='worker'
CT_INDEX='1'
CT_STORE_URI='file:///srv/cloudtrain/bucket'
CT_BUNDLE_URL='file:///srv/cloudtrain/bucket/cloudtrain/runs/golden-run/bundle/abababababababababababababababababababababababababababababababab.tar.gz'
CT_BUNDLE_SHA256='abababababababababababababababababababababababababababababababab'
CT_LOG_URL='file:///srv/cloudtrain/bucket/cloudtrain/runs/golden-run/bootstrap/worker-1.log'
CT_VERSION='0.1.0'
CT_TF_VERSION='2.21.0'
CT_TF_KERAS_VERSION='2.21.0'
CT_GPU_COUNT='0'
CT_PIP_EXTRA=''
DEADLINE_EPOCH=1767225600
# The boot environment may name another interpreter or folder (an image with its own Python).
CT_PYTHON=${CT_PYTHON:-'/usr/bin/python3'}
CT_WORK="${CT_WORK:-/opt/cloudtrain}"
export CT_RUN_ID CT_ROLE CT_INDEX CT_GPU_COUNT DEADLINE_EPOCH
export CLOUDTRAIN_PROVIDER='local'
export CLOUDTRAIN_LOG_LEVEL='debug'

mkdir -p "$CT_WORK"
cd "$CT_WORK"
BOOT_LOG="$CT_WORK/bootstrap.log"
: >"$BOOT_LOG"
# Commands' output goes to the console and the log through tee; phase lines (and FAILED) are
# written to both directly, so the log uploaded on failure always ends with the reason.
exec 3>&1
exec > >(tee -a "$BOOT_LOG") 2>&1

phase() {
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) cloudtrain-bootstrap[$CT_ROLE-$CT_INDEX]: $*"
  printf '%s\n' "$line" >>"$BOOT_LOG"
  printf '%s\n' "$line" >&3
}
# Extra HTTP headers a storage URL needs, one per line: none for a presigned URL. A provider's
# block below may redefine it (say, a bearer token of the node's own identity).
storage_headers() { :; }
ct_curl() { # curl "$@", plus the storage headers of the URL, which is the last argument
  local line
  local -a extra=()
  while IFS= read -r line; do
    if [ -n "$line" ]; then extra+=(-H "$line"); fi
  done < <(storage_headers "${*: -1}")
  curl "${extra[@]}" "$@"
}
upload_log() { ct_curl -fsS --retry 3 -T "$BOOT_LOG" "$CT_LOG_URL" >/dev/null 2>&1 || true; }
fail() {
  trap - ERR
  phase "FAILED: $*"
  upload_log
  exit 1
}
trap 'fail "command failed at line $LINENO (exit $?)"' ERR

phase "start (deadline $(date -u -d "@$DEADLINE_EPOCH" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo "$DEADLINE_EPOCH"))"

# 1. The dead-man switch: the node stops its own bill at the deadline, laptop or not.
( sleep "$(( DEADLINE_EPOCH - $(date +%s) ))"; pkill -TERM -s "$$" ) </dev/null >/dev/null 2>&1 &

# Node facts (address, port) from the provider.
export CLOUDTRAIN_NODE_HOST="${CLOUDTRAIN_NODE_HOST:-127.0.0.1}"
export CLOUDTRAIN_NODE_PORT="${CLOUDTRAIN_NODE_PORT:-}"

# 2. The GPU driver: only when there is an NVIDIA device and no working nvidia-smi.
has_nvidia_gpu() {
  if command -v lspci >/dev/null 2>&1 && lspci -nn 2>/dev/null | grep -qi '\[10de:'; then
    return 0
  fi
  grep -qsi '0x10de' /sys/bus/pci/devices/*/vendor
}
os_id() { (. /etc/os-release 2>/dev/null && echo "${ID:-unknown}-${VERSION_ID:-}") || echo unknown; }
install_driver() {
  case "$(os_id)" in
    ubuntu-22.04 | ubuntu-24.04)
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "linux-headers-$(uname -r)" nvidia-driver-570-server
      ;;
    debian-12)
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "linux-headers-$(uname -r)" nvidia-driver
      ;;
    *) fail "unsupported OS $(os_id) for the GPU driver install (supported: ubuntu-22.04, ubuntu-24.04, debian-12)" ;;
  esac
  modprobe nvidia || fail "the nvidia kernel module does not load after the driver install"
}
phase "driver: checking"
if has_nvidia_gpu && ! nvidia-smi >/dev/null 2>&1; then
  fail "an NVIDIA GPU is present but nvidia-smi does not work, and this provider does not install drivers"
fi
phase "driver: done"

# 3. Python and TensorFlow: skipped when the pinned versions are already installed.
stack_ok() {
  "$CT_PYTHON" - <<PY 2>/dev/null
import importlib.metadata as m, sys
ok = m.version("tensorflow") == "$CT_TF_VERSION" and m.version("tf-keras") == "$CT_TF_KERAS_VERSION"
sys.exit(0 if ok else 1)
PY
}
phase "python: checking"
if ! stack_ok; then
  fail "tensorflow $CT_TF_VERSION and tf-keras $CT_TF_KERAS_VERSION are not installed for $CT_PYTHON (pip install 'cloudtrain[tf]')"
fi
phase "python: done"

# 4. The bundle: fetch, verify, unpack; install the wheel unless this version is there already.
phase "bundle: fetching"
ct_curl -fsSL --retry 5 --retry-connrefused -o bundle.tar.gz "$CT_BUNDLE_URL" ||
  fail "bundle: download failed (curl exit $?); the presigned URL may have expired"
echo "$CT_BUNDLE_SHA256  bundle.tar.gz" | sha256sum -c --quiet - ||
  fail "bundle: sha256 mismatch (expected $CT_BUNDLE_SHA256)"
rm -rf bundle && mkdir bundle && tar -xzf bundle.tar.gz -C bundle || fail "bundle: cannot unpack"
if ! "$CT_PYTHON" -c "import sys, cloudtrain; sys.exit(cloudtrain.__version__ != '$CT_VERSION')" 2>/dev/null; then
  phase "bundle: installing the cloudtrain wheel"
  wheel=$(ls bundle/wheel/*.whl)
  if [ -n "$CT_PIP_EXTRA" ]; then wheel="${wheel}[${CT_PIP_EXTRA}]"; fi
  "$CT_PYTHON" -m pip install -q "$wheel" || fail "bundle: pip could not install $wheel"
fi
phase "bundle: done"

# 5. The agent takes over (rendezvous, TF_CONFIG, training, logs, checkpoints). When it ends (run
#    stopped, job over and nobody tore the node down, or the deadline), the node powers itself off.
phase "agent: starting"
upload_log
trap - ERR
set +e
"$CT_PYTHON" -m cloudtrain.jobs.agent \
  --run-id "$CT_RUN_ID" --role "$CT_ROLE" --index "$CT_INDEX" \
  --store-uri "$CT_STORE_URI" --work "$CT_WORK"
agent_rc=$?
phase "agent: exited with $agent_rc; powering off"
upload_log
:
exit "$agent_rc"
