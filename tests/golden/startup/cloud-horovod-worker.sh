#!/usr/bin/env bash
# cloudtrain node bootstrap for ct-golden-run-worker-1 (run golden-run), cloudtrain 0.1.0.
# Runs as root at boot (as the user on `local`). Phases: driver (NVIDIA kernel driver), python (venv,
# pinned TensorFlow, GPU check), bundle (job code and wheel), agent (training). Supported for
# installs: Ubuntu 22.04/24.04 and Debian 12; an image that already has everything boots on any OS.
#
# Re-runs: GCE runs its startup-script on every boot; cloud-init (AWS, Azure) runs user data on the
# first boot only, so before the one reboot a driver install may need, the script copies itself into
# cloud-init's per-boot folder (and removes that copy once the driver works).
#
# The bootstrap log ($CT_WORK/bootstrap.log) goes to the bucket through the presigned PUT URL
# before the agent starts, on failure, before a reboot, when an install or a wait begins, at the
# end of a phase that did real work (>= 1 s, an install or a wait, a resumed boot) and when the
# agent exits; a ready image's quick phases (well under a second) are one upload, not four. The
# controller parses these lines (cloudtrain/state/bootlog.py), each
# `<UTC time> cloudtrain-bootstrap[<role>-<index>]: <text>`:
#   phase <name>: <state>          a phase's progress; <name> is driver|python|bundle|agent, e.g.
#                                  `phase python: installing tensorflow[and-cuda]==2.21.0`
#   phase <name>: done in <N>s     the end of a phase (agent: `exited with <rc> in <N>s`)
#   FAILED: <reason>               the bootstrap failed (one line; diagnostics come before it)
#   durations driver=<N>s python=<N>s bundle=<N>s agent=<N>s
#                                  whole seconds per phase so far (a failed phase: up to the
#                                  failure; driver includes the time before a reboot); written
#                                  after every phase end and after FAILED, so it is the log's
#                                  last line whenever the log is uploaded
#   steps <phase>: apt=<N>s venv=<N>s fetch=<N>s pip=<N>s
#                                  whole seconds of the steps inside a phase that had any (the
#                                  python phase of a bare image: apt installs python3-venv, venv
#                                  makes the venv, fetch gets and checks the wheelhouse, pip
#                                  installs the stack), written before the phase's end line and
#                                  before a FAILED line
#   wheelhouse: <state>            the background publisher's outcome (after the python phase)
# Provider blocks may also write `<name>: <state>` and `WARNING: <text>` lines.
#
# The wheelhouse (cloudtrain/run/wheelhouse.py; ARCHITECTURE.md, "The bucket"): on a bare image the
# controller may offer the pinned stack's wheels, kept in the bucket under
# cloudtrain/wheelhouse/<tag>/ (wheels.tar, then manifest.json), tag = py<X.Y>-<uname -m>-<first
# 12 hex of the sha256 of the pins, one a line>. The script computes its own tag and uses an offer
# only for that tag. "warm": one presigned GET of wheels.tar (one URL: EC2 user data is at most
# 16 KB raw, docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html), checked against the
# sha256 the controller read from the manifest (the bucket is never trusted at boot), then
# `pip install --no-index --find-links`. "cold": `pip wheel` the stack into a folder, install from
# it with --no-index, and publish the tar and then the manifest through presigned PUT URLs (the
# run's presign ttl) in the background. A wrong tag, a failed fetch, a bad hash or a failed
# install from the wheels falls back to the index with a `phase python: wheelhouse ...` line.
#
# Paths the boot environment (or a test) may override: CT_PYTHON, CT_WORK, CT_OS_RELEASE
# (/etc/os-release), CT_SYS_PCI (/sys/bus/pci/devices), CT_STATE_DIR ($CT_WORK/state: the reboot
# marker), CT_PERBOOT_DIR (/var/lib/cloud/scripts/per-boot), CT_BOOT_ID (the kernel's boot id).
# CT_ALLOW_NO_GPU=1 (test harnesses only, on machines without a GPU): a GPU node without a GPU
# goes on, installs TensorFlow without the CUDA wheels, and a shimmed GPU that TensorFlow cannot
# see is a warning rather than a failure.
set -Eeuo pipefail
umask 077
# the run's trace (jobs/trace.py): this boot's start, to the microsecond ($EPOCHREALTIME: bash 5)
ct_t0=${EPOCHREALTIME:-}

CT_RUN_ID='golden-run'
CT_ROLE='worker'
CT_INDEX='1'
CT_STORE_URI='s3://ct-golden'
CT_BUNDLE_URL='https://ct-golden.s3.eu-west-1.amazonaws.com/cloudtrain/runs/golden-run/bundle/abababababababababababababababababababababababababababababababab.tar.gz?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=3600&X-Amz-Signature=0123abcd'
CT_BUNDLE_SHA256='abababababababababababababababababababababababababababababababab'
CT_LOG_URL='https://ct-golden.s3.eu-west-1.amazonaws.com/cloudtrain/runs/golden-run/bootstrap/worker-1.log?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=3600&X-Amz-Signature=0123abcd'
CT_VERSION='0.1.0'
CT_TF_VERSION='2.15.1'
CT_TF_KERAS_VERSION='2.15.1' # "": no tf-keras (a stack of its own, below)
CT_GPU_COUNT='2'
CT_PIP_EXTRA='aws'
CT_MIN_PYTHON='3.10'
DEADLINE_EPOCH=1767225600
# The boot environment may name another interpreter or folder (an image with its own Python).
CT_PYTHON=${CT_PYTHON:-'/opt/cloudtrain/venv/bin/python'}
CT_WORK="${CT_WORK:-/opt/cloudtrain}"
CT_OS_RELEASE="${CT_OS_RELEASE:-/etc/os-release}"
CT_SYS_PCI="${CT_SYS_PCI:-/sys/bus/pci/devices}"
CT_STATE_DIR="${CT_STATE_DIR:-$CT_WORK/state}"
CT_PERBOOT_DIR="${CT_PERBOOT_DIR:-/var/lib/cloud/scripts/per-boot}"
if [ -z "${CT_BOOT_ID:-}" ]; then
  read -r CT_BOOT_ID 2>/dev/null </proc/sys/kernel/random/boot_id || CT_BOOT_ID=unknown
