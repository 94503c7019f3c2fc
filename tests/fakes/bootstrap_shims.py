"""A fake node for running the rendered bootstrap script (jobs/startup.sh.j2) under bash.

`FakeNode` puts shims first on PATH for everything the script may touch on a real VM: `lspci`,
`nvidia-smi`, `apt-get`, `apt-cache`, `dpkg`, `modprobe`, `reboot`, `shutdown`, `uname`, `curl`,
`python3` (the image's interpreter) and `pip`; the agent's interpreter ($CT_PYTHON) is a shim too:
its `-m pip wheel -w DIR` writes two fake wheels of the stack, and its `-m pip install --no-index
--find-links DIR` fails unless DIR holds them (the wheelhouse paths; sha256sum and tar are real).
Every shim appends one line `<name> <args>` (newlines in arguments become spaces) to `calls.log`,
so a test reads back what happened and in what order. Nothing touches this machine: `curl` passes
file:// URLs (the bucket is a folder) to the real curl and answers anything else with a dummy
file (a URL containing $SHIM_SLOW_URL, an `extra_env` knob, takes 2 s more); the rest only record
and pretend.

The machine's facts are knobs (`Machine`): an NVIDIA GPU or not, a working driver from the start,
a module that never loads, TensorFlow present (in the venv or the image's python3), how many GPUs
TensorFlow sees, horovod importable. Installs change state files under `state/` (the apt shim
"installs" the driver, the modprobe shim "loads" it, pip "installs" TensorFlow), which is what
later shims answer from. `/etc/os-release` and `/sys/bus/pci/devices` are fakes through the
script's CT_OS_RELEASE and CT_SYS_PCI; CT_STATE_DIR, CT_PERBOOT_DIR and CT_BOOT_ID keep the
reboot marker, the per-boot copy and the boot id in the test's folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import cloudtrain
from cloudtrain.core.errors import NotFound
from cloudtrain.jobs.strategies import HOROVOD
from cloudtrain.providers.base import StartupBlocks
from cloudtrain.providers.local import LocalStore
from cloudtrain.run.bundle import Bundle, build_bundle
from cloudtrain.run.startup import StartupParams, WheelhouseOffer, render_startup

OS_RELEASES = {
    "ubuntu-22.04": 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\nVERSION_ID="22.04"\n',
    "ubuntu-24.04": 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n',
    "debian-12": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
    "rocky-9": 'PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\nID="rocky"\nVERSION_ID="9.4"\n',
}
T4_LSPCI = "00:04.0 3D controller [0302]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8]"
VGA_LSPCI = "00:02.0 VGA compatible controller [0300]: Device [1234:1111] (rev 02)"
PREFIX = "cloudtrain/runs/shim-run/"

_RECORD = 'printf \'%s %s\\n\' "$(basename "$0")" "${*//$\'\\n\'/ }" >>"$SHIM_CALLS"\n'
# An interpreter's answer to the script's one question (node_facts): its version, 1 if that is
# >= the minimum ($3), the versions of tensorflow and tf-keras, cloudtrain's ("-": missing), from
# the knobs and the state (each interpreter's shim defines shim_tf and shim_cloudtrain first);
# and its version alone (the wheelhouse's stack_tag).
_PY_VERSION = """\
if [ "${1:-}" = -c ]; then
  case "$2" in
    *importlib.metadata*)
      ok=0 tf=-
      if [ "$(printf '%s\\n%s\\n' "$3" "$SHIM_PYTHON_VERSION" | sort -V | head -n 1)" = "$3" ]; then
        ok=1
      fi
      # the version pip installed (tensorflow and tf-keras alike), else the pinned stack's
      if shim_tf; then tf=$(cat "$SHIM_STATE/tf-version" 2>/dev/null || echo 2.21.0); fi
      echo "$SHIM_PYTHON_VERSION $ok $tf $tf $(shim_cloudtrain)"
      exit 0 ;;
    *python_version*) echo "$SHIM_PYTHON_VERSION"; exit 0 ;; # the wheelhouse's stack_tag
  esac
