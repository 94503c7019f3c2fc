"""`list_runs`: the newest runs of the ledger with their live resources and cost."""

from __future__ import annotations

from cloudtrain.api.results import RunListing
from cloudtrain.run.build import ledger


def list_runs(limit: int = 20) -> list[RunListing]:
    """The newest `limit` runs of the ledger, with their live resources and cost. Read-only."""
    the_ledger = ledger()
    out = []
    for rec in the_ledger.list_runs(limit=limit):
        live = [x for x in the_ledger.resources(rec.run_id, live_only=True) if x.kind != "bucket"]
        out.append(RunListing(rec, len(live), the_ledger.billed_cost(rec.run_id)))
    return out
