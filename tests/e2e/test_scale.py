"""`cloudtrain scale` on local (issue 18's acceptance): one real run per size, 1, 2 and 3
workers of digits-multiworker stopped after 20 steps, each measured and torn down; the table
has a row per size with examples/s from the run, and its $/h is what `cloudtrain plan` prices
the same size at."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.e2e.conftest import Env, assert_clean

pytestmark = pytest.mark.e2e


def test_scale_measures_each_size_at_the_plans_price(ct: Env) -> None:
    ct.env["CLOUDTRAIN_LOCAL_PRICE_USD"] = "0.25"  # a priced machine: the cost columns count
    job = ct.job("digits-multiworker", "python train.py --epochs 2")
    proc = ct.cli("scale", str(job), "--workers", "1,2,3", "--steps", "20", "--json", "-q")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    assert [r["workers"] for r in rows] == [1, 2, 3], out
    assert all(r["examples_per_s"] and r["examples_per_s"] > 0 for r in rows), out
    assert out["baseline_workers"] == 1 and rows[0]["speedup"] == 1.0
    assert "2 epochs" in out["budget_rule"], out  # the job's epochs, from its heartbeats
    spec = yaml.safe_load(job.read_text())
    for row in rows:  # the plan of the same override: that many workers
        spec["cluster"]["workers"] = row["workers"]
        job.write_text(yaml.safe_dump(spec))
        plan = json.loads(ct.cli("plan", str(job), "--json").stdout)
        assert row["hourly_usd"] == plan["hourly_usd"] == 0.25 * row["workers"], (row, plan)
        if row["epoch_seconds"] is not None:
            usd = row["hourly_usd"] * row["epoch_seconds"] / 3600
            assert row["usd_per_epoch"] == pytest.approx(usd)
    assert sum("cheapest/epoch" in r["marks"] for r in rows) == 1, rows
    assert sum("fastest within budget" in r["marks"] for r in rows) == 1, rows
    run_ids = [r["run_id"] for r in rows]
    assert sorted(run_ids) == sorted(ct.run_ids())  # one run per size, no other
    for run_id in run_ids:
        assert ct.ledger().get_run(run_id).outcome == "succeeded"  # type: ignore[union-attr]
        logs = ct.cli("logs", run_id, "--node", "worker-0").stdout
        assert "stopped after 20 steps (CLOUDTRAIN_MAX_STEPS)" in logs, logs[-2000:]
        assert_clean(ct, run_id)
