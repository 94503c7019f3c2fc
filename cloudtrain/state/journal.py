"""The run's journal: every ledger write of a run, one object each, under `ledger/` in its bucket.

The run's record travels with the run: whichever process controls it (the laptop, or a
controller node) mirrors its ledger writes here (`Ledger.journal_to`), and any machine replays
them into its own ledger (`import_journal`) with their original times, so `status`, `cost`,
`down` and `attach` see the same runs, resources, events and bill.

Objects are written once and never rewritten, so two writers need no read-modify-write: a key
is `ledger/<time_ns:020d>-<seq:06d>-<writer>.json`, which sorts by the writer's wall clock (made
strictly increasing per writer), then its sequence number, then its id. Writes go through one
background thread per `Journal`, in order, so a ledger write costs the caller no bucket round trip;
`flush` (and `append(..., wait=True)`) block until the bucket has what was appended.

Which ledger writes wait for their entry (`Ledger.journal_to`): `record_intent` (a resource's
intent is in the bucket before its create call), `finish_run` and `set_status(..., "done")`. The
others are queued: a process that dies before its thread wrote them loses those entries (the
journal then lags the ledger it came from; the resources' intents are never among them).

Runs on the controller node: Python 3.10+.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import CloudtrainError, LedgerError, NotFound, TooLarge
from cloudtrain.jobs.bucket_reads import JOURNAL_ENTRY_MAX_BYTES
from cloudtrain.jobs.protocol import journal_prefix
from cloudtrain.jobs.protocol_base import ProtocolError, load_json
from cloudtrain.state import run_key

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore
    from cloudtrain.state.ledger import Ledger

LOG = logging.getLogger("cloudtrain.state.journal")

WRITER_RE = re.compile(r"[A-Za-z0-9_.]{1,64}")  # no '-': it separates a key's fields
KEY_RE = re.compile(r"(?P<ns>[0-9]{20})-(?P<seq>[0-9]{6,})-(?P<writer>[A-Za-z0-9_.]{1,64})\.json")
# How far behind the newest entry this ledger holds an importer still looks for entries it has not
# seen (`import_journal(incremental=True)`): another writer's clock may be behind this one's, and a
# queued entry reaches the bucket after later ones of other writers (the retry layer's minutes).
SKEW_S = 600.0
RETRY_S = 2.0  # the writer thread's pause before it tries a failed write again
READ_PARALLEL = 16  # an import's entry reads at a time (one object each: a long run has thousands)


def entry_key(time_ns: int, seq: int, writer: str) -> str:
    """An entry's name under the journal prefix. Pure; ValueError for a writer id that is not
    1-64 of [A-Za-z0-9_.]."""
    if WRITER_RE.fullmatch(writer) is None:
        raise ValueError(f"journal writer id {writer[:70]!r} is not 1-64 of [A-Za-z0-9_.]")
    return f"{time_ns:020d}-{seq:06d}-{writer}.json"


def writer_id(role: str) -> str:
    """A writer id for this process: '<role>.<host>.<pid>' with every character outside
    [A-Za-z0-9_.] made '_' and the host cut to fit 64 (e.g. 'laptop.my_mac.4242',
    'controller.ct_mnist_0a1b2c_controller_0.731'). Reads the host name and pid only."""
    import os
    import socket

    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.]", "_", text)

    tail = f".{os.getpid()}"
    head = clean(role)[:20] + "."
    return head + clean(socket.gethostname())[: 64 - len(head) - len(tail)] + tail


def key_time_ns(key: str) -> int | None:
    """The writer's time in an entry's name, or None for a name that is not an entry's. Pure."""
    m = KEY_RE.fullmatch(key)
    return int(m["ns"]) if m else None


