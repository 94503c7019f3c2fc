"""A run's trace read as a whole: the controller's spans and its nodes', their breakdown into the
phases a user reads ("boot 0.4 s, rendezvous 0.2 s, training 12.6 s, end + teardown 0.3 s"),
how much of the run they cover, and whether they nest. Pure, except `load_spans` (reads the
ledger and the bucket). The spans and their names: `jobs/trace.py`.

The breakdown tiles the run by instants taken from the spans, each clipped to be no earlier than
the one before, so its phases add up to the run's wall time:

| phase | from | to |
|---|---|---|
| start | the CLI's start | the first create call |
| create | the first create call | the last create call's return |
| boot | that return | the last node's agent up (its "agent start" ends) |
| agent | that | the last registration of the first attempt |
| rendezvous | that | the last node's cluster complete (+ its peers answering) |
| setup | that | the last node's entrypoint launch |
| training | that | the last node's entrypoint exit (with the chief's, in its last attempt) |
| end detection | that | the end of the controller's "end" phase (every final report seen) |
| teardown | that | the run's end (a stop, the teardown) |

A phase whose spans are missing (a run that failed early, a node that never booted) keeps its
start instant: it is 0 s, and the time goes to the next phase that has an end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.core.node_text import figure, finite
from cloudtrain.insight.run_trace import SPAN_EVENT, read_node_traces
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.protocol import load_json
from cloudtrain.jobs.trace import Span

PHASES = (
    "start",
    "create",
    "boot",
    "agent",
    "rendezvous",
    "setup",
    "training",
    "end detection",
    "teardown",
)


@dataclass(frozen=True)
class Phase:
    """One row of the breakdown."""

    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def controller_spans(events: Iterable[Any]) -> list[Span]:
    """The controller's spans from the run's ledger events (rows with `kind` and `message`;
    a journal imported from the bucket is untrusted): a malformed one, one nested too deep or
    one whose times are not finite numbers is skipped (the protocol's `load_json`). Pure."""
    spans = []
    for event in events:
        if event.kind != SPAN_EVENT:
            continue
        try:
            spans.append(Span.from_dict(load_json(str(event.message), what="span")))
        except ValueError:  # ProtocolError included
            continue
    return spans


def load_spans(ledger: Any, store: Any, run_id: str, nodes: Sequence[str]) -> list[Span]:
    """Every span of the run: the controller's from `ledger`, each of `nodes`' (node ids) from
    its trace document in `store` (one GET each; a node without one has none). Blocks."""
    return [*controller_spans(ledger.events(run_id)), *read_node_traces(store, run_id, nodes)]


def _first(spans: Iterable[Span], name: str, node: str | None = "") -> Span | None:
    found = [s for s in spans if s.name == name and (node is None or s.node == node)]
    return min(found, key=lambda s: s.start) if found else None


def _node_ids(spans: Iterable[Span]) -> list[str]:
    return sorted({s.node for s in spans if s.node})


def breakdown(spans: Sequence[Span], chief: str = "worker-0") -> list[Phase]:
    """The run's phases (PHASES, in order) from its spans; empty when the controller's root
    span is missing (a run still going, or one from before traces). Pure."""
    root = _first(spans, tr.ROOT)
    if root is None:
        return []
    nodes = _node_ids(spans)
    first_attempt = min((s.attempt for s in spans if s.node and s.attempt), default=1)

    def last_end(name: str, attempt: int | None = None) -> float | None:
        ends = [
            s.end
            for s in spans
            if s.node and s.name == name and (attempt is None or s.attempt == attempt)
        ]
        return max(ends) if ends else None

    creates = [s for s in spans if not s.node and s.parent == tr.CREATE]
    create = _first(spans, tr.CREATE)
    launches = [s.start for s in spans if s.node and s.name == tr.TRAINING]
    launches_first = [
        s.start for s in spans if s.node and s.name == tr.TRAINING and s.attempt == first_attempt
    ]
    runs = [s for s in spans if s.node and s.name == tr.TRAINING]
    chief_runs = [s for s in runs if s.node == chief]
    # the job is over when its last process is (what a launch by hand waits for too)
    job_end = max(s.end for s in runs) if runs else None
    watches = [s for s in spans if not s.node and s.name == tr.WATCH]
    ends = [s for s in spans if not s.node and s.name == tr.END]
    marks: list[float | None] = [
        min((c.start for c in creates), default=create.start if create else None),
        max((c.end for c in creates), default=create.end if create else None),
        last_end(tr.AGENT_START) if nodes else None,
        last_end(tr.REGISTER, first_attempt),
        last_end(tr.PEERS, first_attempt) or last_end(tr.RENDEZVOUS, first_attempt),
        max(launches_first) if launches_first else (max(launches) if launches else None),
        job_end if chief_runs else None,
        max(e.end for e in ends) if ends else (max(w.end for w in watches) if watches else None),
        root.end,
    ]
    phases = []
    at = root.start
    for name, mark in zip(PHASES, marks, strict=True):
        end = at if mark is None else min(max(at, mark), root.end)
        phases.append(Phase(name, at, end))
        at = end
    return phases


def summary_line(phases: Sequence[Phase]) -> str:
    """'start 0.21 s, create 0.05 s, boot 0.40 s, ...' (phases under 5 ms left out). Pure."""
    return time_line({"breakdown": [{"phase": p.name, "seconds": p.seconds} for p in phases]})


def time_line(trace: Any) -> str:
    """The same line from a trace as `to_json` gives it (a run's result, `status --json`);
    "" without a breakdown. What the summary and `cloudtrain status` print; a row whose
    seconds are no finite number (read from a bucket) is left out. Pure."""
    parts = []
    for row in (trace or {}).get("breakdown") or []:
        seconds = finite(row.get("seconds")) if isinstance(row, dict) else None
        if seconds is not None and seconds >= 0.005:
            parts.append(f"{row.get('phase')} {figure(seconds, '.2f')} s")
    return ", ".join(parts)


def coverage(spans: Sequence[Span], start: float, end: float) -> float:
    """The share of [start, end] inside the union of the controller's top-level spans (parent
    "run") and the root itself excluded. 0..1. Pure."""
    if end <= start:
        return 0.0
    parts = sorted(
        (max(s.start, start), min(s.end, end))
        for s in spans
        if not s.node and s.parent == tr.ROOT and s.end > start and s.start < end
    )
    covered, reach = 0.0, start
    for a, b in parts:
        if b <= reach:
            continue
        covered += b - max(a, reach)
        reach = b
    return covered / (end - start)


def nesting_problems(spans: Sequence[Span], slack_s: float = 0.0) -> list[str]:
    """Spans that do not lie within a span of their parent's name on the same recorder (a
    node's top level within the controller's root, on one clock), each as a sentence; a child
    may overhang by `slack_s` (clocks of different machines). Pure."""
    problems = []
    for s in spans:
        if s.name == tr.ROOT and not s.node:
            continue
        if s.name == tr.NODE and s.node:
            parents = [p for p in spans if not p.node and p.name == tr.ROOT]
        else:
            parents = [p for p in spans if p.node == s.node and p.name == (s.parent or tr.ROOT)]
        if not parents:
            problems.append(f"{s.node or 'controller'}: {s.name!r} has no parent {s.parent!r}")
        elif not any(p.start - slack_s <= s.start and s.end <= p.end + slack_s for p in parents):
            problems.append(
                f"{s.node or 'controller'}: {s.name!r} [{s.start:.3f}, {s.end:.3f}] is outside "
                f"its parent {s.parent!r}"
            )
    return problems


def to_json(spans: Sequence[Span], chief: str = "worker-0") -> dict[str, Any]:
    """The trace as `status --json` and the report show it: the breakdown (phase, seconds),
    the wall time, the coverage and every span. Pure."""
    phases = breakdown(spans, chief)
    root = _first(spans, tr.ROOT)
    wall = root.seconds if root else None
    return {
        "wall_s": round(wall, 3) if wall is not None else None,
        "breakdown": [{"phase": p.name, "seconds": round(p.seconds, 3)} for p in phases],
        "covered": round(coverage(spans, root.start, root.end), 4) if root else None,
        "spans": [s.to_dict() for s in sorted(spans, key=lambda s: (s.start, s.node))],
    }
