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

from cloudtrain.errors import CloudtrainError, LeaseHeld, UsageError
from cloudtrain.jobs import protocol
from cloudtrain.lease import Lease, describe, read_lease
from cloudtrain.runtypes import Observer, Outcome, RunResult

YIELD_WAIT_FACTOR = 2.0  # a controller checks for a yield at every renewal: ttl/6; wait 2 ttls


def attach(
    run_id: str,
    observer: Observer,
    *,
    provider: str | None = None,
    region: str | None = None,
    account: str | None = None,
    detach: bool = False,
    say: Callable[[str], None] | None = None,
) -> RunResult:
    """Take control of `run_id` and follow it to its end (or, with `detach`, hand it to a new
    controller node). UsageError for an unknown run, or one that ended already; LeaseHeld when
    the holder does not yield in time. Blocks until the run ends (tears it down) or is handed
    over."""
    from cloudtrain import api_build
    from cloudtrain.adopt import adopt
    from cloudtrain.journal import Journal, import_journal
    from cloudtrain.runrules import check_run_ref

    tell = say or observer.event
    check_run_ref(run_id)
    ledger = api_build.ledger()
    rec = ledger.get_run(run_id)
    if rec is None and provider is None:
        rec = ledger.find_run(run_id)
    rid = rec.run_id if rec else check_run_ref(run_id, exact=True)
    name = provider or (rec.provider if rec else "")
    prov = api_build.provider(name, region or (rec.region if rec else None), None, account)
    store_uri = rec.store_uri if rec and rec.store_uri else prov.default_store_uri(rid)
    store = prov.store(store_uri)
    import_journal(ledger, store, rid)
    rec = ledger.get_run(rid)
    if rec is None:
        raise UsageError(f"no run {rid!r} in {store_uri}: no journal there")
    if rec.status == "done":
        raise UsageError(
            f"run {rid} has ended: {rec.outcome or 'done'}",
            hint=f"`cloudtrain status {rid}` shows it",
        )
    prov = api_build.record_provider(rec)
    store = prov.store(store_uri)
    owner = f"attach:{socket.gethostname()}:{os.getpid()}"
    lease = Lease(store, rid, owner)
    _take(lease, store, rid, tell)
    ledger.journal_to(rid, Journal(store, rid, owner))
    ledger.event(rid, "lease", f"{owner} took the run (term {lease.term})")
    tell(f"attached to run {rid} (term {lease.term})")
    orch = adopt(prov, ledger, observer, lease, rid, store_uri)
    _retire_controller(orch, tell)
    if detach:
        from cloudtrain.controller_launch import launch_controller

        launch_controller(orch)
        return orch._result(Outcome.DETACHED, "")
    return orch.follow()


def _take(lease: Lease, store, run_id: str, tell: Callable[[str], None]) -> None:  # type: ignore[no-untyped-def]
    """Acquire the lease; ask a live holder to yield first and wait for it. Raises LeaseHeld."""
    try:
        lease.acquire()
        return
    except LeaseHeld:
        pass
    holder = read_lease(store, run_id)
    tell(f"asking {describe(holder) if holder else 'the controller'} to hand the run over")
    store.put(protocol.yield_key(run_id), lease.owner.encode())
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