fi
export CT_RUN_ID CT_ROLE CT_INDEX CT_GPU_COUNT DEADLINE_EPOCH
export CLOUDTRAIN_PROVIDER='aws'

mkdir -p "$CT_WORK" "$CT_STATE_DIR"
cd "$CT_WORK"
BOOT_LOG="$CT_WORK/bootstrap.log"
REBOOT_MARKER="$CT_STATE_DIR/driver-reboot" # holds the driver seconds spent before the reboot
PERBOOT_COPY="$CT_PERBOOT_DIR/cloudtrain-bootstrap.sh"

BOOTING_MARKER="$CT_STATE_DIR/booting" # the bootstrap began on an earlier boot and has not ended

# Until the agent starts, any reboot must resume the boot: the driver's own (below), or one that
# an image's or extension's driver install does on its own (Azure's NVIDIA driver extension may
# reboot the VM: MicrosoftDocs azure-compute-docs hpccompute-gpu-linux.md). cloud-init runs user
# data once per instance (cloudinit.readthedocs.io, "Boot stages": scripts-user is PER_INSTANCE),
# so the script registers a copy of itself in cloud-init's per-boot folder while it boots. GCE
# runs its startup-script on every boot as well, so after a reboot two copies may start: the first
# to claim the boot goes on, the other leaves. (Never on local: this machine's folder is the user's.)
if ! mkdir "$CT_STATE_DIR/claimed-$CT_BOOT_ID" 2>/dev/null; then
  echo "cloudtrain-bootstrap: another copy already runs the bootstrap on this boot" >&2
  exit 0
fi
ct_continuing=""
if [ -e "$BOOTING_MARKER" ]; then ct_continuing=1; fi
: >"$BOOTING_MARKER"
if [ -d "$CT_PERBOOT_DIR" ] && [ -f "$0" ] && [ "$0" != "$PERBOOT_COPY" ]; then
  { cp "$0" "$PERBOOT_COPY.tmp" && chmod 700 "$PERBOOT_COPY.tmp" &&
    mv "$PERBOOT_COPY.tmp" "$PERBOOT_COPY"; } || echo "cloudtrain-bootstrap: no per-boot copy" >&2
fi
# After a reboot the log goes on, so the uploaded log tells the whole story.
# $CT_WORK/trace.tsv: `<phase>\t<start>\t<end>` per ended phase, for the agent's trace
TRACE_FILE="$CT_WORK/trace.tsv"
if [ -z "$ct_continuing" ]; then : >"$BOOT_LOG"; : >"$TRACE_FILE"; fi
# Commands' output goes to the console and the log through tee; our own lines (phase, FAILED,
# durations, diagnostics) are written to both directly, so they are in the log when it is uploaded.
exec 3>&1
exec > >(tee -a "$BOOT_LOG") 2>&1
ct_tee_pid=$!

# The boot's fast path forks as little as it can (each fork and exec costs milliseconds on a
# small node): times come from bash's own printf (%(...)T, bash >= 4.2) and $EPOCHREALTIME.
utc_time() { # utc_time VAR [EPOCH]: VAR = EPOCH (default now) as 2026-01-02T03:04:05Z
  TZ=UTC0 printf -v "$1" '%(%Y-%m-%dT%H:%M:%SZ)T' "${2:--1}"
}
phase() { # one timestamped line, straight to the log and the console
  local line
  utc_time line
  line="$line cloudtrain-bootstrap[$CT_ROLE-$CT_INDEX]: $*"
  printf '%s\n' "$line" >>"$BOOT_LOG"
  printf '%s\n' "$line" >&3
}
diag() { tee -a "$BOOT_LOG" >&3; } # stdin to the log and the console, before the next line
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
# Every curl is bounded: one unanswered connection once held a boot for ~130 s. Each try has
# CT_CONNECT_S to connect; a small request (the log, a manifest, a key) CT_SMALL_S in all; a large
# transfer (the bundle, the wheelhouse: up to a few GB) is cut when it moves under 10 KB/s for
# CT_STALL_S, and at CT_LARGE_S in all (30 min: 1.7 MB/s for 3 GB). Retries wait 2 s, 4 s, ...
# and none starts after CT_RETRY_S, so a retried call ends within CT_RETRY_S + one try's bound.
# (The boot environment may shorten them: tests do.)
CT_CONNECT_S=${CT_CONNECT_S:-10}
CT_SMALL_S=${CT_SMALL_S:-30}
CT_STALL_S=${CT_STALL_S:-60}
CT_LARGE_S=${CT_LARGE_S:-1800}
CT_RETRY_S=${CT_RETRY_S:-120}
ct_small=(--connect-timeout "$CT_CONNECT_S" --max-time "$CT_SMALL_S")
ct_large=(--connect-timeout "$CT_CONNECT_S" --max-time "$CT_LARGE_S"
  --speed-limit 10240 --speed-time "$CT_STALL_S")
ct_fetch() { # ct_fetch WHAT CURL_ARGS...: ct_curl; a timeout (curl exit 28) is said in the log
  local what=$1 t=$SECONDS rc=0
  shift
  ct_curl "$@" || rc=$?
  if [ "$rc" = 28 ]; then
    phase "phase ${ct_phase:-boot}: $what timed out after $((SECONDS - t)) s (curl exit 28)"
  fi
  return "$rc"
}
upload_log() { # one PUT of the log (an HTTPS request on a cloud: 50-100 ms); at most ~3 tries
  ct_uploaded=1
  ct_fetch "the boot log upload" -fsS "${ct_small[@]}" --retry 2 --retry-delay 1 \
    --retry-max-time "$CT_SMALL_S" -T "$BOOT_LOG" "$CT_LOG_URL" >/dev/null 2>&1 || true
}

