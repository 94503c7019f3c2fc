"""The ledger stands concurrent writers: several processes opening one fresh (or old) file at the
same moment, writing runs, resources and events at once, and `down` finishing a run while its
controller writes the outcome.

Real processes (multiprocessing, fork: they start within milliseconds of each other) on a real
SQLite file; nothing of the ledger is mocked.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
from pathlib import Path

import pytest

from cloudtrain.core.procid import controller
from cloudtrain.providers.base import Resource
from cloudtrain.state.ledger import SCHEMA_VERSION, Ledger

WRITERS = 8
RUNS_EACH = 15


def _writer(path: str, index: int, start_at: float, runs: int) -> None:
    """Open the ledger at `start_at` (all writers at once), then write `runs` runs with a
    resource and an event each. Exits non-zero on any error (the traceback goes to stderr)."""
    while time.time() < start_at:
        pass  # spin: a sleep's wake-up would spread the openings apart
    ledger = Ledger(Path(path))
    for k in range(runs):
        run_id = f"w{index}-{k}"
        ledger.create_run(run_id, "w", "local", None, None, None, None, None)
        ledger.record_intent(Resource("local", "node", f"n{k}", None, run_id), 1.0)
        ledger.mark_created(run_id, "node", f"n{k}", "pid")
        ledger.event(run_id, "node", "created")
        ledger.set_status(run_id, "running")


def _race(path: Path, runs: int = RUNS_EACH) -> list[int | None]:
    """WRITERS processes open `path` at the same instant; their exit codes."""
    ctx = mp.get_context("fork")
    start_at = time.time() + 0.3
    procs = [
        ctx.Process(target=_writer, args=(str(path), i, start_at, runs)) for i in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    return [proc.exitcode for proc in procs]


def _check(path: Path, runs_each: int = RUNS_EACH) -> None:
    ledger = Ledger(path)
    assert ledger.schema_version() == SCHEMA_VERSION
    runs = ledger.list_runs(limit=10_000)
    assert len(runs) == WRITERS * runs_each
    assert {r.status for r in runs} == {"running"}
    for rec in runs[:5]:
        assert [r.state for r in ledger.resources(rec.run_id)] == ["created"]
        assert len(ledger.events(rec.run_id)) == 1


def test_many_processes_open_a_fresh_ledger_at_once(tmp_path: Path) -> None:
    # a journal-mode switch gets no busy handler in SQLite: without a retry, one of the
    # processes dies with "database is locked" in a good share of these rounds
    for round_ in range(20):
        path = tmp_path / f"fresh-{round_}" / "ledger.db"
        codes = _race(path, runs=1)
        assert codes == [0] * WRITERS, f"round {round_}: exit codes {codes}"
        _check(path, runs_each=1)
    path = tmp_path / "busy" / "ledger.db"  # and then many writes at once
    assert _race(path) == [0] * WRITERS
    _check(path)


def _version_2_file(path: Path) -> None:
    """A ledger as cloudtrain wrote it at schema version 2 (no controller columns)."""
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, name TEXT NOT NULL, provider TEXT NOT NULL,"
        " region TEXT, zone TEXT, account TEXT, spec_path TEXT, store_uri TEXT, plan_json TEXT,"
        " status TEXT NOT NULL, outcome TEXT, created_at REAL NOT NULL, ended_at REAL,"
        " detail TEXT);"
        "CREATE TABLE resources (run_id TEXT NOT NULL, provider TEXT NOT NULL, kind TEXT NOT NULL,"
        " resource_id TEXT NOT NULL, region TEXT, cloud_id TEXT, state TEXT NOT NULL,"
        " price_hourly REAL NOT NULL DEFAULT 0, created_at REAL NOT NULL, deleted_at REAL,"
        " PRIMARY KEY (run_id, kind, resource_id));"
        "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL,"
        " ts REAL NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL);"
        "INSERT INTO runs (run_id, name, provider, status, created_at)"
        " VALUES ('old-abcdef', 'old', 'local', 'done', 1.0);"
        "PRAGMA user_version = 2;"
    )
    conn.close()


def test_many_processes_upgrade_an_old_ledger_at_once(tmp_path: Path) -> None:
    path = tmp_path / "old" / "ledger.db"
    _version_2_file(path)
    codes = _race(path)
    assert codes == [0] * WRITERS, codes
    ledger = Ledger(path)
    assert ledger.schema_version() == SCHEMA_VERSION
    old = ledger.get_run("old-abcdef")
    assert old is not None and old.controller_pid is None  # migrated, not invented
    assert controller(old).state == "unknown"
    assert len(ledger.list_runs(limit=10_000)) == WRITERS * RUNS_EACH + 1


def test_create_run_records_this_process_as_the_controller(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.create_run("me-abcdef", "me", "local", None, None, None, None, None)
    rec = ledger.get_run("me-abcdef")
    assert rec is not None
    assert controller(rec).state == "alive"
    assert f"pid {rec.controller_pid} " in controller(rec).describe()
    # a process that ran and ended: its row says so
    ctx = mp.get_context("fork")
    child = ctx.Process(target=_create_one, args=(str(ledger.path), "gone-abcdef"))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    gone = ledger.get_run("gone-abcdef")
    assert gone is not None and gone.controller_pid == child.pid
    assert controller(gone).state == "gone"


def _create_one(path: str, run_id: str) -> None:
    Ledger(Path(path)).create_run(run_id, "x", "local", None, None, None, None, None)


def test_finish_run_keeps_an_outcome_written_after_the_caller_read_the_row(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.create_run("race-abcdef", "race", "local", None, None, None, None, None)
    stale = ledger.get_run("race-abcdef")  # `down` reads the row...
    assert stale is not None and stale.outcome is None
    other = Ledger(ledger.path)  # ...the controller writes its outcome...
    other.set_status("race-abcdef", "tearing_down", "interrupted", "by Ctrl-C")
    done = ledger.finish_run("race-abcdef")  # ...and `down` finishes the run
    assert (done.status, done.outcome, done.detail) == ("done", "interrupted", "by Ctrl-C")
    fresh = Ledger(ledger.path)
    fresh.create_run("lone-abcdef", "lone", "local", None, None, None, None, None)
    assert fresh.finish_run("lone-abcdef").outcome == "crashed"
    with pytest.raises(Exception, match="no run"):
        fresh.finish_run("nope-abcdef")
