"""The run's journal in its bucket (cloudtrain/state/journal.py): a ledger mirrors its writes of a
run, one new object each; any other ledger replays them with their original times, idempotently;
`status`, `logs` and the journal's own import work from a fresh CLOUDTRAIN_HOME given the run id
and the provider. Against the local store and S3 (moto's server, the real boto3). Runs on the
node Pythons too (the controller node imports journals): no TensorFlow here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import LedgerError, NotFound
from cloudtrain.jobs.protocol import journal_prefix
from cloudtrain.providers.base import ObjectStore, Resource
from cloudtrain.providers.local import LocalStore
from cloudtrain.state import run_key
from cloudtrain.state.journal import (
    KEY_RE,
    Journal,
    _window,
    import_journal,
    key_time_ns,
    writer_id,
)
from cloudtrain.state.ledger import JOURNAL_OPS, Ledger
from tests.fakes.moto_server import moto_available

RUN = "mnist-0a1b2c"
OTHER = "cifar-3d4e5f"
HOUR = 3600.0


class Clock:
    """A settable clock for a ledger: every timestamp it writes is `t`."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """The run's bucket: a folder, or an S3 bucket on moto's server through boto3."""
    if request.param == "local":
        yield LocalStore((tmp_path / "bucket").as_uri())
        return
    if not moto_available():
        pytest.fail("moto[server], flask and boto3 are needed (the node-test extras)")
    request.getfixturevalue("moto_server")
    from cloudtrain.providers.aws.storage import S3Store

    s3 = S3Store("s3://cloudtrain-journal-test/runs", "us-east-1")
    s3.ensure_bucket()
    yield s3


from tests.fakes.moto_server import moto_server, moto_server_session  # noqa: E402

__all__ = ["moto_server", "moto_server_session"]  # fixtures used by `store`


def node(name: str, run_id: str = RUN, provider: str = "aws") -> Resource:
    return Resource(provider, "node", name, "us-east-1", run_id, None)


def a_run(
    led: Ledger, clock: Clock, run_id: str = RUN, provider: str = "aws", bucket: str = "s3://b/x"
) -> int:
    """Every write a ledger offers, at distinct times; returns how many writes were made."""
    steps = run_steps(led, clock, run_id, provider, bucket)
    for step in steps:
        step()
    return len(steps)


def run_steps(
    led: Ledger, clock: Clock, run_id: str = RUN, provider: str = "aws", bucket: str = "s3://b/x"
) -> list[Callable[[], None]]:
    """`a_run`'s writes, one call each, to be made in order (each sets its own time)."""
    steps: list[Callable[[], None]] = []

    def step(t: float | None, write: Callable[[], Any]) -> None:
        def made() -> None:
            clock.t = clock.t + 1 if t is None else t
            write()

        steps.append(made)

    sg = Resource(provider, "security-group", "sg", "us-east-1", run_id, None)
    step(1000.0, lambda: led.create_run(
        run_id, "mnist", provider, "us-east-1", None, "job.yaml", bucket, '{"n":2}'
    ))  # fmt: skip
    step(1001.0, lambda: led.set_status(run_id, "provisioning"))
    step(1002.0, lambda: led.record_intent(sg))
    step(1003.0, lambda: led.mark_created(run_id, "security-group", "sg", "sg-123"))
    for i, price in enumerate((3.6, 7.2)):
        res = node(f"worker-{i}", run_id, provider)
        step(1010.0 + i, lambda r=res, p=price: led.record_intent(r, price_hourly=p))
        step(1020.0 + i, lambda i=i: led.mark_created(run_id, "node", f"worker-{i}", f"i-{i}"))
    step(1030.0, lambda: led.set_status(run_id, "running"))
    # failover moved it (cloudtrain/run/failover.py): the row names the new place
    step(1031.0, lambda: led.move_run(run_id, provider, "us-west-2", "w-a", bucket, "{}", "p-2"))
    step(1040.0, lambda: led.event(run_id, "preempted", "worker-1 was preempted"))
    step(1041.0, lambda: led.mark_failed(run_id, "node", "worker-1"))
    again = node("worker-1", run_id, provider)  # its replacement
    step(1050.0, lambda: led.record_intent(again, price_hourly=7.2))
    step(1060.0, lambda: led.mark_created(run_id, "node", "worker-1", "i-9"))
    step(1000.0 + 2 * HOUR, lambda: led.set_status(run_id, "tearing_down", "succeeded", "ok"))
    for name in ("worker-0", "worker-1"):
        step(None, lambda n=name: led.mark_deleting(run_id, "node", n))
        step(None, lambda n=name: led.mark_deleted(run_id, "node", n))
    step(None, lambda: led.mark_deleted(run_id, "security-group", "sg"))
    step(None, lambda: led.set_status(run_id, "done"))
    step(None, lambda: led.finish_run(run_id))  # a later `down`: the outcome is kept
    return steps


