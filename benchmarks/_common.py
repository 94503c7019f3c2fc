"""Shared helpers for the benchmark scripts: a throw-away CLOUDTRAIN_HOME, result lines, cleanup.

Every benchmark runs inside `bench_home()`: it points `$CLOUDTRAIN_HOME` at a fresh temp folder
(inherited by every process the benchmark starts), and on exit finds any process still carrying
that value in its environment, kills it (SIGTERM, then SIGKILL, by pid) and reports it, then
removes the folder. `result()` prints the one line per figure that `run_all.py` parses:

    help_wall_s median=0.21 (n=10, target <= 0.25) PASS

and `figure()` a supporting one without a target (`plain_run_wall_s median=22.10 (n=3)`).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "jobs" / "examples"
HOME_ENV = "CLOUDTRAIN_HOME"

# top-level modules that must never load on the CLI's light paths (--help, plan)
HEAVY_PREFIXES: tuple[str, ...] = (
    "tensorflow",
    "tf_keras",
    "keras",
    "boto3",
    "botocore",
    "google.cloud",
    "google.api_core",
    "azure",
)

_OPS = {"<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t, "==": lambda v, t: v == t}


def result(
    figure: str,
    value: float,
    target: float,
    *,
    op: str = "<=",
    stat: str = "median",
    n: int | None = None,
    digits: int = 2,
) -> bool:
    """Print the figure's result line (the format run_all.py parses); return whether it passes."""
    ok = _OPS[op](value, target)
    count = f"n={n}, " if n is not None else ""
    shown = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    tgt = f"{target:g}"
    print(f"{figure} {stat}={shown} ({count}target {op} {tgt}) {'PASS' if ok else 'FAIL'}")
    sys.stdout.flush()
    return ok


def figure(name: str, value: float, *, stat: str = "median", n: int | None = None) -> None:
    """Print a supporting figure without a target (run_all.py lists it with target "-")."""
    count = f" (n={n})" if n is not None else ""
    print(f"{name} {stat}={value:.2f}{count}", flush=True)


def info(message: str) -> None:
    """Print a supporting line (not a figure)."""
    print(f"  {message}", flush=True)


def cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def median(values: Sequence[float]) -> float:
    """The median of `values`."""
    return float(statistics.median(values))


def console_script(name: str = "cloudtrain") -> Path:
    """The console script pip installed next to this interpreter (not a pyenv shim on PATH)."""
    path = Path(sysconfig.get_path("scripts")) / name
    if path.exists():
        return path
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"{name} is not installed (pip install -e .)")
    return Path(found)


def cli_env(tmp: Path) -> dict[str, str]:
    """The environment for timing CLI runs as a user's shell has it: bytecode caching on (this
    sandbox sets PYTHONDONTWRITEBYTECODE=1), with the cache under `tmp` so that nothing is
    written into the repository or site-packages. The first (warm-up) run fills the cache."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    return env


def timed_run(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run `cmd` (output discarded, must exit 0); return (wall seconds, CPU seconds user+sys).

    The CPU time barely changes when other work competes for the cores; the wall time does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def timed_runs(
    cmd: Sequence[str], repeat: int, env: dict[str, str] | None = None, warmup: int = 1
) -> tuple[list[float], list[float]]:
    """`timed_run` `repeat` times after `warmup` untimed runs: (wall times, CPU times)."""
    walls: list[float] = []
    cpus_: list[float] = []
    for i in range(warmup + repeat):
        wall, cpu = timed_run(cmd, env)
        if i >= warmup:
            walls.append(wall)
            cpus_.append(cpu)
    return walls, cpus_


MULTIWORKER_JOB = """\
name: {name}
cluster:
  strategy: multi_worker_mirrored
  workers: 2
