"""`cloudtrain status`, `logs` from a fresh CLOUDTRAIN_HOME, from the run's journal in its bucket
(cloudtrain/state/journal.py): the command line of what tests/unit/state/test_journal.py checks
through the API. Controller-side (the CLI needs Python 3.11): not among the node-side tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.state.test_journal import RUN, local_run, shared_homes


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200")
    env.pop("CLOUDTRAIN_FAULTS", None)
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_status_and_logs_from_a_fresh_home_read_the_journal(tmp_path: Path) -> None:
    first, fresh, bucket = shared_homes(tmp_path)
    writer = local_run(first, bucket)
    expected = writer.billed_cost(RUN, now=0.0)
    assert expected > 20.0

    proc = cli(fresh, "status", RUN, "--provider", "local", "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["status"], shown["outcome"]) == ("done", "succeeded")
    assert shown["cost_usd"] == pytest.approx(expected, abs=1e-6)
    proc = cli(fresh, "status", RUN)  # the record is there now; the journal is read again
    assert proc.returncode == 0, proc.stderr
    assert "done succeeded" in proc.stdout and f"${expected:.4f}" in proc.stdout, proc.stdout
    proc = cli(fresh, "logs", RUN[:6])
    assert proc.returncode == 0, proc.stderr
    # a run neither the ledger nor a journal knows: one line, no traceback
    proc = cli(tmp_path / "empty", "status", "nope-000000")
    assert proc.returncode != 0 and "no run" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli(tmp_path / "empty", "logs", "nope-000000", "--provider", "local")
    assert proc.returncode != 0 and "no journal" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_cost_from_a_fresh_home_reads_the_journal(tmp_path: Path) -> None:
    first, fresh, bucket = shared_homes(tmp_path)
    writer = local_run(first, bucket)
    expected = writer.billed_cost(RUN, now=0.0)
    proc = cli(fresh, "cost", RUN, "--provider", "local", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["runs"]
    assert [(r["run_id"], r["outcome"]) for r in rows] == [(RUN, "succeeded")]
    assert rows[0]["compute_usd"] == pytest.approx(expected, abs=1e-6)
