"""The run's control lease: exactly one process controls a run at a time (issue 17).

`control/lease` (protocol.LeaseDoc) names the owner, an expiry and a term. It is only ever
written with a conditional write (ObjectStore.put_if: S3 If-Match/If-None-Match, GCS
ifGenerationMatch, Azure If-Match, local: a lock and an atomic rename), so two writers can never
both believe they wrote last. Rules:

- `acquire` takes a lease that is absent, expired, or handed to this owner as its `successor`;
  every takeover adds one to the term. A live lease of someone else raises LeaseHeld, unless
  `force` (`cloudtrain down`: a teardown outranks any controller).
- `renew` rewrites the lease on the tag this process last wrote, same term, later expiry. Any
  other writer in between (a takeover, `down`) moved the tag: PreconditionFailed, and the lease
  raises LeaseLost naming the new holder. A lease this process let expire (a paused process, a
  laptop's closed lid) is renewed the same way: the conditional write lands only when nobody
  wrote the lease since, and nobody acts on a run without writing its lease first, so an
  untouched lease proves that nobody acted meanwhile and the process carries on (issue 29).
- `check` is what guards every create and delete (cloudtrain/state/fencing.py): a renewal. Nobody
  creates or deletes a node without the current term.
- `release(successor)` hands the run over: the lease stays live (`ttl` of the successor's boot)
  with `successor` named, so the controller node takes it without a race; or, with no successor,
  expires now, so the next `attach` takes it at once.

With the run's key (cloudtrain/state/run_key.py, which the nodes never see) every write is signed,
and a lease document without a valid MAC for a term above this process's is a forgery (a node wrote
it, or put an old document back): `renew` takes the lease back over it (said through
`on_forged`), and `acquire` counts it as expired. Without a key (a run from before keys) every
document counts, as before.

A lost reply to a conditional write that did write reads back as PreconditionFailed; `_write`
then reads the lease again and counts the write as its own when the document is its own
(owner, term and nonce), so the retry layer's ambiguity never costs the lease.
Clocks: the expiry is the writer's wall clock; every owner renews at a sixth of the ttl, so a
skew smaller than most of the ttl is harmless.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable

from cloudtrain.core import env
from cloudtrain.core.errors import (
    CloudtrainError,
    LeaseHeld,
    LeaseLost,
    PreconditionFailed,
    TooLarge,
)
from cloudtrain.jobs import protocol
from cloudtrain.jobs.protocol import LeaseDoc, ProtocolError
from cloudtrain.providers.base import ObjectStore
from cloudtrain.state import run_key

DEFAULT_TTL_S = 30.0
# the owner `cloudtrain down` takes the lease as (cloudtrain/api/tear_down.py): a run it took is
# being stopped and torn down by it, whatever the order its holder sees the stop and the loss in
DOWN_OWNER_PREFIX = "down:"
TTL_ENV = env.LEASE_TTL.name
LEASE_MAX_BYTES = 64 * 1024  # a lease document is ~400 bytes; a larger one is a node's forgery


def lease_ttl_s() -> float:
    """The lease's ttl: $CLOUDTRAIN_LEASE_TTL_S (tests shorten it), else 30 s. Pure."""
    try:
        value = env.LEASE_TTL.get()
    except ValueError:
        value = None
    return value if value is not None and value >= 1.0 else DEFAULT_TTL_S


def read_lease(store: ObjectStore, run_id: str) -> LeaseDoc | None:
    """The run's lease as the bucket holds it, or None (none, or unreadable). Blocks (one read
    of at most LEASE_MAX_BYTES)."""
    got = _get_tagged(store, protocol.lease_key(run_id))
    if got is None:
        return None
    try:
        return LeaseDoc.from_json(got[0])
    except ProtocolError:
        return None


def describe(doc: LeaseDoc, now: float | None = None) -> str:
    """'controller:ct-x-controller-0 (term 3, expires in 12 s)'. Pure."""
    left = doc.expires - (time.time() if now is None else now)
    when = f"expires in {left:.0f} s" if left >= 0 else f"expired {-left:.0f} s ago"
    return f"{doc.owner} (term {doc.term}, {when})"