def snapshot(led: Ledger, run_id: str = RUN) -> dict[str, Any]:
    """Everything the ledger knows of the run, comparable across files."""
    return {
        "run": led.get_run(run_id),
        "resources": led.resources(run_id),
        "events": [(e.ts, e.kind, e.message) for e in led.events(run_id)],
        "cost": led.billed_cost(run_id, now=99_999.0),
        "bills": led.node_bills(run_id, job_end=1000.0 + HOUR, now=99_999.0),
    }


def written(tmp_path: Path, store: ObjectStore, run_id: str = RUN) -> tuple[Ledger, int]:
    """A ledger that ran `a_run` mirrored into `store`, its journal closed."""
    clock = Clock(0.0)
    led = Ledger(tmp_path / "writer.db", clock=clock)
    journal = Journal(store, run_id, "laptop.host.1")
    led.journal_to(run_id, journal)
    writes = a_run(led, clock, run_id)
    journal.close()
    return led, writes


def entries(store: ObjectStore, run_id: str = RUN) -> list[tuple[str, dict[str, Any]]]:
    prefix = journal_prefix(run_id)
    return [(o.key[len(prefix) :], json.loads(store.get(o.key))) for o in store.list(prefix)]


def test_every_write_is_one_new_object_with_its_op_time_and_arguments(
    tmp_path: Path, store: ObjectStore
) -> None:
    _, writes = written(tmp_path, store)
    found = entries(store)
    assert len(found) == writes == 22
    names = [name for name, _ in found]
    assert all(KEY_RE.fullmatch(n) for n in names), names
    assert names == sorted(names) and len(set(names)) == len(names)
    ops = [e["op"] for _, e in found]
    assert set(ops) == set(JOURNAL_OPS)  # every write the ledger offers is mirrored
    assert ops[:3] == ["create_run", "set_status", "record_intent"]
    first = found[0][1]
    assert first["at"] == 1000.0 and first["run_id"] == RUN and first["plan_json"] == '{"n":2}'
    intent = found[4][1]
    assert len(intent.pop("mac")) == 64  # signed with the run's key (cloudtrain/state/run_key.py)
    assert intent == {
        "op": "record_intent",
        "at": 1010.0,
        "run_id": RUN,
        "provider": "aws",
        "kind": "node",
        "resource_id": "worker-0",
        "region": "us-east-1",
        "cloud_id": None,
        "price_hourly": 3.6,
    }


def test_a_fresh_ledger_importing_the_journal_has_the_same_run_and_bill(
    tmp_path: Path, store: ObjectStore
) -> None:
    writer, writes = written(tmp_path, store)
    reader = Ledger(tmp_path / "reader.db", clock=Clock(5e9))  # its own clock is never used
    assert import_journal(reader, store, RUN) == writes
    assert snapshot(reader) == snapshot(writer)
    assert reader.get_run(RUN).outcome == "succeeded"  # type: ignore[union-attr]
    # the bill: worker-0 3.6 $/h and worker-1 7.2 $/h (twice), from intent to delete
    assert reader.billed_cost(RUN) == pytest.approx(writer.billed_cost(RUN, now=0.0), abs=1e-9)
    assert reader.billed_cost(RUN) > 20.0
    # twice: nothing changes, nothing is added
    assert import_journal(reader, store, RUN) == 0
    assert import_journal(reader, store, RUN, incremental=True) == 0
    assert snapshot(reader) == snapshot(writer)
    # the writer's own entries are already in its file
    before = snapshot(writer)
    assert import_journal(writer, store, RUN) == 0
    assert snapshot(writer) == before


