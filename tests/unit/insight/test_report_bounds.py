"""`cloudtrain report` draws what nodes wrote, so it bounds it (issue 29): a node's trace is cut at
MAX_SPANS_PER_NODE spans (a trace of 100,000 spans took minutes to lay out), a timeline's legend
shows at most MAX_LEGEND entries and says how many more, and a span or a figure that is not a
finite number is skipped and counted (the page's "skipped" row says so)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.insight.report_data import MAX_SPANS_PER_NODE
from cloudtrain.insight.report_timeline import MAX_LEGEND, draw, lanes
from cloudtrain.insight.run_trace import SPAN_EVENT
from cloudtrain.insight.trace_view import controller_spans
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.protocol import trace_key
from cloudtrain.providers.local import LocalStore
from tests.unit.insight.test_report import RUN_ID, T0, collect_run, write_run

pytest.importorskip("matplotlib")


def _spans(count: int, node: str = "worker-0") -> list[tr.Span]:
    root = tr.Span(tr.NODE, T0 + 5, T0 + 95, node=node)
    return [root] + [
        tr.Span(f"phase-{i}", T0 + 10 + i * 1e-3, T0 + 10.5 + i * 1e-3, node, parent=tr.NODE)
        for i in range(count)
    ]


def test_a_trace_of_100k_spans_is_cut_to_its_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = write_run(tmp_path, monkeypatch)
    store = LocalStore((tmp_path / "bucket").as_uri())
    store.put(trace_key(RUN_ID, "worker-0"), tr.TraceDoc(tuple(_spans(100_000))).to_json().encode())
    data = collect_run(tmp_path, ledger)
    drawn = [s for s in data.trace if s.node == "worker-0"]
    assert 0 < len(drawn) <= MAX_SPANS_PER_NODE
    assert data.skipped >= 100_001 - MAX_SPANS_PER_NODE


def test_a_timeline_legend_shows_at_most_its_cap_and_says_how_many_more() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    laid = lanes(_spans(300), ["worker-0"], 100.0)
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    draw(fig, ax, laid, T0, 1.0, (0.0, 100.0), 8.0)
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert len(texts) == MAX_LEGEND + 1
    assert texts[-1] == f"+{300 - MAX_LEGEND} more"


def test_controller_spans_skip_what_is_deep_or_not_finite() -> None:
    good = tr.Span(tr.ROOT, T0, T0 + 1)
    events = [
        SimpleNamespace(kind=SPAN_EVENT, message=json.dumps(good.to_dict())),
        SimpleNamespace(kind=SPAN_EVENT, message='{"name": "x", "start": NaN, "end": 1}'),
        SimpleNamespace(kind=SPAN_EVENT, message='{"name": "x", "start": 1, "end": Infinity}'),
        SimpleNamespace(kind=SPAN_EVENT, message="[" * 100_000 + "]" * 100_000),
    ]
    assert controller_spans(events) == [good]


def test_a_plot_legend_of_a_hundred_nodes_is_capped() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cloudtrain.insight.report_timeline import legend

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i in range(100):
        ax.plot([0, 1], [i, i], label=f"worker-{i}")
    legend(ax, 7)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[:2] == ["worker-0", "worker-1"] and texts[-1] == f"+{100 - MAX_LEGEND} more"
    assert len(texts) == MAX_LEGEND + 1


def test_nodes_only_the_bucket_names_are_cut_at_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloudtrain.insight.report_data import MAX_NODES
    from cloudtrain.jobs.protocol import NodeStatus, status_key

    ledger = write_run(tmp_path, monkeypatch)
    store = LocalStore((tmp_path / "bucket").as_uri())
    before = collect_run(tmp_path, ledger).skipped
    for i in range(MAX_NODES + 50):
        store.put(status_key(RUN_ID, f"evaluator-{i}"), NodeStatus(state="running").to_json())
    data = collect_run(tmp_path, ledger)
    assert data.nodes[:2] == ["worker-0", "worker-1"] and len(data.nodes) == MAX_NODES
    assert data.skipped == before + 52
