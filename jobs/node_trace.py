"""The agent's side of the run's trace (jobs/trace.py): its spans, the startup script's, and the
node's trace document in the bucket (`protocol.trace_key`), rewritten whole at a few moments
(the training's launch, the final status, a stop, an error): never per poll.

The startup script hands over its times in the environment: CT_BOOT_START (its start,
`$EPOCHREALTIME`) and CT_AGENT_LAUNCH (just before it started this Python), and its phases in
`$CT_WORK/trace.tsv` (`trace.read_boot_trace`). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs import trace as tr

BOOT_START_ENV = "CT_BOOT_START"
AGENT_LAUNCH_ENV = "CT_AGENT_LAUNCH"
BOOT_TRACE_FILE = "trace.tsv"


def _env_time(name: str) -> float | None:
    try:
        value = float(os.environ.get(name, "").replace(",", "."))
    except ValueError:
        return None
    return value if value > 0 else None


class NodeTrace:
    """Mixin for the Agent: `self.run_id`, `self.me`, `self.store`, `self.work` and
    `self.attempt` are the agent's."""

    run_id: str
    me: str
    store: Any
    work: Path
    attempt: int

    def _init_trace(self) -> None:
        self.trace = tr.Tracer(self.me)
        self._trained = (0.0, 0.0)  # the current attempt's training: launched, exited
        launched = _env_time(AGENT_LAUNCH_ENV) or tr.process_start()
        self._trace_agent_launch = launched
        boot = [s for s in tr.read_boot_trace(self.work / BOOT_TRACE_FILE, self.me) if s.name]
        boot_start = _env_time(BOOT_START_ENV)
        starts = [s.start for s in boot] + ([boot_start] if boot_start else [])
        # the boot's first start: a boot a reboot cut short left its phases in the file too
        self._trace_start = min([*starts, launched])
        self.trace.extend(boot)
        if starts:
            self.trace.add(tr.BOOT, self._trace_start, launched, parent=tr.NODE)

    def agent_up(self) -> None:
        """The agent is up (its first status is written): the "agent start" span ends."""
        self.trace.add(tr.AGENT_START, self._trace_agent_launch, time.time(), parent=tr.NODE)

    @contextlib.contextmanager
    def traced(self, name: str, detail: str = "") -> Iterator[None]:
        """Record the `with` body as span `name` of the node, in the current attempt."""
        with self.trace.span(name, parent=tr.NODE, attempt=self.attempt, detail=detail):
            yield

    def trace_steps(
        self, launched: float, exited: float, first: float | None, last: float | None
    ) -> None:
        """The training's first and last train steps, as its runtime reported them (none for a
        job without `runtime.callbacks`): "first step" from the launch to the first step's end
        (imports, data, the tf.function's tracing), "after last step" from the last step's end
        to the exit (saving the model)."""
        if first is not None and launched <= first <= exited:
            self.trace.add(tr.FIRST_STEP, launched, first, parent=tr.NODE, attempt=self.attempt)
        if last is not None and launched <= last <= exited:
            self.trace.add(tr.LAST_STEP, last, exited, parent=tr.NODE, attempt=self.attempt)

    def publish_trace(self) -> None:
        """Rewrite the node's trace document: every span so far, under a "node" span from the
        boot's start to now. One PUT; best effort (a trace never fails a run). Blocks."""
        spans = self.trace.spans()
        root = tr.Span(tr.NODE, self._trace_start, time.time(), self.me, 0, tr.ROOT)
        doc = tr.TraceDoc((root, *spans))
        with contextlib.suppress(Exception):
            self.store.put(proto.trace_key(self.run_id, self.me), doc.to_json().encode())