def test_an_entry_written_after_an_import_is_taken_by_the_next(
    tmp_path: Path, store: ObjectStore
) -> None:
    writer, _ = written(tmp_path, store)
    reader = Ledger(tmp_path / "reader.db")
    import_journal(reader, store, RUN)
    journal = Journal(store, RUN, "controller.2")  # another writer: the controller node
    writer.journal_to(RUN, journal)
    writer.clock = Clock(50_000.0)
    writer.event(RUN, "note", "written after the first import")
    journal.close()
    assert import_journal(reader, store, RUN, incremental=True) == 1
    assert import_journal(reader, store, RUN, incremental=True) == 0
    assert import_journal(reader, store, RUN) == 0
    assert reader.events(RUN)[-1].ts == 50_000.0
    assert snapshot(reader) == snapshot(writer)


def test_an_incremental_import_lists_only_the_window_near_its_newest_entry(
    tmp_path: Path, store: ObjectStore
) -> None:
    t0 = 1_764_105_000 * 10**9  # the writer's clock; the window: 0176410xxx... (1e5 s)
    ticks = iter(range(t0, t0 + 10**9, 10**6))
    clock = Clock(0.0)
    writer = Ledger(tmp_path / "writer.db", clock=clock)
    journal = Journal(store, RUN, "w", clock_ns=lambda: next(ticks))
    writer.journal_to(RUN, journal)
    a_run(writer, clock)
    journal.close()
    reader = Ledger(tmp_path / "reader.db")
    now = lambda: t0 + 10 * 10**9  # noqa: E731
    import_journal(reader, store, RUN, now_ns=now)
    # entries whose writers' clocks are 30 days off: outside the window, only a full import
    # sees them
    for days in (-30, 30):
        skewed = Journal(
            store, RUN, f"skewed{days + 30}", clock_ns=lambda d=days: t0 + d * 86400 * 10**9
        )
        skewed.sign_with(writer.run_key(RUN) or b"")  # another controller of the run
        skewed.append({"op": "event", "at": 7.0, "run_id": RUN, "kind": "k", "message": "m"})
        skewed.close()
    near = Journal(store, RUN, "near", clock_ns=lambda: t0 - 300 * 10**9)  # 5 min behind
    near.sign_with(writer.run_key(RUN) or b"")
    near.append({"op": "event", "at": 8.0, "run_id": RUN, "kind": "k", "message": "m"})
    near.close()
    assert import_journal(reader, store, RUN, incremental=True, now_ns=now) == 1
    assert import_journal(reader, store, RUN, incremental=True, now_ns=now) == 0
    assert import_journal(reader, store, RUN, now_ns=now) == 2
    assert _window(t0 - 600 * 10**9, t0 + 610 * 10**9) == "0176410"
    assert _window(1_764_106_000 * 10**9, 1_764_106_999 * 10**9) == "01764106"
    assert _window(5, 5) == "00000000000000000005"


def test_keys_increase_per_writer_when_the_clock_steps_back(store: ObjectStore) -> None:
    times = iter([5_000, 4_000, 4_000, 9_000])
    journal = Journal(store, RUN, "w", clock_ns=lambda: next(times))
    keys = [journal.reserve() for _ in range(4)]
    assert keys == sorted(keys) and len(set(keys)) == 4
    assert [key_time_ns(k) for k in keys] == [5_000, 5_001, 5_002, 9_000]
    with pytest.raises(ValueError):
        Journal(store, RUN, "a-b")  # '-' separates a key's fields
    for role in ("laptop", "controller", "a-role-with-dashes-and-far-too-long-" * 3):
        writer = writer_id(role)
        Journal(store, RUN, writer)  # a valid id
        assert writer.endswith(f".{os.getpid()}") and len(writer) <= 64, writer


