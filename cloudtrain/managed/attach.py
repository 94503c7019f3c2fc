"""`cloudtrain attach RUN`: take control of a detached run back, follow it live, end it (issue 17).

Given only the run id (and its provider when this machine's ledger has never seen the run), it
imports the run's journal, then takes the lease:
- held by a live controller node: asks it to yield (control/yield) and waits for the release;
- expired (the controller node died, or a detach without one): takes it at once, term + 1;
then deletes the controller node it replaces (its identity goes at the teardown), and follows the
run with the same watch loop as `run`: recovery, budget, deadline, Ctrl-C stops and tears down.
`--detach` then hands it to a new controller node again.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.core.errors import CloudtrainError, LeaseHeld, UsageError
from cloudtrain.jobs import protocol
from cloudtrain.providers.base import ObjectStore
from cloudtrain.run.view import Observer, RunResult
from cloudtrain.state import launch_doc
from cloudtrain.state.lease import Lease, describe, read_lease

if TYPE_CHECKING:
    from cloudtrain.jobspec.run_ids import RunRef

YIELD_WAIT_FACTOR = 2.0  # a controller checks for a yield at every renewal: ttl/6; wait 2 ttls


def attach(
    run_id: RunRef,
    observer: Observer,
    *,
    provider: str | None = None,
    region: str | None = None,
    account: str | None = None,
    detach: bool = False,
    say: Callable[[str], None] | None = None,
) -> RunResult:
    """Take control of `run_id` (parsed at the edge: `cli.common.run_ref`) and follow it to its
    end (or, with `detach`, hand it to a new controller node). UsageError for an unknown run,
    or one that ended already; LeaseHeld when the holder does not yield in time. Blocks until
    the run ends (tears it down) or is handed over."""
    from cloudtrain.managed.adopt import adopt
    from cloudtrain.run import build as api_build
    from cloudtrain.run.journal_sync import sync_run
    from cloudtrain.state.journal import Journal, writer_id

    tell = say or observer.event
    ledger = api_build.ledger()
    # this machine's ledger brought up to date with the run's journal (or made from it)
    rec = sync_run(run_id, provider=provider, region=region, account=account, ledger=ledger)
    rid = rec.run_id
    if rec.status == "done":
        raise UsageError(
            f"run {rid} has ended: {rec.outcome or 'done'}",
            hint=f"`cloudtrain status {rid}` shows it",
        )
    if detach:  # refused before the lease is taken: nobody would control the run
        from cloudtrain.jobs.strategies import strategy
        from cloudtrain.managed.controller_offer import check_hand_off

        declared = strategy(str((rec.plan or {}).get("strategy") or ""))
        if declared is not None:
            check_hand_off(declared)
    store_uri = rec.store_uri or ""
    prov = api_build.record_provider(rec)
    store = prov.store(store_uri)
    # a run that cannot be adopted is refused before its lease is taken: taking it and failing
    # would leave the run controlled by nobody
    launch_doc.read(store, rid, ledger.run_key(rid))
    owner = f"attach:{socket.gethostname()}:{os.getpid()}"
    lease = Lease(store, rid, owner, key=ledger.run_key(rid))
    _take(lease, store, rid, tell, ledger.run_key(rid))
    journal = Journal(store, rid, writer_id("attach"))
    ledger.journal_to(rid, journal)
    ledger.event(rid, "lease", f"{owner} took the run (term {lease.term})")
    tell(f"attached to run {rid} (term {lease.term})")
    orch = adopt(prov, ledger, observer, lease, rid, store_uri)
    orch.journal = journal  # closed (written out) when the run ends or is handed over
    _retire_controller(orch, tell)
    if detach:
        from cloudtrain.managed.controller_launch import launch_controller

        try:
            launch_controller(orch)
        finally:
            orch.close_journal()
        return orch.detached_result()
    return orch.follow()


def _take(
    lease: Lease,
    store: ObjectStore,
    run_id: str,
    tell: Callable[[str], None],
    key: bytes | None,
) -> None:
    """Acquire the lease; ask a live holder to yield first (control/yield, signed with the
    run's `key` for the holder's term: a controller ignores an unsigned one, which a node
    could write) and wait for it. Raises LeaseHeld; UsageError with no key to sign with."""
    from cloudtrain.state.run_key import yield_body

    try:
        lease.acquire()
        return
    except LeaseHeld:
        pass
    holder = read_lease(store, run_id)
    if key is None:
        raise UsageError(
            f"run {run_id}: no key to sign a yield with; its controller would ignore it",
            hint=f"wait for its lease to expire, or `cloudtrain down {run_id}`",
        )
    tell(f"asking {describe(holder) if holder else 'the controller'} to hand the run over")
    term = holder.term if holder is not None else 0
    store.put(protocol.yield_key(run_id), yield_body(key, run_id, lease.owner, term))
    try:
        end = time.time() + lease.ttl_s * YIELD_WAIT_FACTOR
        while True:
            try:
                lease.acquire()
                return
            except LeaseHeld:
                if time.time() > end:
                    raise
            time.sleep(min(1.0, lease.ttl_s / 6))
    finally:
        store.delete(protocol.yield_key(run_id))


def _retire_controller(orch, tell: Callable[[str], None]) -> None:  # type: ignore[no-untyped-def]
    """Delete the controller node this process replaces (fenced: with the new term). Its
    identity stays until the teardown. Blocks."""
    compute = orch.provider.compute
    mine = [n for n in compute.list_nodes(orch.run_id) if n.role == "controller"]
    if not mine:
        return
    tell(f"deleting the controller node {mine[0].name}: this process controls the run now")
    try:
        compute.delete_listed(mine)
    except CloudtrainError as exc:
        tell(f"could not delete {mine[0].name} yet ({exc}); the teardown will")
        return
    for node in mine:
        orch.ledger.mark_deleted(orch.run_id, "node", node.name)