# Phase timing: `begin NAME STATE` ... `finish [STATE]`; ct_durations is the durations line.
# ct_uploaded: the log went up during this phase (an install or a driver wait said so first).
ct_phase="" ct_phase_start=0 ct_phase_extra=0 ct_durations="" ct_uploaded=""
begin() {
  ct_phase=$1 ct_phase_start=$SECONDS ct_phase_extra=0 ct_phase_t0=${EPOCHREALTIME:-}
  ct_uploaded=""
  phase "phase $1: $2"
}
phase_seconds() { echo $((SECONDS - ct_phase_start + ct_phase_extra)); }
micros() { # micros VAR TIME: VAR = TIME (as $EPOCHREALTIME: s.us, or s,us) in us; 0 if none
  local t=${2:-0}
  printf -v "$1" '%s' "$((10#${t/[.,]/}))"
}
# Steps inside a phase: `t=$SECONDS; ...; step NAME "$t"` adds the seconds to NAME's total.
declare -A ct_step_s=()
ct_step_order=""
step() {
  if [ -z "${ct_step_s[$1]+set}" ]; then
    ct_step_order="${ct_step_order:+$ct_step_order }$1"
    ct_step_s[$1]=0
  fi
  ct_step_s[$1]=$((ct_step_s[$1] + SECONDS - $2))
}
flush_steps() { # the phase's `steps` line, if it had steps
  local name text=""
  for name in $ct_step_order; do text="${text:+$text }$name=${ct_step_s[$name]}s"; done
  if [ -n "$text" ]; then phase "steps $ct_phase: $text"; fi
  ct_step_s=()
  ct_step_order=""
}
finish() { # ends the phase. Its end uploads the log when the phase did real work: it took
  # >= 1 s, it uploaded the log already (an install or a wait said so), or the boot resumes
  # after a reboot. A quick phase's lines go up with the next upload: at the latest when the
  # agent starts (always: so the agent phase's end uploads too), on FAILED (always) or before a
  # reboot. Each upload is an HTTPS PUT on a cloud: a ready image's three quick phases paid three
  # for nothing the controller needs.
  local secs t1=${EPOCHREALTIME:-} u0 u1
  flush_steps
  secs=$((SECONDS - ct_phase_start + ct_phase_extra))
  ct_durations="${ct_durations:+$ct_durations }$ct_phase=${secs}s"
  printf '%s\t%s\t%s\n' "$ct_phase" "$ct_phase_t0" "$t1" >>"$TRACE_FILE"
  phase "phase $ct_phase: ${1:-done} in ${secs}s"
  ct_phase=""
  phase "durations $ct_durations"
  micros u0 "$ct_phase_t0"
  micros u1 "$t1"
  # without $EPOCHREALTIME (bash < 5) every phase end uploads, as it always did
  if [ -n "$ct_uploaded$ct_continuing" ] || [ "$ct_phase_extra" != 0 ] || [ "$u0" = 0 ] ||
    [ $((u1 - u0)) -ge 1000000 ]; then
    upload_log
  fi
}
flush_output() { # let tee write what commands printed, so our last lines end the log
  exec 1>&3 2>&3
  local waited=0
  while kill -0 "$ct_tee_pid" 2>/dev/null && [ "$waited" -lt 10 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
}
fail() {
  trap - ERR
  flush_output
  if [ -n "$ct_phase" ]; then flush_steps; fi
  phase "FAILED: $*"
  if [ -n "$ct_phase" ]; then
    ct_durations+="${ct_durations:+ }$ct_phase=$((SECONDS - ct_phase_start + ct_phase_extra))s"
  fi
  if [ -n "$ct_durations" ]; then phase "durations $ct_durations"; fi
  upload_log
  exit 1
}
trap 'fail "command failed at line $LINENO (exit $?)"' ERR

if [ -n "$ct_continuing" ]; then phase "continuing after a reboot (boot $CT_BOOT_ID)"; fi
ct_deadline=""
utc_time ct_deadline "$DEADLINE_EPOCH"
phase "start (deadline $ct_deadline)"

# 1. The dead-man switch: the node stops its own bill at the deadline, laptop or not.
shutdown -h "+$(( (DEADLINE_EPOCH - $(date +%s)) / 60 ))" || true

# Node facts (address, port) from the provider.
CLOUDTRAIN_NODE_HOST="$(hostname -I | cut -d' ' -f1)"
export CLOUDTRAIN_NODE_HOST
export CLOUDTRAIN_NODE_PORT=2222

# --- helpers for the phases ----------------------------------------------------------------------
has_nvidia_gpu() { # an NVIDIA PCI device (vendor 10de); minimal images may lack lspci
  if command -v lspci >/dev/null 2>&1 && lspci -nn 2>/dev/null | grep -qi '\[10de:'; then
    return 0
  fi
  grep -qsi '0x10de' "$CT_SYS_PCI"/*/vendor
}
driver_version() { nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1; }
os_field() { # os_field KEY: a value of $CT_OS_RELEASE, unquoted (read, never sourced)
  local v
  v="$(grep -m 1 "^$1=" "$CT_OS_RELEASE" 2>/dev/null)" || return 0
  printf '%s' "${v#*=}" | tr -d "\"'"
}
os_id() { printf '%s-%s' "$(os_field ID)" "$(os_field VERSION_ID)"; }
os_name() { local n; n="$(os_field PRETTY_NAME)"; printf '%s' "${n:-unknown}"; }
require_supported_os() { # require_supported_os WHAT: installs use apt on tested OSes only
  case "$(os_id)" in
    ubuntu-22.04 | ubuntu-24.04 | debian-12) ;;
    *)
      fail "unsupported OS '$(os_name)' ($(os_id) from $CT_OS_RELEASE): cannot install $1; supported: Ubuntu 22.04, Ubuntu 24.04, Debian 12"
      ;;
  esac
}
ct_apt_updated=""
apt_install() { # waits for a boot-time apt run (unattended-upgrades) rather than failing on its lock
  if [ -z "$ct_apt_updated" ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq || fail "apt-get update failed (exit $?)"
    ct_apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" ||
    fail "apt-get install $* failed (exit $?)"
}
driver_diagnostics() {
  {
    echo "--- diagnostics: nvidia-smi"
    nvidia-smi 2>&1 | head -n 30 || true
    echo "--- diagnostics: kernel"
    uname -r 2>&1 || true
    cat /proc/driver/nvidia/version 2>&1 || true
    if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1 || true; fi
    dmesg 2>/dev/null | grep -i -e nvidia -e nouveau | tail -n 20 || true
  } | diag
}
# The NVIDIA driver branch installed where none works. TensorFlow 2.21 is built with CUDA 12.5 (its
# sm_90 kernels are PTX, which the driver must JIT: that needs >= 555) and `[and-cuda]` takes the
# newest CUDA 12.x wheels (12.9: >= 575 runs them natively). R580 is NVIDIA's long-term branch
# (supported into 2028), the last one that still drives Pascal and Volta (GCP's P100, P4, V100),
# and the branch of GCP's Deep Learning VM images for CUDA 12.9.
CT_NVIDIA_BRANCH='580'
install_driver() { # the kernel driver only: CUDA and cuDNN come as pip wheels with TensorFlow
  require_supported_os "the NVIDIA driver"
  case "$(os_id)" in
    ubuntu-*)
      # Ubuntu's -server packages are NVIDIA's datacenter builds of the branch, built by DKMS
      apt_install "linux-headers-$(uname -r)" "nvidia-driver-$CT_NVIDIA_BRANCH-server"
      ;;
    debian-12)
      # Debian 12's own driver (535) is too old for CUDA 12.5: use NVIDIA's repository, with its
      # proprietary modules (the open ones do not drive Pascal or Volta), locked to the branch
      local arch keyring="$CT_STATE_DIR/cuda-keyring.deb"
      case "$(uname -m)" in
        x86_64) arch=x86_64 ;;
        aarch64) arch=sbsa ;;
        *) fail "driver: no NVIDIA repository for the $(uname -m) architecture" ;;
      esac
      curl -fsSL "${ct_small[@]}" --retry 5 --retry-delay 2 --retry-max-time "$CT_RETRY_S" \
        -o "$keyring" \
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/$arch/cuda-keyring_1.1-1_all.deb" ||
        fail "driver: cannot download NVIDIA's cuda-keyring package"
      dpkg -i "$keyring" || fail "driver: cannot install NVIDIA's cuda-keyring package"
      ct_apt_updated="" # the new repository needs an update
      apt_install "linux-headers-$(uname -r)"
      if apt-cache show "cuda-drivers-$CT_NVIDIA_BRANCH" >/dev/null 2>&1; then
        apt_install "cuda-drivers-$CT_NVIDIA_BRANCH"
      else # newer repositories lock the branch with a pinning package instead
        apt_install "nvidia-driver-pinning-$CT_NVIDIA_BRANCH"
        apt_install cuda-drivers
      fi
      ;;
  esac
}
load_driver() { # load the module now, or reboot once (the script continues on the next boot)
  # the packages blacklist nouveau, but a loaded nouveau holds the GPU until it is unloaded
  modprobe -r nouveau >/dev/null 2>&1 || true
  if modprobe nvidia && nvidia-smi >/dev/null 2>&1; then return 0; fi
  if [ -e "$REBOOT_MARKER" ]; then
    driver_diagnostics
    fail "driver: the nvidia kernel module still does not load after a reboot (under Secure Boot an unsigned DKMS module is refused: see the diagnostics above)"
  fi
  phase_seconds >"$REBOOT_MARKER" # the per-boot copy (registered at the start) comes back
  flush_output # modprobe's complaint goes in the log before our last lines, which end it
  phase "phase driver: rebooting once to load the nvidia module"
  phase "durations ${ct_durations:+$ct_durations }driver=$(phase_seconds)s"
  upload_log
  trap - ERR
  reboot || fail "driver: cannot reboot to load the nvidia module"
  exit 0
}
make_venv() { # make_venv [--system-site-packages]: the venv $CT_PYTHON belongs to
  local venv t=$SECONDS
  forget_facts
  venv="$(dirname "$(dirname "$CT_PYTHON")")"
  if command -v python3 >/dev/null 2>&1 && python3 -m venv "$@" "$venv"; then
    step venv "$t"
    return 0
  fi
  # stock Ubuntu and Debian images lack ensurepip (python3-venv)
  require_supported_os "python3-venv"
  rm -rf "$venv"
  phase "phase python: installing python3-venv with apt"
  t=$SECONDS
  apt_install python3 python3-venv
  step apt "$t"
  t=$SECONDS
  python3 -m venv "$@" "$venv" || fail "python: cannot make the venv $venv"
  step venv "$t"
}

# --- the wheelhouse (see the header) -------------------------------------------------------------
CT_WHEELHOUSE_MODE=''
CT_WHEELHOUSE_TAG=''
CT_WHEELHOUSE_URL=''
CT_WHEELHOUSE_SHA256=''
CT_WHEELHOUSE_PUT_URL=''
CT_WHEELHOUSE_MANIFEST_PUT_URL=''
CT_WHEELS="$CT_WORK/wheelhouse"
# a strategy's stack of its own (cloudtrain/run/startup.py: BuiltStack), else all three empty: the
# requirement built from source against the installed TensorFlow, its build's environment
# (NAME=VALUE words), the Pythons (X.Y) its TensorFlow has wheels for
CT_STACK_BUILD='horovod==0.28.1'
CT_STACK_BUILD_ENV='HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1'
CT_STACK_PYTHONS='3.9 3.10 3.11'
ct_publisher="" # the pid of the background wheelhouse publisher, if any
stack_tag() { # stack_tag REQUIREMENT...: this node's wheelhouse tag for these pins
  local version
  version="$("$CT_PYTHON" -c 'import platform; print(platform.python_version())' 2>/dev/null)" ||
    version=unknown
  printf 'py%s-%s-%s' "$(printf '%s' "$version" | cut -d. -f1-2)" "$(uname -m)" \
    "$(printf '%s\n' "$@" | sha256sum | cut -c1-12)"
}
install_from_wheels() { # install_from_wheels DIR REQUIREMENT...: no index at all
  local dir=$1
  shift
  "$CT_PYTHON" -m pip install -q --disable-pip-version-check --no-index --find-links "$dir" "$@"
}
wheelhouse_warm() { # wheelhouse_warm REQUIREMENT...: 0 if installed from the offered wheelhouse
  local tag t=$SECONDS rc=0
  tag="$(stack_tag "$@")"
  if [ "$CT_WHEELHOUSE_TAG" != "$tag" ]; then
    phase "phase python: wheelhouse not used: offered $CT_WHEELHOUSE_TAG, this node is $tag; installing from the index"
    return 1
  fi
  phase "phase python: fetching the wheelhouse $tag"
  rm -rf "$CT_WHEELS" && mkdir -p "$CT_WHEELS/wheels"
  # the URL stays out of the log: curl's own messages are dropped, its exit code is said
  ct_fetch "the wheelhouse download" -fsSL "${ct_large[@]}" --retry 5 --retry-delay 2 \
    --retry-max-time "$CT_RETRY_S" --retry-connrefused -o "$CT_WHEELS/wheels.tar" \
    "$CT_WHEELHOUSE_URL" >/dev/null 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    step fetch "$t"
    phase "phase python: wheelhouse not used: download failed (curl exit $rc); installing from the index"
    return 1
  fi
  if ! echo "$CT_WHEELHOUSE_SHA256  $CT_WHEELS/wheels.tar" | sha256sum -c --quiet - >/dev/null 2>&1; then
    step fetch "$t"
    phase "phase python: wheelhouse not used: sha256 mismatch (expected $CT_WHEELHOUSE_SHA256); installing from the index"
    return 1
  fi
  if ! tar -xf "$CT_WHEELS/wheels.tar" -C "$CT_WHEELS/wheels"; then
    step fetch "$t"
    phase "phase python: wheelhouse not used: cannot unpack wheels.tar; installing from the index"
    return 1
  fi
  rm -f "$CT_WHEELS/wheels.tar"
  step fetch "$t"
  phase "phase python: installing $* from the wheelhouse (no index)"
  t=$SECONDS
  rc=0
  install_from_wheels "$CT_WHEELS/wheels" "$@" || rc=$?
  step pip "$t"
  if [ "$rc" != 0 ]; then
    phase "phase python: wheelhouse not used: pip could not install from it (exit $rc); installing from the index"
    return 1
  fi
  rm -rf "$CT_WHEELS"
}
require_stack_python() { # the stack's TensorFlow has a wheel for the venv's Python, or the boot fails
  local python=$CT_PYTHON where
  if [ -z "$CT_STACK_PYTHONS" ]; then return 0; fi
  if [ ! -x "$python" ]; then python=python3; fi
  have_facts "$python" || fail "python: $python does not run"
  where="$(command -v "$python" || echo "$python")"
  case " $CT_STACK_PYTHONS " in
    *" ${ct_py_version%.*} "*) return 0 ;;
  esac
  fail "python: tensorflow $CT_TF_VERSION (for $CT_STACK_BUILD) has wheels for Python $CT_STACK_PYTHONS only, but $where is Python $ct_py_version: use an image whose python3 is one of them (Ubuntu 22.04: 3.10, Debian 12: 3.11) or one that ships ${CT_STACK_BUILD%%=*}"
}
build_tools_missing() { # the packages missing to build $CT_STACK_BUILD: a C++ compiler, cmake, Python.h
  command -v g++ >/dev/null 2>&1 || printf '%s\n' g++
  command -v cmake >/dev/null 2>&1 || printf '%s\n' cmake
  "$CT_PYTHON" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    >/dev/null 2>&1 || printf '%s\n' python3-dev
}
build_stack_module() { # build_stack_module DIR: pip wheel $CT_STACK_BUILD (and its dependencies)
  # into DIR against the installed TensorFlow (minutes); the boot fails where it cannot
  local t=$SECONDS rc=0 what=${CT_STACK_BUILD%%=*}
  local -a missing build_env
  mapfile -t missing < <(build_tools_missing)
  if [ -n "${missing[*]}" ]; then
    case "$(os_id)" in
      ubuntu-22.04 | ubuntu-24.04 | debian-12)
        phase "phase python: installing ${missing[*]} with apt to build $CT_STACK_BUILD"
        apt_install "${missing[@]}"
        step apt "$t"
        mapfile -t missing < <(build_tools_missing)
        ;;
    esac
  fi
  if [ -n "${missing[*]}" ]; then
    fail "python: building $CT_STACK_BUILD needs a C++ compiler, cmake and Python's headers, but ${missing[*]} is missing on $(os_name): use Ubuntu 22.04 or Debian 12, or an image that ships $what"
  fi
  phase "phase python: building $CT_STACK_BUILD against tensorflow $CT_TF_VERSION (minutes; the bucket's wheelhouse keeps the wheel for later nodes and runs)"
  upload_log
  t=$SECONDS
  read -r -a build_env <<<"$CT_STACK_BUILD_ENV"
  mkdir -p "$1"
  env "${build_env[@]}" MAKEFLAGS="-j$(nproc)" "$CT_PYTHON" -m pip wheel -q \
    --disable-pip-version-check --no-build-isolation -w "$1" "$CT_STACK_BUILD" \
    >"$CT_WORK/stack-build.log" 2>&1 || rc=$?
  step build "$t"
  if [ "$rc" != 0 ]; then
    tail -n 30 "$CT_WORK/stack-build.log" | diag
    fail "python: pip could not build $CT_STACK_BUILD (exit $rc): see the build's last lines above"
  fi
}
wheelhouse_cold() { # wheelhouse_cold REQUIREMENT...: 0 if built, installed and being published
  # ($CT_STACK_BUILD among them is built from source once the rest is installed)
  local tag t=$SECONDS rc=0 name
  local -a plain=()
  tag="$(stack_tag "$@")"
  local built=""
  for name in "$@"; do
    if [ "$name" = "$CT_STACK_BUILD" ]; then built=1; else plain+=("$name"); fi
  done
  if [ "$CT_WHEELHOUSE_TAG" != "$tag" ]; then
    phase "phase python: wheelhouse not built: asked for $CT_WHEELHOUSE_TAG, this node is $tag; installing from the index"
    return 1
  fi
  phase "phase python: building the wheelhouse $tag (pip wheel $*)"
  upload_log
  rm -rf "$CT_WHEELS" && mkdir -p "$CT_WHEELS/wheels"
  "$CT_PYTHON" -m pip wheel -q --disable-pip-version-check -w "$CT_WHEELS/wheels" "${plain[@]}" || rc=$?
  if [ "$rc" != 0 ]; then
    step pip "$t"
    phase "phase python: wheelhouse not built: pip wheel failed (exit $rc); installing from the index"
    return 1
  fi
  phase "phase python: installing ${plain[*]} from the new wheelhouse (no index)"
  install_from_wheels "$CT_WHEELS/wheels" "${plain[@]}" ||
    fail "python: pip could not install ${plain[*]} from the wheels it just built (exit $?)"
  step pip "$t"
  if [ -n "$built" ]; then
    forget_facts
    build_stack_module "$CT_WHEELS/wheels"
    t=$SECONDS
    install_from_wheels "$CT_WHEELS/wheels" "$CT_STACK_BUILD" ||
      fail "python: pip could not install $CT_STACK_BUILD from the wheel it just built (exit $?)"
    step pip "$t"
  fi
  publish_wheelhouse "$tag" "$@" &
  ct_publisher=$!
}
publish_wheelhouse() { # publish_wheelhouse TAG REQUIREMENT... (in the background): tar, then
  # the manifest; best effort and idempotent (same keys); only the outcome is said, no URL
  trap - ERR
  set +e
  local tag=$1 tar="$CT_WHEELS/wheels.tar" manifest="$CT_WHEELS/manifest.json" name sha size
  local pins="" files="" n=0 rc=0
  shift
  for name in "$@"; do pins="${pins:+$pins,}\"$name\""; done
  for name in "$CT_WHEELS"/wheels/*; do
    name="${name##*/}"
    case "$name" in # wheel names are [A-Za-z0-9_.+!-] (PEP 427): safe inside a JSON string
      *[!A-Za-z0-9_.+!-]* | '*') phase "wheelhouse: not published: unexpected file name in the wheels"; return 0 ;;
    esac
    files="${files:+$files,}\"$name\""
    n=$((n + 1))
  done
  tar -cf "$tar" -C "$CT_WHEELS/wheels" . || { phase "wheelhouse: not published: tar failed"; return 0; }
  sha="$(sha256sum "$tar" | cut -d' ' -f1)"
  size="$(stat -c %s "$tar")"
  printf '{"tag": "%s", "sha256": "%s", "size": %s, "pins": [%s], "files": [%s]}\n' \
    "$tag" "$sha" "$size" "$pins" "$files" >"$manifest"
  ct_fetch "the wheelhouse upload" -fsS "${ct_large[@]}" --retry 3 --retry-delay 2 \
    --retry-max-time "$CT_RETRY_S" -T "$tar" "$CT_WHEELHOUSE_PUT_URL" >/dev/null 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    ct_fetch "the wheelhouse manifest upload" -fsS "${ct_small[@]}" --retry 3 --retry-delay 2 \
      --retry-max-time "$CT_RETRY_S" -T "$manifest" "$CT_WHEELHOUSE_MANIFEST_PUT_URL" \
      >/dev/null 2>&1 || rc=$?
  fi
  rm -rf "$tar" "$CT_WHEELS/wheels"
  if [ "$rc" != 0 ]; then
    phase "wheelhouse: not published: upload failed (curl exit $rc)"
    return 0
  fi
  phase "wheelhouse: published $tag ($n wheels, $size bytes)"
}

