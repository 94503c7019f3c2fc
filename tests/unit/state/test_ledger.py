"""The SQLite run ledger: runs, resources (intent before create), events, billing, concurrency."""

from __future__ import annotations

import json
import random
import re
import sqlite3
import threading
from pathlib import Path

import pytest

from cloudtrain.core import paths
from cloudtrain.core.errors import LedgerError, UsageError
from cloudtrain.providers.base import Resource
from cloudtrain.state.ledger import SCHEMA_VERSION, Ledger


class FakeClock:
    """A settable clock: `clock.t` is the time every ledger timestamp gets."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: FakeClock) -> Ledger:
    return Ledger(tmp_path / "ledger.db", clock=clock)


def node(run_id: str, name: str, cloud_id: str | None = None) -> Resource:
    return Resource("aws", "node", name, "us-east-1", run_id, cloud_id)


def new_run(ledger: Ledger, run_id: str, name: str = "mnist") -> None:
    plan = json.dumps({"nodes": 2})
    ledger.create_run(run_id, name, "aws", "us-east-1", "us-east-1a", "job.yaml", "s3://b", plan)


def test_paths_follow_cloudtrain_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    assert paths.cloudtrain_home() == tmp_path / "home"
    assert paths.runs_dir() == tmp_path / "home" / "runs"
    led = Ledger()
    assert led.path == tmp_path / "home" / "ledger.db"
    assert led.path.exists()
    monkeypatch.delenv("CLOUDTRAIN_HOME")
    assert paths.cloudtrain_home() == Path.home() / ".cloudtrain"


def test_schema_version_and_wal(ledger: Ledger) -> None:
    assert ledger.schema_version() == SCHEMA_VERSION
    with sqlite3.connect(ledger.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    Ledger(ledger.path)  # reopening an existing file is fine


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match="newer"):
        Ledger(path)


def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:  # the v1 runs table: no account column
        conn.execute(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, name TEXT NOT NULL, provider TEXT NOT"
            " NULL, region TEXT, zone TEXT, spec_path TEXT, store_uri TEXT, plan_json TEXT,"
            " status TEXT NOT NULL, outcome TEXT, created_at REAL NOT NULL, ended_at REAL,"
            " detail TEXT)"
        )
        conn.execute(
            "INSERT INTO runs VALUES ('old', 'n', 'aws', 'r', 'z', '', '', '', 'done',"
            " 'succeeded', 1.0, 2.0, '')"
        )
        conn.execute("PRAGMA user_version = 1")
    ledger = Ledger(path)
    assert ledger.schema_version() == SCHEMA_VERSION
    old = ledger.get_run("old")
    assert old is not None and old.account is None and old.outcome == "succeeded"
    ledger.create_run("new", "n", "gcp", "us-central1", None, None, None, None, account="proj-1")
    new = ledger.get_run("new")
    assert new is not None and new.account == "proj-1"


def test_corrupt_file_is_a_ledger_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError, match=re.escape(str(path))):
        Ledger(path)


def test_create_and_get_run(ledger: Ledger, clock: FakeClock) -> None:
    new_run(ledger, "r1")
    run = ledger.get_run("r1")
    assert run is not None
    assert (run.name, run.provider, run.zone, run.status, run.outcome) == (
        "mnist",
        "aws",
        "us-east-1a",
        "planned",
        None,
    )
    assert run.created_at == clock.t
    assert run.plan == {"nodes": 2}
    assert ledger.get_run("nope") is None
    new_run(ledger, "r1", name="other")  # idempotent: the first record stays
    again = ledger.get_run("r1")
    assert again is not None and again.name == "mnist"


def test_set_status_and_done_stamps_ended_at(ledger: Ledger, clock: FakeClock) -> None:
    new_run(ledger, "r1")
    ledger.set_status("r1", "running")
    run = ledger.get_run("r1")
    assert run is not None and run.status == "running" and run.ended_at is None
    ledger.set_status("r1", "stopping", outcome="budget_exceeded", detail="max_cost_usd=5")
    clock.t += 60
    ledger.set_status("r1", "done")
    run = ledger.get_run("r1")
    assert run is not None
    assert (run.status, run.outcome, run.detail) == ("done", "budget_exceeded", "max_cost_usd=5")
    assert run.ended_at == clock.t
    clock.t += 60
    ledger.set_status("r1", "done")  # idempotent: ended_at keeps the first stamp
    again = ledger.get_run("r1")
    assert again is not None and again.ended_at == run.ended_at


def test_a_done_run_stays_done_and_a_late_outcome_still_lands(ledger: Ledger) -> None:
    """`down` may mark a run done before the process it fenced out records why it stopped:
    the late write gives the outcome, and never takes the run back out of `done`."""
    new_run(ledger, "r1")
    ledger.set_status("r1", "running")
    assert ledger.finish_run("r1").outcome == "crashed"  # down: nobody recorded an outcome
    ledger.set_status("r1", "stopping", outcome="interrupted", detail="stopped by down")
    run = ledger.get_run("r1")
    assert run is not None
    assert (run.status, run.outcome, run.detail) == ("done", "interrupted", "stopped by down")


def test_set_status_rejects_bad_values(ledger: Ledger) -> None:
    new_run(ledger, "r1")
    with pytest.raises(LedgerError):
        ledger.set_status("r1", "exploded")
    with pytest.raises(LedgerError):
        ledger.set_status("r1", "done", outcome="meh")
    with pytest.raises(LedgerError, match="no run"):
        ledger.set_status("missing", "done")


def test_list_runs_newest_first(ledger: Ledger, clock: FakeClock) -> None:
    for i in range(5):
        clock.t += 10
        new_run(ledger, f"run-{i}")
    assert [r.run_id for r in ledger.list_runs()] == [f"run-{i}" for i in range(4, -1, -1)]
    assert [r.run_id for r in ledger.list_runs(limit=2)] == ["run-4", "run-3"]
    since = ledger.get_run("run-3")
    assert since is not None
    assert [r.run_id for r in ledger.list_runs(since=since.created_at)] == ["run-4", "run-3"]


def test_find_run(ledger: Ledger) -> None:
    for run_id in ("abc123", "abd456", "abc"):
        new_run(ledger, run_id)
    assert ledger.find_run("abd").run_id == "abd456"
    assert ledger.find_run("abc").run_id == "abc"  # an exact id wins over a longer match
    assert ledger.find_run("abc1").run_id == "abc123"
    with pytest.raises(UsageError, match="ambiguous") as ambiguous:
        ledger.find_run("ab")
    assert "abc123" in str(ambiguous.value) and "abd456" in str(ambiguous.value)
    with pytest.raises(UsageError) as missing:
        ledger.find_run("zzz")
    assert "no run 'zzz'" in str(missing.value)
    assert str(ledger.path) in str(missing.value)
    assert "`cloudtrain ls`" in str(missing.value)
    with pytest.raises(UsageError):
        ledger.find_run("")
    with pytest.raises(UsageError):
        ledger.find_run("a%")  # no wildcard semantics


def test_intent_is_recorded_before_create(ledger: Ledger) -> None:
    new_run(ledger, "r1")
    ledger.record_intent(node("r1", "ct-r1-chief-0"), price_hourly=3.0)
    [rec] = ledger.resources("r1")
    assert (rec.state, rec.cloud_id, rec.price_hourly, rec.deleted_at) == (
        "intent",
        None,
        3.0,
        None,
    )
    assert rec.live
    ledger.mark_created("r1", "node", "ct-r1-chief-0", cloud_id="i-123")
    [rec] = ledger.resources("r1")
    assert (rec.state, rec.cloud_id) == ("created", "i-123")
    assert rec.to_resource() == node("r1", "ct-r1-chief-0", "i-123")
    ledger.mark_created("r1", "node", "ct-r1-chief-0")  # idempotent, cloud_id kept
    assert ledger.resources("r1")[0].cloud_id == "i-123"
    with pytest.raises(LedgerError, match="no intent"):
        ledger.mark_created("r1", "node", "ct-r1-worker-9")


def test_record_intent_is_an_upsert(ledger: Ledger, clock: FakeClock) -> None:
    res = node("r1", "ct-r1-worker-0")
    ledger.record_intent(res, price_hourly=1.0)
    first = ledger.resources("r1")[0].created_at
    clock.t += 30
    ledger.record_intent(res, price_hourly=1.5)  # a retried create
    [rec] = ledger.resources("r1")
    assert rec.created_at == first
    assert rec.price_hourly == 1.5 and rec.state == "intent"
    ledger.mark_created("r1", "node", res.id, "i-1")
    ledger.record_intent(res, price_hourly=1.5)  # a retry after success keeps `created`
    assert ledger.resources("r1")[0].state == "created"


def test_failed_create_stays_live_and_stops_billing(ledger: Ledger, clock: FakeClock) -> None:
    res = node("r1", "ct-r1-worker-0")
    ledger.record_intent(res, price_hourly=3600.0)
    clock.t += 2
    ledger.mark_failed("r1", "node", res.id)
    clock.t += 100
    [rec] = ledger.resources("r1", live_only=True)
    assert rec.state == "failed"
    assert ledger.billed_cost("r1") == pytest.approx(2.0)
    ledger.record_intent(res, price_hourly=3600.0)  # re-create after a failure
    [rec] = ledger.resources("r1")
    assert rec.state == "intent" and rec.deleted_at is None


def test_a_re_created_node_bills_its_lives_not_the_gap_between(
    ledger: Ledger, clock: FakeClock
) -> None:
    res = node("r1", "ct-r1-worker-1")
    ledger.record_intent(res, price_hourly=3600.0)  # $1 a second
    ledger.mark_created("r1", "node", res.id)
    clock.t += 100
    ledger.mark_deleted("r1", "node", res.id)  # preempted
    clock.t += 1000  # no node while the replacement waits for capacity
    ledger.record_intent(res, price_hourly=3600.0)  # the replacement, by the same name
    ledger.mark_created("r1", "node", res.id)
    clock.t += 50
    assert ledger.billed_cost("r1") == pytest.approx(150.0)
    ledger.mark_failed("r1", "node", res.id)  # ... and again, from a failed create
    clock.t += 500
    ledger.record_intent(res, price_hourly=3600.0)
    clock.t += 10
    ledger.mark_deleted("r1", "node", res.id)
    assert ledger.billed_cost("r1") == pytest.approx(160.0)


def test_mark_deleted_and_live_only(ledger: Ledger, clock: FakeClock) -> None:
    for name in ("ct-r1-chief-0", "ct-r1-worker-0"):
        ledger.record_intent(node("r1", name))
        ledger.mark_created("r1", "node", name)
    ledger.record_intent(Resource("aws", "security-group", "ct-r1-sg", "us-east-1", "r1"))
    ledger.mark_deleting("r1", "node", "ct-r1-worker-0")
    states = {r.resource_id: r.state for r in ledger.resources("r1")}
    assert states["ct-r1-worker-0"] == "deleting"
    clock.t += 5
    ledger.mark_deleted("r1", "node", "ct-r1-worker-0")
    deleted_at = clock.t
    clock.t += 5
    ledger.mark_deleted("r1", "node", "ct-r1-worker-0")  # idempotent: first stamp kept
    ledger.mark_deleting("r1", "node", "ct-r1-worker-0")  # never resurrects a deleted row
    ledger.mark_deleted("r1", "node", "not-in-ledger")  # `down` may find unknown resources
    by_id = {r.resource_id: r for r in ledger.resources("r1")}
    assert by_id["ct-r1-worker-0"].state == "deleted"
    assert by_id["ct-r1-worker-0"].deleted_at == deleted_at
    assert not by_id["ct-r1-worker-0"].live
    live = {r.resource_id for r in ledger.resources("r1", live_only=True)}
    assert live == {"ct-r1-chief-0", "ct-r1-sg"}
    assert ledger.resources("other-run") == []


def test_a_providers_accounted_life_is_the_rows_whatever_the_controller_stamped(
    ledger: Ledger, clock: FakeClock
) -> None:
    start = clock.t
    ledger.record_intent(Resource("slurm", "allocation", "job-41", "gpu", "r1", "41"), 3600.0)
    clock.t += 100
    ledger.mark_deleted("r1", "allocation", "job-41")  # the controller's own stamp
    ledger.mark_deleted("r1", "allocation", "job-41", lasted_s=93.5)  # sacct's elapsed time
    [rec] = ledger.resources("r1")
    assert rec.state == "deleted" and rec.deleted_at == start + 93.5
    assert ledger.billed_cost("r1") == pytest.approx(93.5)
    for bad in (-1.0, float("nan"), float("inf"), True, "93", 1e12):
        with pytest.raises(ValueError, match="lasted_s"):
            ledger.mark_deleted("r1", "allocation", "job-41", lasted_s=bad)  # type: ignore[arg-type]
    assert ledger.resources("r1")[0].deleted_at == start + 93.5


def test_billed_cost_with_injected_clock(ledger: Ledger, clock: FakeClock) -> None:
    start = clock.t
    ledger.record_intent(node("r1", "ct-r1-chief-0"), price_hourly=2.0)
    ledger.record_intent(node("r1", "ct-r1-worker-0"), price_hourly=4.0)
    network = Resource("aws", "security-group", "ct-r1-sg", "us-east-1", "r1")
    ledger.record_intent(network, price_hourly=100.0)  # not a node: not billed
    ledger.record_intent(node("r2", "ct-r2-chief-0"), price_hourly=50.0)  # another run
    clock.t = start + 1800
    ledger.mark_deleted("r1", "node", "ct-r1-worker-0")
    clock.t = start + 3600
    assert ledger.billed_cost("r1") == pytest.approx(2.0 * 1.0 + 4.0 * 0.5)
    assert ledger.billed_cost("r1", now=start + 7200) == pytest.approx(2.0 * 2.0 + 4.0 * 0.5)
    assert ledger.billed_cost("nothing") == 0.0


def test_concurrent_mark_deleted_from_16_threads(ledger: Ledger) -> None:
    names = [f"ct-r1-worker-{i}" for i in range(16)]
    for name in names:
        ledger.record_intent(node("r1", name), price_hourly=1.0)
        ledger.mark_created("r1", "node", name)
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)
    other = Ledger(ledger.path)  # a second handle on the same file, as another process has

    def teardown(i: int) -> None:
        try:
            led = ledger if i % 2 else other
            barrier.wait()
            for name in random.Random(i).sample(names, len(names)):
                led.mark_deleting("r1", "node", name)
                led.mark_deleted("r1", "node", name)
            led.event("r1", "teardown", f"thread {i} done")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=teardown, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ledger.resources("r1", live_only=True) == []
    assert all(r.state == "deleted" for r in ledger.resources("r1"))
    assert len(ledger.events("r1")) == 16


def test_events_in_order(ledger: Ledger, clock: FakeClock) -> None:
    ledger.event("r1", "plan", "2 x g5.xlarge")
    clock.t += 1
    ledger.event("r1", "node", "chief up")
    ledger.event("r2", "plan", "other run")
    events = ledger.events("r1")
    assert [(e.kind, e.message) for e in events] == [
        ("plan", "2 x g5.xlarge"),
        ("node", "chief up"),
    ]
    assert events[0].ts < events[1].ts
    assert events[0].id < events[1].id
    assert ledger.events("none") == []
