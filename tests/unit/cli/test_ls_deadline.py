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


# `cloudtrain ls` where the journal lists, and then no entry read ever answers: the reads run in
# the journal's thread pool, which the interpreter joins at exit, so the reads must not hold it
NEVER_ANSWERS = """
import sys, threading
from cloudtrain.jobs.protocol import journal_prefix
from cloudtrain.providers.base import ObjectInfo
from cloudtrain.run import build
from cloudtrain.state.journal import entry_key

RUN, NEVER = sys.argv[1], threading.Event()  # never set


class Store:
    uri = "file:///nowhere"

    def list(self, prefix):
        return [ObjectInfo(journal_prefix(RUN) + entry_key(n, n, "w"), 9, 0.0) for n in (1, 2, 3)]

    def get(self, key, max_bytes=None):
        NEVER.wait()


class Provider:
    def store(self, uri):
        return Store()


build.record_provider = lambda rec: Provider()
from cloudtrain.cli.main import app

app(["ls", "--json"])
"""


def test_ls_exits_when_entry_reads_never_answer(tmp_path: Path) -> None:
    run = RUNS[0]
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.create_run(run, run[:-7], "local", "local", None, None, "file:///nowhere", None)
    ledger.set_status(run, "running")
    ledger.set_run_key(run, b"k" * 32)  # so the entries are read, not skipped for want of a key
    script = tmp_path / "never_answers.py"
    script.write_text(NEVER_ANSWERS)
    env = dict(os.environ, CLOUDTRAIN_HOME=str(tmp_path))
    env.pop("CLOUDTRAIN_FAULTS", None)
    try:
        proc = subprocess.run(
            [sys.executable, str(script), run],
            env=env,
            capture_output=True,
            text=True,
            timeout=WITHIN_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"ls did not exit within {WITHIN_S}s: {exc.stderr!r}") from None
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert (row["run_id"], row["refreshed"]) == (run, False)
    assert "warning: 1 run(s) not refreshed" in proc.stderr
