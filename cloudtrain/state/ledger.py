"""The local run ledger: runs, the cloud resources each one made, and their events, in SQLite.

The ledger is what makes teardown safe: a resource is recorded (state `intent`) *before* its create
call, so a crash between the call and its reply still leaves a row for `cloudtrain down` to clean.

Concurrency: every call opens its own connection (so a `Ledger` is thread-safe and can be shared by
the orchestrator's teardown threads), writes run in `BEGIN IMMEDIATE` transactions behind a
per-file lock, and the database is in WAL mode with a busy timeout, so another process (say `down`
while a crashed run's file is still there) can use the same file at the same time (the file, its
schema and connections: cloudtrain/state/ledger_db.py).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import LedgerError, UsageError
from cloudtrain.core.paths import ledger_path
from cloudtrain.core.procid import start_stamp
from cloudtrain.providers.base import Resource
from cloudtrain.state.ledger_db import SCHEMA_VERSION, LedgerFile
from cloudtrain.state.ledger_records import (
    JOURNAL_OPS,
    OUTCOMES,
    RESOURCE_STATES,
    RUN_STATUSES,
    EventRecord,
    JournalSink,
    ResourceRecord,
    RunRecord,
    lasted_seconds,
    state_entries,
)

if TYPE_CHECKING:
    from cloudtrain.jobspec.run_ids import RunRef

__all__ = [  # the records live in ledger_records (this file's size); import them from either
    "ALLOCATION",
    "BILLED_KINDS",
    "JOURNAL_OPS",
    "OUTCOMES",
    "RESOURCE_STATES",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "EventRecord",
    "JournalSink",
    "Ledger",
    "ResourceRecord",
    "RunRecord",
    "state_entries",
]

# The resource kinds that bill at their price_hourly while they live: a VM provider's nodes, and
# a gang compute's allocations (Slurm: its nodes wait in the queue for free, and the allocation
# bills from when the job is seen running to its end: cloudtrain/run/provisioning.py).
ALLOCATION = "allocation"
BILLED_KINDS = ("node", ALLOCATION)

# the run row's fields a move_run entry sets, then the run it names (Ledger.move_run)
MOVE_FIELDS = ("provider", "region", "zone", "store_uri", "plan_json", "account", "run_id")


class Ledger:
    """The run ledger at `path` (default `$CLOUDTRAIN_HOME/ledger.db`).

    Thread-safe and safe across processes. Creates the file and schema on first use. Every error
    from SQLite surfaces as `LedgerError` naming the file. `clock` supplies timestamps (seconds
    since the epoch) and exists for tests.
    """

    def __init__(self, path: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path is not None else ledger_path()
        self.clock = clock
        self._journals: dict[str, JournalSink] = {}
        self._file = LedgerFile(self.path)  # its folder, file and schema

    def schema_version(self) -> int:
        """The schema version stored in the file (`PRAGMA user_version`). Read-only."""
        return self._file.schema_version()

    # -- the journal: every write of a run mirrored to its bucket, and replayed from it --------

    def journal_to(
        self, run_id: str, journal: JournalSink | None, *, backfill: bool = False
    ) -> None:
        """From now on, mirror every write of `run_id` through this `Ledger` object into
        `journal` (cloudtrain/state/journal.py: one object per write in the run's bucket), or stop
        (None). Each entry's key is recorded as applied in the same transaction as the write,
        so importing the journal back into this file changes nothing. Which writes wait for
        their entry to be in the bucket: `record_intent` (before a create call, as in the
        ledger), `finish_run` and `set_status(..., "done")`; the others only queue it.

        Every entry is signed with the run's key (cloudtrain/state/run_key.py: this file's, else
        the bucket's, else a new one put in both), which blocks for a bucket read (and a write)
        the first time; the store's errors propagate.

        `backfill`: first journal the run as this file holds it now (`state_entries`: its
        row, resources and events with their recorded times), for a journal started after the
        run's first writes (the bucket exists only after the run's row); blocks until those
        are written (LedgerError if they cannot be). LedgerError for an unknown run then."""
        if journal is None:
            self._journals.pop(run_id, None)
            return
        from cloudtrain.state.run_key import writer_key

        journal.sign_with(writer_key(self, journal.store, run_id))  # before any entry
        if not backfill:
            self._journals[run_id] = journal
            return
        with self._file.connect(write=True) as conn:  # no write of the run between state and mirror
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise LedgerError(f"no run {run_id!r} in the ledger at {self.path}")
            res = conn.execute(
                "SELECT * FROM resources WHERE run_id = ? ORDER BY created_at, kind, resource_id",
                (run_id,),
            ).fetchall()
            evs = conn.execute("SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))
            entries = state_entries(
                RunRecord(**dict(row)),
                [ResourceRecord(**dict(r)) for r in res],
                [EventRecord(**dict(e)) for e in evs.fetchall()],
            )
            keyed = [(journal.reserve(), entry) for entry in entries]
            conn.executemany(
                "INSERT OR IGNORE INTO journal_applied (run_id, key) VALUES (?, ?)",
                [(run_id, key) for key, _ in keyed],
            )
            self._journals[run_id] = journal
        for i, (key, entry) in enumerate(keyed):
            journal.append(entry, key=key, wait=i == len(keyed) - 1)

    def _write(self, op: str, args: dict[str, Any], wait: bool = False) -> Any:
        """Run the write `op` with `args` at the clock's time in one transaction; mirrored
        (see `journal_to`) as `{"op": op, "at": <that time>, **args}`. Returns the op's result."""
        journal = self._journals.get(args["run_id"])
        with self._file.connect(write=True) as conn:
            at = self.clock()
            result = getattr(self, f"_op_{op}")(conn, at, args)
            if journal is not None:
                key = journal.reserve()
                conn.execute(
                    "INSERT OR IGNORE INTO journal_applied (run_id, key) VALUES (?, ?)",
                    (args["run_id"], key),
                )
        if journal is not None:
            journal.append({"op": op, "at": at, **args}, key=key, wait=wait)
        return result

    def apply_entry(self, run_id: str, key: str, entry: dict[str, Any]) -> bool:
        """Replay one journal entry of `run_id` (named `key` in its journal) with its own
        time `at`: False when this file holds it already, else True. Never mirrored. Raises
        LedgerError for an entry it cannot apply (an op it does not know: `JOURNAL_OPS`; one
        of another run; a missing or mistyped field; a write the ledger refuses, such as a
        status for a run it has not seen), leaving the file as it was. Idempotent."""
        entry = {k: v for k, v in entry.items() if k != "mac"}  # checked by the importer
        op = entry.get("op")
        if op not in JOURNAL_OPS:
            raise LedgerError(f"unknown journal op {str(op)[:40]!r} (a newer cloudtrain's?)")
        if entry.get("run_id") != run_id:
            raise LedgerError(f"a {op} entry of another run in run {run_id!r}'s journal")
        at = entry.get("at")
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise LedgerError(f"a {op} entry without a time")
        with self._file.connect(write=True) as conn:
            seen = conn.execute(
                "SELECT 1 FROM journal_applied WHERE run_id = ? AND key = ?", (run_id, key)
            ).fetchone()
            if seen is not None:
                return False
            try:
                getattr(self, f"_op_{op}")(conn, float(at), entry)
            except (KeyError, TypeError, ValueError) as exc:
                raise LedgerError(f"a malformed {op} entry: {type(exc).__name__} {exc}") from exc
            conn.execute("INSERT INTO journal_applied (run_id, key) VALUES (?, ?)", (run_id, key))
        return True

    def run_key(self, run_id: str) -> bytes | None:
        """The run's key (cloudtrain/state/run_key.py), or None when this file holds none.
        Read-only."""
        with self._file.connect() as conn:
            row = conn.execute("SELECT key FROM run_keys WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def set_run_key(self, run_id: str, key: bytes) -> bytes:
        """Keep `key` as the run's key unless the file holds one already; returns the one it
        holds then (a key, once kept, never changes). Never journaled. Idempotent."""
        with self._file.connect(write=True) as conn:
            conn.execute(
                "INSERT OR IGNORE INTO run_keys (run_id, key) VALUES (?, ?)", (run_id, key)
            )
            row = conn.execute("SELECT key FROM run_keys WHERE run_id = ?", (run_id,)).fetchone()
        return bytes(row[0])

    def journal_keys(self, run_id: str) -> set[str]:
        """The keys of the run's journal entries this file holds (applied or written). Read-only."""
        with self._file.connect() as conn:
            rows = conn.execute("SELECT key FROM journal_applied WHERE run_id = ?", (run_id,))
            return {str(r[0]) for r in rows.fetchall()}

    def last_journal_key(self, run_id: str) -> str | None:
        """The greatest key of `journal_keys`, or None. Read-only."""
        with self._file.connect() as conn:
            row = conn.execute(
                "SELECT MAX(key) FROM journal_applied WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    # -- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        name: str,
        provider: str,
        region: str | None,
        zone: str | None,
        spec_path: str | None,
        store_uri: str | None,
        plan_json: str | None,
        account: str | None = None,
    ) -> None:
        """Record a new run in status `planned`, controlled by this process (its pid, host and
        start stamp are recorded: `controller`). Idempotent: an existing run_id is left as is.
        `account` is the GCP project or Azure subscription (None: the SDK's default)."""
        pid = os.getpid()
        self._write(
            "create_run",
            {
                "run_id": run_id,
                "name": name,
                "provider": provider,
                "region": region,
                "zone": zone,
                "account": account,
                "spec_path": spec_path,
                "store_uri": store_uri,
                "plan_json": plan_json,
                "controller_pid": pid,
                "controller_host": socket.gethostname(),
                "controller_start": start_stamp(pid),
            },
        )

    def _op_create_run(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        conn.execute(
            "INSERT INTO runs (run_id, name, provider, region, zone, account, spec_path,"
            " store_uri, plan_json, status, created_at, controller_pid, controller_host,"
            " controller_start)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'planned', ?, ?, ?, ?)"
            " ON CONFLICT (run_id) DO NOTHING",
            (
                a["run_id"],
                a["name"],
                a["provider"],
                a.get("region"),
                a.get("zone"),
                a.get("account"),
                a.get("spec_path"),
                a.get("store_uri"),
                a.get("plan_json"),
                at,
                a.get("controller_pid"),
                a.get("controller_host"),
                a.get("controller_start"),
            ),
        )

    def set_status(
        self,
        run_id: str,
        status: str,
        outcome: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Set a run's status; `outcome`/`detail` replace the stored ones only when given.

        Status `done` stamps `ended_at` (the first time only) and is final: a later status is
        ignored (its outcome and detail still land). Idempotent. Raises LedgerError for
        an unknown run, status or outcome. A mirrored `done` waits for its journal entry.
        """
        args = {"run_id": run_id, "status": status, "outcome": outcome, "detail": detail}
        self._write("set_status", args, wait=status == "done")

    def _op_set_status(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        status, outcome, run_id = a["status"], a.get("outcome"), a["run_id"]
        if status not in RUN_STATUSES:
            raise LedgerError(f"unknown run status {status!r}; expected one of {RUN_STATUSES}")
        if outcome is not None and outcome not in OUTCOMES:
            raise LedgerError(f"unknown run outcome {outcome!r}; expected one of {OUTCOMES}")
        cur = conn.execute(
            # `done` is final: a process that `down` fenced out records its outcome after
            # down may have finished the run (LeaseHolder.stop_acting)
            "UPDATE runs SET status = CASE WHEN status = 'done' THEN 'done' ELSE ? END,"
            " outcome = COALESCE(?, outcome),"
            " detail = COALESCE(?, detail),"
            " ended_at = CASE WHEN ? = 'done' THEN COALESCE(ended_at, ?) ELSE ended_at END"
            " WHERE run_id = ?",
            (status, outcome, a.get("detail"), status, at, run_id),
        )
        if cur.rowcount == 0:
            raise LedgerError(f"no run {run_id!r} in the ledger at {self.path}")

    def move_run(
        self,
        run_id: str,
        provider: str,
        region: str | None,
        zone: str | None,
        store_uri: str | None,
        plan_json: str | None,
        account: str | None = None,
    ) -> None:
        """Record where a run now is: its cloud, region, zone, store, plan and account (the GCP
        project or Azure subscription; None: the SDK's default), after failover
        moved it (cloudtrain/run/failover.py), before anything is made there, so `status`, `down`
        and the summary look there. Idempotent; LedgerError for an unknown run. Waits for its
        journal entry."""
        args = {
            "run_id": run_id,
            "provider": provider,
            "region": region,
            "zone": zone,
            "store_uri": store_uri,
            "plan_json": plan_json,
            "account": account,
        }
        self._write("move_run", args, wait=True)

    def _op_move_run(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        cur = conn.execute(
            "UPDATE runs SET provider = ?, region = ?, zone = ?, store_uri = ?, plan_json = ?,"
            " account = ? WHERE run_id = ?",
            [a.get(k) for k in MOVE_FIELDS],
        )
        if cur.rowcount == 0:
            raise LedgerError(f"no run {a['run_id']!r} in the ledger at {self.path}")

    def finish_run(self, run_id: str, default_outcome: str = "crashed") -> RunRecord:
        """Mark a run `done` after an outside teardown (`down`, `gc`): its outcome stays the one
        recorded (a controller may have written it a moment ago), else `default_outcome`.
        One transaction, so a concurrent writer's outcome is never overwritten with a stale
        read. Idempotent. Returns the row as written; LedgerError for an unknown run. A
        mirrored one waits for its journal entry."""
        args = {"run_id": run_id, "default_outcome": default_outcome}
        row: RunRecord = self._write("finish_run", args, wait=True)
        return row

    def _op_finish_run(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> RunRecord:
        default_outcome, run_id = a["default_outcome"], a["run_id"]
        if default_outcome not in OUTCOMES:
            raise LedgerError(f"unknown run outcome {default_outcome!r}; expected {OUTCOMES}")
        cur = conn.execute(
            "UPDATE runs SET status = 'done', outcome = COALESCE(outcome, ?),"
            " ended_at = COALESCE(ended_at, ?) WHERE run_id = ?",
            (default_outcome, at, run_id),
        )
        if cur.rowcount == 0:
            raise LedgerError(f"no run {run_id!r} in the ledger at {self.path}")
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return RunRecord(**dict(row))

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run with exactly this id, or None. Read-only."""
        with self._file.connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return RunRecord(**dict(row)) if row else None

    def list_runs(self, limit: int = 50, since: float | None = None) -> list[RunRecord]:
        """Up to `limit` runs created at or after `since`, newest first. Read-only."""
        where, args = ("WHERE created_at >= ?", [since]) if since is not None else ("", [])
        with self._file.connect() as conn:
            rows = conn.execute(
                f"SELECT * FROM runs {where} ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [RunRecord(**dict(r)) for r in rows]

    def find_run(self, prefix: RunRef) -> RunRecord:
        """The run whose id is `prefix`, else the one run whose id starts with it. Read-only.

        `prefix` was parsed at the edge (`run_ids.parse_run_ref`: its shape is not checked
        again). Raises UsageError when nothing matches or the prefix is ambiguous.
        """
        missing = UsageError(
            f"no run {prefix!r} in the ledger at {self.path}; `cloudtrain ls` lists runs"
        )
        if not prefix:
            raise missing
        exact = self.get_run(prefix)
        if exact is not None:
            return exact
        with self._file.connect() as conn:
            rows = conn.execute(
                "SELECT * FROM runs WHERE substr(run_id, 1, ?) = ?"
                " ORDER BY created_at DESC LIMIT 6",
                (len(prefix), prefix),
            ).fetchall()
        if not rows:
            raise missing
        if len(rows) > 1:
            shown = ", ".join(r["run_id"] for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
            raise UsageError(
                f"run prefix {prefix!r} is ambiguous: it matches {shown}",
                hint="give more characters of the run id",
            )
        return RunRecord(**dict(rows[0]))

    # -- resources --------------------------------------------------------------------------------

    def record_intent(self, resource: Resource, price_hourly: float = 0.0) -> None:
        """Record that `resource` is about to be created. Call BEFORE the create call.

        Upsert, idempotent: a retried intent keeps the row's `created_at` and a `created` or
        `deleting` state; a `failed` or `deleted` row goes back to `intent` (a re-create), its
        `created_at` moved on by the time it did not exist, so its bill is its lives' sum.
        A mirrored intent returns only once its journal entry is in the bucket (the same rule
        for the journal: intent before create); LedgerError if it cannot be written.
        """
        args = {
            "run_id": resource.run_id,
            "provider": resource.provider,
            "kind": resource.kind,
            "resource_id": resource.id,
            "region": resource.region,
            "cloud_id": resource.cloud_id,
            "price_hourly": float(price_hourly),
        }
        self._write("record_intent", args, wait=True)

    def _op_record_intent(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        conn.execute(
            "INSERT INTO resources (run_id, provider, kind, resource_id, region, cloud_id,"
            " state, price_hourly, created_at) VALUES (?, ?, ?, ?, ?, ?, 'intent', ?, ?)"
            " ON CONFLICT (run_id, kind, resource_id) DO UPDATE SET"
            " provider = excluded.provider, region = excluded.region,"
            " cloud_id = COALESCE(excluded.cloud_id, cloud_id),"
            " price_hourly = excluded.price_hourly,"
            # a re-create: billed on from now, not over the gap (SET reads the row as it was)
            " created_at = CASE WHEN state IN ('failed', 'deleted') AND deleted_at IS NOT NULL"
            "  THEN created_at + excluded.created_at - deleted_at ELSE created_at END,"
            " deleted_at = CASE WHEN state IN ('failed', 'deleted') THEN NULL"
            "  ELSE deleted_at END,"
            " state = CASE WHEN state IN ('failed', 'deleted') THEN 'intent' ELSE state END",
            (
                a["run_id"],
                a["provider"],
                a["kind"],
                a["resource_id"],
                a.get("region"),
                a.get("cloud_id"),
                float(a.get("price_hourly") or 0.0),
                at,
            ),
        )

    def mark_created(
        self, run_id: str, kind: str, resource_id: str, cloud_id: str | None = None
    ) -> None:
        """The create call returned: state `created` (from `intent`/`failed`), `cloud_id` stored.

        Idempotent; never moves a `deleting`/`deleted` row back. Raises LedgerError when no intent
        was recorded (a bug: intents come first).
        """
        args = {"run_id": run_id, "kind": kind, "resource_id": resource_id, "cloud_id": cloud_id}
        self._write("mark_created", args)

    def _op_mark_created(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        run_id, kind, resource_id = a["run_id"], a["kind"], a["resource_id"]
        cur = conn.execute(
            "UPDATE resources SET cloud_id = COALESCE(?, cloud_id),"
            " deleted_at = CASE WHEN state = 'failed' THEN NULL ELSE deleted_at END,"
            " state = CASE WHEN state IN ('intent', 'failed') THEN 'created' ELSE state END"
            " WHERE run_id = ? AND kind = ? AND resource_id = ?",
            (a.get("cloud_id"), run_id, kind, resource_id),
        )
        if cur.rowcount == 0:
            raise LedgerError(
                f"no intent recorded for {kind} {resource_id!r} of run {run_id!r} "
                f"in the ledger at {self.path}"
            )

    def mark_failed(self, run_id: str, kind: str, resource_id: str) -> None:
        """The create call failed: state `failed`, billing stops. The row stays live (the create
        may have happened anyway), so teardown still deletes it. Idempotent; a missing row or a
        `deleting`/`deleted` one is left alone."""
        self._write("mark_failed", {"run_id": run_id, "kind": kind, "resource_id": resource_id})

    def _op_mark_failed(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        conn.execute(
            "UPDATE resources SET state = 'failed', deleted_at = COALESCE(deleted_at, ?)"
            " WHERE run_id = ? AND kind = ? AND resource_id = ?"
            " AND state IN ('intent', 'created', 'failed')",
            (at, a["run_id"], a["kind"], a["resource_id"]),
        )

    def mark_deleting(self, run_id: str, kind: str, resource_id: str) -> None:
        """A delete call is under way: state `deleting`. Idempotent; a missing or already
        `deleted` row is left alone."""
        self._write("mark_deleting", {"run_id": run_id, "kind": kind, "resource_id": resource_id})

    def _op_mark_deleting(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        conn.execute(
            "UPDATE resources SET state = 'deleting'"
            " WHERE run_id = ? AND kind = ? AND resource_id = ? AND state != 'deleted'",
            (a["run_id"], a["kind"], a["resource_id"]),
        )

    def mark_deleted(
        self, run_id: str, kind: str, resource_id: str, lasted_s: float | None = None
    ) -> None:
        """The resource is gone: state `deleted`, `deleted_at` stamped (the first time only);
        with `lasted_s`, its life as the provider accounts it (Slurm's sacct), `deleted_at` is
        `created_at + lasted_s` whatever it was: its bill is the provider's. Idempotent; a
        missing row is fine (`down` may find resources the ledger never saw). ValueError for
        a `lasted_s` out of 0..MAX_LASTED_S."""
        args: dict[str, Any] = {"run_id": run_id, "kind": kind, "resource_id": resource_id}
        if lasted_s is not None:
            args["lasted_s"] = lasted_seconds(lasted_s)
        self._write("mark_deleted", args)

    def _op_mark_deleted(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        end, args = "COALESCE(deleted_at, ?)", [at]
        if a.get("lasted_s") is not None:
            end, args = "created_at + ?", [lasted_seconds(a["lasted_s"])]
        conn.execute(
            f"UPDATE resources SET state = 'deleted', deleted_at = {end}"
            " WHERE run_id = ? AND kind = ? AND resource_id = ?",
            (*args, a["run_id"], a["kind"], a["resource_id"]),
        )

    def resources(self, run_id: str, live_only: bool = False) -> list[ResourceRecord]:
        """The run's resources in creation order; `live_only` drops `deleted` ones. Read-only."""
        sql = "SELECT * FROM resources WHERE run_id = ?"
        if live_only:
            sql += " AND state != 'deleted'"
        with self._file.connect() as conn:
            rows = conn.execute(sql + " ORDER BY created_at, kind, resource_id", (run_id,))
            return [ResourceRecord(**dict(r)) for r in rows.fetchall()]

    def billed_cost(self, run_id: str, now: float | None = None) -> float:
        """USD billed so far for the run's nodes (and a gang compute's allocations: BILLED_KINDS):
        price_hourly x (deleted_at or now - created_at).

        Counts from the intent (slightly over, never under). Read-only.
        """
        at = self.clock() if now is None else now
        total = 0.0
        for r in self.resources(run_id):
            if r.kind in BILLED_KINDS and r.price_hourly:
                end = r.deleted_at if r.deleted_at is not None else at
                total += r.price_hourly * max(0.0, end - r.created_at) / 3600.0
        return total

    def node_bills(
        self, run_id: str, job_end: float | None = None, now: float | None = None
    ) -> dict[str, tuple[float, float | None]]:
        """Per node (and a gang compute's allocation: BILLED_KINDS): (USD billed, seconds
        billed after `job_end`). A node accrues from its intent to its confirmed delete (or
        `now` while it lives), and never after; its idle seconds are known only once it is
        deleted and the job's end is. Read-only."""
        at = self.clock() if now is None else now
        bills: dict[str, tuple[float, float | None]] = {}
        for r in self.resources(run_id):
            if r.kind not in BILLED_KINDS:
                continue
            end = r.deleted_at if r.deleted_at is not None else at
            cost = r.price_hourly * max(0.0, end - r.created_at) / 3600.0
            idle = None
            if job_end is not None and r.deleted_at is not None:
                idle = max(0.0, r.deleted_at - max(job_end, r.created_at))
            bills[r.resource_id] = (cost, idle)
        return bills

    # -- events -----------------------------------------------------------------------------------

    def event(self, run_id: str, kind: str, message: str) -> None:
        """Append one event to the run's log. Not idempotent (each call adds a row)."""
        self._write("event", {"run_id": run_id, "kind": kind, "message": message})

    def _op_event(self, conn: sqlite3.Connection, at: float, a: dict[str, Any]) -> None:
        conn.execute(
            "INSERT INTO events (run_id, ts, kind, message) VALUES (?, ?, ?, ?)",
            (a["run_id"], at, a["kind"], a["message"]),
        )

    def events(self, run_id: str) -> list[EventRecord]:
        """The run's events, oldest first. Read-only."""
        with self._file.connect() as conn:
            rows = conn.execute(
                "SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,)
            ).fetchall()
        return [EventRecord(**dict(r)) for r in rows]
