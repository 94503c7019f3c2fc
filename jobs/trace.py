"""Spans: where a run's time goes, as the controller and every agent record it.

A span is a named interval `[start, end]` in unix seconds (`time.time()`; the nodes' clocks are
their clouds' NTP-synced ones, on local the one clock). Who recorded it:
- `node` "" is the controller. It keeps its spans in the ledger (events of kind "span"). Its
  top-level spans (parent "run") follow each other without a gap: together they are the run, from
  the CLI's start to the end of the teardown.
- any other `node` is a node id ("worker-0"). Its agent keeps its spans in the run's bucket,
  `trace/<node>.json` (`protocol.trace_key`), a `TraceDoc` it rewrites as spans end. The spans of
  the node's boot before the agent ran are the startup script's, read from `$CT_WORK/trace.tsv`
  (`read_boot_trace`).

`parent` names the enclosing span of the same recorder ("run" for the controller's top level;
"node" for a node's). `attempt` is 0 where no attempt applies. `detail` says more (a resource id,
an exit code). The names a reader relies on are the constants below.

Standard library only (this module runs on the nodes' Pythons, 3.10 to 3.12).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = "run"  # the controller's root span: the CLI's start to the teardown's end
NODE = "node"  # a node's root span: its startup script's start to the agent's exit
# the controller's top level, in order (each the parent of its per-item spans)
STARTUP, BUNDLE, BUCKET, PROVISION, CREATE, WATCH, END, STOP, TEARDOWN = (
    "startup",  # process start to the orchestrator's start: imports, spec, plan
    "bundle",
    "bucket",
    "provision",  # lease, bundle upload, cluster document, network
    "create",  # every node's create call (children: "create <node>")
    "watch",  # the watch loop of one attempt (attempt set)
    "end",  # the chief's end seen, the others' final reports (settle)
    "stop",  # a graceful stop
    "teardown",  # children: "delete <resource>"
)
# a node's spans (under NODE), in order; boot phases come from the startup script
BOOT = "boot"  # the startup script to the agent's start (children: the script's phases)
AGENT_START = "agent start"  # the agent's process start to its first status
RESTORE = "restore"
REGISTER = "register"  # the registration PUT
RENDEZVOUS = "rendezvous"  # registered to the complete cluster (attempt set)
PEERS = "peers"  # every peer answers at TCP level
SETUP = "setup"
TRAINING = "training"  # the entrypoint's launch to its exit (attempt set)
FIRST_STEP = "first step"  # the entrypoint's launch to its first train step's end
LAST_STEP = "after last step"  # the last train step's end to the entrypoint's exit
FINISH = "finish"  # final sync, model upload, final flushes and status


@dataclass(frozen=True)
class Span:
    """One named interval of a run's time (see the module docstring)."""

    name: str
    start: float
    end: float
    node: str = ""
    attempt: int = 0
    parent: str = ""
    detail: str = ""

    @property
    def seconds(self) -> float:
        """The span's length (never negative). Pure."""
        return max(0.0, self.end - self.start)

    def to_dict(self) -> dict[str, object]:
        """The JSON form (every field). Pure."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Span:
        """A span from its JSON form. Raises ValueError for anything else. Pure."""
        if not isinstance(data, dict):
            raise ValueError("a span must be an object")
        try:
            name, start, end = data["name"], data["start"], data["end"]
        except KeyError as exc:
            raise ValueError(f"a span without {exc.args[0]!r}") from None
        if not isinstance(name, str) or not name:
            raise ValueError("a span's name must be a non-empty string")
        for value in (start, end):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"span {name!r}: start and end must be numbers")
        attempt = data.get("attempt", 0)
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            raise ValueError(f"span {name!r}: attempt must be an integer")
        text = {k: data.get(k, "") for k in ("node", "parent", "detail")}
        if not all(isinstance(v, str) for v in text.values()):
            raise ValueError(f"span {name!r}: node, parent and detail must be strings")
        return cls(name, float(start), float(end), attempt=attempt, **text)


class Tracer:
    """Collects the spans of one recorder (`node`: "" for the controller). Thread-safe.
    `on_span` (optional) is called with each span as it is recorded, outside the lock."""

    def __init__(self, node: str = "", on_span: Callable[[Span], None] | None = None) -> None:
        self.node = node
        self.on_span = on_span
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def add(
        self,
        name: str,
        start: float,
        end: float,
        *,
        parent: str = "",
        attempt: int = 0,
        detail: str = "",
    ) -> Span:
        """Record a span that has ended. Returns it. Not idempotent (each call adds one)."""
        span = Span(name, start, max(start, end), self.node, attempt, parent, detail)
        with self._lock:
            self._spans.append(span)
        if self.on_span is not None:
            self.on_span(span)
        return span

    @contextlib.contextmanager
    def span(
        self, name: str, *, parent: str = "", attempt: int = 0, detail: str = ""
    ) -> Iterator[None]:
        """Record the time of the `with` body as a span, also when it raises."""
        start = time.time()
        try:
            yield
        finally:
            self.add(name, start, time.time(), parent=parent, attempt=attempt, detail=detail)

    def extend(self, spans: list[Span]) -> None:
        """Record spans made elsewhere (the startup script's), as they are. Not idempotent."""
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[Span]:
        """A copy of every span recorded so far, in recording order."""
        with self._lock:
            return list(self._spans)


class PhaseClock:
    """A recorder's top level as back-to-back phases: `next(name)` ends the current phase and
    starts `name` at the same instant, so the phases tile the time without a gap. Thread-safe
    enough for one thread to drive it (the controller's main thread)."""

    def __init__(self, tracer: Tracer, parent: str, start: float) -> None:
        self.tracer, self.parent = tracer, parent
        self._name: str | None = None
        self._attempt = 0
        self._start = start

    @property
    def current(self) -> str | None:
        """The phase in progress (None before the first and after `close`)."""
        return self._name

    def next(self, name: str, attempt: int = 0, at: float | None = None) -> None:
        """End the current phase (if any) now (or at `at`) and start `name`."""
        now = time.time() if at is None else at
        if self._name is not None:
            self.tracer.add(self._name, self._start, now, parent=self.parent, attempt=self._attempt)
        self._name, self._attempt, self._start = name, attempt, now

    def close(self, at: float | None = None) -> float:
        """End the current phase; returns the end time. Idempotent."""
        now = time.time() if at is None else at
        if self._name is not None:
            self.tracer.add(self._name, self._start, now, parent=self.parent, attempt=self._attempt)
            self._name = None
        return now


@dataclass(frozen=True)
class TraceDoc:
    """trace/<node>.json: every span a node's agent recorded (and its startup script's)."""

    spans: tuple[Span, ...] = ()

    def to_json(self) -> str:
        """The document's bytes' text. Pure."""
        return json.dumps({"spans": [s.to_dict() for s in self.spans]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TraceDoc:
        """Parse a document. Raises ValueError for one that is not a trace. Pure."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("spans"), list):
            raise ValueError("a trace document is an object with a list of spans")
        return cls(tuple(Span.from_dict(s) for s in data["spans"]))


def read_boot_trace(path: Path, node: str) -> list[Span]:
    """The startup script's spans from its trace file: one `name<TAB>start<TAB>end[<TAB>parent]`
    line per ended phase or step (start and end as `$EPOCHREALTIME`). Lines that do not parse
    (a boot cut short mid-line) are skipped; a missing file is no spans. Reads the file."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    spans = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) not in (3, 4) or not fields[0]:
            continue
        try:
            start, end = float(fields[1].replace(",", ".")), float(fields[2].replace(",", "."))
        except ValueError:
            continue
        parent = fields[3] if len(fields) == 4 else BOOT
        spans.append(Span(fields[0], start, max(start, end), node, 0, parent))
    return spans


def process_start() -> float:
    """This process's start as a unix time, to about 10 ms (Linux: its start in clock ticks
    after the boot against /proc/uptime, read now), so a trace counts the interpreter's start
    and the imports; elsewhere, now."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as uptime:
            up = float(uptime.read().split()[0])
        now = time.time()
        start = now - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()
    return start if now - 3600 < start <= now else now