workdir: {workdir}
entrypoint: {entrypoint}
max_hours: 0.5
"""


def write_job(path: Path, name: str, epochs: int, entrypoint: str | None = None) -> Path:
    """Write a job.yaml running the digits-multiworker example (2 workers) for `epochs`
    (`entrypoint`, if given, replaces `python train.py --epochs <epochs>`)."""
    workdir = EXAMPLES / "digits-multiworker"
    command = entrypoint or f"python train.py --epochs {epochs}"
    path.write_text(MULTIWORKER_JOB.format(name=name, workdir=workdir, entrypoint=command))
    return path


def cloudtrain_run(job: Path, log: Path) -> tuple[float, dict[str, Any]]:
    """`cloudtrain run job --json`: (wall seconds, the JSON result). Raises on failure."""
    t0 = time.perf_counter()
    with log.open("ab") as err:
        proc = subprocess.run(
            [str(console_script()), "run", str(job), "--json"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )
    wall = time.perf_counter() - t0
    data = parse_json_result(proc.stdout)
    if proc.returncode != 0 or data.get("outcome") != "succeeded":
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(
            f"cloudtrain run failed (exit {proc.returncode}): {data or proc.stdout[-2000:]!r}\n"
            f"stderr tail:\n{tail}"
        )
    stray = stdout_noise(proc.stdout)
    if stray and not _warned_noise:
        _warned_noise.append(stray)
        info(f"note: `cloudtrain run --json` printed {stray} non-JSON line(s) to stdout first")
    return wall, data


_warned_noise: list[int] = []


def stdout_noise(stdout: bytes) -> int:
    """How many lines precede the JSON document in `cloudtrain run --json`'s stdout."""
    text = stdout.decode(errors="replace")
    return text[: text.rfind("\n{") + 1].count("\n")