fi
"""
_SHIMS: dict[str, str] = {
    "lspci": 'if [ "$SHIM_GPU" = 1 ]; then echo "$SHIM_LSPCI_GPU"; fi\necho "$SHIM_LSPCI_OTHER"\n',
    "nvidia-smi": """\
if [ "$SHIM_DRIVER" != 1 ] && [ ! -e "$SHIM_STATE/driver-loaded" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
  exit 9
fi
case "$*" in
  *driver_version*) echo "580.95.05" ;;
  *) echo "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |"
     echo "|   0  Tesla T4   On  | 00000000:00:04.0 Off |  0 |" ;;
esac
""",
    "apt-get": """\
if [ "$SHIM_APT" = fail ] && [ "${*: -1}" != -qq ]; then
  echo "E: Unable to locate package ${*: -1}" >&2
  exit 100
fi
case "$*" in
  *install*nvidia-driver-*-server* | *install*cuda-drivers*) touch "$SHIM_STATE/driver-installed" ;;
  *install*python3-venv*) touch "$SHIM_STATE/python3-venv" ;;
esac
case "$*" in
  *install*python3-dev*) touch "$SHIM_STATE/python3-dev" ;;
esac
""",
    "apt-cache": "exit 0\n",
    "dpkg": "exit 0\n",
    "modprobe": """\
case "$*" in
  *-r*) exit 0 ;;
esac
if [ "$SHIM_MODPROBE" = fail ]; then
  echo "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service" >&2
  exit 1
fi
if [ ! -e "$SHIM_STATE/driver-installed" ]; then
  echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.8.0-1015-gcp" >&2
  exit 1
fi
touch "$SHIM_STATE/driver-loaded"
""",
    "reboot": "exit 0\n",
    "shutdown": "exit 0\n",
    "uname": """\
case "${1:-}" in
  -r) echo "6.8.0-1015-gcp" ;;
  -m) echo "x86_64" ;;
  *) echo "Linux" ;;
esac
""",
    "curl": """\
url="${*: -1}"
if [ -n "${SHIM_SLOW_URL:-}" ] && [[ "$url" == *"$SHIM_SLOW_URL"* ]]; then sleep 2; fi
case "$url" in
  file://*) exec "$SHIM_REAL_CURL" "$@" ;;
esac
out=""
while [ "$#" -gt 0 ]; do
  if [ "$1" = -o ]; then out="$2"; fi
  shift
done
if [ -n "$out" ]; then echo "fake download of $url" >"$out"; fi
""",
    "pip": 'echo "pip shim: the script must use \\"$CT_PYTHON -m pip\\"" >&2\nexit 97\n',
    # the image's interpreter: makes venvs (whose python is the venv shim) and may have TF
    "python3": 'shim_tf() { [ "$SHIM_SYSTEM_TF" = 1 ]; }\nshim_cloudtrain() { echo -; }\n'
    + _PY_VERSION
    + """\
if [ "${1:-}" = -m ] && [ "${2:-}" = venv ]; then
  if [ "$SHIM_ENSUREPIP" != 1 ] && [ ! -e "$SHIM_STATE/python3-venv" ]; then
    echo "The virtual environment was not created successfully because ensurepip is not" \
      "available. On Debian/Ubuntu systems, you need to install the python3-venv package" >&2
    exit 1
  fi
  venv="${*: -1}"
  mkdir -p "$venv/bin"
  cp "$SHIM_VENV_PYTHON" "$venv/bin/python"
  case "$*" in
    *--system-site-packages*)
      if [ "$SHIM_SYSTEM_TF" = 1 ]; then touch "$SHIM_STATE/tf-system"; fi ;;
  esac
  exit 0
fi
exit 1
""",
}
# The venv's interpreter ($CT_PYTHON): answers the script's checks from the knobs and state.
VENV_PYTHON = (
    """\
