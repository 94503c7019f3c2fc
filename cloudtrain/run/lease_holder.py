"""The control side of the Orchestrator: act only while the run's lease holds, and keep the
run's record in its journal (issue 17).

A part the Orchestrator holds (`LeaseHolder`): `take_lease` fences the run's provider
(cloudtrain/state/fencing.py) and starts a keeper thread that renews the lease
(cloudtrain/state/lease.py); the watch loop calls `check` every round and stops acting at once
(LeaseLost) when the keeper found it gone; `hand_over` stops renewing and gives the lease to a
successor (the controller node) or to anyone (expired now). `start_journal` mirrors the run's
ledger writes into its journal in the bucket (cloudtrain/state/journal.py) once the bucket exists,
and `close_journal` writes what is left before the process goes.
"""

from __future__ import annotations

import contextlib

from cloudtrain.core.errors import CloudtrainError, LeaseLost
from cloudtrain.jobs import protocol
from cloudtrain.providers.base import Provider
from cloudtrain.run.run_state import RunState
from cloudtrain.run.view import Observer, Outcome
from cloudtrain.state import run_key
from cloudtrain.state.fencing import FencedProvider
from cloudtrain.state.journal import Journal
from cloudtrain.state.lease import DOWN_OWNER_PREFIX, Lease, LeaseKeeper, read_lease
from cloudtrain.state.ledger import Ledger

JOURNAL_CLOSE_S = 60.0
STOPPED_BY_DOWN = f"stopped by `cloudtrain down` ({protocol.STOP_NAME})"


