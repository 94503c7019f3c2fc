"""`cloudtrain ls` ends promptly when no bucket answers (issue 31): with every store call of the
local provider failing (the fault injector, $CLOUDTRAIN_FAULTS), each call retried for the
store's whole retry budget (about a minute a run before), the listing still ends at its
refresh deadline, lists the runs as the ledger has them and says so in one warning line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cloudtrain.run.journal_refresh import REFRESH_S
from cloudtrain.state.ledger import Ledger

RUNS = ("alpha-0a0a0a", "beta-0b0b0b", "gamma-0c0c0c")
# ends at the deadline plus a start-up on a loaded machine: below the injected throttling's
# retries for three runs read one after another (about 17 s each: `providers/retrying.py`), let
# alone an unreachable cloud's (its whole 60 s budget for a listing, per run)
WITHIN_S = REFRESH_S + 25.0


def test_ls_with_no_bucket_answering_ends_at_its_deadline(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    bucket = (tmp_path / "buckets" / "local").as_uri()
    for run_id in RUNS:
        ledger.create_run(run_id, run_id[:-7], "local", "local", None, None, bucket, None)
        ledger.set_status(run_id, "running")
    env = dict(os.environ, CLOUDTRAIN_HOME=str(tmp_path))
    env["CLOUDTRAIN_FAULTS"] = json.dumps({"store_error_rate": 1.0})
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", "ls", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WITHIN_S + 60,
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert took < WITHIN_S, f"ls took {took:.1f}s"
    rows = {row["run_id"]: row for row in json.loads(proc.stdout)}
    assert {run: (rows[run]["status"], rows[run]["refreshed"]) for run in RUNS} == dict.fromkeys(
        RUNS, ("running", False)
    )
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: 3 run(s) not refreshed: their journals were not read within {REFRESH_S:g}s "
        "(a cloud that does not answer?); listed as this ledger last saw them"
    ], proc.stderr