def test_corrupt_unknown_and_foreign_entries_are_skipped_with_a_warning(
    tmp_path: Path, store: ObjectStore
) -> None:
    writer, writes = written(tmp_path, store)
    prefix = journal_prefix(RUN)
    t = 10**19  # after every real entry
    bad = {
        f"{t + 1:020d}-000001-x.json": b"{not json",
        f"{t + 2:020d}-000002-x.json": json.dumps(
            {"op": "resize_node", "at": 1.0, "run_id": RUN}
        ).encode(),  # an op a newer cloudtrain writes
        f"{t + 3:020d}-000003-x.json": json.dumps(
            {"op": "event", "at": 1.0, "run_id": OTHER, "kind": "k", "message": "m"}
        ).encode(),  # another run's, in this run's journal
        f"{t + 4:020d}-000004-x.json": json.dumps(
            {"op": "mark_created", "at": 1.0, "run_id": RUN, "kind": "node"}
        ).encode(),  # a field missing
        f"{t + 5:020d}-000005-x.json": json.dumps([1, 2]).encode(),
        f"{t + 6:020d}-000006-x.json": json.dumps(
            {"op": "set_status", "at": "soon", "run_id": RUN, "status": "done"}
        ).encode(),
        "notes.txt": b"hello",
    }
    key = writer.run_key(RUN) or b""
    for name, data in bad.items():
        doc = json.loads(data) if data.startswith(b"{\"") else None
        if isinstance(doc, dict):  # signed by a controller of the run (a newer one, a buggy one)
            data = json.dumps(run_key.sign_doc(key, run_key.journal_purpose(name), doc)).encode()
        store.put(prefix + name, data)
    reader = Ledger(tmp_path / "reader.db")
    warnings: list[str] = []
    assert import_journal(reader, store, RUN, warn=warnings.append) == writes
    assert len(warnings) == len(bad), warnings
    assert any("resize_node" in w and "newer" in w for w in warnings), warnings
    assert any("another run" in w for w in warnings), warnings
    assert reader.get_run(OTHER) is None and reader.events(OTHER) == []
    assert snapshot(reader) == snapshot(writer)
    # skipped entries are not recorded: a later (newer) cloudtrain would try them again
    again: list[str] = []
    assert import_journal(reader, store, RUN, warn=again.append) == 0
    assert len(again) == len(bad)


def test_an_intent_returns_only_once_its_entry_is_in_the_bucket(
    tmp_path: Path, store: ObjectStore
) -> None:
    led = Ledger(tmp_path / "writer.db", clock=Clock(1.0))
    journal = Journal(store, RUN, "w", retry_s=0.05)
    led.journal_to(RUN, journal)
    led.create_run(RUN, "mnist", "aws", "us-east-1", None, None, store.uri, None)
    led.record_intent(node("worker-0"))
    assert journal.pending == 0
    assert [e["op"] for _, e in entries(store)] == ["create_run", "record_intent"]
    # a journal that cannot write: the intent is refused (no create may follow), an event is not
    broken = Journal(unwritable(tmp_path, store), RUN, "w2", retry_s=0.05)
    led.journal_to(RUN, broken)
    led.event(RUN, "note", "queued, not waited for")
    assert broken.pending == 1
    with pytest.raises(LedgerError, match="journal"):
        led.record_intent(node("worker-1"))
    with pytest.raises(LedgerError):
        broken.close(timeout_s=5)


def unwritable(tmp_path: Path, store: ObjectStore) -> ObjectStore:
    """A store of the same kind whose writes fail: a folder under a file; a missing bucket."""
    if isinstance(store, LocalStore):
        (tmp_path / "a-file").write_text("")
        return LocalStore((tmp_path / "a-file" / "bucket").as_uri())
    from cloudtrain.providers.aws.storage import S3Store

    return S3Store("s3://cloudtrain-journal-missing", "us-east-1")