def parse_json_result(stdout: bytes) -> dict[str, Any]:
    """The RunResult JSON object `cloudtrain run --json` prints: the last object that starts a
    line (event lines the observer may print to the same stream come before it)."""
    text = stdout.decode(errors="replace")
    try:
        data = json.loads(text[text.rfind("\n{") + 1 :])
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def cloudtrain_status(run_id: str, log: Path) -> dict[str, Any]:
    """`cloudtrain status RUN --json` of a run in this CLOUDTRAIN_HOME: its JSON object, or {}
    when it fails or prints something else (the caller says so). Blocks; reads only."""
    with log.open("ab") as err:
        proc = subprocess.run(
            [str(console_script()), "status", run_id, "--json"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {}
    return data if proc.returncode == 0 and isinstance(data, dict) else {}


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback TCP ports (held together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def run_by_hand(work: Path, example: Path, argv: Sequence[str], workers: int) -> float:
    """Launch a MultiWorkerMirrored job as a user would without cloudtrain: copy `example` to
    `work/code`, then start `argv` (e.g. python train.py --epochs 4) once per worker there with
    a hand-written TF_CONFIG on free loopback ports, TF_USE_LEGACY_KERAS=1, PYTHONUNBUFFERED=1,
    TF_CPP_MIN_LOG_LEVEL defaulting to 1 (as the agent does) and per-worker
    CLOUDTRAIN_CHECKPOINT_DIR/CLOUDTRAIN_MODEL_DIR; output to work/worker-<i>.log. Blocks until
    every worker exits (killed after 600 s). Returns the wall seconds from the first spawn to
    the last exit; SystemExit if any worker failed."""
    code = work / "code"
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(example, code)
    addresses = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    command = [sys.executable if a == "python" else a for a in argv]
    procs: list[subprocess.Popen[bytes]] = []
    codes: list[int] = []
    t0 = time.perf_counter()
    try:
        for i in range(workers):
            tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
            env = dict(os.environ)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
            env.update(
                TF_CONFIG=json.dumps(tf_config),
                TF_USE_LEGACY_KERAS="1",
                PYTHONUNBUFFERED="1",
                CLOUDTRAIN_CHECKPOINT_DIR=str(work / f"worker-{i}" / "checkpoints"),
                CLOUDTRAIN_MODEL_DIR=str(work / f"worker-{i}" / "model"),
            )
            with (work / f"worker-{i}.log").open("ab") as log:
                procs.append(
                    subprocess.Popen(
                        command,
                        cwd=code,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        codes = [p.wait(timeout=600) for p in procs]
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if any(codes):
        raise SystemExit(f"hand-launched run failed: exit codes {codes}; see {work}/worker-*.log")
    return wall


def heavy_modules(names: Sequence[str]) -> list[str]:
    """The module names in `names` that belong to a heavy package (TF, a cloud SDK)."""
    return sorted({m for m in names for p in HEAVY_PREFIXES if m == p or m.startswith(p + ".")})


def parse_importtime(stderr: str) -> list[tuple[str, int, int, int]]:
    """`python -X importtime` output -> [(module, self_us, cumulative_us, depth)] in import
    order; depth 0 is an import made by the program itself rather than by another module."""
    rows: list[tuple[str, int, int, int]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3:
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        with contextlib.suppress(ValueError):
            rows.append((name.strip(), int(parts[0]), int(parts[1]), depth))
    return rows


def slowest_imports(rows: list[tuple[str, int, int, int]], k: int = 6) -> str:
    """The `k` costliest imports the program made itself (depth 0), cumulative ms."""
    top = sorted((r for r in rows if r[3] == 0), key=lambda r: -r[2])[:k]
    return ", ".join(f"{r[0]} {r[2] / 1000:.0f} ms" for r in top)


def _pids_with_env(key: str, value: str) -> list[int]:
    """Pids of live processes (other than this one) whose environment has key=value."""
    needle = f"{key}={value}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].startswith("Z"):
            continue  # a zombie holds nothing; its parent reaps it
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def _kill(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(0.5)


@contextlib.contextmanager
def bench_home(name: str) -> Iterator[Path]:
    """A fresh temp folder with `$CLOUDTRAIN_HOME` = `<folder>/home` for the block's duration.

    On exit: kills and reports any process left holding that home (by pid), restores the
    environment and deletes the folder. Exits with status 1 if anything was left behind.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f"ct-bench-{name}-"))
    home = tmp / "home"
    home.mkdir()
    old = os.environ.get(HOME_ENV)
    os.environ[HOME_ENV] = str(home)
    leftovers: list[int] = []
    load = os.getloadavg()[0]
    busy = " (busy: other work competes, figures are pessimistic)" if load > cpus() else ""
    info(f"load average {load:.2f} on {cpus()} CPU(s){busy}")
    try:
        yield tmp
    finally:
        for _ in range(10):  # the last deleted processes may still be exiting
            leftovers = _pids_with_env(HOME_ENV, str(home))
            if not leftovers:
                break
            time.sleep(0.2)
        if leftovers:
            _kill(leftovers)
        if old is None:
            os.environ.pop(HOME_ENV, None)
        else:
            os.environ[HOME_ENV] = old
        shutil.rmtree(tmp, ignore_errors=True)
    if leftovers:
        print(f"cleanup: FAILED, killed {len(leftovers)} leftover process(es): {leftovers}")
        sys.exit(1)
    info("cleanup: temp home removed, no process left behind")


def import_report(cmd: Sequence[str], env: dict[str, str], what: str) -> list[str]:
    """Run `cmd` (a script and its arguments) under `python -X importtime`, print the import
    cost, and return the heavy modules it loaded. Raises SystemExit if the command fails."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed: {proc.stderr[-2000:]}")
    rows = parse_importtime(proc.stderr)
    total_ms = sum(r[1] for r in rows) / 1000
    info(f"imports of {what}: {len(rows)} modules, {total_ms:.0f} ms (self time sum)")
    info(f"slowest imports (cumulative): {slowest_imports(rows)}")
    return heavy_modules([r[0] for r in rows])
