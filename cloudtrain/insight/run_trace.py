"""The controller's trace of one run (issue 20): its top-level phases, back to back from the
CLI's start to the end of the teardown, and their children, each written to the ledger as it
ends (an event of kind `SPAN_EVENT`). The span names: `jobs/trace.py`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cloudtrain.jobs import protocol
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.bucket_reads import TRACE_MAX_BYTES
from cloudtrain.jobs.trace import PhaseClock, Span, TraceDoc, Tracer, process_start

SPAN_EVENT = "span"  # the ledger event kind of a controller span (its message: the span's JSON)


class RunTrace:
    """The controller's spans of run `run_id`, written to `ledger` as each ends (best effort:
    a span the ledger refuses is kept in memory only). Not thread-safe: the orchestrator's main
    thread drives the phases; `tracer.add` (children) is thread-safe."""

    def __init__(self, ledger: Any, run_id: str, start: float | None = None) -> None:
        self.ledger, self.run_id = ledger, run_id
        self.start = process_start() if start is None else start
        self.tracer = Tracer("", on_span=self._write)
        self.phases = PhaseClock(self.tracer, tr.ROOT, self.start)
        self.end: float | None = None
        # held until the run's ledger row exists: input refused before it leaves no row at all
        self._held: list[Span] | None = []
        self._lock = threading.Lock()

    def _write(self, span: Span) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(span)
                return
        with contextlib.suppress(Exception):  # a trace never fails a run
            self.ledger.event(self.run_id, SPAN_EVENT, json.dumps(span.to_dict()))

    def recorded(self) -> None:
        """The run's ledger row exists: write the spans held so far, and each one from now on
        as it ends. Idempotent."""
        with self._lock:
            held, self._held = self._held, None
        for span in held or []:
            self._write(span)

    def phase(self, name: str, attempt: int = 0) -> None:
        """End the current top-level phase now and start `name`."""
        self.phases.next(name, attempt)

    def child(self, name: str, start: float, end: float, parent: str, detail: str = "") -> None:
        """Record a finished child span of the phase `parent`. Thread-safe."""
        self.tracer.add(name, start, end, parent=parent, detail=detail)

    def close(self) -> float:
        """End the last phase and the root span now; returns the end. Idempotent."""
        if self.end is None:
            self.end = self.phases.close()
            self.tracer.add(tr.ROOT, self.start, self.end)
        return self.end

    def spans(self) -> list[Span]:
        """Every controller span so far."""
        return self.tracer.spans()


def read_node_traces(store: Any, run_id: str, nodes: Sequence[str]) -> list[Span]:
    """The spans of `nodes` (node ids) from their trace documents, in parallel (one GET each;
    a node without one, or with an unreadable one, has none). Blocks."""

    def one(node: str) -> list[Span]:
        try:
            body = store.get(protocol.trace_key(run_id, node), max_bytes=TRACE_MAX_BYTES)
            doc = TraceDoc.from_json(body)
        except Exception:  # NotFound, TooLarge, ValueError, any store error: never fails a run
            return []
        return [s for s in doc.spans if s.node == node]

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        return [s for spans in pool.map(one, nodes) for s in spans]
