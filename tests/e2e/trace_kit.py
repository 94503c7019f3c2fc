"""Checks of a finished run's trace (issue 20), as `cloudtrain status RUN --json` shows it."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any

from cloudtrain.insight.trace_view import PHASES, coverage, nesting_problems
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.trace import Span
from cloudtrain.providers.base import node_name
from tests.e2e.conftest import Env

CONTROLLER_PHASES = [tr.STARTUP, tr.BUNDLE, tr.BUCKET, tr.PROVISION, tr.CREATE, tr.WATCH]
NODE_SPANS = {tr.NODE, tr.BOOT, tr.AGENT_START, tr.REGISTER, tr.RENDEZVOUS, tr.TRAINING}
BOOT_PHASES = {"driver", "python", "bundle"}  # the startup script's, from its trace file


def assert_traced(
    ct: Env,
    run_id: str,
    spawned: float,
    exited: float,
    nodes: Iterable[str],
    slack_s: float = 0.0,
) -> dict[str, Any]:
    """The run's spans nest (a child may overhang its parent by `slack_s`: 0 when the nodes
    share the controller's clock, as local and the cloud boxes' process-session VMs do), its
    controller's phases follow each other without a gap and cover at least 95 % of the CLI's
    wall time as the test saw it (spawn to exit), every node has its boot (with the startup
    script's phases), agent, rendezvous and training spans, and the breakdown adds up to the
    traced wall time. Returns the trace as `status --json` shows it. Read-only; blocks."""
    status = ct.cli("status", run_id, "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    trace: dict[str, Any] = json.loads(status.stdout)["trace"]
    spans = [Span.from_dict(s) for s in trace["spans"]]
    problems = nesting_problems(spans, slack_s)
    assert problems == [], problems  # (this module's asserts are not rewritten: say what failed)
    top = sorted((s for s in spans if not s.node and s.parent == tr.ROOT), key=lambda s: s.start)
    names = [s.name for s in top]
    assert names[: len(CONTROLLER_PHASES)] == CONTROLLER_PHASES, names
    assert names[-2:] == [tr.END, tr.TEARDOWN], names
    assert all(a.end == b.start for a, b in itertools.pairwise(top)), "a gap or overlap"
    covered = coverage(spans, spawned, exited)
    # the CLI's wall time outside its trace: before the process start, after the teardown's end
    head, tail = top[0].start - spawned, exited - top[-1].end
    assert covered >= 0.95, (covered, exited - spawned, f"head {head:.2f} s, tail {tail:.2f} s")
    nodes = list(nodes)
    for node in nodes:
        mine = {s.name for s in spans if s.node == node}
        assert mine >= NODE_SPANS, (node, sorted(mine))
        booted = {s.name for s in spans if s.node == node and s.parent == tr.BOOT}
        assert booted >= BOOT_PHASES, (node, sorted(booted))
    # one create span per node that exists, and maybe failed ones (a zone without capacity)
    creates = {s.name for s in spans if not s.node and s.parent == tr.CREATE}
    made = {node_name(run_id, n.rsplit("-", 1)[0], int(n.rsplit("-", 1)[1])) for n in nodes}
    done = {c for c in creates if not c.endswith(" (failed)")}
    assert done == {f"create {name}" for name in made}, creates
    assert [p["phase"] for p in trace["breakdown"]] == list(PHASES)
    total = sum(p["seconds"] for p in trace["breakdown"])
    assert abs(total - trace["wall_s"]) < 0.01, (total, trace["wall_s"])
    return trace