class Lease:
    """This process's hold on one run's lease. Thread-safe; not reusable across runs."""

    def __init__(
        self,
        store: ObjectStore,
        run_id: str,
        owner: str,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.time,
        key: bytes | None = None,
        on_forged: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.store, self.run_id, self.owner = store, run_id, owner
        self.mac_key, self.on_forged = key, on_forged  # the run's key (see the module)
        self.ttl_s = ttl_s if ttl_s is not None else lease_ttl_s()
        self.clock = clock
        self.key = protocol.lease_key(run_id)
        self.term = 0
        self._tag: str | None = None
        self._expires = 0.0
        self._nonce = ""
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        """Whether this process believes it holds the lease (not a check against the bucket)."""
        return self._tag is not None and self.clock() < self._expires

    def acquire(self, force: bool = False) -> int:
        """Take the lease: absent, expired, handed to this owner, or held by this owner already
        (then a renewal); with `force`, whatever holds it. Returns the term. Raises LeaseHeld
        naming the live holder. Blocks (one read, one conditional write, a retry on a race)."""
        with self._lock:
            for _ in range(5):  # each loss of a race is someone's progress; a few are plenty
                got = _get_tagged(self.store, self.key)
                doc, tag = self._parse(got)
                now = self.clock()
                if doc is not None and not force:
                    live = doc.expires > now
                    mine = doc.owner == self.owner or doc.successor == self.owner
                    if live and not mine:
                        raise LeaseHeld(
                            f"run {self.run_id} is controlled by {describe(doc, now)}",
                            hint="wait for it to expire, or `cloudtrain down` the run",
                        )
                term = (doc.term if doc else 0) + 1
                if doc is not None and doc.owner == self.owner and doc.expires > now:
                    term = doc.term  # still ours: a renewal
                try:
                    self._write(term, tag if got is not None else None)
                    return self.term
                except PreconditionFailed:
                    continue
            raise LeaseHeld(f"run {self.run_id}: the lease kept changing while taking it")

    def renew(self) -> None:
        """Extend the lease, same term, also past its expiry: raises LeaseLost (naming the new
        holder) only when anyone else wrote it since this process did. Blocks (one conditional
        write; one read after a loss)."""
        with self._lock:
            if self._tag is None:
                raise LeaseLost(f"run {self.run_id}: {self.owner} does not hold the lease")
            try:
                self._write(self.term, self._tag)
            except PreconditionFailed:
                if self._took_back_a_forgery():
                    return
                self._tag = None
                now = read_lease(self.store, self.run_id)
                holder = describe(now) if now else "nobody"
                raise LeaseLost(
                    f"run {self.run_id}: {self.owner} lost the lease (term {self.term}); "
                    f"now {holder}"
                ) from None

    def check(self) -> None:
        """Fencing: prove the lease is still this process's, right before acting (a renewal).
        Raises LeaseLost. Blocks."""
        self.renew()

    def release(self, successor: str = "", ttl_s: float | None = None) -> None:
        """Give the lease up: to `successor` (live for `ttl_s`, default the ttl, so nobody else
        takes it while the successor boots), or to whoever comes next (expired now). Best effort
        when the lease is lost already (then a no-op). Blocks."""
        with self._lock:
            if self._tag is None:
                return
            until = self.clock() + (ttl_s if ttl_s is not None else self.ttl_s) if successor else 0
            with contextlib.suppress(PreconditionFailed):  # lost already: nothing to give
                self._write(self.term, self._tag, expires=until, successor=successor)
            self._tag = None

    # --- one conditional write ----------------------------------------------------------------
    def _took_back_a_forgery(self) -> bool:
        """After a renewal found the lease changed: when no controller of the run wrote it (see
        the module), write this process's lease over it, same term, and say so. Returns whether
        it did. Blocks (one read, one conditional write)."""
        if self.mac_key is None:
            return False
        got = _get_tagged(self.store, self.key)
        if got is None or self._genuine(got[0]):
            return False
        try:
            self._write(self.term, got[1])
        except PreconditionFailed:  # changed again meanwhile: judged by the next renewal
            return False
        self.on_forged(
            f"run {self.run_id}: control/lease was written without the run's key "
            f"({_shown(got[0])}); {self.owner} took it back (term {self.term})"
        )
        return True

    def _genuine(self, data: bytes) -> bool:
        """Whether a lease document that is not this process's last write came from a controller
        of the run: signed with its key, for a later term (a takeover always adds one). Pure."""
        if self.mac_key is None:
            return True
        try:
            body = json.loads(data)
        except (ValueError, RecursionError):
            return False
        if not run_key.verify_doc(self.mac_key, self._purpose, body):
            return False
        term = body.get("term")
        return isinstance(term, int) and term > self.term

    @property
    def _purpose(self) -> str:
        return f"{run_key.LEASE}:{self.run_id}"

    def _parse(self, got: tuple[bytes, str] | None) -> tuple[LeaseDoc | None, str | None]:
        if got is None:
            return None, None
        forged = self.mac_key is not None and not _signed(self.mac_key, self._purpose, got[0])
        try:
            doc = LeaseDoc.from_json(got[0])
        except ProtocolError:
            doc = None
        if doc is None or forged:
            # unreadable, or no controller wrote it: expired, whatever it says, and its term
            # says nothing true either (a node may write term 0 over term 5): the next term is
            # taken from the clock, above every counted one, so the last genuine holder sees
            # the takeover as one (its term is smaller) and never takes the lease back
            return LeaseDoc(owner="?", term=max(int(self.clock()), 1), expires=0.0), got[1]
        return doc, got[1]

    def _write(
        self, term: int, tag: str | None, expires: float | None = None, successor: str = ""
    ) -> None:
        now = self.clock()
        until = now + self.ttl_s if expires is None else expires
        nonce = uuid.uuid4().hex
        doc = LeaseDoc(owner=self.owner, term=term, expires=until, successor=successor, time=now)
        body = doc.to_dict()
        body["nonce"] = nonce  # tells this write from any other of the same owner and term
        if self.mac_key is not None:
            body = run_key.sign_doc(self.mac_key, self._purpose, body)
        data = json.dumps(body).encode()
        try:
            new_tag = self.store.put_if(self.key, data, tag)
        except PreconditionFailed:
            got = _get_tagged(self.store, self.key)  # a lost reply to a write that did land?
            if got is None or _nonce_of(got[0]) != nonce:
                raise
            new_tag = got[1]
        self.term, self._tag, self._expires, self._nonce = term, new_tag, until, nonce


def _get_tagged(store: ObjectStore, key: str) -> tuple[bytes, str] | None:
    """The lease object and its tag, read with a bound: a larger one (a node's, since no
    controller writes one) reads as empty bytes, unreadable, with its tag, so a conditional
    write still replaces it. Blocks (one read)."""
    try:
        return store.get_tagged(key, max_bytes=LEASE_MAX_BYTES)
    except TooLarge as exc:
        if exc.tag is None:
            raise
        return b"", exc.tag


def _signed(key: bytes, purpose: str, data: bytes) -> bool:
    try:
        return run_key.verify_doc(key, purpose, json.loads(data))
    except (ValueError, RecursionError):
        return False


def _shown(data: bytes) -> str:
    """A forged document's owner, for the message: escaped and short. Pure."""
    try:
        owner = json.loads(data).get("owner", "?")
    except (ValueError, RecursionError, AttributeError):
        owner = "unreadable"
    return "owner " + repr(str(owner))[:80]


def _nonce_of(data: bytes) -> str:
    try:
        value = json.loads(data)
    except ValueError:
        return ""
    return str(value.get("nonce", "")) if isinstance(value, dict) else ""


class LeaseKeeper:
    """Renews a held lease from its own thread every ttl/6 until stopped or lost. `lost` is set
    (and `on_lost` called once, from the thread) when a renewal fails, or after a release when
    `should_yield()` says so: the owner must stop acting at once (cloudtrain/state/fencing.py
    refuses every create and delete anyway)."""

    def __init__(
        self,
        lease: Lease,
        on_lost: Callable[[str], None] = lambda _m: None,
        should_yield: Callable[[], bool] = lambda: False,
    ) -> None:
        self.lease, self.on_lost, self.should_yield = lease, on_lost, should_yield
        self.lost = threading.Event()
        self.reason = ""  # why it was lost, naming the new holder (set before `lost`)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)

    def start(self) -> LeaseKeeper:
        """Start renewing. Returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (the lease stays as last written). Blocks until the thread ends."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.lease.ttl_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.lease.ttl_s / 6):
            try:
                if self.should_yield():
                    self.lease.release()  # expired now: the asker takes it at once
                    self._lose(f"{self.lease.owner} yielded the run")
                    return
                self.lease.renew()
            except LeaseLost as exc:
                self._lose(str(exc))
                return
            except (CloudtrainError, OSError):  # a store hiccup: the next round tries again
                continue

    def _lose(self, reason: str) -> None:
        self.reason = reason
        self.lost.set()
        self.on_lost(reason)
