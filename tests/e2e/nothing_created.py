"""The "nothing created" check of the bad-input corpus, by what a command leaves, not by what it
says: take a `snapshot(home)` before the command and `created_since(snapshot)` after it.

What counts as created, each from where it lives (not from cloudtrain's own bookkeeping):
- any new path under `$CLOUDTRAIN_HOME` (a local bucket folder, a node folder, a bundle, a
  temporary file left behind), except the ledger's own files;
- new rows in the ledger's `runs`, `resources` or `events` tables (read with sqlite3 directly);
- any live process whose working folder is under the home or whose environment carries this
  `CLOUDTRAIN_HOME` (a node session, an orphaned child), other than this test process.

`tests/e2e/test_nothing_created_check.py` shows that each of these is reported.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

# the ledger database and SQLite's side files: opening the ledger to refuse a run may make them
LEDGER_FILES = frozenset({"ledger.db", "ledger.db-wal", "ledger.db-shm", "ledger.db-journal"})
LEDGER_TABLES = ("runs", "resources", "events")
UNREADABLE = -1  # the row count of a table in a ledger that is not a readable SQLite database


@dataclass(frozen=True)
class Snapshot:
    """What a home holds at one moment: its paths, its ledger's row counts, its processes."""

    home: Path
    paths: frozenset[str]
    rows: tuple[tuple[str, int], ...]
    pids: frozenset[int]


def home_paths(home: Path) -> frozenset[str]:
    """Every path under `home`, relative to it (folders included). Blocks on the disk only."""
    if not home.exists():
        return frozenset()
    out: set[str] = set()
    for root, dirs, files in os.walk(home, followlinks=False):
        rel = Path(root).relative_to(home)
        out.update(str(rel / name) for name in [*dirs, *files])
    return frozenset(out)


def ledger_rows(home: Path) -> tuple[tuple[str, int], ...]:
    """(table, row count) of the ledger under `home`; no rows when it does not exist, and
    UNREADABLE counts when it is not a SQLite database. Opens it read-only: creates nothing."""
    path = home / "ledger.db"
    if not path.exists():
        return tuple((t, 0) for t in LEDGER_TABLES)
    counts: list[tuple[str, int]] = []
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return tuple((t, UNREADABLE) for t in LEDGER_TABLES)
    try:
        for table in LEDGER_TABLES:
            try:
                (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            except sqlite3.OperationalError as exc:
                n = 0 if "no such table" in str(exc) else UNREADABLE
            except sqlite3.DatabaseError:
                n = UNREADABLE
            counts.append((table, int(n)))
    finally:
        conn.close()
    return tuple(counts)


def home_processes(home: Path) -> dict[int, str]:
    """Live processes (pid -> command line) working under `home` or started with
    CLOUDTRAIN_HOME=`home`, other than this process. Read from /proc; processes of other users
    that cannot be read are skipped (the CLI's children are ours)."""
    home = home.resolve()
    marker = f"CLOUDTRAIN_HOME={home}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        proc = Path("/proc") / entry
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie holds nothing
            cwd = Path(os.readlink(proc / "cwd"))
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if cwd == home or home in cwd.parents or marker in env:
            found[int(entry)] = cmd.strip()
    return found


def snapshot(home: Path) -> Snapshot:
    """What `home` holds now (see the module docstring). Read-only."""
    return Snapshot(home, home_paths(home), ledger_rows(home), frozenset(home_processes(home)))


def created_since(before: Snapshot) -> list[str]:
    """Everything created under `before.home` since `before` was taken, one line each (empty
    when nothing was). Read-only."""
    home = before.home
    found = [
        f"path {rel}" for rel in sorted(home_paths(home) - before.paths) if rel not in LEDGER_FILES
    ]
    was = dict(before.rows)
    for table, n in ledger_rows(home):
        if n != was.get(table, 0):
            found.append(f"ledger {table}: {was.get(table, 0)} rows before, {n} after")
    for pid, cmd in sorted(home_processes(home).items()):
        if pid not in before.pids:
            found.append(f"process {pid}: {cmd[:200]}")
    return found


def assert_nothing_created(before: Snapshot) -> None:
    """Fail with the list of what was created under `before.home` since `before`."""
    found = created_since(before)
    assert found == [], "created:\n" + "\n".join(found)
