"""Bring many runs' ledger rows up to date with their journals within one deadline (what
`cloudtrain ls` does before it lists): whatever the clouds do, the caller waits at most the
deadline for the reads.

The journals are read in daemon threads, READERS runs at a time (each run's provider made, one
listing of its journal's recent window, one read per new entry: `state.journal.import_journal`
against a `_Deferred` ledger that answers its reads and holds its writes); the writes are applied
afterwards in the calling thread, so nothing changes the ledger once `refresh_runs` returns. A
run whose read has not ended by the deadline is left as the ledger has it. Every store call of
a read runs in a daemon thread of its own and is waited for only until the deadline
(`_Bounded`): a call that never answers holds no thread the interpreter joins at exit (it joins
a thread pool's, and the journal reads its entries in one), so the process ends too.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from cloudtrain.core.errors import CloudtrainError, LedgerError, TransientError

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectInfo, ObjectStore
    from cloudtrain.state.ledger import Ledger, RunRecord

T = TypeVar("T")

REFRESH_S = 5.0  # the whole refresh's deadline: every run's journal read, in parallel
READERS = 16  # runs read at a time (each in a daemon thread)


@dataclass
class _Deferred:
    """The part of a `Ledger` that `import_journal` uses, for a thread that must not write:
    reads go to `ledger` (thread-safe: a connection per call), writes are held in order for
    `_Read.apply` in the calling thread."""

    ledger: Ledger
    key: bytes | None = None  # the run's key, read from the bucket, to keep
    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def run_key(self, run_id: str) -> bytes | None:
        """This ledger's key of the run, else the one read from the bucket. Read-only."""
        return self.ledger.run_key(run_id) or self.key

    def set_run_key(self, run_id: str, key: bytes) -> bytes:
        """Hold `key` to keep in the ledger (`_Read.apply`). Non-blocking."""
        self.key = key
        return key

    def journal_keys(self, run_id: str) -> set[str]:
        """See `Ledger.journal_keys`. Read-only."""
        return self.ledger.journal_keys(run_id)

    def last_journal_key(self, run_id: str) -> str | None:
        """See `Ledger.last_journal_key`. Read-only."""
        return self.ledger.last_journal_key(run_id)

    def apply_entry(self, run_id: str, key: str, entry: dict[str, Any]) -> bool:
        """Hold the checked entry to apply (`_Read.apply`). Non-blocking."""
        self.entries.append((key, entry))
        return True


@dataclass
class _Bounded:
    """The part of a store that `import_journal` uses, every call of which returns or raises
    by `end` (a `time.monotonic()`): the call runs in a daemon thread of its own, and one not
    answered by then raises TransientError (and sets `expired`), leaving its thread behind."""

    store: ObjectStore
    end: float
    expired: bool = False

    @property
    def uri(self) -> str:
        """The store's URI. Pure."""
        return self.store.uri

    def list(self, prefix: str) -> list[ObjectInfo]:
        """See ObjectStore.list; blocks until `end` at most."""
        return self._call(lambda: self.store.list(prefix))

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """See ObjectStore.get; blocks until `end` at most."""
        from cloudtrain.providers.base import bound

        return self._call(lambda: self.store.get(key, **bound(max_bytes)))

    def _call(self, call: Callable[[], T]) -> T:
        answer: Future[T] = Future()

        def run() -> None:
            try:
                answer.set_result(call())
            except BaseException as exc:  # raised in the caller's thread
                answer.set_exception(exc)

        threading.Thread(target=run, name="journal-refresh-call", daemon=True).start()
        wait([answer], timeout=max(0.0, self.end - time.monotonic()))
        if not answer.done():
            self.expired = True
            raise TransientError(f"{self.store.uri}: no answer by the refresh's deadline")
        return answer.result()


@dataclass
class _Read:
    """One run's journal as read by its thread: what to write, and what to say."""

    held: _Deferred
    lines: list[str] = field(default_factory=list)  # warnings, said by the calling thread
    unread: str | None = None  # why the journal could not be read (a store's error), if so
    late: bool = False  # a store call was not answered by the deadline

    def apply(self, ledger: Ledger, run_id: str, say: Callable[[str], None]) -> None:
        """Keep the run's key, then apply the held entries in order (one already held is
        skipped: `apply_entry` is idempotent). An entry the ledger refuses is one warning and
        not recorded (a later refresh tries it again). Blocks for the ledger's writes."""
        for line in self.lines:
            say(line)
        key = self.held.key
        if key is not None and ledger.set_run_key(run_id, key) != key:
            say(f"run {run_id}'s journal: not replayed: its key is not this ledger's")
            return
        for name, entry in self.held.entries:
            try:
                ledger.apply_entry(run_id, name, entry)
            except LedgerError as exc:
                say(f"run {run_id}'s journal: skipped {name}: {exc}")