tf_present() {
  [ "$SHIM_TF" = 1 ] || [ -e "$SHIM_STATE/tf-installed" ] || [ -e "$SHIM_STATE/tf-system" ]
}
shim_tf() { tf_present; }
shim_cloudtrain() { echo "$SHIM_CLOUDTRAIN_VERSION"; } # the wheel's version is installed
"""
    + _PY_VERSION
    + """\
if [ "${1:-}" = -m ]; then
  case "${2:-}" in
    cloudtrain.jobs.agent)
      printf '%s\\n' "$@" >"$SHIM_AGENT_ARGV"
      exit 0 ;;
    pip)
      case "${3:-}" in
        wheel) # `pip wheel -w DIR ...`: fake wheels of what it names in DIR
          dir="" prev="" v=""
          for arg in "$@"; do
            if [ "$prev" = -w ]; then dir="$arg"; fi
            case "$arg" in tensorflow*==*) v="${arg##*==}" ;; esac
            prev="$arg"
          done
          if [ -n "$v" ]; then
            echo "fake tensorflow wheel" >"$dir/tensorflow-$v-cp310-cp310-manylinux_x86_64.whl"
            echo "fake tf-keras wheel" >"$dir/tf_keras-$v-py3-none-any.whl"
          fi
          case "$*" in # a build from source (the stack's horovod)
            *horovod==*)
              echo "fake built wheel" >"$dir/horovod-0.28.1-cp310-cp310-linux_x86_64.whl" ;;
          esac
          exit 0 ;;
        install)
          case "$*" in
            *--no-index*) # only from the --find-links folder: it must hold the stack's wheels
              links="" prev=""
              for arg in "$@"; do
                if [ "$prev" = --find-links ]; then links="$arg"; fi
                prev="$arg"
              done
              case "$*" in
                *tensorflow*)
                  if ! ls "$links"/tensorflow-*.whl "$links"/tf_keras-*.whl >/dev/null 2>&1; then
                    echo "ERROR: No matching distribution found for tensorflow (--no-index)" >&2
                    exit 1
                  fi ;;
              esac
              case "$*" in
                *horovod==*)
                  if ! ls "$links"/horovod-*.whl >/dev/null 2>&1; then
                    echo "ERROR: No matching distribution found for horovod (--no-index)" >&2
                    exit 1
                  fi ;;
              esac ;;
          esac
          for arg in "$@"; do
            case "$arg" in
              tensorflow*==*)
                echo "${arg##*==}" >"$SHIM_STATE/tf-version"
                touch "$SHIM_STATE/tf-installed" ;;
              horovod==*) touch "$SHIM_STATE/horovod-installed" ;;
            esac
          done
          exit 0 ;;
        list)
          echo "tensorflow 2.21.0"
          case "$(cat "$SHIM_CALLS")" in
            *"pip install"*and-cuda*)
              echo "nvidia-cudnn-cu12 9.3.0.75"
              echo "nvidia-cublas-cu12 12.5.3.2" ;;
          esac
          exit 0 ;;
      esac ;;
  esac
  exit 0
fi
if [ "${1:-}" = -c ]; then
  case "$2" in
    *list_physical_devices*)
      tf_present || exit 1
      gpus="${SHIM_TF_GPUS:-0}"
      echo "W0000 cuda_dnn.cc: Cannot dlopen some GPU libraries (shim)" >&2
      echo "cloudtrain-gpus $gpus"
      exit 0 ;;
    *Python.h*) # Python's headers, which a build from source needs (python3-dev)
      if [ "$SHIM_HEADERS" = 1 ] || [ -e "$SHIM_STATE/python3-dev" ]; then exit 0; fi
      exit 1 ;;
    *horovod*)
      if [ "$SHIM_HOROVOD" = 1 ] || [ -e "$SHIM_STATE/horovod-installed" ]; then exit 0; fi
      echo "ModuleNotFoundError: No module named 'horovod'" >&2
      exit 1 ;;
  esac
