"""cloudtrain/insight/throughput.py: the run's figures from its heartbeats, and how the live view,
the summary and `status --json` show them."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from cloudtrain.cli.ui import node_table, summary
from cloudtrain.insight.throughput import of_attempt, sparkline, throughput
from cloudtrain.jobs.protocol import Heartbeat
from cloudtrain.run.view import NodeView, Outcome, RunResult, RunView


def beat(attempt: int = 1, **metrics: Any) -> Heartbeat:
    """A heartbeat as an agent writes it, read back as the controller reads it."""
    return Heartbeat.from_json(Heartbeat(attempt=attempt, metrics=metrics or None).to_json())


def test_the_cluster_rate_is_the_sum_of_the_nodes_shares_and_prices_follow() -> None:
    beats = {
        "worker-0": beat(examples_per_s=1000.0, epoch_seconds=10.0, steps_per_epoch=50),
        "worker-1": beat(examples_per_s=1000.0, epoch_seconds=12.0),
    }
    tp = throughput(beats, hourly_usd=3.6)
    assert tp.cluster_examples_per_s == 2000.0
    assert tp.epoch_seconds == 12.0  # the slowest node paces an epoch
    assert tp.usd_per_epoch == pytest.approx(3.6 * 12 / 3600)
    assert tp.usd_per_million_examples == pytest.approx(3.6 / (2000 * 3600) * 1e6)
    assert tp.steps_per_epoch == 50


def test_a_node_more_than_20_percent_below_the_median_is_a_straggler() -> None:
    beats = {
        "worker-0": beat(examples_per_s=100.0),
        "worker-1": beat(examples_per_s=100.0),
        "chief-0": beat(examples_per_s=100.0),
        "worker-2": beat(examples_per_s=79.0),  # 21 % below the median
        "worker-3": beat(examples_per_s=85.0),  # 15 % below: not one
    }
    tp = throughput(beats, hourly_usd=1.0)
    assert tp.stragglers == ["worker-2"]
    assert tp.nodes["worker-0"].efficiency == 1.0
    assert tp.nodes["worker-2"].efficiency == pytest.approx(0.79)


def test_an_unmeasured_or_malformed_node_is_listed_but_counts_for_nothing() -> None:
    beats = {
        "worker-0": beat(examples_per_s=50.0, gpu_util_percent=3.0),
        "worker-1": beat(examples_per_s="fast", loss=math.nan, losses=[0.5, "x", 0.4]),
        "ps-0": beat(),
    }
    tp = throughput(beats, hourly_usd=1.0)
    assert tp.cluster_examples_per_s == 50.0
    assert tp.nodes["worker-1"].examples_per_s is None and tp.nodes["worker-1"].loss is None
    assert tp.nodes["worker-1"].losses == (0.5, 0.4)
    assert tp.nodes["worker-0"].idle  # a GPU at 3 % waits for work
    assert tp.stragglers == []  # one measured node has nobody to lag behind


def test_before_a_whole_epoch_its_length_comes_from_the_steps_rate() -> None:
    beats = {
        "worker-0": beat(steps_per_s=10.0, steps_per_epoch=100),
        "worker-1": beat(steps_per_s=8.0),
    }
    assert throughput(beats, hourly_usd=0.0).epoch_seconds == pytest.approx(100 / 8.0)


def test_only_the_attempt_asked_for_counts() -> None:
    beats = {"worker-0": beat(2, examples_per_s=10.0), "worker-1": beat(1, examples_per_s=99.0)}
    assert of_attempt(beats, 2, 1.0).cluster_examples_per_s == 10.0


@given(st.lists(st.floats(-1e6, 1e6), max_size=40), st.integers(1, 30))
def test_a_sparkline_has_one_mark_per_value_it_shows(values: list[float], width: int) -> None:
    line = sparkline(values, width)
    assert len(line) == min(len(values), width)
    if len(set(values[-width:])) > 1:  # the lowest and the highest are the extreme marks
        assert "▁" in line and "█" in line


def _render(renderable: Any) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_live_view_shows_rates_gpu_loss_and_the_straggler() -> None:
    beats = {
        "worker-0": beat(
            examples_per_s=900.0, gpu_util_percent=87.0, loss=0.25, losses=[0.9, 0.5, 0.25]
        ),
        "worker-1": beat(examples_per_s=500.0, gpu_util_percent=40.0, loss=0.3),
        "worker-2": beat(examples_per_s=880.0, gpu_util_percent=85.0, loss=0.26),
    }
    nodes = [NodeView(f"ct-r-worker-{i}", "worker", i, "running", "running") for i in range(3)]
    view = RunView(
        "r", "running", 1, nodes, time.time(), 1.8, cost_usd=0.01, throughput=throughput(beats, 1.8)
    )
    text = _render(node_table(view))
    assert "900/s" in text and "87%" in text and "0.2500" in text
    row1 = next(line for line in text.splitlines() if "worker-1" in line)
    assert "straggler" in row1
    assert "straggler" not in next(ln for ln in text.splitlines() if "worker-0" in ln)
    assert "cluster 2,280/s" in text and "cost so far $0.0100" in text


def test_the_summary_gives_the_cluster_rate_and_the_cost_per_epoch() -> None:
    beats = {"worker-0": beat(examples_per_s=400.0, epoch_seconds=36.0, step_p50_s=0.02)}
    result = RunResult("r", Outcome.SUCCEEDED, throughput=throughput(beats, hourly_usd=10.0))
    text = _render(summary(result))
    assert "cluster 400/s" in text and "$0.1000/epoch" in text and "20ms" in text
    assert "throughput" not in _render(summary(RunResult("r", Outcome.SUCCEEDED)))
