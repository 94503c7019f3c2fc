"""`cloudtrain cost`: what runs cost, from the ledger, and what their kept outputs cost per month.

Compute cost is the ledger's: each node's price times its billed interval (from the create
intent to the confirmed delete, or now while it lives). Storage is what a run keeps in its bucket
after teardown (checkpoints, model, logs), priced per GB-month at the provider's standard rate:
an estimate, since the bucket's class and region change the real price. Listing a bucket needs
that provider's SDK and credentials; a run whose bucket cannot be read shows its storage as
unknown rather than failing the report.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from cloudtrain.core.errors import CloudtrainError, UsageError

if TYPE_CHECKING:  # annotations only: `plan` imports the API's types and needs no sqlite
    from cloudtrain.state.ledger import Ledger, RunRecord

GB = 1e9
_SINCE_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[hdw])$")
_UNIT_S = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


@dataclass(frozen=True)
class RunCost:
    """One run's line in the report."""

    run_id: str
    name: str
    provider: str
    outcome: str
    started: float
    node_hours: float
    compute_usd: float
    stored_gb: float | None  # None: the bucket could not be read
    storage_usd_month: float | None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return asdict(self)


def storage_usd_per_gb_month(provider: str) -> float:
    """The provider's list price of standard storage per GB-month (its
    `ProviderInfo.storage_usd_per_gb_month`); 0.0 for a provider this version does not know."""
    from cloudtrain.providers.registry import info

    try:
        return info(provider).storage_usd_per_gb_month
    except CloudtrainError:
        return 0.0


def parse_since(text: str) -> float:
    """Seconds in '30d', '12h', '2w'. Raises UsageError. Pure."""
    m = _SINCE_RE.match(text.strip())
    if not m:
        raise UsageError(f"--since {text!r} is not a duration", hint="e.g. 12h, 30d or 2w")
    return float(m["n"]) * _UNIT_S[m["unit"]]


def run_cost(
    ledger: Ledger, rec: RunRecord, stored_bytes: Callable[[RunRecord], int], now: float
) -> RunCost:
    """One run's compute cost from the ledger and its kept storage (unknown when the bucket
    cannot be read). Blocks for the bucket listing."""
    hours = 0.0
    for r in ledger.resources(rec.run_id):
        if r.kind == "node":
            end = r.deleted_at if r.deleted_at is not None else now
            hours += max(0.0, end - r.created_at) / 3600
    try:
        gb: float | None = stored_bytes(rec) / GB
    except CloudtrainError:
        gb = None
    rate = storage_usd_per_gb_month(rec.provider)
    return RunCost(
        run_id=rec.run_id,
        name=rec.name,
        provider=rec.provider,
        outcome=rec.outcome or rec.status,
        started=rec.created_at,
        node_hours=hours,
        compute_usd=ledger.billed_cost(rec.run_id, now=now),
        stored_gb=gb,
        storage_usd_month=None if gb is None else gb * rate,
    )


def report(
    ledger: Ledger,
    stored_bytes: Callable[[RunRecord], int],
    run_id: str | None = None,
    since_s: float | None = None,
    now: float | None = None,
    limit: int = 1000,
) -> list[RunCost]:
    """The runs of the report, newest first: one run (a unique id prefix), or every run started
    within `since_s`. Read-only; blocks for bucket listings."""
    at = time.time() if now is None else now
    if run_id is not None:
        runs = [ledger.find_run(run_id)]
    else:
        runs = [
            r
            for r in ledger.list_runs(limit=limit)
            if since_s is None or r.created_at >= at - since_s
        ]
    return [run_cost(ledger, r, stored_bytes, at) for r in runs]


def totals(rows: list[RunCost]) -> dict[str, float]:
    """Sums over the rows (storage over the runs whose bucket could be read). Pure."""
    return {
        "runs": float(len(rows)),
        "node_hours": sum(r.node_hours for r in rows),
        "compute_usd": sum(r.compute_usd for r in rows),
        "stored_gb": sum(r.stored_gb or 0.0 for r in rows),
        "storage_usd_month": sum(r.storage_usd_month or 0.0 for r in rows),
    }
