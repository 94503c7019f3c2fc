"""cloudtrain/insight/trace_view.py: the breakdown that tiles a run, its coverage and the nesting
check, on span sets made the way the controller and the agents make them (jobs/trace.py's Tracer and
PhaseClock)."""

from __future__ import annotations

import pytest

from cloudtrain.insight.trace_view import (
    PHASES,
    breakdown,
    coverage,
    nesting_problems,
    summary_line,
    to_json,
)
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.trace import PhaseClock, Span, Tracer


def _run(t0: float = 1000.0) -> list[Span]:
    """A two-worker run: the controller's phases, each node's spans (times in seconds from t0)."""
    ctl = Tracer("")
    clock = PhaseClock(ctl, tr.ROOT, t0)
    for name, at, attempt in (
        (tr.STARTUP, 0.0, 0),
        (tr.BUNDLE, 0.2, 0),
        (tr.BUCKET, 0.3, 0),
        (tr.PROVISION, 0.35, 0),
        (tr.CREATE, 0.4, 0),
        (tr.WATCH, 0.6, 1),
        (tr.END, 15.2, 0),
        (tr.TEARDOWN, 15.3, 0),
    ):
        clock.next(name, attempt, at=t0 + at)
    end = clock.close(at=t0 + 15.6)
    ctl.add(tr.ROOT, t0, end)
    for node, created in (("worker-0", 0.45), ("worker-1", 0.5)):
        ctl.add(f"create {node}", t0 + 0.42, t0 + created, parent=tr.CREATE)
    ctl.add("delete nodes", t0 + 15.3, t0 + 15.5, parent=tr.TEARDOWN)
    spans = ctl.spans()
    for node, lag, exit_at in (("worker-0", 0.0, 15.0), ("worker-1", 0.1, 15.05)):
        n = Tracer(node)
        n.add(tr.BOOT, t0 + 0.5 + lag, t0 + 0.9 + lag, parent=tr.NODE)
        n.add("python", t0 + 0.55 + lag, t0 + 0.8 + lag, parent=tr.BOOT)
        n.add(tr.AGENT_START, t0 + 0.9 + lag, t0 + 1.2 + lag, parent=tr.NODE)
        n.add(tr.REGISTER, t0 + 1.2 + lag, t0 + 1.21 + lag, parent=tr.NODE, attempt=1)
        n.add(tr.RENDEZVOUS, t0 + 1.21 + lag, t0 + 1.45, parent=tr.NODE, attempt=1)
        n.add(tr.PEERS, t0 + 1.45, t0 + 1.5, parent=tr.NODE, attempt=1)
        n.add(tr.SETUP, t0 + 1.5, t0 + 2.0 + lag, parent=tr.NODE, attempt=1)
        n.add(tr.TRAINING, t0 + 2.0 + lag, t0 + exit_at, parent=tr.NODE, attempt=1)
        n.add(tr.FINISH, t0 + exit_at, t0 + exit_at + 0.05, parent=tr.NODE, attempt=1)
        spans += [Span(tr.NODE, t0 + 0.5 + lag, t0 + exit_at + 0.05, node, 0, tr.ROOT)]
        spans += n.spans()
    return spans


def test_the_breakdown_tiles_the_run_at_the_instants_the_spans_name() -> None:
    phases = breakdown(_run())
    assert [p.name for p in phases] == list(PHASES)
    got = {p.name: round(p.seconds, 3) for p in phases}
    assert got == {
        "start": 0.42,  # to the first create call
        "create": 0.08,  # to the last create's return
        "boot": 0.8,  # to worker-1's agent up (1.3)
        "agent": 0.01,  # to the last registration (1.31)
        "rendezvous": 0.19,  # to the last peers check's end (1.5)
        "setup": 0.6,  # to the last launch (2.1)
        "training": 12.95,  # to the last node's (worker-1's) exit
        "end detection": 0.25,  # to the end of the controller's "end" phase
        "teardown": 0.3,
    }
    assert sum(p.seconds for p in phases) == pytest.approx(15.6)
    assert summary_line(phases).startswith("start 0.42 s, create 0.08 s, boot 0.80 s")


def test_a_missing_phase_is_zero_and_its_time_goes_to_the_next() -> None:
    # a run that failed before any node booted: no node spans at all
    spans = [s for s in _run() if not s.node]
    got = {p.name: round(p.seconds, 3) for p in breakdown(spans)}
    assert got["boot"] == got["agent"] == got["training"] == 0.0
    assert got["end detection"] == pytest.approx(15.3 - 0.5)
    assert sum(got.values()) == pytest.approx(15.6)
    # an instant earlier than the one before it is clipped: phases never go negative
    early = [
        Span(s.name, s.start - 5, s.end - 5, s.node, s.attempt, s.parent)
        if s.node == "worker-0" and s.name == tr.TRAINING
        else s
        for s in _run()
    ]
    assert all(p.seconds >= 0 for p in breakdown(early))
    assert breakdown([s for s in _run() if s.name != tr.ROOT]) == []


def test_coverage_is_the_union_of_the_controller_s_top_level() -> None:
    spans = _run()
    assert coverage(spans, 1000.0, 1015.6) == pytest.approx(1.0)
    # seen from outside: the process ran 0.4 s longer than its trace
    assert coverage(spans, 1000.0, 1016.0) == pytest.approx(15.6 / 16.0)
    gap = [s for s in spans if not (not s.node and s.name == tr.WATCH)]
    assert coverage(gap, 1000.0, 1015.6) == pytest.approx(1 - 14.6 / 15.6)
    assert to_json(spans)["covered"] == 1.0


def test_nesting_problems_name_the_span_outside_its_parent() -> None:
    spans = _run()
    assert nesting_problems(spans) == []
    late = Span("python", 1000.55, 1001.0, "worker-0", 0, tr.BOOT)  # past its boot's end (0.9)
    orphan = Span(tr.SETUP, 1001.5, 1002.0, "worker-0", 1, "nowhere")
    problems = nesting_problems([*spans, late, orphan])
    assert len(problems) == 2
    assert "worker-0: 'python'" in problems[0] and "outside its parent 'boot'" in problems[0]
    assert "has no parent 'nowhere'" in problems[1]
    # a node's clock a little ahead of the controller's: tolerated by the slack, not without it
    ahead = [
        Span(s.name, s.start + 0.2, s.end + 0.7, s.node, s.attempt, s.parent)
        if s.node and s.name == tr.NODE
        else s
        for s in spans
    ]
    assert nesting_problems(ahead) and not nesting_problems(ahead, slack_s=1.0)
