"""The node bootstrap script (cloudtrain/run/startup.py + jobs/startup.sh.j2): rendering and
running it.

Rendering is compared byte for byte with golden files under `tests/golden/startup/`, one per
variant (a local-like node, a cloud GPU worker, a cloud CPU parameter server). After an intended
change to the template or to the renderer, rewrite them and review the diff:

    CLOUDTRAIN_UPDATE_GOLDEN=1 python -m pytest tests/unit/run/test_startup.py

Every variant must pass `bash -n` and, when `shellcheck` is installed, `shellcheck -S warning`.
Values are shell-quoted (hostile values are rendered and the script's prologue is run to prove
they stay data), and nothing secret from the controller's environment reaches the script.

The last tests run the rendered local script for real under bash: it fetches a real bundle over a
file:// URL with curl, verifies its sha256, unpacks it and execs the agent. The interpreter is a
shim that records the agent's command line instead of starting it and refuses `pip`, so the test
never touches the Python environment; a wrong sha256 must fail and upload the bootstrap log.
The GPU, driver, OS and reboot paths run under shims in tests/unit/run/test_bootstrap_shims.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cloudtrain
from cloudtrain.core.errors import NotFound
from cloudtrain.jobs.strategies import HOROVOD
from cloudtrain.providers.base import NodeRequest, RunInfo, StartupBlocks, node_name
from cloudtrain.providers.local import LocalCompute, LocalStore, session_pids
from cloudtrain.run.bundle import build_bundle
from cloudtrain.run.startup import TF_KERAS_VERSION, TF_VERSION, StartupParams, render_startup
from cloudtrain.state.bootlog import parse
from tests.fakes.shell import require_tool

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "startup"
UPDATE_ENV = "CLOUDTRAIN_UPDATE_GOLDEN"
RUN_ID = "golden-run"
SHA = "ab" * 32
DEADLINE = 1767225600  # 2026-01-01T00:00:00Z

LOCAL_BLOCKS = StartupBlocks(
    python="/usr/bin/python3",
    metadata=(
        'export CLOUDTRAIN_NODE_HOST="${CLOUDTRAIN_NODE_HOST:-127.0.0.1}"\n'
        'export CLOUDTRAIN_NODE_PORT="${CLOUDTRAIN_NODE_PORT:-}"'
    ),
    self_shutdown=(
        '( sleep "$(( DEADLINE_EPOCH - $(date +%s) ))"; pkill -TERM -s "$$" )'
        " </dev/null >/dev/null 2>&1 &"
    ),
    env={"CLOUDTRAIN_PROVIDER": "local"},
    install_stack=False,
)
CLOUD_BLOCKS = StartupBlocks(
    python="/opt/cloudtrain/venv/bin/python",
    metadata=(
        "CLOUDTRAIN_NODE_HOST=\"$(hostname -I | cut -d' ' -f1)\"\n"
        "export CLOUDTRAIN_NODE_HOST\n"
        "export CLOUDTRAIN_NODE_PORT=2222"
    ),
    self_shutdown='shutdown -h "+$(( (DEADLINE_EPOCH - $(date +%s)) / 60 ))" || true',
    env={"CLOUDTRAIN_PROVIDER": "aws"},
    install_stack=True,
)


def local_params(role: str, index: int) -> StartupParams:
    bucket = "file:///srv/cloudtrain/bucket"
    prefix = f"{bucket}/cloudtrain/runs/{RUN_ID}"
    return StartupParams(
        run_id=RUN_ID,
        role=role,
        index=index,
        node_name=node_name(RUN_ID, role, index),
        store_uri=bucket,
        bundle_url=f"{prefix}/bundle/{SHA}.tar.gz",
        bundle_sha256=SHA,
        log_put_url=f"{prefix}/bootstrap/{role}-{index}.log",
        version="0.1.0",
        deadline_epoch=DEADLINE,
        env={"CLOUDTRAIN_LOG_LEVEL": "debug"},
    )


def cloud_params(role: str, index: int, gpu_count: int) -> StartupParams:
    host = "https://ct-golden.s3.eu-west-1.amazonaws.com"
    prefix = f"{host}/cloudtrain/runs/{RUN_ID}"
    signed = "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=3600&X-Amz-Signature=0123abcd"
    return StartupParams(
        run_id=RUN_ID,
        role=role,
        index=index,
        node_name=node_name(RUN_ID, role, index),
        store_uri="s3://ct-golden",
        bundle_url=f"{prefix}/bundle/{SHA}.tar.gz{signed}",
        bundle_sha256=SHA,
        log_put_url=f"{prefix}/bootstrap/{role}-{index}.log{signed}",
        version="0.1.0",
        deadline_epoch=DEADLINE,
        gpu_count=gpu_count,
        pip_extra="aws",
    )


VARIANTS: dict[str, tuple[StartupParams, StartupBlocks]] = {
    "local-worker": (local_params("worker", 1), LOCAL_BLOCKS),
    "cloud-gpu-worker": (cloud_params("worker", 0, gpu_count=1), CLOUD_BLOCKS),
    "cloud-cpu-ps": (cloud_params("ps", 0, gpu_count=0), CLOUD_BLOCKS),
    # a strategy whose module has a stack of its own (horovod: tensorflow 2.15.1, horovod built)
    "cloud-horovod-worker": (
        dataclasses.replace(
            cloud_params("worker", 1, gpu_count=2),
            require_module=HOROVOD.image_module or "",
            require_for=HOROVOD.name,
            require_hint=HOROVOD.image_hint,
        ),
        CLOUD_BLOCKS,
    ),
}


def render(variant: str) -> str:
    params, blocks = VARIANTS[variant]
    return render_startup(params, blocks)


def prologue(script: str) -> str:
    """The script up to (not including) its first action: shebang, settings and assignments."""
    lines = script.splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.startswith('mkdir -p "$CT_WORK"'))
    return "".join(lines[:end])


def run_bash(script: str, cwd: Path, *, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CT_WORK": str(cwd / "work")},
    )


# --- rendering ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_golden(variant: str) -> None:
    text = render(variant)
    assert render(variant) == text, "rendering must be deterministic"
    golden = GOLDEN_DIR / f"{variant}.sh"
    if os.environ.get(UPDATE_ENV) == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
        return
    if not golden.exists():
        pytest.fail(f"{golden} is missing; create it with {UPDATE_ENV}=1")
    assert text == golden.read_text(), (
        f"{variant} differs from {golden}; if the change is intended, rerun with {UPDATE_ENV}=1 "
        "and review the diff"
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bash_syntax(variant: str, tmp_path: Path) -> None:
    script = tmp_path / f"{variant}.sh"
    script.write_text(render(variant))
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shellcheck(variant: str, tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    script = tmp_path / f"{variant}.sh"
    script.write_text(render(variant))
    proc = subprocess.run(
        [shellcheck, "-S", "warning", "-s", "bash", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_install_stack_decides_whether_the_script_installs() -> None:
    local, cloud = render("local-worker"), render("cloud-gpu-worker")
    for text in (local, cloud):
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "set -Eeuo pipefail" in text
        assert '--store-uri "$CT_STORE_URI" --work "$CT_WORK"\nagent_rc=$?' in text
        assert text.rstrip().endswith('exit "$agent_rc"')
    assert "install_driver" not in local and "load_driver" not in local
    assert 'ct_pins+=("tf-keras==' not in local
    assert "this provider does not install drivers" in local
    assert "  install_driver\n  load_driver\n" in cloud
    assert 'ct_pins+=("tf-keras==$CT_TF_KERAS_VERSION")' in cloud
    assert "CT_NVIDIA_BRANCH='580'\n" in cloud
    assert "horovod" not in cloud, "only a horovod job checks for horovod"
    assert "CT_PYTHON=${CT_PYTHON:-'/opt/cloudtrain/venv/bin/python'}\n" in cloud
    assert "CT_GPU_COUNT='1'\n" in cloud
    assert "CT_PIP_EXTRA='aws'\n" in cloud
    assert f"DEADLINE_EPOCH={DEADLINE}\n" in cloud
    # blocks' env and the params' env are both exported, quoted
    assert "export CLOUDTRAIN_PROVIDER='local'\n" in local
    assert "export CLOUDTRAIN_LOG_LEVEL='debug'\n" in local
    assert LOCAL_BLOCKS.self_shutdown in local
    assert CLOUD_BLOCKS.metadata in cloud


# --- quoting and secrets -----------------------------------------------------------------------

NASTY = "x'; rm -rf / #"


def test_hostile_values_stay_data(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    sub = f'a b "$(touch {marker})" `touch {marker}` ${{HOME}} \\ ; & | > {marker}'
    params = StartupParams(
        run_id=NASTY,
        role=sub,
        index=3,
        node_name=NASTY,
        store_uri=NASTY,
        bundle_url=sub,
        bundle_sha256=NASTY,
        log_put_url=sub,
        version=NASTY,
        deadline_epoch=DEADLINE,
        gpu_count=0,
        pip_extra=sub,
        env={"CT_USER_VALUE": NASTY, "CT_USER_SUB": sub},
    )
    blocks = dataclasses.replace(LOCAL_BLOCKS, python=sub, env={"CT_BLOCK_VALUE": sub})
    text = render_startup(params, blocks)

    # Every line with the payload is a comment or one single-quoted assignment of it.
    quoted = {shlex.quote(NASTY), shlex.quote(sub)}
    assert all(q.startswith("'") for q in quoted)
    for line in text.splitlines():
        if "rm -rf / #" in line or str(marker) in line:
            if line.startswith("#"):
                continue
            name, _, value = line.removeprefix("export ").partition("=")
            assert name.isidentifier(), line
            # CT_PYTHON may be overridden by the boot environment: NAME=${NAME:-'quoted'}
            default = value.removeprefix(f"${{{name}:-").removesuffix("}")
            assert value in quoted or (value != default and default in quoted), line

    # Running the prologue creates nothing and sets every variable to the value, byte for byte.
    names = [
        "CT_RUN_ID",
        "CT_ROLE",
        "CT_STORE_URI",
        "CT_BUNDLE_URL",
        "CT_BUNDLE_SHA256",
        "CT_LOG_URL",
        "CT_VERSION",
        "CT_PIP_EXTRA",
        "CT_PYTHON",
        "CT_USER_VALUE",
        "CT_USER_SUB",
        "CT_BLOCK_VALUE",
    ]
    show = "printf '%s\\0' " + " ".join(f'"${n}"' for n in names)
    proc = run_bash(prologue(text) + show + "\n", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    values = dict(zip(names, proc.stdout.split("\0")[:-1], strict=True))
    assert values == {
        "CT_RUN_ID": NASTY,
        "CT_ROLE": sub,
        "CT_STORE_URI": NASTY,
        "CT_BUNDLE_URL": sub,
        "CT_BUNDLE_SHA256": NASTY,
        "CT_LOG_URL": sub,
        "CT_VERSION": NASTY,
        "CT_PIP_EXTRA": sub,
        "CT_PYTHON": sub,
        "CT_USER_VALUE": NASTY,
        "CT_USER_SUB": sub,
        "CT_BLOCK_VALUE": sub,
    }


def test_newline_cannot_escape_the_header_comment(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"x\ntouch {marker}\n#"
    params = dataclasses.replace(
        local_params("worker", 0), run_id=evil, node_name=evil, version=evil
    )
    proc = run_bash(prologue(render_startup(params, LOCAL_BLOCKS)), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


def test_env_keys_cannot_inject(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    params = dataclasses.replace(
        local_params("worker", 0), env={f"A=1; touch {marker}; B": "value"}
    )
    try:
        text = render_startup(params, LOCAL_BLOCKS)
    except ValueError:
        return
    run_bash(prologue(text), tmp_path)
    assert not marker.exists()


def test_no_secret_from_the_environment_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "supersecret",
        "AWS_SESSION_TOKEN": "sessiontoken-4f9a",
        "AZURE_CLIENT_SECRET": "azure-client-secret-77",
        "GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.google-token",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    run = RunInfo(RUN_ID, None, None, (2222, 2230))
    request = NodeRequest(RUN_ID, "worker", 0, "local", "")
    texts = [render(v) for v in VARIANTS]
    texts.append(
        render_startup(
            local_params("worker", 0),
            LocalCompute(Path("/nonexistent")).startup_blocks(run, request),
        )
    )
    for text in texts:
        for key, value in secrets.items():
            assert value not in text
            assert key not in text


# --- running the local script ------------------------------------------------------------------


@dataclasses.dataclass
class Boot:
    """One real run of the rendered local script."""

    returncode: int
    work: Path
    argv: list[str] | None
    boot_log: str
    uploaded_log: str | None
    console: str
    store_uri: str
    log_puts: int  # requests to the log's URL (storage_headers is called for every curl)


def write_python_shim(path: Path, argv_file: Path) -> None:
    """A python that records the agent's argv (and exits 0), refuses pip, else runs Python."""
    path.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "${1:-}" = -m ] && [ "${2:-}" = cloudtrain.jobs.agent ]; then\n'
        f"  printf '%s\\n' \"$@\" > {shlex.quote(str(argv_file))}\n"
        "  exit 0\n"
        "fi\n"
        'if [ "${1:-}" = -m ] && [ "${2:-}" = pip ]; then\n'
        '  echo "python shim: refusing pip $*" >&2\n'
        "  exit 97\n"
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    path.chmod(0o755)