# What the phases decide on, from ONE start of an interpreter (each start costs 40-100 ms, more
# with a big site-packages): its Python version and whether that is >= $CT_MIN_PYTHON, the
# installed versions of tensorflow and tf-keras (importlib.metadata: TensorFlow is not imported)
# and cloudtrain's __version__ ("-" for what is missing). A ready image's boot asks once. The
# answers are PYTHON's as it was then: whatever installs into it (make_venv, pip, a wheelhouse)
# calls forget_facts, and the next question asks again.
ct_facts_of="" ct_py_version="" ct_py_ok="" ct_tf="" ct_tf_keras="" ct_cloudtrain=""
node_facts() { # node_facts PYTHON: sets the ct_* facts of PYTHON; 1 if it does not run
  local out
  ct_facts_of=""
  out="$("$1" -c 'import sys
def dist(name):
    try:
        from importlib.metadata import version
        return version(name) or "-"
    except Exception:
        return "-"
def cloudtrain():
    try:
        import cloudtrain
        return cloudtrain.__version__
    except Exception:
        return "-"
need = tuple(map(int, sys.argv[1].split(".")))
print(sys.version.split()[0], int(sys.version_info[:2] >= need), dist("tensorflow"),
      dist("tf-keras"), cloudtrain())' "$CT_MIN_PYTHON" 2>/dev/null)" || return 1
  read -r ct_py_version ct_py_ok ct_tf ct_tf_keras ct_cloudtrain <<<"$out"
  if [ -z "$ct_cloudtrain" ]; then return 1; fi # not all five answers: not a usable Python
  ct_facts_of=$1
}
forget_facts() { ct_facts_of=""; }
have_facts() { # have_facts PYTHON: the facts are PYTHON's (asked now if not); 1 if it does not run
  [ "$ct_facts_of" = "$1" ] || node_facts "$1"
}
require_python() { # require_python PYTHON: the node's agent runs on $CT_MIN_PYTHON or newer
  local where=$1
  case $1 in */*) ;; *) where="$(command -v "$1" || echo "$1")" ;; esac
  have_facts "$1" || fail "python: $1 does not run"
  if [ "$ct_py_ok" != 1 ]; then
    fail "python: $where is Python $ct_py_version, but cloudtrain's node agent needs Python >= $CT_MIN_PYTHON: use an image with a newer python3 (Ubuntu 22.04 or later, Debian 12)"
  fi
  phase "phase python: $where is Python $ct_py_version"
}
stack_ok() { # stack_ok PYTHON: the pinned tensorflow and tf-keras are installed for PYTHON
  have_facts "$1" && [ "$ct_tf" = "$CT_TF_VERSION" ] &&
    { [ -z "$CT_TF_KERAS_VERSION" ] || [ "$ct_tf_keras" = "$CT_TF_KERAS_VERSION" ]; }
}
check_gpus() { # TensorFlow must see every GPU: a silent fallback to the CPU is refused
  local out n
  phase "phase python: checking that TensorFlow sees $CT_GPU_COUNT GPU(s)"
  out="$("$CT_PYTHON" -c 'import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
import tensorflow as tf
print("cloudtrain-gpus", len(tf.config.list_physical_devices("GPU")))' 2>&1)" || true
  n="$(printf '%s\n' "$out" | sed -n 's/^cloudtrain-gpus //p' | tail -n 1)"
  if [ "$n" = "$CT_GPU_COUNT" ]; then return 0; fi
  if [ "${CT_ALLOW_NO_GPU:-}" = 1 ] && [ -n "$n" ]; then
    phase "WARNING: TensorFlow sees $n GPU(s) of $CT_GPU_COUNT: a test harness's GPU, going on"
    return 0
  fi
  {
    echo "--- diagnostics: TensorFlow's GPU check"
    printf '%s\n' "$out" | tail -n 40
    echo "--- diagnostics: driver $(driver_version || true)"
    echo "--- diagnostics: CUDA libraries found by pip"
    "$CT_PYTHON" -m pip list 2>/dev/null | grep -i '^nvidia-' ||
      echo "(no nvidia-* wheels: tensorflow[and-cuda] brings CUDA and cuDNN)"
  } | diag
  driver_diagnostics
  fail "python: TensorFlow sees ${n:-no} GPU(s) but this node has $CT_GPU_COUNT (driver ${ct_driver:-none}); refusing to train on the CPU, see the diagnostics above"
}

# 2. The GPU driver: only when there is an NVIDIA device and no working nvidia-smi.
begin driver "checking"
ct_gpu="" ct_driver=""
if has_nvidia_gpu; then ct_gpu=1; fi
if [ -e "$REBOOT_MARKER" ]; then ct_phase_extra="$(cat "$REBOOT_MARKER" 2>/dev/null || echo 0)"; fi
if [ -n "$ct_gpu" ] && ! nvidia-smi >/dev/null 2>&1; then
  phase "phase driver: installing nvidia-driver $CT_NVIDIA_BRANCH for $(os_id)"
  upload_log
  install_driver
  load_driver
fi
if [ -n "$ct_gpu" ]; then
  ct_driver="$(driver_version || true)"
  phase "phase driver: nvidia-smi works (driver ${ct_driver:-unknown})"
elif [ "$CT_GPU_COUNT" -gt 0 ]; then
  # never a silent fallback to the CPU; only a test harness that boots GPU nodes on a machine
  # without one (CT_ALLOW_NO_GPU=1 in its boot environment) goes on, with a warning
  if [ "${CT_ALLOW_NO_GPU:-}" != 1 ]; then
    fail "$CT_GPU_COUNT GPU(s) expected but no NVIDIA PCI device found (lspci, $CT_SYS_PCI)"
  fi
  phase "WARNING: $CT_GPU_COUNT GPU(s) expected but no NVIDIA PCI device found: TensorFlow will use the CPU"
fi
# the driver works: a later reboot is no driver reboot
if [ -e "$REBOOT_MARKER" ]; then rm -f "$REBOOT_MARKER"; fi
finish

# 3. Python and TensorFlow: skipped when the pinned versions are already installed.
begin python "checking"
# the interpreter the node will run: the venv's, or the image's python3 it will be made from
if [ -x "$CT_PYTHON" ]; then
  require_python "$CT_PYTHON"
elif command -v python3 >/dev/null 2>&1; then
  require_python python3
fi
ct_has_module=""
# Strategy horovod's stack of its own (cloudtrain/run/startup.py: BuiltStack):
# tensorflow $CT_TF_VERSION and tf-keras, and $CT_STACK_BUILD built against them unless the
# bucket's wheelhouse has its wheel. An interpreter that imports horovod.tensorflow already
# (the venv of an earlier boot; an image that ships it) is used as it is, whatever its TensorFlow.
if [ -x "$CT_PYTHON" ] && ! stack_ok "$CT_PYTHON" &&
  "$CT_PYTHON" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  phase "phase python: $CT_PYTHON has horovod.tensorflow (tensorflow $ct_tf): using it as it is"
  ct_has_module=1
elif [ ! -x "$CT_PYTHON" ] && command -v python3 >/dev/null 2>&1 && ! stack_ok python3 &&
  python3 -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  phase "phase python: making a venv over the image's python3, which has horovod.tensorflow"
  make_venv --system-site-packages
  ct_has_module=1
fi
if [ -z "$ct_has_module" ] && ! stack_ok "$CT_PYTHON"; then
  if [ ! -x "$CT_PYTHON" ] && command -v python3 >/dev/null 2>&1 && stack_ok python3; then
    # a Deep Learning image: its python3 has the stack; the venv builds on it
    phase "phase python: making a venv over the image's python3, which has tensorflow $CT_TF_VERSION"
    if python3 -m pip --version >/dev/null 2>&1; then
      # the image's pip serves the venv (it installs into the venv it runs from): no ensurepip
      # copy of pip, which costs seconds on every boot
      make_venv --system-site-packages --without-pip
    else
      make_venv --system-site-packages
    fi
  fi
  if ! stack_ok "$CT_PYTHON"; then
    require_supported_os "tensorflow $CT_TF_VERSION"
    require_stack_python
    if [ ! -x "$CT_PYTHON" ]; then make_venv; fi
    tf_pkg="tensorflow==$CT_TF_VERSION"
    if [ -n "$ct_gpu" ] || { [ "$CT_GPU_COUNT" -gt 0 ] && [ "${CT_ALLOW_NO_GPU:-}" != 1 ]; }; then
      tf_pkg="tensorflow[and-cuda]==$CT_TF_VERSION"
    fi
    ct_pins=("$tf_pkg")
    if [ -n "$CT_TF_KERAS_VERSION" ]; then ct_pins+=("tf-keras==$CT_TF_KERAS_VERSION"); fi
    # the wheelhouse holds the built package too (the tag's pins name it)
    ct_all_pins=("${ct_pins[@]}")
    if [ -n "$CT_STACK_BUILD" ]; then ct_all_pins+=("$CT_STACK_BUILD"); fi
    ct_installed=""
    case "$CT_WHEELHOUSE_MODE" in
      warm) if wheelhouse_warm "${ct_all_pins[@]}"; then ct_installed=1; fi ;;
      cold) if wheelhouse_cold "${ct_all_pins[@]}"; then ct_installed=1; fi ;;
    esac
    ct_tried_wheelhouse=1
    if [ -z "$ct_installed" ]; then
      phase "phase python: installing $tf_pkg"
      upload_log
      t=$SECONDS
      "$CT_PYTHON" -m pip install -q --disable-pip-version-check "${ct_pins[@]}" ||
        fail "python: pip could not install $tf_pkg (exit $?)"
      step pip "$t"
    fi
    forget_facts # the install changed what $CT_PYTHON has
    stack_ok "$CT_PYTHON" || fail "python: tensorflow $CT_TF_VERSION is still not importable after the install"
  fi
fi
if [ -z "$ct_has_module" ] && [ -z "${ct_tried_wheelhouse:-}" ] &&
  ! "$CT_PYTHON" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  # the image has the stack's TensorFlow but not horovod.tensorflow: from the wheelhouse
  # (its tar holds every pin's wheel: a cold offer builds them all), else built here
  require_stack_python
  tf_pkg="tensorflow==$CT_TF_VERSION"
  if [ -n "$ct_gpu" ] || { [ "$CT_GPU_COUNT" -gt 0 ] && [ "${CT_ALLOW_NO_GPU:-}" != 1 ]; }; then
    tf_pkg="tensorflow[and-cuda]==$CT_TF_VERSION"
  fi
  case "$CT_WHEELHOUSE_MODE" in
    warm) wheelhouse_warm "$tf_pkg" "$CT_STACK_BUILD" || true ;;
    cold) wheelhouse_cold "$tf_pkg" "$CT_STACK_BUILD" || true ;;
  esac
fi
if [ -z "$ct_has_module" ] && ! "$CT_PYTHON" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
  # no wheelhouse had it (none offered, another node's to publish): build it here
  build_stack_module "$CT_WORK/built"
  t=$SECONDS
  install_from_wheels "$CT_WORK/built" "$CT_STACK_BUILD" ||
    fail "python: pip could not install $CT_STACK_BUILD from the wheel it just built (exit $?)"
  step pip "$t"
  rm -rf "$CT_WORK/built"
fi
if [ -n "$ct_gpu" ] && [ "$CT_GPU_COUNT" -gt 0 ]; then check_gpus; fi
# strategy horovod needs a module the image must ship (jobs/strategies.py: image_module)
phase "phase python: checking horovod"
if ! ct_mod_err="$("$CT_PYTHON" -c 'import horovod.tensorflow' 2>&1)"; then
  printf '%s\n' "$ct_mod_err" | tail -n 5 | diag
  fail "python: strategy horovod needs horovod for $CT_PYTHON, but 'import horovod.tensorflow' fails; cloudtrain installs tensorflow 2.15.1 and builds horovod 0.28.1 (Gloo) on images with Python 3.9-3.11; elsewhere use an image whose python3 ships horovod"
fi
finish

# 4. The bundle: fetch, verify, unpack; install the wheel unless this version is there already.
#    The job's `setup` commands are the agent's (once per node, before the entrypoint).
begin bundle "fetching"
ct_fetch "the bundle download" -fsSL "${ct_large[@]}" --retry 5 --retry-delay 2 \
  --retry-max-time "$CT_RETRY_S" --retry-connrefused -o bundle.tar.gz "$CT_BUNDLE_URL" ||
  fail "bundle: download failed (curl exit $?); the presigned URL may have expired"
sha256sum -c --quiet - <<<"$CT_BUNDLE_SHA256  bundle.tar.gz" ||
  fail "bundle: sha256 mismatch (expected $CT_BUNDLE_SHA256)"
if [ -e bundle ]; then rm -rf bundle; fi
mkdir bundle && tar -xzf bundle.tar.gz -C bundle || fail "bundle: cannot unpack"
# the installed cloudtrain's version: the python phase asked already (node_facts)
if ! have_facts "$CT_PYTHON" || [ "$ct_cloudtrain" != "$CT_VERSION" ]; then
  phase "phase bundle: installing the cloudtrain wheel"
  wheel=$(ls bundle/wheel/*.whl)
  if [ -n "$CT_PIP_EXTRA" ]; then wheel="${wheel}[${CT_PIP_EXTRA}]"; fi
  "$CT_PYTHON" -m pip install -q --disable-pip-version-check "$wheel" ||
    fail "bundle: pip could not install $wheel"
fi
finish

# 5. The agent takes over (rendezvous, TF_CONFIG, setup, training, logs, checkpoints). When it ends
#    (run stopped, job over and nobody tore the node down, or the deadline), the node powers off.
begin agent "starting"
# the node is booted: from here a reboot is a lost node, as on any cloud
rm -f "$PERBOOT_COPY" "$BOOTING_MARKER"
upload_log
trap - ERR
set +e
CT_BOOT_START="$ct_t0" CT_AGENT_LAUNCH="${EPOCHREALTIME:-}" "$CT_PYTHON" -m cloudtrain.jobs.agent \
  --run-id "$CT_RUN_ID" --role "$CT_ROLE" --index "$CT_INDEX" \
  --store-uri "$CT_STORE_URI" --work "$CT_WORK"
agent_rc=$?
flush_output # the agent's last lines (a traceback) belong in the uploaded log
finish "exited with $agent_rc"
# a wheelhouse still being published gets its upload finished before the node goes down; its
# outcome line came after the durations, which end the log again
if [ -n "$ct_publisher" ]; then
  wait "$ct_publisher"
  phase "durations $ct_durations"
  upload_log
fi
:
exit "$agent_rc"
