"""`cloudtrain ls` as a user meets it: the plan as a JSON object, whole run ids in any width, and
what a run's journal says of a run this machine's ledger last saw running (issue 31)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.providers.local import LocalStore
from cloudtrain.state.journal import Journal
from cloudtrain.state.ledger import Ledger
from tests.unit.state.test_journal import Clock, run_steps, shared_homes

LONGEST = "a" * 30 + "-0a1b2c"  # the longest legal run id: a 30-char name, '-', 6 hex digits


def cli(home: Path, *args: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    """`cloudtrain ARGS` with its output into a pipe (as `| less` or a script reads it)."""
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home))
    for name in ("CLOUDTRAIN_FAULTS", "COLUMNS", "LINES"):
        env.pop(name, None)
    if columns is not None:
        env["COLUMNS"] = columns
    proc = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def a_ledger(home: Path, run_id: str = LONGEST) -> Ledger:
    """A ledger with one running run that has a plan, and no bucket."""
    home.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(home / "ledger.db")
    plan = json.dumps({"provider": "local", "nodes": [{"role": "worker"}], "hourly_usd": 0.0})
    ledger.create_run(run_id, "a" * 30, "local", None, None, "job.yaml", None, plan)
    ledger.set_status(run_id, "running")
    return ledger


def test_ls_json_holds_the_plan_as_an_object(tmp_path: Path) -> None:
    a_ledger(tmp_path)
    (row,) = json.loads(cli(tmp_path, "ls", "--json").stdout)
    assert row["run_id"] == LONGEST
    assert row["plan"] == {"provider": "local", "nodes": [{"role": "worker"}], "hourly_usd": 0.0}
    assert "plan_json" not in row


@pytest.mark.parametrize("columns", ["80", "60", None], ids=["80-columns", "60-columns", "pipe"])
def test_ls_into_a_pipe_shows_every_value_whole(tmp_path: Path, columns: str | None) -> None:
    a_ledger(tmp_path)
    out = cli(tmp_path, "ls", columns=columns).stdout
    (row,) = [line for line in out.splitlines() if LONGEST in line]
    assert "running" in row and "local" in row and "…" not in out, out


@pytest.mark.parametrize("width", [80, 60])
def test_ls_on_a_narrow_terminal_keeps_the_run_id_whole(tmp_path: Path, width: int) -> None:
    """The id never wraps or ends in an ellipsis; the other values wrap in their cells."""
    from rich.console import Console

    from cloudtrain.api.results import RunListing
    from cloudtrain.cli.listing import table

    rec = a_ledger(tmp_path).get_run(LONGEST)
    assert rec is not None
    screen = io.StringIO()
    term = Console(file=screen, width=width, force_terminal=True, color_system=None)
    term.print(table([RunListing(rec, 0, 0.0)]))
    out = screen.getvalue()
    assert any(LONGEST in line for line in out.splitlines()), out
    assert max(len(line) for line in out.splitlines()) <= width and "…" not in out, out


def test_ls_shows_what_the_journal_says_of_a_run_last_seen_running(tmp_path: Path) -> None:
    """A detached run this ledger saw running, finished since (its journal in the bucket says
    so): `ls` shows it done with nothing live, without a `status` first."""
    run = "mnist-0a1b2c"
    fresh, rest = running_in_a_journal(tmp_path, run)
    cli(fresh, "status", run, "--provider", "local", "--json")  # this machine sees it running
    seen = json.loads(cli(fresh, "ls", "--json").stdout)
    assert [(r["status"], r["live"]) for r in seen] == [("running", 3)]
    rest()
    (row,) = json.loads(cli(fresh, "ls", "--json").stdout)
    assert (row["status"], row["outcome"], row["live"]) == ("done", "succeeded", 0)
    assert "done" in cli(fresh, "ls").stdout


def running_in_a_journal(tmp_path: Path, run: str) -> tuple[Path, Callable[[], None]]:
    """A run another machine controls, its journal in a bucket two homes share, written up
    to the run's `running`: (the home that has not seen it yet, a call that writes the rest
    of the run, to its end, and closes the journal)."""
    first, fresh, bucket = shared_homes(tmp_path)
    clock = Clock(0.0)
    writer = Ledger(first / "ledger.db", clock=clock)
    journal = Journal(LocalStore(bucket.as_uri()), run, "controller")
    writer.journal_to(run, journal)
    steps = run_steps(writer, clock, run, "local", bucket.as_uri())
    while (seen := writer.get_run(run)) is None or seen.status != "running":
        steps.pop(0)()
    journal.flush()

    def rest() -> None:
        for step in steps:
            step()
        journal.close()

    return fresh, rest


def test_ls_marks_a_row_its_journal_did_not_refresh(tmp_path: Path) -> None:
    from rich.console import Console

    from cloudtrain.api.listing import ListedRun
    from cloudtrain.cli.listing import table

    rec = a_ledger(tmp_path).get_run(LONGEST)
    assert rec is not None
    screen = io.StringIO()
    Console(file=screen, width=200, color_system=None).print(
        table([ListedRun(rec, 0, 0.0, refreshed=False)])
    )
    assert "running (not refreshed)" in screen.getvalue()
    assert ListedRun(rec, 0, 0.0).to_dict()["refreshed"] is True
