"""The node's metrics stream: what the training measures of itself and what the agent sees of it
from outside, uploaded as ordered chunks of JSON lines (`metrics/<node>/<seq>.jsonl`; the record
kinds are jobs/protocol.py's METRICS), and the node's latest figures for its heartbeat.

Four sources feed it:
- the training's metrics file ($CLOUDTRAIN_METRICS_FILE; `runtime.callbacks()` appends "epoch" and
  "window" records): tailed by offset, a partial last line waits for its newline;
- Keras' progress lines in the training's output, for a job without the runtime: "keras-log"
  epoch records, kept back until the runtime has had time to show itself (no double counting);
- /proc: the training's process tree ("process" records: CPU, 100 = one core, and memory);
- `nvidia-smi`, when it is on PATH ("gpu" records).

Standard library only (node-side: Python 3.10+).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloudtrain.core.node_text import finite
from cloudtrain.jobs import protocol as proto

LOSSES_KEPT = 32  # the heartbeat's `losses`: the live view's sparkline
# the stream's pace: its readers (the report) need no second-by-second chunks, and a PUT every
# beat would be ~43,000 objects a node a day (the heartbeat carries the live figures); the end of
# the training and a stop flush at once
FLUSH_S = 10.0
KERAS_LOG_HOLD_S = 10.0  # a keras-log record waits this long for the runtime's records to show
MAX_READ_BYTES = 4 * 1024 * 1024  # of the metrics file per flush (the rest waits for the next)
# The metrics file is the job's, so untrusted: a longer line, a deeper record or a number out of
# these bounds is no record (skipped, each kind of problem said once in the node's log)
MAX_RECORD_BYTES = 64 * 1024
MAX_RECORD_DEPTH = 8
MAX_RECORD_INT = 2**63
MAX_KERAS_LINE = 4096  # of a progress line's last `\r` update: Keras' own are under 1 KiB
NVIDIA_SMI = "nvidia-smi"
GPU_QUERY = (
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI_TIMEOUT_S = 5.0
PROC = Path("/proc")


def metrics_seq(key: str) -> int:
    """The sequence number of a metrics chunk key (`.../00000042.jsonl` -> 42; -1 if not one).
    Pure."""
    name = key.rsplit("/", 1)[-1].removesuffix(".jsonl")
    return int(name) if name.isdigit() else -1


# a finite number, else None: a record's field may be anything a newer writer wrote
_num = finite


# the known fields' types (protocol.METRICS); null is allowed for each, unknown fields are free
_NUMBER_FIELDS = frozenset(
    {
        *("time", "epoch", "epochs", "steps", "examples", "seconds", "loss", "step"),
        *("examples_per_s", "steps_per_s", "step_p50_s", "step_p95_s", "last_step_time"),
        *("cpu_percent", "rss_bytes", "processes", "steps_per_epoch", "global_batch", "workers"),
    }
)
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "metrics": dict,
    "source": str,
    "partial": bool,
    "gpus": list,
}


def _wrong_type(record: dict[str, Any]) -> str | None:
    """The first known field of `record` whose value has the wrong type, else None. Pure."""
    for key, value in record.items():
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in _NUMBER_FIELDS and not number:
            return key
        if key in _FIELD_TYPES and not isinstance(value, _FIELD_TYPES[key]):
            return key
    return None


def record_problem(value: Any, depth: int = 0) -> str | None:
    """Why `value` (a parsed line of the metrics file) is no record, else None: not an object,
    no string `kind`, nested deeper than MAX_RECORD_DEPTH, a number that is not finite or an
    int beyond MAX_RECORD_INT, a known field of the wrong type. Pure; recursion bounded by the
    depth."""
    if depth == 0:
        if not (isinstance(value, dict) and isinstance(value.get("kind"), str)):
            return "not a record (an object with a string kind)"
        if _wrong_type(value) is not None:
            return "a field of the wrong type"
    if depth > MAX_RECORD_DEPTH:
        return "nested too deep"
    if isinstance(value, float) and not math.isfinite(value):
        return "a number that is not finite"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_RECORD_INT:
        return "an integer too large"
    if isinstance(value, (dict, list)):
        for child in value.values() if isinstance(value, dict) else value:
            problem = record_problem(child, depth + 1)
            if problem:
                return problem
    return None


# --- Keras' progress lines ------------------------------------------------------------------------
_RANK = re.compile(r"^\[rank (\d+)\] ")  # the agent's prefix of a horovod rank's lines
# numbers are bounded (int() of a 5000-digit string raises ValueError on 3.11+)
_EPOCH = re.compile(r"^Epoch (\d{1,9})/(\d{1,9})$")
_TIME = r"(\d{1,12})(s|ms|us)"
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_LOGS = r"(?P<logs>(?: - [^\s:]+: \S+)*)"
# verbose=1, finalized: "24/24 [====] - 1s 44ms/step - loss: 0.5270 - accuracy: 0.8567"
_VERBOSE1 = re.compile(rf"^(\d{{1,12}})/(\d{{1,12}}) \[=+\] - \d{{1,12}}s {_TIME}/step{_LOGS}$")
# verbose=2: "24/24 - 1s - loss: 0.5270 - accuracy: 0.8567 - 1s/epoch - 44ms/step"
_VERBOSE2 = re.compile(
    rf"^(\d{{1,12}})/(\d{{1,12}}) - \d{{1,12}}s{_LOGS} - {_TIME}/epoch - {_TIME}/step$"
)
_LOG_ITEM = re.compile(r" - ([^\s:]+): (\S+)")


class KerasProgress:
    """Reads tf-keras' progress output line by line (as the agent reads the training's stdout:
    verbose=1's lines hold every `\\r`-separated update, the last one final) and makes a
    "keras-log" epoch record of each epoch's final line after an `Epoch N/M` line. A final
    line without an epoch announced before it (evaluate's, predict's) is ignored, as is a
    horovod rank other than 0. Not thread-safe (MetricsPump locks around it)."""

    def __init__(self) -> None:
        self.epoch: int | None = None  # announced, not yet ended
        self.epochs: int | None = None

    def feed(self, line: str, now: float) -> dict[str, Any] | None:
        """The record of the epoch `line` ends, else None. Not idempotent (it ends the epoch)."""
        rank = _RANK.match(line)
        if rank:
            if rank[1] != "0":
                return None
            line = line[rank.end() :]
        text = line.split("\r")[-1].replace("\b", "").strip()
        if len(text) > MAX_KERAS_LINE:  # no Keras line: not worth a regex's time
            return None
        announced = _EPOCH.match(text)
        if announced:
            self.epoch, self.epochs = int(announced[1]), int(announced[2])
            return None
        if self.epoch is None:
            return None
        m1 = _VERBOSE1.match(text)
        m2 = None if m1 else _VERBOSE2.match(text)
        if m1:
            steps, target, step_s = int(m1[1]), int(m1[2]), int(m1[3]) * _UNITS[m1[4]]
            seconds, logs = steps * step_s, m1["logs"]
        elif m2:
            steps, target, logs = int(m2[1]), int(m2[2]), m2["logs"]
            seconds = int(m2[4]) * _UNITS[m2[5]]
            step_s = int(m2[6]) * _UNITS[m2[7]]
        else:
            return None
        if steps != target:
            return None
        values: dict[str, float] = {}
        for name, raw in _LOG_ITEM.findall(logs):
            with contextlib.suppress(ValueError, OverflowError):
                values[name] = float(raw)
        loss = values.pop("loss", None)
        record = {
            "time": now,
            "kind": "epoch",
            "source": "keras-log",
            "epoch": self.epoch,
            "epochs": self.epochs,
            "steps": steps,
            "seconds": round(seconds, 6),
            "steps_per_s": round(1.0 / step_s, 6) if step_s > 0 else None,
            "step_p50_s": step_s,
            "loss": loss if loss is not None and math.isfinite(loss) else None,
            "metrics": {k: v for k, v in values.items() if math.isfinite(v)},
        }
        self.epoch = None
        return record


# --- the process tree and the GPUs ----------------------------------------------------------------
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_tree(root: int, proc: Path = PROC) -> tuple[int, int, int] | None:
    """(CPU clock ticks used so far, resident bytes, processes) of the tree of `root`: the
    processes of its process group (when `root` leads one) and of `root` itself, and their
    descendants. The ticks are user + system, reaped children's included, so a child that ended
    since the last sample still counts. None when `root` is gone (or a zombie: the training
    has ended) or /proc is unreadable. Blocking (reads /proc); pure otherwise."""
    stats: dict[int, tuple[int, int, int, int]] = {}  # pid -> (ppid, pgid, ticks, rss pages)
    ended = False
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            raw = (proc / entry / "stat").read_text()
            f = raw[raw.rindex(")") + 2 :].split()
            stats[int(entry)] = (int(f[1]), int(f[2]), sum(int(x) for x in f[11:15]), int(f[21]))
            ended = ended or (int(entry) == root and f[0] == "Z")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or unreadable
    if root not in stats or ended:
        return None
    members = {pid for pid, s in stats.items() if s[1] == root} | {root}
    children: dict[int, list[int]] = {}
    for pid, s in stats.items():
        children.setdefault(s[0], []).append(pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members:
                members.add(child)
                todo.append(child)
    ticks = sum(stats[p][2] for p in members)
    return ticks, sum(stats[p][3] for p in members) * _PAGE, len(members)


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """nvidia-smi's `index, utilization.gpu, memory.used, memory.total` CSV (noheader, nounits)
    as the "gpu" record's list; a field it cannot give (`[N/A]`) is None. Raises ValueError for
    anything else. Pure."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [x.strip() for x in line.split(",")]
        if len(fields) != 4:
            raise ValueError(f"not nvidia-smi's CSV: {line!r}")
        values = [None if x.startswith("[") else float(x) for x in fields]
        index, util, used, total = values
        if index is None:
            raise ValueError(f"no GPU index: {line!r}")
        gpus.append(
            {
                "index": int(index),
                "util_percent": util,
                "mem_used_mib": used,
                "mem_total_mib": total,
            }
        )
    return gpus