fi
exit 0
"""
)


@dataclass
class Machine:
    """What the fake VM has. Defaults: a supported OS, no GPU, nothing installed."""

    os: str = "ubuntu-22.04"
    gpu: bool = False
    driver: bool = False  # a working nvidia-smi from the start
    modprobe_fails: bool = False  # the module never loads (say, Secure Boot)
    tf: bool = False  # TensorFlow in the venv from the start
    system_tf: bool = False  # TensorFlow in the image's python3 (a Deep Learning image)
    venv_exists: bool = True  # $CT_PYTHON exists (else the script makes the venv)
    ensurepip: bool = True  # python3 -m venv works without apt's python3-venv
    apt_fails: bool = False  # apt-get install fails (apt-get update works)
    tf_gpus: int | None = None  # GPUs TensorFlow sees; default: 1 with a GPU, else 0
    horovod: bool = False
    headers: bool = True  # Python's headers (python3-dev) for the venv's interpreter
    python: str = "3.10.12"  # the image's python3 (Ubuntu 22.04's), and so the venv's


@dataclass
class Boot:
    """One run of the script."""

    returncode: int
    seconds: float
    calls: list[str]
    console: str
    boot_log: str
    uploaded_log: str | None
    agent_argv: list[str] | None

    def called(self, name: str) -> list[str]:
        """The argument strings of every call of one shim."""
        return [c.partition(" ")[2] for c in self.calls if c.partition(" ")[0] == name]

    def index(self, needle: str) -> int:
        """Position of the first call containing `needle` (fails the test if none)."""
        hits = [i for i, c in enumerate(self.calls) if needle in c]
        assert hits, f"no call with {needle!r} in {self.calls}"
        return hits[0]


@dataclass
class FakeNode:
    """A folder holding one fake VM: shims, fake /etc and /sys, its bucket and its state."""

    root: Path
    bundle: Bundle
    blocks: StartupBlocks
    gpu_count: int = 0
    require_horovod: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    wheelhouse: WheelhouseOffer | None = None  # what the controller offers (the bucket's)

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"
        self.state = self.root / "state"  # the shims' state (what is "installed")
        self.ct_state = self.root / "ct-state"  # the script's CT_STATE_DIR
        self.perboot = self.root / "per-boot"
        self.work = self.root / "work"
        self.calls_file = self.root / "calls.log"
        self.agent_argv = self.root / "agent-argv.txt"
        self.venv_python = self.root / "venv" / "bin" / "python"
        for folder in (self.bin, self.state, self.perboot):
            folder.mkdir(parents=True, exist_ok=True)
        for name, body in _SHIMS.items():
            self._write(self.bin / name, body)
        self._write(self.root / "venv-python-shim", VENV_PYTHON)
        self.store = LocalStore(f"file://{self.root / 'bucket'}")
        self.store.ensure_bucket()
        self.store.put_file(PREFIX + self.bundle.key, str(self.bundle.path))
        self.log_key = PREFIX + "bootstrap/worker-0.log"
        self.log_url = self.store.presign_put(self.log_key)
        self.script_text = ""  # the script of the latest boot

    @staticmethod
    def _write(path: Path, body: str) -> None:
        path.write_text("#!/usr/bin/env bash\n" + _RECORD + body)
        path.chmod(0o755)

    def script(self) -> str:
        params = StartupParams(
            run_id="shim-run",
            role="worker",
            index=0,
            node_name="ct-shim-run-worker-0",
            store_uri=self.store.uri,
            bundle_url=self.store.presign_get(PREFIX + self.bundle.key),
            bundle_sha256=self.bundle.sha256,
            log_put_url=self.log_url,
            version=cloudtrain.__version__,
            deadline_epoch=int(time.time()) + 3600,
            gpu_count=self.gpu_count,
            pip_extra="aws",
            **(
                {
                    "require_module": HOROVOD.image_module or "",
                    "require_for": HOROVOD.name,
                    "require_hint": HOROVOD.image_hint,
                }
                if self.require_horovod
                else {}
            ),
            wheelhouse=self.wheelhouse,
        )
        return render_startup(params, self.blocks)

    def boot(self, machine: Machine, *, boot_id: str = "boot-1", timeout: float = 60) -> Boot:
        """Run the script once as the VM's boot would (state persists between boots)."""
        os_release = self.root / "os-release"
        os_release.write_text(OS_RELEASES[machine.os])
        pci = self.root / "pci"
        shutil.rmtree(pci, ignore_errors=True)
        devices = {"0000:00:02.0": "0x1234"}
        if machine.gpu:
            devices["0000:00:04.0"] = "0x10de"
        for slot, vendor in devices.items():
            (pci / slot).mkdir(parents=True)
            (pci / slot / "vendor").write_text(vendor + "\n")
        if machine.venv_exists and not self.venv_python.exists():
            self.venv_python.parent.mkdir(parents=True)
            shutil.copy(self.root / "venv-python-shim", self.venv_python)
        self.calls_file.write_text("")
        self.agent_argv.unlink(missing_ok=True)
        flag = {True: "1", False: "0"}
        tf_gpus = machine.tf_gpus if machine.tf_gpus is not None else int(machine.gpu)
        env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "CT_WORK": str(self.work),
            "CT_PYTHON": str(self.venv_python),
            "CT_OS_RELEASE": str(os_release),
            "CT_SYS_PCI": str(pci),
            "CT_STATE_DIR": str(self.ct_state),
            "CT_PERBOOT_DIR": str(self.perboot),
            "CT_BOOT_ID": boot_id,
            "CLOUDTRAIN_NODE_HOST": "10.0.0.7",
            "SHIM_CALLS": str(self.calls_file),
            "SHIM_STATE": str(self.state),
            "SHIM_AGENT_ARGV": str(self.agent_argv),
            "SHIM_VENV_PYTHON": str(self.root / "venv-python-shim"),
            "SHIM_REAL_CURL": shutil.which("curl") or "/usr/bin/curl",
            "SHIM_LSPCI_GPU": T4_LSPCI,
            "SHIM_LSPCI_OTHER": VGA_LSPCI,
            "SHIM_GPU": flag[machine.gpu],
            "SHIM_DRIVER": flag[machine.driver],
            "SHIM_MODPROBE": "fail" if machine.modprobe_fails else "ok",
            "SHIM_TF": flag[machine.tf],
            "SHIM_SYSTEM_TF": flag[machine.system_tf],
            "SHIM_TF_GPUS": str(tf_gpus),
            "SHIM_HOROVOD": flag[machine.horovod],
            "SHIM_HEADERS": flag[machine.headers],
            "SHIM_ENSUREPIP": flag[machine.ensurepip],
            "SHIM_APT": "fail" if machine.apt_fails else "ok",
            "SHIM_PYTHON_VERSION": machine.python,
            "SHIM_CLOUDTRAIN_VERSION": cloudtrain.__version__,
            **self.extra_env,
        }
        script = self.root / "startup.sh"
        self.script_text = self.script()
        script.write_text(self.script_text)
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", str(script)],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        seconds = time.monotonic() - started
        try:
            uploaded: str | None = self.store.get(self.log_key).decode()
        except NotFound:
            uploaded = None
        log = self.work / "bootstrap.log"
        return Boot(
            returncode=proc.returncode,
            seconds=seconds,
            calls=self.calls_file.read_text().splitlines(),
            console=proc.stdout + proc.stderr,
            boot_log=log.read_text() if log.exists() else "",
            uploaded_log=uploaded,
            agent_argv=(
                self.agent_argv.read_text().splitlines() if self.agent_argv.exists() else None
            ),
        )


def make_bundle(tmp: Path) -> Bundle:
    """A real, small bundle (a workdir with one file and the cloudtrain wheel)."""
    workdir = tmp / "job"
    workdir.mkdir(parents=True)
    (workdir / "train.py").write_text("print('hello')\n")
    return build_bundle(workdir, tmp / "build")