def test_an_old_ledger_file_gains_the_journal_table(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "v3.db"
    Ledger(path)
    with sqlite3.connect(path) as conn:  # as a version-3 file was: no journal_applied
        conn.execute("DROP TABLE journal_applied")
        conn.execute("PRAGMA user_version = 3")
    led = Ledger(path)
    assert led.schema_version() == 5  # and the run keys' table (cloudtrain/state/run_key.py)
    assert led.journal_keys(RUN) == set() and led.last_journal_key(RUN) is None
    assert led.run_key(RUN) is None


# --- the API from a fresh CLOUDTRAIN_HOME (the CLI's: tests/unit/cli/test_journal_cli.py) ---


def shared_homes(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two CLOUDTRAIN_HOMEs sharing only the local provider's bucket (`$CLOUDTRAIN_HOME/buckets/
    local`), as two machines share a cloud bucket: (first, fresh, bucket)."""
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    bucket = first / "buckets" / "local"
    bucket.mkdir(parents=True)
    (fresh / "buckets").mkdir(parents=True)
    (fresh / "buckets" / "local").symlink_to(bucket)
    return first, fresh, bucket


def local_run(first: Path, bucket: Path, run_id: str = RUN) -> Ledger:
    """The first home's ledger after a local run mirrored to the shared bucket."""
    clock = Clock(0.0)
    writer = Ledger(first / "ledger.db", clock=clock)
    journal = Journal(LocalStore(bucket.as_uri()), run_id, "laptop")
    writer.journal_to(run_id, journal)
    a_run(writer, clock, run_id, "local", bucket.as_uri())
    journal.close()
    return writer


def test_sync_run_builds_the_record_from_the_journal_then_reads_only_what_is_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloudtrain.core.errors import UsageError
    from cloudtrain.run.journal_sync import sync_run

    first, fresh, bucket = shared_homes(tmp_path)
    writer = local_run(first, bucket)
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(fresh))
    with pytest.raises(UsageError, match="no run"):
        sync_run(RUN)  # no record, no provider: nowhere to look
    with pytest.raises(UsageError, match="no journal"):
        sync_run("other-000000", provider="local")
    with pytest.raises(UsageError):
        sync_run("mnist", provider="local")  # the cloud's bucket needs a whole run id
    rec = sync_run(RUN, provider="local")
    assert (rec.status, rec.outcome, rec.provider) == ("done", "succeeded", "local")
    fresh_ledger = Ledger(fresh / "ledger.db")
    assert snapshot(fresh_ledger) == snapshot(writer)
    # the record is here now: a prefix will do, and a new entry comes in
    journal = Journal(LocalStore(bucket.as_uri()), RUN, "controller")
    writer.journal_to(RUN, journal)
    writer.event(RUN, "note", "after the first sync")
    journal.close()
    assert sync_run(RUN[:5]).run_id == RUN
    assert fresh_ledger.events(RUN)[-1].message == "after the first sync"


def test_a_bucket_that_cannot_be_read_is_a_warning_for_a_ledger_that_has_the_run(
    tmp_path: Path, moto_server: Any
) -> None:
    from cloudtrain.providers.aws.storage import S3Store
    from cloudtrain.state.journal import try_import

    led = Ledger(tmp_path / "l.db")
    said: list[str] = []
    missing = S3Store("s3://cloudtrain-journal-missing", "us-east-1")
    assert try_import(led, missing, RUN, warn=said.append) == 0
    assert len(said) == 1 and "journal not read" in said[0], said
    with pytest.raises(NotFound):
        import_journal(led, missing, RUN)


def test_logs_follow_ends_when_the_journal_says_the_run_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run controlled elsewhere (here: by a live process, so only the journal can end the
    follow): the follow takes in the run's outcome from its journal."""
    import threading

    from cloudtrain.api import log_stream as api_logs
    from cloudtrain.api.log_stream import LogStream
    from cloudtrain.providers.local import LocalProvider
    from cloudtrain.state.runstate import RunReader

    store = LocalStore((tmp_path / "bucket").as_uri())
    writer = Ledger(tmp_path / "writer.db", clock=Clock(1.0))
    journal = Journal(store, RUN, "controller")
    writer.journal_to(RUN, journal)
    writer.create_run(RUN, "mnist", "local", None, None, None, store.uri, None)
    writer.set_status(RUN, "running")
    journal.flush()
    reader = Ledger(tmp_path / "reader.db")
    import_journal(reader, store, RUN)
    rec = reader.get_run(RUN)
    assert rec is not None and rec.status == "running"
    prov = LocalProvider()
    monkeypatch.setattr(api_logs, "JOURNAL_CHECK_S", 0.1)  # 10 s between reads otherwise
    stream = LogStream(rec, prov, RunReader(store, RUN), reader, follow=True, poll_s=0.02)
    ended = threading.Event()
    threading.Thread(target=lambda: (list(stream), ended.set()), daemon=True).start()
    assert not ended.wait(0.5)  # the ledger here says running, and its controller lives
    writer.set_status(RUN, "done", "succeeded")
    assert ended.wait(20), "the follow did not take in the journal's outcome"
    assert stream.end is not None and (stream.end.reason, stream.end.outcome) == (
        "done",
        "succeeded",
    )
    journal.close()


def test_an_entry_applied_twice_at_once_is_held_once(tmp_path: Path) -> None:
    """Two importers into one file (two `status` commands) may both list an entry before either
    applies it: the file's own record of applied keys decides, in the write's transaction."""
    led = Ledger(tmp_path / "l.db")
    led.create_run(RUN, "mnist", "local", None, None, None, None, None)
    entry = {"op": "event", "at": 5.0, "run_id": RUN, "kind": "k", "message": "once"}
    name = f"{10**18:020d}-000001-w.json"
    assert led.apply_entry(RUN, name, entry) is True
    assert led.apply_entry(RUN, name, entry) is False
    assert [(e.ts, e.message) for e in led.events(RUN)] == [(5.0, "once")]
    assert led.journal_keys(RUN) == {name} and led.last_journal_key(RUN) == name


def test_an_accounted_life_replays_and_a_forged_one_is_refused(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.db")
    led.create_run(RUN, "mnist", "slurm", None, None, None, None, None)
    intent = {
        "op": "record_intent", "at": 100.0, "run_id": RUN, "provider": "slurm",
        "kind": "allocation", "resource_id": "job-7", "region": "gpu", "cloud_id": "7",
        "price_hourly": 1.0,
    }  # fmt: skip
    assert led.apply_entry(RUN, f"{1:020d}-000001-w.json", intent)
    deleted = {"op": "mark_deleted", "at": 900.0, "run_id": RUN, "kind": "allocation",
               "resource_id": "job-7"}  # fmt: skip
    with pytest.raises(LedgerError, match="malformed mark_deleted"):
        led.apply_entry(RUN, f"{2:020d}-000001-w.json", {**deleted, "lasted_s": -5})
    assert led.apply_entry(RUN, f"{3:020d}-000001-w.json", {**deleted, "lasted_s": 60})
    [rec] = led.resources(RUN)
    assert (rec.state, rec.deleted_at) == ("deleted", 160.0)


@pytest.mark.parametrize("cut", [1, 4, 9, 14, 21])
def test_a_journal_started_mid_run_backfills_what_the_ledger_holds(
    tmp_path: Path, store: ObjectStore, cut: int
) -> None:
    """The laptop's ledger has the run's row (and maybe more) before its bucket exists: the
    journal it then starts carries the whole record, and the writes after it."""
    clock = Clock(0.0)
    writer = Ledger(tmp_path / "writer.db", clock=clock)
    journal = Journal(store, RUN, "laptop")
    steps = run_steps(writer, clock)
    for step in steps[:cut]:
        step()
    writer.journal_to(RUN, journal, backfill=True)  # the bucket exists from here on
    for step in steps[cut:]:
        step()
    writer.event(RUN, "note", "after the run")  # the cut may be past the run's last write
    journal.close()
    reader = Ledger(tmp_path / "reader.db")
    assert import_journal(reader, store, RUN) > 0
    assert snapshot(reader) == snapshot(writer)
    assert import_journal(writer, store, RUN) == 0  # the backfill's keys are the writer's


def test_backfill_rebuilds_failed_and_half_deleted_resources(
    tmp_path: Path, store: ObjectStore
) -> None:
    clock = Clock(100.0)
    writer = Ledger(tmp_path / "writer.db", clock=clock)
    writer.create_run(RUN, "mnist", "aws", None, None, None, None, None)
    for name in ("a", "b", "c", "d"):
        writer.record_intent(node(name), price_hourly=3.6)
    clock.t = 200.0
    writer.mark_created(RUN, "node", "b", "i-b")
    writer.mark_created(RUN, "node", "c", "i-c")
    writer.mark_failed(RUN, "node", "a")  # billed 100 s
    writer.mark_failed(RUN, "node", "d")
    clock.t = 300.0
    writer.mark_deleting(RUN, "node", "c")  # still billed
    writer.mark_deleting(RUN, "node", "d")  # billed until it failed
    journal = Journal(store, RUN, "laptop")
    writer.journal_to(RUN, journal, backfill=True)
    assert journal.pending == 0  # the backfill waited for the bucket
    journal.close()
    reader = Ledger(tmp_path / "reader.db")
    import_journal(reader, store, RUN)
    assert snapshot(reader) == snapshot(writer)
    assert [r.state for r in reader.resources(RUN)] == ["failed", "created", "deleting", "deleting"]
    with pytest.raises(LedgerError, match="no run"):
        writer.journal_to(OTHER, journal, backfill=True)