def query_gpus(exe: str, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[dict[str, Any]]:
    """The GPUs as `exe` (nvidia-smi) reports them now. Blocking (at most `timeout_s`); raises
    OSError, subprocess.SubprocessError or ValueError when it fails."""
    out = subprocess.run(
        [exe, *GPU_QUERY],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return parse_gpus(out.stdout)


# --- the pump -------------------------------------------------------------------------------------
class MetricsPump:
    """The node's metrics stream and latest figures. Thread-safe: the agent's output pumps call
    `log_line`, its main loop `flush`, `sample` and `summary`.

    `path` is the training's metrics file ($CLOUDTRAIN_METRICS_FILE). The chunks go to
    `metrics/<node>/<seq>.jsonl`, numbered on from the bucket's last (an agent restarted on the
    node continues the sequence; a file it finds is taken as already read). `say` puts a line
    in the node's log (a failing nvidia-smi is said once)."""

    def __init__(
        self,
        store: Any,
        run_id: str,
        node: str,
        path: Path,
        *,
        say: Callable[[str], None] | None = None,
        hold_s: float = KERAS_LOG_HOLD_S,
    ) -> None:
        self.store, self.run_id, self.node, self.path = store, run_id, node, path
        self.hold_s = hold_s
        prefix = proto.metrics_prefix(run_id, node)
        self.seq = 1 + max((metrics_seq(o.key) for o in store.list(prefix)), default=-1)
        self._say = say or (lambda _message: None)
        self._lock = threading.Lock()
        self._out: list[str] = []  # the lines of the next chunk
        self._gpu_failed = False
        self._said: set[str] = set()  # the kinds of bad input said in the log already
        self._skipping = False  # inside a line longer than a read: dropped to its newline
        self._reset()
        with contextlib.suppress(OSError):
            self._offset = path.stat().st_size

    def _reset(self) -> None:
        """The per-attempt state (a new attempt's training is a new process)."""
        self._offset = 0
        self._runtime = False  # the training writes the metrics file: no keras-log records
        self.first_step_at: float | None = None  # the attempt's first train step's end
        self.last_step_at: float | None = None  # and its last's (the run's trace)
        self._keras = KerasProgress()
        self._held: list[dict[str, Any]] = []  # keras-log records waiting out hold_s
        self._epoch: dict[str, Any] | None = None
        self._epoch_seconds: float | None = None  # the last whole (not `partial`) epoch's
        self._window: dict[str, Any] | None = None
        self._info: dict[str, Any] = {}  # steps_per_epoch, global_batch, workers
        self._examples: float | None = None
        self._losses: deque[float] = deque(maxlen=LOSSES_KEPT)
        self._process: dict[str, Any] | None = None
        self._gpu: dict[str, Any] | None = None
        self._cpu_last: tuple[int, float, int] | None = None  # (root, monotonic, ticks)

    def new_attempt(self) -> None:
        """Start a new attempt: what the last training wrote is read (it goes in the next
        chunk), its metrics file is removed, and the figures start again. Blocking (file I/O);
        idempotent."""
        with self._lock:
            self._read_file()
            self._release_held(time.time(), everything=True)
            self._reset()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def log_line(self, line: str, now: float | None = None) -> None:
        """Feed one line of the training's output to the Keras progress parser. Cheap; a line
        it cannot read is skipped (said once), never raised."""
        with self._lock:
            if self._runtime:
                return
            try:
                record = self._keras.feed(line, time.time() if now is None else now)
            except (ValueError, ArithmeticError) as exc:  # the output is untrusted: skipped
                self._warn_once(f"a progress line skipped ({type(exc).__name__})")
                return
            if record is not None:
                self._held.append(record)

    def refresh(self, now: float | None = None) -> None:
        """Read what the training appended and release the keras-log records that waited long
        enough, for `summary()`, without uploading (`flush` does, at its own pace). Reads the
        local file only."""
        now = time.time() if now is None else now
        with self._lock:
            self._read_file()
            self._release_held(now, everything=False)

    def flush(self, now: float | None = None, *, final: bool = False) -> int:
        """Read what the training appended, release the keras-log records that waited long
        enough (all of them when `final`: the training has ended), and upload every new record
        as the next chunk. Returns the records uploaded. Blocking (one PUT at most); safe to
        call often."""
        now = time.time() if now is None else now
        with self._lock:
            self._read_file()
            self._release_held(now, everything=final)
            lines, self._out = self._out, []
            seq = self.seq
            if lines:
                self.seq += 1
        if lines:
            data = ("\n".join(lines) + "\n").encode()
            self.store.put(proto.metrics_chunk_key(self.run_id, self.node, seq), data)
        return len(lines)

    def sample(self, pid: int | None, now: float | None = None) -> None:
        """A "process" record of the training's tree rooted at `pid` (its CPU over the time since
        the last sample of the same root: none on the first) and, with nvidia-smi on PATH, a
        "gpu" record. Nothing without a training. Blocking: reads /proc, runs nvidia-smi (at
        most NVIDIA_SMI_TIMEOUT_S)."""
        if pid is None:
            return
        now = time.time() if now is None else now
        tree, mono = process_tree(pid), time.monotonic()
        gpus = self._query_gpus()
        with self._lock:
            if tree is not None:
                ticks, rss, count = tree
                cpu = None
                last = self._cpu_last
                if last is not None and last[0] == pid and mono > last[1]:
                    used = max(0, ticks - last[2]) / _TICKS_PER_S
                    cpu = round(100.0 * used / (mono - last[1]), 1)
                self._cpu_last = (pid, mono, ticks)
                record = {"time": now, "kind": "process", "cpu_percent": cpu, "rss_bytes": rss}
                self._emit({**record, "processes": count})
            if gpus is not None:
                self._emit({"time": now, "kind": "gpu", "gpus": gpus})

    def _query_gpus(self) -> list[dict[str, Any]] | None:
        exe = shutil.which(NVIDIA_SMI)
        if exe is None:
            return None
        try:
            return query_gpus(exe)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            if not self._gpu_failed:
                self._gpu_failed = True
                self._say(f"nvidia-smi failed, GPU samples skipped: {str(exc)[:200]}")
            return None

    def summary(self) -> dict[str, Any]:
        """The node's latest figures (HEARTBEAT_METRICS' keys, only those known): the rates of
        the newer of the last window and the last epoch, the last whole epoch's duration (not
        a `partial` one's), the last loss and the last LOSSES_KEPT, the latest CPU, memory and
        GPU samples (the GPUs' mean use and their memory in use, summed). Non-blocking; changes
        nothing."""
        with self._lock:
            out: dict[str, Any] = {}
            epoch, window = self._epoch or {}, self._window or {}
            newer = (
                window if (_num(window.get("time")) or 0) >= (_num(epoch.get("time")) or 0) else {}
            )
            rates = newer or epoch
            for key in ("examples_per_s", "steps_per_s", "step_p50_s", "step_p95_s"):
                out[key] = _num(rates.get(key))
            out["epoch_seconds"] = self._epoch_seconds
            out["loss"] = _num(epoch.get("loss"))
            out.update(self._info)
            out["examples"] = self._examples_so_far()
            out["losses"] = list(self._losses) or None
            if self._process:
                out["cpu_percent"] = _num(self._process.get("cpu_percent"))
                rss = _num(self._process.get("rss_bytes"))
                out["rss_bytes"] = int(rss) if rss is not None else None
            gpus = (self._gpu or {}).get("gpus") or []
            utils = [u for u in (_num(g.get("util_percent")) for g in gpus) if u is not None]
            used = [m for m in (_num(g.get("mem_used_mib")) for g in gpus) if m is not None]
            out["gpu_util_percent"] = sum(utils) / len(utils) if utils else None
            out["gpu_mem_used_mib"] = sum(used) if used else None
            out["source"] = epoch.get("source") or ("runtime" if self._runtime else None)
            return {k: v for k, v in out.items() if v is not None}

    # --- under the lock -----------------------------------------------------------------------
    def _examples_so_far(self) -> float | None:
        """The finished epochs' examples and the current epoch's steps times this node's share
        of the batch (the last window's step)."""
        done = self._examples
        window, epoch = self._window or {}, self._epoch or {}
        step, batch = _num(window.get("step")), _num(self._info.get("global_batch"))
        workers = _num(self._info.get("workers")) or 1.0
        ended = _num(epoch.get("epoch")) or 0.0
        if step is not None and batch and (_num(window.get("epoch")) or 0.0) > ended:
            return (done or 0.0) + step * batch / workers
        return done

    def _read_file(self) -> None:
        """Take the complete lines the training appended since the last read."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:  # replaced by a shorter file: read it from its start
                    self._offset = 0
                f.seek(self._offset)
                data = f.read(MAX_READ_BYTES)
        except OSError:
            return
        self._runtime = True  # the training writes its own records
        self._held.clear()
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) == MAX_READ_BYTES:  # a line longer than that is no record: skipped
                self._offset += len(data)
                self._skipping = True  # to its newline, in a later read
            return
        self._offset += end + 1
        lines = data[:end].split(b"\n")
        if self._skipping:  # the end of a line too long to be a record
            self._skipping = False
            lines = lines[1:]
            self._warn_once("a line too long skipped")
        for raw in lines:
            parsed = self._parse(raw)
            if parsed is not None:
                self._emit(*parsed)

    def _parse(self, raw: bytes) -> tuple[dict[str, Any], str] | None:
        """The record on the line `raw` and its text, else None (said once per kind of
        problem)."""
        if len(raw) > MAX_RECORD_BYTES:
            self._warn_once("a line too long skipped")
            return None
        if not raw.strip():
            return None
        try:
            text = raw.decode().strip()
            record = json.loads(text)
        except (ValueError, RecursionError):  # a torn or foreign line, or nested too deep
            self._warn_once("a line that is not JSON skipped")
            return None
        problem = record_problem(record)
        if problem is not None:
            self._warn_once(f"a line skipped: {problem}")
            return None
        return record, text

    def _warn_once(self, what: str) -> None:
        if what not in self._said:
            self._said.add(what)
            self._say(f"metrics file: {what} (further ones are not said)")

    def _release_held(self, now: float, everything: bool) -> None:
        while self._held and (everything or now - self._held[0]["time"] >= self.hold_s):
            self._emit(self._held.pop(0))

    def _emit(self, record: dict[str, Any], line: str | None = None) -> None:
        """Stream `record` (as `line` when it came as one) and update the figures."""
        self._out.append(line if line is not None else json.dumps(record))
        kind = record["kind"]
        for key in ("steps_per_epoch", "global_batch", "workers"):
            if _num(record.get(key)) is not None:
                self._info[key] = record[key]
        if kind == "epoch":
            self._epoch = record
            if not record.get("partial"):  # an epoch cut short (CLOUDTRAIN_MAX_STEPS) is not one
                self._epoch_seconds = _num(record.get("seconds"))
            examples = _num(record.get("examples"))
            if examples is not None:
                self._examples = (self._examples or 0.0) + examples
            loss = _num(record.get("loss"))
            if loss is not None:
                self._losses.append(loss)
            if record.get("source") == "keras-log" and _num(record.get("steps")):
                self._info["steps_per_epoch"] = record["steps"]
        elif kind == "window":
            self._window = record
        elif kind == "first_step" and self.first_step_at is None:
            self.first_step_at = _num(record.get("time"))
        elif kind == "train_end":
            self.last_step_at = _num(record.get("last_step_time"))
        elif kind == "process":
            self._process = record
        elif kind == "gpu":
            self._gpu = record