def pinned_stack_missing() -> str | None:
    """Why this Python cannot pass the script's stack check (which installs nothing on local)."""
    for dist, want in (("tensorflow", TF_VERSION), ("tf-keras", TF_KERAS_VERSION)):
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != want:
            return f"the local script needs {dist}=={want} in this Python (found {have})"
    return None


def boot_local_node(tmp_path: Path, *, wrong_sha: bool = False) -> Boot:
    """Build a bundle, put it in a folder bucket, render the local script and run it."""
    reason = pinned_stack_missing()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('hello from train.py')\n")
    bundle = build_bundle(workdir, tmp_path / "build")
    store = LocalStore(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    prefix = "cloudtrain/runs/boot-run/"
    store.put_file(prefix + bundle.key, str(bundle.path))

    argv_file = tmp_path / "agent-argv.txt"
    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    write_python_shim(shim, argv_file)

    run = RunInfo("boot-run", None, None, (2222, 2230), store_uri=store.uri)
    request = NodeRequest("boot-run", "worker", 1, "local", "")
    blocks = LocalCompute(tmp_path / "local").startup_blocks(run, request)
    assert not blocks.install_stack
    # the provider's storage_headers hook sees every URL the script curls: count the log's PUTs
    urls = tmp_path / "curled-urls.txt"
    hook = f"\nstorage_headers() {{ printf '%s\\n' \"$1\" >>{shlex.quote(str(urls))}; }}"
    blocks = dataclasses.replace(blocks, python=str(shim), metadata=blocks.metadata + hook)
    log_key = prefix + "bootstrap/worker-1.log"
    params = StartupParams(
        run_id="boot-run",
        role="worker",
        index=1,
        node_name=request.name,
        store_uri=store.uri,
        bundle_url=store.presign_get(prefix + bundle.key),
        bundle_sha256="0" * 64 if wrong_sha else bundle.sha256,
        log_put_url=store.presign_put(log_key),
        version=cloudtrain.__version__,
        deadline_epoch=int(time.time()) + 3600,
    )
    script = tmp_path / "startup.sh"
    script.write_text(render_startup(params, blocks))
    work = tmp_path / "node"
    env = {**os.environ, "CT_WORK": str(work), "CLOUDTRAIN_NODE_PORT": "2222"}
    console = tmp_path / "console.log"
    with console.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        returncode = proc.wait(timeout=60)
    finally:
        # the local dead-man switch sleeps in the background until the deadline: end it
        proc.kill()
        proc.wait()
        for _ in range(100):
            left = session_pids(proc.pid)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        assert not session_pids(proc.pid), "the node's session must be empty after the test"
    try:
        uploaded: str | None = store.get(log_key).decode()
    except NotFound:
        uploaded = None
    return Boot(
        returncode=returncode,
        work=work,
        argv=argv_file.read_text().splitlines() if argv_file.exists() else None,
        boot_log=(work / "bootstrap.log").read_text(),
        uploaded_log=uploaded,
        console=console.read_text(errors="replace"),
        store_uri=store.uri,
        log_puts=urls.read_text().splitlines().count(params.log_put_url) if urls.exists() else 0,
    )


def phase_positions(log: str, phases: list[str]) -> list[int]:
    lines = log.splitlines()
    out = []
    for phase in phases:
        hits = [
            i for i, line in enumerate(lines) if f"cloudtrain-bootstrap[worker-1]: {phase}" in line
        ]
        assert hits, f"phase {phase!r} missing from the bootstrap log:\n{log}"
        out.append(hits[0])
    return out


def test_local_script_fetches_verifies_unpacks_and_runs_the_agent(tmp_path: Path) -> None:
    boot = boot_local_node(tmp_path)
    # after the agent exits the local node powers itself off: SIGKILL to its own session
    assert boot.returncode == -9, boot.console
    assert "phase agent: exited with 0 in " in boot.console
    assert (boot.work / "bundle" / "workdir" / "train.py").read_text() == (
        "print('hello from train.py')\n"
    )
    assert len(list((boot.work / "bundle" / "wheel").glob("cloudtrain-*.whl"))) == 1
    assert boot.argv == [
        "-m",
        "cloudtrain.jobs.agent",
        "--run-id",
        "boot-run",
        "--role",
        "worker",
        "--index",
        "1",
        "--store-uri",
        boot.store_uri,
        "--work",
        str(boot.work),
    ]
    positions = phase_positions(
        boot.boot_log,
        [
            "start",
            "phase driver: checking",
            "phase driver: done in ",
            "phase python: checking",
            "phase python: done in ",
            "phase bundle: fetching",
            "phase bundle: done in ",
            "phase agent: starting",
        ],
    )
    assert positions == sorted(positions)
    assert "FAILED" not in boot.boot_log
    assert "installing" not in boot.boot_log, "nothing is installed on a ready machine"
    # the log goes up before the agent starts, so a node that dies later still explains its boot,
    # and when the agent exits; the quick phases of a ready machine upload nothing more (each PUT
    # is an HTTPS request on a cloud)
    assert boot.log_puts == 2, boot.log_puts
    assert boot.uploaded_log is not None
    assert "cloudtrain-bootstrap[worker-1]: start" in boot.uploaded_log
    assert parse(boot.uploaded_log).agent_exit == 0, boot.uploaded_log


def test_local_script_refuses_a_bundle_with_the_wrong_sha(tmp_path: Path) -> None:
    boot = boot_local_node(tmp_path, wrong_sha=True)
    assert boot.returncode != 0
    assert boot.argv is None, "the agent must not start"
    assert not (boot.work / "bundle" / "workdir").exists(), "nothing unverified is unpacked"
    assert boot.uploaded_log is not None, "a failed boot uploads its log"
    failed = [line for line in boot.uploaded_log.splitlines() if "]: FAILED: " in line]
    assert len(failed) == 1, boot.uploaded_log
    assert "bundle" in failed[0] and ("sha256" in failed[0] or "checksum" in failed[0]), failed
    positions = phase_positions(
        boot.uploaded_log,
        ["phase driver: checking", "phase python: checking", "phase bundle: fetching", "FAILED"],
    )
    assert positions == sorted(positions)
    # the durations line ends the log: the failed phase counts up to the failure
    last = boot.uploaded_log.splitlines()[-1]
    assert re.search(r"\]: durations driver=\d+s python=\d+s bundle=\d+s$", last), last
