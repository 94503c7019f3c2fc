"""The controller node's process: `python -m cloudtrain.managed.controller_node` (issue 17).

The startup script of a node of role `controller` runs it instead of the agent. It:
1. imports the run's journal (cloudtrain/state/journal.py) into its own ledger ($CT_WORK/home);
2. takes the lease the laptop handed it (`successor`), or leaves quietly when someone else holds
   it (`attach` took over first): exit 6, and the script powers the VM off;
3. adopts the run (cloudtrain/managed/adopt.py) and follows it with the laptop's own watch loop:
   recovery, budget, deadline, stop requests; every ledger write goes to the journal;
4. at the end tears everything down but itself (teardown's `spare`), and then, last, deletes its
   own VM through the cloud's API (the delete is asynchronous on every cloud: the guest gets its
   shutdown time) and, in that time, its own identity (SIGTERM is ignored from here).
`cloudtrain attach` may ask it to yield (control/yield): it hands the lease back and exits 6,
leaving its VM for the new holder to delete. Runs on the nodes' Pythons (3.10+).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import CloudtrainError, LeaseHeld
from cloudtrain.jobs import protocol
from cloudtrain.run.view import Outcome, RunView

if TYPE_CHECKING:
    from cloudtrain.providers.base import Compute, Resource
    from cloudtrain.run.orchestrator import Orchestrator
    from cloudtrain.state.journal import Journal

EXIT_NOT_MINE = 6  # another process controls the run (Outcome.LEASE_LOST's code)


class PrintObserver:
    """The controller node's observer: plain timestamped lines on stdout (the VM's console and
    the bootstrap log's agent phase). Thread-safe enough for line writes."""

    def __init__(self) -> None:
        self._phase = ""

    def event(self, message: str) -> None:
        """One lifecycle line."""
        print(f"{time.strftime('%H:%M:%S')} cloudtrain-controller: {message}", flush=True)

    def log_line(self, node: str, line: str) -> None:
        """The nodes' lines are in the bucket already: not repeated here."""

    def update(self, view: RunView) -> None:
        """A line when the run's phase changes."""
        if view.phase != self._phase:
            self._phase = view.phase
            self.event(f"phase: {view.phase}")


def main(argv: list[str] | None = None) -> int:
    """Run the controller node's process (see the module); returns the exit code. Blocks until
    the run ends or control passes to another process."""
    parser = argparse.ArgumentParser(prog="cloudtrain.managed.controller_node")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--store-uri", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args(argv)
    # its own ledger, beside the node's files; CLOUDTRAIN_HOME stays the environment's (on local
    # it is the laptop's: where the local provider keeps its nodes)
    ledger_path = Path(args.work) / "controller" / "ledger.db"
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    observer = PrintObserver()
    try:
        return _control(args.run_id, args.store_uri, args.provider, ledger_path, observer)
    except LeaseHeld as exc:
        observer.event(f"not taking the run: {exc}")
        return EXIT_NOT_MINE
    except CloudtrainError as exc:
        observer.event(f"error: {exc}")
        return 1


def _control(
    run_id: str, store_uri: str, provider_name: str, ledger_path: Path, observer: PrintObserver
) -> int:
    from cloudtrain.jobspec.run_ids import check_run_ref
    from cloudtrain.managed.adopt import adopt
    from cloudtrain.managed.controller_launch import controller_owner
    from cloudtrain.providers.base import node_name
    from cloudtrain.run import build as api_build
    from cloudtrain.state.journal import Journal, import_journal, writer_id
    from cloudtrain.state.lease import Lease
    from cloudtrain.state.ledger import Ledger

    check_run_ref(run_id, exact=True)
    ledger = Ledger(ledger_path)
    store = api_build.provider(provider_name).store(store_uri)
    imported = import_journal(ledger, store, run_id)
    rec = ledger.get_run(run_id)
    if rec is None:
        raise CloudtrainError(f"run {run_id}: no journal in {store_uri} (imported {imported})")
    provider = api_build.record_provider(rec)
    name = node_name(run_id, "controller", 0)
    owner = controller_owner(name)
    store = provider.store(store_uri)
    lease = Lease(store, run_id, owner, key=ledger.run_key(run_id))  # the journal's import kept it
    lease.acquire()  # LeaseHeld: attach (or down) took the run first
    journal = Journal(store, run_id, writer_id("controller"))
    ledger.journal_to(run_id, journal)
    ledger.event(run_id, "lease", f"{owner} took the run (term {lease.term})")
    observer.event(f"controlling run {run_id} (term {lease.term}, {imported} journal entries)")
    orch = adopt(provider, ledger, observer, lease, run_id, store_uri, spare=name)
    orch.watch_yield(protocol.yield_key(run_id))
    crash_point("controller-adopted")
    result = orch.follow()
    observer.event(f"run {run_id}: {result.outcome}: {result.detail}")
    if result.outcome == Outcome.LEASE_LOST or orch.fenced_out:  # `down` took it, say
        return EXIT_NOT_MINE
    crash_point("controller-torn-down")
    _delete_self(orch, journal)
    return 0


def _delete_self(orch: Orchestrator, journal: Journal) -> None:
    """Last: the controller node's own VM, its identity and what holds the VM (Azure's resource
    group). Where a power-off deletes the VM (AWS) the identity goes first and the VM powers off
    as this process ends (the startup script's last step); elsewhere the VM's delete comes first
    (the guest has its shutdown time) and the identity after it. The ledger (and so the journal)
    says all of it is gone before the calls; a failure is left to the dead-man switch of the
    node's deadline and to `cloudtrain down`. Blocks."""
    from cloudtrain.run.teardown import spared_kind

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the guest's shutdown must not cut this short
    ledger, run_id, compute = orch.ledger, orch.run_id, orch.provider.compute
    left = {
        (r.kind, r.id): r for r in compute.list_resources(run_id) if spared_kind(compute, r.kind)
    }
    for rec in ledger.resources(run_id, live_only=True):
        if spared_kind(compute, rec.kind):
            left.setdefault((rec.kind, rec.resource_id), rec.to_resource())
    # the identity before what holds the VM (deleting a group deletes what is in it)
    last = sorted(left.values(), key=lambda r: r.kind in compute.holds_nodes_kinds)
    me = [n for n in compute.list_nodes(run_id) if n.name == orch.spare]
    for res in last:
        ledger.mark_deleted(run_id, res.kind, res.id)
    ledger.mark_deleted(run_id, "node", orch.spare)
    ledger.event(run_id, "controller", f"{orch.spare} deletes itself, then its identity")
    journal.flush()
    # the deletes are fenced (the lease is still ours); handed over (expired) after them
    if compute.deletes_on_power_off:  # AWS: no right to delete the VM is needed at all
        _delete_resources(compute, last)
        orch.hand_over()
        return  # the startup script powers the VM off when this process ends: the cloud deletes it
    # what the VM's delete does not need goes first, outside the guest's shutdown time
    _delete_resources(compute, [r for r in last if not compute.needed_to_delete_self(r)])
    with contextlib.suppress(CloudtrainError, OSError):
        if me:
            compute.delete_listed(me)  # the guest gets its shutdown time to finish what follows
    _delete_resources(compute, [r for r in last if compute.needed_to_delete_self(r)])
    orch.hand_over()


def _delete_resources(compute: Compute, resources: list[Resource]) -> None:
    """Delete each resource, each failure left for `cloudtrain down` (best effort). Blocks."""
    for res in resources:
        with contextlib.suppress(CloudtrainError, OSError):
            compute.delete_resources([res])


if __name__ == "__main__":
    sys.exit(main())