class LeaseHolder:
    """The lease of one run, held by the process that controls it (see the module).

    Inputs: the run's shared `state` (it reads `store`), its `ledger` (events, the run key, the
    journal's mirror), the `observer`, the `run_id` and this process's lease `owner` id. It
    changes `state.provider` (fenced by `take_lease`) and its own `lease`, `journal` and
    `fenced_out`."""

    def __init__(
        self, state: RunState, ledger: Ledger, observer: Observer, run_id: str, owner: str
    ) -> None:
        self.state, self.ledger, self.observer = state, ledger, observer
        self.run_id, self.owner = run_id, owner
        self.lease: Lease | None = None  # held from the bucket on
        self.journal: Journal | None = None  # the run's journal in its bucket, once it exists
        self.fenced_out = False  # the lease was lost: this process acts no more
        self._keeper: LeaseKeeper | None = None
        self._yield_key = ""

    def take_lease(self, lease: Lease) -> None:
        """Act only while `lease` (held) holds: the provider becomes fenced (every create and
        delete checks it), and a keeper renews it from its own thread. Idempotent per lease."""
        self.lease = lease
        lease.on_forged = self._lease_forged
        if not isinstance(self.state.provider, FencedProvider):
            self.state.provider = FencedProvider(self.state.provider, lease)
        if self._keeper is not None:
            self._keeper.stop()
        self._keeper = LeaseKeeper(lease, self._lease_lost_notice, self._yield_asked).start()

    def take_new_lease(self) -> None:
        """A new run's lease in its bucket (term 1: nobody else can hold it), the run's key
        first (cloudtrain/state/run_key.py: every lease write is signed with it), then its
        journal. Blocks."""
        store = self.state.store
        key = run_key.writer_key(self.ledger, store, self.run_id)
        lease = Lease(store, self.run_id, self.owner, key=key)
        lease.acquire()
        self.take_lease(lease)
        self.start_journal()

    def fence(self, provider: Provider) -> Provider:
        """`provider` fenced by the lease held (as it is when none is held). Pure."""
        return FencedProvider(provider, self.lease) if self.lease else provider

    def let_go(self) -> None:
        """Leave the run's store (a failover to another cloud): write out and stop the journal,
        stop renewing, and forget the lease without releasing it (its store is going). Blocks."""
        self.close_journal()
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        self.lease = None

    def watch_yield(self, key: str) -> None:
        """Hand the lease back (expired) and stop acting once `key` exists in the run's bucket
        (control/yield: `cloudtrain attach` asks the controller node for the run). Checked at
        each renewal."""
        self._yield_key = key

    def _yield_asked(self) -> bool:
        key = self._yield_key
        if not key or self.lease is None:
            return False
        # only a yield signed with the run's key for this term counts: a node could write one
        # (cloudtrain/state/run_key.py), and a controller that yields to it stops acting on the run
        run_key_ = self.ledger.run_key(self.run_id)
        return run_key.yield_asked(self.lease.store, self.run_id, run_key_, self.lease.term)

    def _lease_forged(self, message: str) -> None:
        """A lease no controller of the run wrote was taken back (cloudtrain/state/lease.py)."""
        with contextlib.suppress(CloudtrainError, OSError):
            self.ledger.event(self.run_id, "lease", message)
        self.observer.event(f"warning: {message}")

    def _lease_lost_notice(self, message: str) -> None:
        self.observer.event(f"lost control of the run: {message}")

    def check(self) -> None:
        """Raise LeaseLost once the keeper found the lease gone (the watch loop's check)."""
        if self._keeper is not None and self._keeper.lost.is_set():
            raise LeaseLost(self._keeper.reason or f"run {self.run_id}: the lease was lost")

    def stop_acting(self, outcome: Outcome, detail: str, why: str) -> tuple[Outcome, str]:
        """This process lost the run's lease (`why`): stop renewing, note it in the ledger and
        to the observer, and set `fenced_out`; the new holder stops and tears the run down. A
        run `cloudtrain down` took ends `interrupted` (as when the watch reads its stop first,
        whichever this process saw first), in the ledger too; otherwise `outcome`, `detail`
        stay. Returns the outcome and detail to report. Blocks (one read of the lease)."""
        self.fenced_out = True
        self.hand_over()
        self.ledger.event(self.run_id, "lease", why)
        self.observer.event(f"stopped acting: {why}")
        with contextlib.suppress(CloudtrainError, OSError):
            held = read_lease(self.state.store, self.run_id)
            if held is not None and held.owner.startswith(DOWN_OWNER_PREFIX):
                # the run's record says so too (down, finishing the run, keeps it; a `done`
                # down wrote first stays done: Ledger.set_status)
                self.ledger.set_status(
                    self.run_id, "stopping", Outcome.INTERRUPTED.value, STOPPED_BY_DOWN
                )
                return Outcome.INTERRUPTED, STOPPED_BY_DOWN
        return outcome, detail

    def hand_over(self, successor: str = "", ttl_s: float | None = None) -> None:
        """Stop renewing and hand the lease over (to `successor`, or to anyone: expired)."""
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        if self.lease is not None:
            with contextlib.suppress(CloudtrainError, OSError):
                self.lease.release(successor, ttl_s)

    def start_journal(self) -> None:
        """From the bucket on, every ledger write of the run also goes to its journal
        (cloudtrain/state/journal.py), the run's row first: any machine can follow the run then."""
        from cloudtrain.state.journal import writer_id

        rec = self.ledger.get_run(self.run_id)
        assert rec is not None
        self.journal = Journal(self.state.store, self.run_id, writer_id("laptop"))
        # the run as the ledger holds it (row, status, the bucket's intent, events), then
        # every write: one transaction, so nothing falls between; blocks until written
        self.ledger.journal_to(self.run_id, self.journal, backfill=True)

    def close_journal(self) -> None:
        """Write what the journal still holds (before this process exits). Blocks, at most
        JOURNAL_CLOSE_S; a journal that cannot be written is a warning, not a failure."""
        journal, self.journal = self.journal, None
        if journal is None:
            return
        self.ledger.journal_to(self.run_id, None)
        try:
            journal.close(JOURNAL_CLOSE_S)
        except CloudtrainError as exc:
            self.observer.event(f"warning: {exc}")
