"""`list_runs`: the newest runs of the ledger with their live resources and cost, optionally
brought up to date with their journals first (what `cloudtrain ls` shows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.api.results import RunListing
from cloudtrain.core.errors import CloudtrainError
from cloudtrain.run.build import ledger

if TYPE_CHECKING:
    from cloudtrain.state.ledger import Ledger, RunRecord


def list_runs(
    limit: int = 20, *, sync: bool = False, warn: Callable[[str], None] | None = None
) -> list[RunListing]:
    """The newest `limit` runs of the ledger, with their live resources and cost. Read-only
    without `sync`.

    With `sync`, each listed run that is not `done` and has a bucket first takes in the new
    entries of its journal (`journal_sync.sync_run`, as `status` does), so a run controlled
    elsewhere (a detached run's controller node) shows what its controller last wrote, not
    what this machine last saw. Cost: per such run, its provider made once (its SDK loaded),
    one listing of the journal's recent window and one read per new entry; `done` runs and
    runs without a bucket cost nothing. A bucket or provider that cannot be read is one
    warning to `warn` and the ledger's row as it is. Blocks then; idempotent."""
    the_ledger = ledger()
    out = []
    for rec in the_ledger.list_runs(limit=limit):
        if sync and rec.status != "done" and rec.store_uri:
            rec = _synced(the_ledger, rec, warn)
        live = [x for x in the_ledger.resources(rec.run_id, live_only=True) if x.kind != "bucket"]
        out.append(RunListing(rec, len(live), the_ledger.billed_cost(rec.run_id)))
    return out


def _synced(the_ledger: Ledger, rec: RunRecord, warn: Callable[[str], None] | None) -> RunRecord:
    """The run's record after importing its journal's new entries; as it was when that fails
    (one warning). Blocks."""
    from cloudtrain.run.journal_sync import sync_run

    try:
        return sync_run(rec.run_id, ledger=the_ledger, warn=warn)
    except CloudtrainError as exc:
        if warn is not None:
            warn(f"run {rec.run_id}'s journal not read: {exc}")
        return rec
