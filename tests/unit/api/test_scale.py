"""`cloudtrain scale`: the table's arithmetic and marks from given measurements, the spec each
size runs (its worker count, the step limit reaching the entrypoint's shell), and the checks
that refuse a scale before anything is created, through the command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from cloudtrain.api.scale import (
    CHEAPEST,
    FASTEST,
    Measurement,
    measurement,
    parse_sizes,
    sized_spec,
    table,
)
from cloudtrain.cli.main import app
from cloudtrain.cli.scale import render
from cloudtrain.core.env import MAX_STEPS
from cloudtrain.core.errors import UsageError
from cloudtrain.insight.throughput import throughput
from cloudtrain.jobspec.job import load_spec
from tests.e2e.nothing_created import assert_nothing_created, snapshot

MAX_STEPS_ENV = MAX_STEPS.name

EXAMPLES = Path(__file__).resolve().parents[3] / "jobs" / "examples"


def _m(
    workers: int,
    rate: float | None,
    hourly: float,
    *,
    steps_per_s: float = 10.0,
    steps_per_epoch: int | None = 360,
    epochs: int | None = None,
) -> Measurement:
    return Measurement(
        workers,
        hourly,
        examples_per_s=rate,
        steps_per_s=steps_per_s,
        steps_per_epoch=steps_per_epoch,
        epochs=epochs,
    )


def test_rows_speedup_efficiency_cost_per_epoch_and_marks() -> None:
    # 1 -> 2 -> 4 workers: 1000, 1800, 2400 examples/s at the pace of 10, 9, 6 steps/s;
    # an epoch is 360 steps: 36 s, 40 s, 60 s at $1, $2, $4 an hour
    ms = [
        _m(4, 2400.0, 4.0, steps_per_s=6.0, epochs=10),
        _m(1, 1000.0, 1.0, steps_per_s=10.0, epochs=10),
        _m(2, 1800.0, 2.0, steps_per_s=9.0, epochs=10),
    ]
    tbl = table(ms, max_cost_usd=0.3, max_hours=1.0)
    by = {r.workers: r for r in tbl.rows}
    assert [r.workers for r in tbl.rows] == [1, 2, 4]
    assert tbl.baseline_workers == 1 and tbl.rate == "examples/s"
    assert by[2].speedup == pytest.approx(1.8) and by[2].efficiency == pytest.approx(0.9)
    assert by[4].speedup == pytest.approx(2.4) and by[4].efficiency == pytest.approx(0.6)
    assert [by[w].epoch_seconds for w in (1, 2, 4)] == pytest.approx([36.0, 40.0, 60.0])
    usd = [by[w].usd_per_epoch for w in (1, 2, 4)]
    assert usd == pytest.approx([0.01, 2 * 40 / 3600, 4 * 60 / 3600])
    # the whole job is 10 epochs: $0.10, $0.22, $0.67 against max_cost_usd $0.30
    assert [by[w].within_budget for w in (1, 2, 4)] == [True, True, False]
    assert by[1].marks == (CHEAPEST,) and by[2].marks == (FASTEST,) and by[4].marks == ()
    assert "10 epochs" in tbl.budget_rule and "$0.3" in tbl.budget_rule


def test_baseline_is_the_smallest_size_and_unknown_epochs_use_the_hourly_rule() -> None:
    ms = [
        _m(2, 500.0, 1.0, steps_per_epoch=None),
        _m(3, 600.0, 1.5, steps_per_epoch=None),
        _m(4, 900.0, 2.0, steps_per_epoch=None),
    ]
    tbl = table(ms, max_cost_usd=1.6, max_hours=1.0)
    by = {r.workers: r for r in tbl.rows}
    assert tbl.baseline_workers == 2
    assert by[2].speedup == 1.0 and by[4].speedup == pytest.approx(1.8)
    assert by[4].efficiency == pytest.approx(0.9)  # 1.8 over twice the workers
    assert by[3].efficiency == pytest.approx(1.2 / 1.5)
    assert all(r.epoch_seconds is None and r.usd_per_epoch is None for r in tbl.rows)
    assert "max_hours" in tbl.budget_rule and any("'?'" in n for n in tbl.notes)
    # $2/h x 1 h is over $1.6: the fastest within budget is 3 workers; nothing is cheapest
    assert [by[w].within_budget for w in (2, 3, 4)] == [True, True, False]
    assert [r.marks for r in tbl.rows] == [(), (FASTEST,), ()]


def test_steps_per_s_compares_sizes_when_one_has_no_examples_per_s() -> None:
    ms = [_m(1, 100.0, 1.0, steps_per_s=4.0), _m(2, None, 2.0, steps_per_s=6.0)]
    tbl = table(ms, max_cost_usd=None, max_hours=1.0)
    assert tbl.rate == "steps/s" and tbl.rows[1].speedup == pytest.approx(1.5)
    assert "no max_cost_usd" in tbl.budget_rule
    assert table([], max_cost_usd=None, max_hours=1.0).rows == []


def test_a_measurement_from_heartbeats_and_its_rendered_row() -> None:
    beats = {  # two workers: each its share of the examples, the slower one paces the cluster
        "worker-0": {"metrics": {"examples_per_s": 320, "steps_per_s": 10, "steps_per_epoch": 24}},
        "worker-1": {"metrics": {"examples_per_s": 256, "steps_per_s": 8, "steps_per_epoch": 24}},
    }
    m = measurement(2, 0.5, throughput(beats, 0.5), epochs=4, run_id="r-2")
    assert (m.examples_per_s, m.steps_per_s, m.steps_per_epoch) == (576.0, 8.0, 24)
    assert measurement(1, 0.25, None).examples_per_s is None
    tbl = table([m, measurement(1, 0.25, None)], max_cost_usd=None, max_hours=1.0)
    console = Console(width=200, record=True)
    for part in render(tbl, "scaling"):
        console.print(part)
    text = console.export_text()
    for head in ("workers", "examples/s", "speed-up", "efficiency", "$/h", "$/epoch", "mark"):
        assert head in text
    # 24 steps at 8 steps/s: 3 s of $0.5/h; the unmeasured size shows '?'
    assert "576.0" in text and "3.0s" in text and "$0.000417" in text and "r-2" in text
    assert CHEAPEST in text and FASTEST in text
    (unmeasured,) = [line for line in text.splitlines() if "$0.2500" in line]
    assert unmeasured.count("?") == 5, unmeasured  # examples/s ... $/epoch: not known


def test_parse_sizes() -> None:
    assert parse_sizes("4, 1,2,2") == [1, 2, 4]
    for bad in ("", "1,,2", "0", "-1", "two", "1.5"):
        with pytest.raises(UsageError, match="not a worker count"):
            parse_sizes(bad)


def test_sized_spec_changes_the_workers_and_the_entrypoint_exports_the_step_limit(
    tmp_path: Path,
) -> None:
    spec = load_spec(EXAMPLES / "digits-ps" / "job.yaml")
    sized = sized_spec(spec, 3, 7)
    assert sized.cluster.roles() == {"chief": 1, "worker": 3, "ps": 1}
    assert spec.cluster.workers == 2  # the loaded spec is left as it was
    assert sized.workdir_path() == spec.workdir_path() and sized.max_hours == spec.max_hours
    # what the node runs: `bash -c ENTRYPOINT` (jobs/agent.py), a compound command here
    job = spec.model_copy(update={"entrypoint": f'cd . && echo "steps=${MAX_STEPS_ENV}"'})
    line = sized_spec(job, 1, 7).entrypoint
    env = {k: v for k, v in os.environ.items() if k != MAX_STEPS_ENV}
    out = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True)
    assert out.stdout == "steps=7\n", out


def _job(tmp_path: Path, example: str, **fields: object) -> Path:
    spec = yaml.safe_load((EXAMPLES / example / "job.yaml").read_text())
    spec.update(workdir=str(EXAMPLES / example), **fields)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("example", "fields", "workers", "message"),
    [
        ("digits-mirrored", {}, "1,2", "strategy 'mirrored' runs on one node"),
        ("digits-multiworker", {}, "1,2,x", "'x' is not a worker count"),
        ("digits-multiworker", {}, "1,65", "65 worker(s): cluster: at most 64 nodes"),
        # $1/h a node for 1 h: 3 workers are over the $2.5 budget, named before 1 and 2 run
        (
            "digits-multiworker",
            {"max_hours": 1, "max_cost_usd": 2.5},
            "1,2,3",
            "3 worker(s): estimated $3.00 for 1.0 h exceeds max_cost_usd $2.50",
        ),
    ],
)
def test_a_refused_scale_creates_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    example: str,
    fields: dict[str, object],
    workers: str,
    message: str,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.setenv("CLOUDTRAIN_LOCAL_PRICE_USD", "1")
    job = _job(tmp_path, example, **fields)
    before = snapshot(home)
    result = CliRunner().invoke(app, ["scale", str(job), "--workers", workers, "--steps", "5"])
    assert isinstance(result.exception, UsageError), result.output
    assert message in str(result.exception)
    assert "size 1/" not in result.output  # no run started
    assert_nothing_created(before)