@dataclass(frozen=True)
class Refreshed:
    """What `refresh_runs` did: the record, as the ledger now has it, of each run whose read
    ended; of those, the ones whose journal could not be read (the warning line that says
    why); and the runs whose read did not end by the deadline."""

    records: dict[str, RunRecord]
    failed: dict[str, str]
    late: list[str]


def refresh_runs(
    ledger: Ledger,
    records: list[RunRecord],
    *,
    deadline_s: float = REFRESH_S,
    warn: Callable[[str], None] | None = None,
) -> Refreshed:
    """Import into `ledger` the new journal entries of each run of `records` that has a bucket,
    reading them in parallel (READERS at a time) and waiting at most `deadline_s` in all for
    the reads; then apply, in this thread, what every finished read found. A read's warnings
    go to `warn` here, after the reads; a run read late says nothing (see `Refreshed.late`).
    A store's or provider's error is the run's line in `Refreshed.failed` (not said); any
    other exception of a read is raised here. Blocks at most `deadline_s` plus the ledger's
    writes; idempotent."""
    say = warn or (lambda line: None)
    end = time.monotonic() + deadline_s
    jobs = {rec.run_id: (rec, Future[_Read]()) for rec in records if rec.store_uri}
    _start(ledger, list(jobs.values()), end)
    wait([future for _, future in jobs.values()], timeout=max(0.0, end - time.monotonic()))
    out: dict[str, RunRecord] = {}
    failed: dict[str, str] = {}
    late: list[str] = []
    for run_id, (rec, future) in jobs.items():
        if not future.done():
            late.append(run_id)
            continue
        read = future.result()  # raises what the read raised, other than a cloud's error
        if read.late:
            late.append(run_id)
            continue
        read.apply(ledger, run_id, say)
        if read.unread is not None:
            failed[run_id] = read.unread
        out[run_id] = ledger.get_run(run_id) or rec
    return Refreshed(out, failed, late)


def _start(ledger: Ledger, jobs: list[tuple[RunRecord, Future[_Read]]], end: float) -> None:
    """Start up to READERS daemon threads that read the jobs' journals in turn, each in a
    copy of this thread's context (a held config read goes with it). Non-blocking."""
    todo: queue.SimpleQueue[tuple[RunRecord, Future[_Read]]] = queue.SimpleQueue()
    for job in jobs:
        todo.put(job)

    def reader() -> None:
        while True:
            try:
                rec, future = todo.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(_read(ledger, rec, end))
            except BaseException as exc:  # handed to the caller, who decides
                future.set_exception(exc)

    for n in range(min(READERS, len(jobs))):
        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(reader,), name=f"journal-refresh-{n}", daemon=True
        ).start()


def _read(ledger: Ledger, rec: RunRecord, end: float) -> _Read:
    """The run's new journal entries, checked and held (no ledger write); a provider or store
    that fails is the read's `unread` line (the entries read before it are held), a store
    call not answered by `end` makes it `late`. Blocks for the provider's making, then until
    `end` at most."""
    from cloudtrain.run import build as api_build
    from cloudtrain.state.journal import import_journal

    assert rec.store_uri is not None
    read = _Read(_Deferred(ledger))
    try:
        store = _Bounded(api_build.record_provider(rec).store(rec.store_uri), end)
    except CloudtrainError as exc:
        read.unread = f"run {rec.run_id}'s journal not read: {exc}"
        return read
    shelf = cast("Ledger", read.held)  # the reads and writes import_journal makes
    bounded = cast("ObjectStore", store)  # the calls import_journal makes
    try:
        import_journal(shelf, bounded, rec.run_id, incremental=True, warn=read.lines.append)
    except CloudtrainError as exc:  # as `try_import` says it
        read.late = store.expired
        read.unread = f"run {rec.run_id}'s journal not read from {store.uri}: {exc}"
    return read
