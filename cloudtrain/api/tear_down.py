"""`api.down`: tear a run down, from the ledger's record or, with no record, from the cloud's
tags alone. Idempotent: after a crash, or a `kill -9` of an earlier `down`, run it again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.api.results import LOG, DownReport
from cloudtrain.core.errors import CloudtrainError, LedgerError, UsageError

if TYPE_CHECKING:
    from cloudtrain.jobspec.run_ids import RunId
    from cloudtrain.providers.base import Provider
    from cloudtrain.state.journal import Journal
    from cloudtrain.state.ledger import Ledger, RunRecord

JOURNAL_CLOSE_S = 30.0


def _log(message: str) -> None:
    LOG.info("%s", message)


def down(
    run_id: str,
    *,
    provider: str | None = None,
    region: str | None = None,
    account: str | None = None,
    say: Callable[[str], None] | None = None,
) -> DownReport:
    """Stop the run's agents (they flush a checkpoint), delete its nodes, then its network and
    identity, blank the secrets its bucket holds, and mark the ledger done (an outcome a racing
    controller wrote is kept). `run_id`: an id or a unique prefix when the ledger knows the
    run; with no record, `provider` (and `region`, `account`: the GCP project / Azure
    subscription) say where to look, and only a whole run id will do (the cloud's tags are
    matched exactly). SIGINT/SIGTERM/SIGHUP half-way only count (on the main thread): half a
    teardown is how VMs leak. `say` hears the progress (default: the `cloudtrain.api` logger).
    Idempotent; blocks until the cloud confirms the nodes are gone."""
    from cloudtrain.jobspec.run_ids import parse_run_id, parse_run_ref
    from cloudtrain.run import build as api
    from cloudtrain.run.stop_signals import signal_name, signals_deferred
    from cloudtrain.run.teardown import request_stop, scrub_secrets, teardown

    tell = say or _log
    ref = parse_run_ref(run_id)  # the edge: before anything is built from it (the ledger too)
    the_ledger = api.ledger()
    rec = the_ledger.get_run(ref)
    whole: RunId | None = None
    if rec is None and provider is not None:  # another machine's run: its journal, if any
        # no record: the journal's key and the cloud's tags are matched exactly, so only a
        # whole run id will do
        whole = parse_run_id(ref)
        rec = _from_journal(whole, provider, region, account, the_ledger, tell)
    if rec is None and provider is None:
        rec = the_ledger.find_run(ref)  # a unique prefix, or a clear "no run" error
    name = provider or (rec.provider if rec else None)
    if name is None:
        raise UsageError(f"no run {ref!r} in the ledger", hint="pass --provider")
    # the ledger holds only ids that were made or parsed (run_ids): trusted as they are
    rid = rec.run_id if rec else whole
    assert rid is not None  # no record only with a provider, and then `whole` was parsed
    if rec is not None and (provider, region, account) == (None, None, None):
        prov = api.record_provider(rec)  # with the options the run was made with
    else:
        prov = api.provider(
            name,
            region or (rec.region if rec else None),
            rec.zone if rec else None,
            account or (rec.account if rec else None),
        )
    store_uri = rec.store_uri if rec else prov.default_store_uri(rid)

    def told(signum: int) -> None:
        tell(
            f"{signal_name(signum)} received: down finishes what it started first "
            "(it is idempotent: after a `kill -9`, run it again)"
        )

    with signals_deferred(told):  # SIGINT/SIGTERM/SIGHUP half-way would leave half a run
        _fence_out(prov, store_uri, rid, tell, the_ledger)
        journal = _mirror(prov, store_uri, rid, the_ledger) if rec is not None else None
        request_stop(prov, store_uri, rid, "cloudtrain down")
        report = teardown(prov, the_ledger if rec else None, rid, tell)
        scrub_secrets(prov, store_uri, rid)
        if rec is not None:  # the outcome a racing controller wrote is kept
            try:
                the_ledger.finish_run(rid)
            except LedgerError as exc:  # the journal's bucket, not the ledger: a warning
                tell(f"warning: {exc}")
        if journal is not None:
            the_ledger.journal_to(rid, None)
            with contextlib.suppress(LedgerError):
                journal.close(JOURNAL_CLOSE_S)
    return DownReport(
        rid, list(report.nodes_deleted), list(report.resources_deleted), report.seconds
    )


def _fence_out(
    prov: Provider,
    store_uri: str,
    run_id: str,
    tell: Callable[[str], None],
    ledger: Ledger,
) -> None:
    """Take the run's lease by force (term + 1), signed with the run's key (a holder takes an
    unsigned lease back: a node could have written it): a controller node, or an attached
    process, stops creating and deleting at its next step (cloudtrain/state/fencing.py), so nothing
    it does races the teardown. Best effort: a run without a bucket has no lease."""
    import os
    import socket

    from cloudtrain.state import run_key
    from cloudtrain.state.lease import DOWN_OWNER_PREFIX, Lease, describe, read_lease

    with contextlib.suppress(CloudtrainError, OSError):
        store = prov.store(store_uri)
        held = read_lease(store, run_id)
        owner = f"{DOWN_OWNER_PREFIX}{socket.gethostname()}:{os.getpid()}"
        key = None
        with contextlib.suppress(CloudtrainError, OSError):  # no key: an unsigned lease
            key = run_key.reader_key(ledger, store, run_id)
        Lease(store, run_id, owner, key=key).acquire(force=True)
        if held is not None and held.expires > time.time():
            tell(f"took control from {describe(held)}")


def _from_journal(
    run_id: RunId,
    provider: str,
    region: str | None,
    account: str | None,
    ledger: Ledger,
    tell: Callable[[str], None],
) -> RunRecord | None:
    """The run's record from its journal (a run made on another machine), or None when its
    bucket holds none: down then works from the cloud's tags alone. Blocks."""
    from cloudtrain.run.journal_sync import sync_run

    try:
        return sync_run(run_id, provider=provider, region=region, account=account, ledger=ledger)
    except (CloudtrainError, OSError) as exc:
        tell(f"no journal of {run_id} to read ({exc}); going by the cloud's tags")
        return None


def _mirror(prov: Provider, store_uri: str, run_id: str, ledger: Ledger) -> Journal | None:
    """Mirror down's ledger writes into the run's journal, so every machine sees the run torn
    down. None when the bucket cannot be written (down goes on without it)."""
    from cloudtrain.state.journal import Journal, writer_id

    try:
        journal = Journal(prov.store(store_uri), run_id, writer_id("down"))
        # signing needs the run's key, put in the bucket the first time: a run that crashed
        # before its bucket existed has none to write to
        ledger.journal_to(run_id, journal)
    except (CloudtrainError, OSError):
        return None
    return journal