class Journal:
    """The journal of `run_id` in `store`, as written by `writer` (an id unique among the run's
    writers, e.g. 'laptop.<host>.<pid>' or 'controller.<term>': 1-64 of [A-Za-z0-9_.]).

    Thread-safe. Entries are written in the order they were appended, by one daemon thread
    started on the first append; a failed write is retried every `retry_s` until it succeeds or
    `close` gives up. Call `close` at the end (it blocks until everything is written).
    """

    def __init__(
        self,
        store: ObjectStore,
        run_id: str,
        writer: str,
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        retry_s: float = RETRY_S,
    ) -> None:
        entry_key(0, 0, writer)  # checks the id
        self.store = store
        self.run_id = run_id
        self.writer = writer
        self.prefix = journal_prefix(run_id)
        self._clock_ns = clock_ns
        self._retry_s = retry_s
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, bytes]] = deque()
        self._seq = 0
        self._last_ns = 0
        self._appended = 0  # entries queued so far
        self._written = 0  # of those, written (in order, so the first `_written` are)
        self._failures = 0
        self._error: BaseException | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self.key: bytes | None = None  # the run's key, which signs every entry (`sign_with`)

    def sign_with(self, key: bytes) -> None:
        """Sign every entry appended from now on with the run's `key` (an HMAC bound to the
        entry's name: cloudtrain/state/run_key.py); `Ledger.journal_to` calls it. Non-blocking."""
        with self._cond:
            self.key = key

    def reserve(self) -> str:
        """A new entry name (not yet written), later than every one this journal gave before,
        even if the wall clock steps back. Non-blocking."""
        with self._cond:
            self._seq += 1
            self._last_ns = max(self._clock_ns(), self._last_ns + 1)
            return entry_key(self._last_ns, self._seq, self.writer)

    def append(self, entry: dict[str, Any], *, key: str | None = None, wait: bool = False) -> str:
        """Queue `entry` (JSON-able) to be written as a new object named `key` (default: a
        freshly reserved one), signed when the journal has the run's key (`sign_with`; an
        unsigned entry is refused by every importer), and return the name. With `wait`, block
        until it is written (`flush`). Never rewrites an object: each name is written once.
        LedgerError once closed."""
        name = key or self.reserve()
        if self.key is not None:
            entry = run_key.sign_doc(self.key, run_key.journal_purpose(name), entry)
        data = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        with self._cond:
            if self._closing:
                raise LedgerError(f"the journal of run {self.run_id} is closed")
            self._queue.append((name, data))
            self._appended += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._drain, name=f"journal-{self.run_id}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        if wait:
            self.flush()
        return name

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every entry appended before the call is in the bucket. Raises LedgerError
        when a write of one of them fails after the store's own retries (the entry stays queued
        and is tried again), or after `timeout_s`. Idempotent."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            target, failures = self._appended, self._failures
            while self._written < target:
                if self._failures != failures:
                    raise LedgerError(
                        f"cannot write run {self.run_id}'s journal to {self.store.uri}: "
                        f"{self._error}",
                        hint="the bucket must be writable while the run is controlled",
                    ) from self._error
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LedgerError(
                        f"run {self.run_id}'s journal: {target - self._written} entries not "
                        f"written to {self.store.uri} in {timeout_s}s (last error: {self._error})"
                    )
                self._cond.wait(left)

    @property
    def pending(self) -> int:
        """Entries appended and not yet written. Non-blocking."""
        with self._cond:
            return self._appended - self._written

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (see `flush`: LedgerError if something could not be written), then stop the
        thread; later appends raise LedgerError. Blocks. Idempotent."""
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
                thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=self._retry_s + 1)

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing, all written
                name, data = self._queue[0]
            try:
                self.store.put(self.prefix + name, data)
            except Exception as exc:  # the store's errors, and anything else: keep the entry
                with self._cond:
                    self._error = exc
                    self._failures += 1
                    self._cond.notify_all()
                    LOG.warning("run %s: journal entry %s not written: %s", self.run_id, name, exc)
                    if self._closing:
                        return  # close's flush reported it
                    self._cond.wait(self._retry_s)
                continue
            with self._cond:
                self._queue.popleft()
                self._written += 1
                self._cond.notify_all()


def _log_warning(line: str) -> None:
    LOG.warning("%s", line)


def _window(lo_ns: int, hi_ns: int) -> str:
    """The longest name prefix every entry name with a time in [lo_ns, hi_ns] starts with (the
    common leading digits of the two 20-digit times). Pure."""
    lo, hi = f"{max(lo_ns, 0):020d}", f"{max(hi_ns, 0):020d}"
    n = 0
    while n < 20 and lo[n] == hi[n]:
        n += 1
    return lo[:n]


def _read_all(store: ObjectStore, keys: list[str]) -> list[bytes | TooLarge | None]:
    """Each object (None: gone; TooLarge: over JOURNAL_ENTRY_MAX_BYTES, of which at most that
    much was read), READ_PARALLEL reads at a time, in `keys`' order. Blocks; the first error
    other than NotFound and TooLarge propagates."""

    def read(key: str) -> bytes | TooLarge | None:
        try:
            return store.get(key, max_bytes=JOURNAL_ENTRY_MAX_BYTES)
        except NotFound:
            return None
        except TooLarge as exc:
            return exc

    if len(keys) <= 1:
        return [read(k) for k in keys]
    with ThreadPoolExecutor(min(READ_PARALLEL, len(keys))) as pool:
        return list(pool.map(read, keys))


def _entries(
    store: ObjectStore, prefix: str, names: list[str]
) -> Iterator[tuple[str, bytes | TooLarge | None]]:
    """(name, what `_read_all` read) of each entry, in `names`' order, read READ_PARALLEL at a
    time: at most READ_PARALLEL * JOURNAL_ENTRY_MAX_BYTES in memory, however long the journal.
    Blocks."""
    for at in range(0, len(names), READ_PARALLEL):
        batch = names[at : at + READ_PARALLEL]
        yield from zip(batch, _read_all(store, [prefix + n for n in batch]), strict=True)


def import_journal(
    ledger: Ledger,
    store: ObjectStore,
    run_id: str,
    *,
    incremental: bool = False,
    warn: Callable[[str], None] | None = None,
    now_ns: Callable[[], int] = time.time_ns,
) -> int:
    """Replay into `ledger` the entries of `run_id`'s journal in `store` that it does not hold
    yet, in key order, each with its original time (so `billed_cost` equals the writer's).
    Returns how many were applied. Idempotent: a second import applies nothing new.

    Only entries signed with the run's key are replayed (`run_key.reader_key`: this ledger's,
    else the bucket's control/key): the others (a node's forgery, an entry copied under
    another name, one from before journals were signed) are skipped with one warning that
    names the key, and tried again by a later import. With no key at all, nothing is replayed
    (one warning). An entry that cannot be applied (unreadable JSON, an op a newer cloudtrain
    wrote, another run's, a field missing, a write the ledger refuses) is skipped with a
    warning to `warn` (default: this module's logger) and not recorded, so a later import
    tries it again.
    `incremental` lists only names whose time is within the decimal window from `SKEW_S`
    before the ledger's newest entry of the run to `SKEW_S` after now (one listing of part of
    `ledger/`; the whole journal when the ledger holds none of it). Blocks for one listing
    and one read per new entry (READ_PARALLEL at a time); the store's errors (NotFound for a
    missing bucket) propagate.
    """
    say = warn or _log_warning
    prefix = journal_prefix(run_id)
    listed = prefix
    if incremental:
        last = ledger.last_journal_key(run_id)
        last_ns = key_time_ns(last) if last else None
        if last_ns is not None:
            skew = int(SKEW_S * 1e9)
            listed = prefix + _window(last_ns - skew, now_ns() + skew)
    held = ledger.journal_keys(run_id)
    key = run_key.reader_key(ledger, store, run_id)
    names: list[str] = []
    for info in store.list(listed):
        name = info.key[len(prefix) :]
        if name in held:
            continue
        if KEY_RE.fullmatch(name) is None:
            say(f"run {run_id}'s journal: skipped {name[:80]!r}: not a journal entry's name")
            continue
        names.append(name)
    if key is None:
        if names:
            say(
                f"run {run_id}'s journal: no key to check it with (none in this ledger, no "
                f"{run_key.key_object(run_id)} in {store.uri}): {len(names)} entries not "
                "replayed (a run from before journals were signed: its own machine's ledger "
                "has it; `down --provider` goes by the cloud's tags)"
            )
        return 0
    applied = 0
    refused: list[str] = []
    for name, data in _entries(store, prefix, names):
        if data is None:
            continue  # deleted since the listing
        if isinstance(data, TooLarge):
            say(f"run {run_id}'s journal: skipped {name}: over {JOURNAL_ENTRY_MAX_BYTES} bytes")
            continue
        try:
            entry = load_json(data, what=name, max_bytes=JOURNAL_ENTRY_MAX_BYTES)
        except ProtocolError as exc:
            say(f"run {run_id}'s journal: skipped {name}: {exc}")
            continue
        if not isinstance(entry, dict):
            say(f"run {run_id}'s journal: skipped {name}: not a JSON object")
            continue
        if not run_key.verify_doc(key, run_key.journal_purpose(name), entry):
            refused.append(name)
            continue
        try:
            applied += ledger.apply_entry(run_id, name, entry)
        except LedgerError as exc:
            say(f"run {run_id}'s journal: skipped {name}: {exc}")
    if refused:
        shown = ", ".join(refused[:3]) + (", ..." if len(refused) > 3 else "")
        say(
            f"run {run_id}'s journal: skipped {len(refused)} entries without a valid MAC under "
            f"the run's {run_key.key_id(key)} (not written by a controller of the run: a "
            f"node's, or from before journals were signed): {shown}"
        )
    return applied


def try_import(
    ledger: Ledger,
    store: ObjectStore,
    run_id: str,
    *,
    incremental: bool = True,
    warn: Callable[[str], None] | None = None,
) -> int:
    """`import_journal`, where a bucket that cannot be read is a warning (0 applied), not an
    error: for a ledger that has the run already and may go on with what it holds. Blocks."""
    say = warn or _log_warning
    try:
        return import_journal(ledger, store, run_id, incremental=incremental, warn=say)
    except CloudtrainError as exc:
        say(f"run {run_id}'s journal not read from {store.uri}: {exc}")
        return 0
