"""`list_runs(sync=True)` (what `cloudtrain ls` shows) ends within its deadline whatever the
clouds do (issue 31): every run's journal is read in parallel under one deadline, the ledger is
written in the calling thread only, and a run whose read did not end in time is listed as the
ledger has it, marked `refreshed: false`, with one warning line saying how many and why.

The stores here block on an Event the test sets only once `list_runs` has returned: a listing
that waited for them would never return, which `finished` turns into a failure after the
deadline plus MARGIN_S (the box is loaded; the margin only bounds a hang, it times nothing)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.api.listing import list_runs
from cloudtrain.core.errors import NotFound, ProviderError
from cloudtrain.jobspec.run_ids import parse_run_id
from cloudtrain.providers.base import ObjectInfo
from cloudtrain.run import build
from cloudtrain.run.journal_sync import sync_run
from cloudtrain.state.ledger import Ledger
from tests.unit.cli.test_ls import running_in_a_journal

DEADLINE_S = 0.5
MARGIN_S = 30.0  # far below one blocked run's cost before (the store's ~48 s retry budget)
RUNS = ("alpha-0a0a0a", "beta-0b0b0b", "gamma-0c0c0c")


@dataclass
class BlockingStore:
    """A bucket that never answers: every listing waits for `release`."""

    uri: str
    release: threading.Event
    entered: threading.Semaphore

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.entered.release()
        self.release.wait()
        raise ProviderError("released at the end of the test")

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self.list(key)
        return b""


@dataclass
class StandIn:
    """A provider whose every store is `store(uri)`."""

    store: Callable[[str], Any]
    made: list[str] = field(default_factory=list)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the abandoned reads end with the test


def a_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """A ledger with RUNS running, each with a bucket, and one done run."""
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    ledger = Ledger(tmp_path / "ledger.db")
    for run_id in (*RUNS, "done-0d0d0d"):
        ledger.create_run(
            run_id, run_id[:-7], "local", None, None, None, f"file:///b/{run_id}", None
        )
        ledger.set_status(run_id, "running")
    ledger.finish_run("done-0d0d0d", "succeeded")
    return ledger


def finished(call: Callable[[], Any], within_s: float) -> Any:
    """`call()`'s value (or its exception, raised here), run in a thread; fails the test when
    it has not returned within `within_s` (it would have blocked for good)."""
    box: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # the test's thread raises it
            box.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(within_s), (
        f"still blocked after {within_s}s: the listing waited for the clouds"
    )
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def test_ls_ends_by_its_deadline_when_no_bucket_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    a_home(tmp_path, monkeypatch)
    entered = threading.Semaphore(0)
    stand_in = StandIn(lambda uri: BlockingStore(uri, release, entered))
    monkeypatch.setattr(build, "record_provider", lambda rec: stand_in)
    lines: list[str] = []

    def listing() -> Any:
        return list_runs(sync=True, warn=lines.append, deadline_s=DEADLINE_S)

    rows = finished(listing, DEADLINE_S + MARGIN_S)
    assert not release.is_set()  # returned while every read still blocks
    shown = {row.record.run_id: row.to_dict() for row in rows}
    assert {run: shown[run]["refreshed"] for run in RUNS} == dict.fromkeys(RUNS, False)
    assert shown["done-0d0d0d"]["refreshed"] is True  # nothing to refresh
    assert [shown[run]["status"] for run in RUNS] == ["running"] * 3  # the ledger's, as it was
    assert len(lines) == 1, lines
    assert "3 run(s) not refreshed" in lines[0] and f"within {DEADLINE_S:g}s" in lines[0]


@dataclass
class MeetingStore:
    """A bucket whose listing answers (no entry) once every run's listing has begun: reads
    made one after another never meet, and the first one fails at the barrier's timeout."""

    uri: str
    meeting: threading.Barrier

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.meeting.wait()
        return []

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        raise NotFound(key)


def test_the_runs_are_read_in_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a_home(tmp_path, monkeypatch)
    meeting = threading.Barrier(len(RUNS), timeout=MARGIN_S / 2)
    stand_in = StandIn(lambda uri: MeetingStore(uri, meeting))
    monkeypatch.setattr(build, "record_provider", lambda rec: stand_in)
    lines: list[str] = []
    rows = finished(lambda: list_runs(sync=True, warn=lines.append, deadline_s=MARGIN_S), MARGIN_S)
    assert lines == [] and all(row.to_dict()["refreshed"] for row in rows)


def test_a_bucket_that_fails_is_its_own_warning_and_the_row_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_home(tmp_path, monkeypatch)

    def broken(uri: str) -> Any:
        raise ProviderError(f"{uri}: access denied")

    monkeypatch.setattr(build, "record_provider", lambda rec: StandIn(broken))
    lines: list[str] = []
    rows = finished(lambda: list_runs(sync=True, warn=lines.append), MARGIN_S)
    said = [f"run {run}'s journal not read: file:///b/{run}: access denied" for run in RUNS]
    assert sorted(lines) == said
    assert [row.to_dict()["refreshed"] for row in rows if row.record.run_id in RUNS] == [False] * 3


def test_a_refresh_writes_the_ledger_in_the_calling_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run seen running, finished since (its journal says so): listed done, refreshed, and
    every ledger write of the refresh made by the thread that called `list_runs`."""
    run = "mnist-0a1b2c"
    fresh, rest = running_in_a_journal(tmp_path, run)
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(fresh))
    sync_run(parse_run_id(run), provider="local")  # this machine sees it running
    rest()
    writers: set[str] = set()
    real_apply = Ledger.apply_entry

    def apply_entry(self: Ledger, *args: Any) -> bool:
        writers.add(threading.current_thread().name)
        return real_apply(self, *args)

    monkeypatch.setattr(Ledger, "apply_entry", apply_entry)
    lines: list[str] = []
    (row,) = list_runs(sync=True, warn=lines.append)
    assert (row.record.status, row.record.outcome, row.live) == ("done", "succeeded", 0)
    assert row.to_dict()["refreshed"] is True and lines == []
    assert writers == {threading.current_thread().name}
