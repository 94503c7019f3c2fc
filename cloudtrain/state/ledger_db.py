"""The ledger's SQLite file: its schema and migrations, WAL mode, connections and the write lock.

Every call opens its own connection, so one `LedgerFile` is thread-safe. Writes run in
`BEGIN IMMEDIATE` transactions behind a per-file lock in this process, and the file is in WAL
mode with a busy timeout, so other processes can use it at the same time. What the rows mean
is cloudtrain/state/ledger.py's.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cloudtrain.core.errors import LedgerError

SCHEMA_VERSION = 5
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    provider   TEXT NOT NULL,
    region     TEXT,
    zone       TEXT,
    account    TEXT,
    spec_path  TEXT,
    store_uri  TEXT,
    plan_json  TEXT,
    status     TEXT NOT NULL,
    outcome    TEXT,
    created_at REAL NOT NULL,
    ended_at   REAL,
    detail     TEXT,
    controller_pid   INTEGER,
    controller_host  TEXT,
    controller_start TEXT
);
CREATE INDEX IF NOT EXISTS runs_created_at ON runs (created_at);
CREATE TABLE IF NOT EXISTS resources (
    run_id       TEXT NOT NULL,
    provider     TEXT NOT NULL,
    kind         TEXT NOT NULL,
    resource_id  TEXT NOT NULL,
    region       TEXT,
    cloud_id     TEXT,
    state        TEXT NOT NULL,
    price_hourly REAL NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL,
    deleted_at   REAL,
    PRIMARY KEY (run_id, kind, resource_id)
);
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  TEXT NOT NULL,
    ts      REAL NOT NULL,
    kind    TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_run_id ON events (run_id, id);
CREATE TABLE IF NOT EXISTS journal_applied (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS run_keys (
    run_id TEXT PRIMARY KEY,
    key    BLOB NOT NULL
);
"""
# Upgrades of an older file, by the version they lead to (v1 -> v2: the cloud account column;
# v2 -> v3: which process controls the run, so `logs --follow` knows when nobody will write;
# v3 -> v4: which entries of a run's journal in its bucket this file holds,
# cloudtrain/state/journal.py;
# v4 -> v5: each run's key, which signs its journal, cloudtrain/state/run_key.py).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE runs ADD COLUMN account TEXT",),
    3: (
        "ALTER TABLE runs ADD COLUMN controller_pid INTEGER",
        "ALTER TABLE runs ADD COLUMN controller_host TEXT",
        "ALTER TABLE runs ADD COLUMN controller_start TEXT",
    ),
    4: (
        "CREATE TABLE IF NOT EXISTS journal_applied (run_id TEXT NOT NULL, key TEXT NOT NULL,"
        " PRIMARY KEY (run_id, key))",
    ),
    5: ("CREATE TABLE IF NOT EXISTS run_keys (run_id TEXT PRIMARY KEY, key BLOB NOT NULL)",),
}

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _file_lock(path: Path) -> threading.Lock:
    """One in-process write lock per database file, shared by every `LedgerFile` on it."""
    key = str(path.resolve())
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


class LedgerFile:
    """The SQLite database at `path`. Constructing one creates its folder, the file and the
    ledger's schema, or upgrades an older file's (`_init_schema`); blocks. Every error from
    SQLite, and a folder that cannot be made, surfaces as `LedgerError` naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(
                f"cannot create the ledger folder {path.parent}: {exc.strerror or exc}",
                hint="set CLOUDTRAIN_HOME to a writable folder",
            ) from exc
        self._lock = _file_lock(path)
        with contextlib.suppress(OSError):  # a new file is born private (see `_private`)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._init_schema()
        self._private()

    def _private(self) -> None:
        """Make the file (and SQLite's WAL and shared-memory files beside it) readable by this
        user alone: it holds the runs' keys (cloudtrain/state/run_key.py). Best effort on a file
        system without modes. Blocks briefly."""
        for path in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
            with contextlib.suppress(OSError):
                if path.exists() and path.stat().st_mode & 0o077:
                    path.chmod(0o600)

    def _fail(self, exc: sqlite3.Error) -> LedgerError:
        """The LedgerError, naming the file, for an error from SQLite."""
        return LedgerError(
            f"cannot use the ledger at {self.path}: {exc}",
            hint="check the file is writable; if it is corrupt, move it aside",
        )

    @contextmanager
    def connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A fresh connection; for `write`, in one IMMEDIATE transaction committed on exit."""
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA synchronous = NORMAL")
            if not write:
                yield conn
                return
            with self._lock:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        finally:
            conn.close()

    def _enable_wal(self) -> None:
        """Put the file in WAL mode (a no-op once it is). SQLite does not call the busy handler
        for a journal-mode change, so two processes opening a fresh file at once would see
        "database is locked" at once: retry for up to the busy timeout. Blocks."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        delay = 0.01
        while True:
            try:
                with self.connect() as conn:
                    mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
                    if mode.lower() != "wal":
                        conn.execute("PRAGMA journal_mode = WAL")
                return
            except LedgerError as exc:
                busy = isinstance(exc.__cause__, sqlite3.OperationalError) and (
                    "locked" in str(exc.__cause__) or "busy" in str(exc.__cause__)
                )
                if not busy or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def _init_schema(self) -> None:
        """Create or upgrade the schema. Safe when several processes open a fresh file at once:
        the check and the upgrade are one IMMEDIATE transaction, so one process upgrades and
        the others find the current version."""
        self._enable_wal()
        with self.connect(write=True) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LedgerError(
                    f"the ledger at {self.path} has schema version {version}, newer than this "
                    f"cloudtrain understands ({SCHEMA_VERSION})",
                    hint="upgrade cloudtrain, or point CLOUDTRAIN_HOME elsewhere",
                )
            if version < SCHEMA_VERSION:
                fresh = (
                    conn.execute(
                        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'runs'"
                    ).fetchone()
                    is None
                )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                if not fresh:  # an older file: its tables predate the newer columns
                    for target in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
                        for statement in _MIGRATIONS[target]:
                            conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def schema_version(self) -> int:
        """The schema version stored in the file (`PRAGMA user_version`). Read-only."""
        with self.connect() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
