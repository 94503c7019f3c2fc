"""`cloudtrain gc`: find the cloud resources that outlived their run, and delete them.

Every node and network/identity resource cloudtrain makes carries its run id in its tags, labels
or name, and `Compute.inventory()` lists them for all runs at once. Grouped by run, a run is
collected when the ledger says it is `done`, when the ledger has no row for it (the ledger file
was lost, or the run was started from another machine), or when its recorded deadline (the run's
`created_at` plus the plan's `max_hours`, plus DEADLINE_GRACE_S) has passed. Any other run is
live and left alone, as is a run unknown to the ledger whose only resources here are global
(AWS IAM): it may live in another region. Deletion is `teardown()`, run by run, as
`cloudtrain down` does it.

The ledger is read *after* the inventory: a run of this machine has its ledger row before its
first cloud call, so a run that starts during the survey is never taken for an unknown one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import CloudtrainError, ProviderError, UsageError
from cloudtrain.jobspec.run_ids import RunRef, read_run_ref
from cloudtrain.providers.base import Provider, Tagged
from cloudtrain.providers.parallel import parallel_map
from cloudtrain.providers.registry import declared
from cloudtrain.run.teardown import TeardownReport, teardown
from cloudtrain.state.ledger import Ledger, RunRecord

if TYPE_CHECKING:
    from rich.table import Table

    from cloudtrain.catalog.offers import Catalog

UNKNOWN = "unknown"
DEADLINE_GRACE_S = 1800.0  # past the deadline, a run's own teardown has had this long to finish
GC_PARALLEL = 4  # runs torn down at once (each fans its own nodes out)
ALL_RUNS = 1_000_000  # `list_runs` limit that means every run


@dataclass(frozen=True)
class Scope:
    """One provider section of `gc`: where to look (None: the provider's default)."""

    provider: str
    region: str | None = None
    account: str | None = None  # GCP project / Azure subscription


@dataclass(frozen=True)
class LeakedRun:
    """A run whose resources `gc` deletes: `state` is its ledger state as shown."""

    run_id: RunRef  # its tag, parsed (`select`)
    state: str  # "unknown", "done", or "<status>, past deadline"
    items: tuple[Tagged, ...]


@dataclass(frozen=True)
class LiveRun:
    """A run with resources that `gc` leaves alone, and why."""

    run_id: str
    reason: str


@dataclass(frozen=True)
class Survey:
    """What one scope holds: the runs to delete and the runs left alone."""

    scope: Scope
    where: str  # e.g. "aws us-east-1", for messages
    region: str | None  # the region the provider resolved
    leaked: tuple[LeakedRun, ...]
    live: tuple[LiveRun, ...]


@dataclass(frozen=True)
class Row:
    """One line of the gc table."""

    run_id: str
    state: str
    kind: str
    id: str
    age_s: float | None  # None: the cloud gave no creation time
    hourly_usd: float | None  # None: a node whose type is not in the catalog


@dataclass
class GcReport:
    """What `collect` deleted, and the runs it could not finish."""

    where: str
    deleted: list[tuple[str, TeardownReport]] = field(default_factory=list)
    failed: list[tuple[str, BaseException]] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        """One line: runs, nodes and other resources deleted, and how long it took. Pure."""
        nodes = sum(len(r.nodes_deleted) for _, r in self.deleted)
        other = sum(len(r.resources_deleted) for _, r in self.deleted)
        line = (
            f"deleted {len(self.deleted)} run(s) in {self.where}: {nodes} node(s) and {other} "
            f"other resource(s) in {self.seconds:.1f}s"
        )
        if self.failed:
            line += f"; {len(self.failed)} run(s) not finished"
        return line

    def raise_for_errors(self) -> None:
        """Raise ProviderError naming the runs not fully deleted (the first one's error)."""
        if self.failed:
            run_id, exc = self.failed[0]
            runs = ", ".join(r for r, _ in self.failed)
            raise ProviderError(
                f"gc in {self.where}: run(s) {runs} not fully deleted: {run_id}: {exc}",
                hint="run `cloudtrain gc --yes` again",
            )


def scopes(
    runs: Iterable[RunRecord],
    provider: str | None = None,
    region: str | None = None,
    account: str | None = None,
) -> list[Scope]:
    """The sections `gc` surveys: for `provider` (or each provider the ledger's `runs` used),
    each distinct region/account its runs used, with `region`/`account` overriding; one scope
    per project for project-wide providers. Raises UsageError without a provider and runs.
    Pure."""
    runs = list(runs)
    names = [provider] if provider else sorted({r.provider for r in runs})
    if not names:
        raise UsageError(
            "the ledger has no runs, so there is no provider to look in", hint="pass --provider"
        )
    out: list[Scope] = []
    for name in names:
        found = [
            Scope(name, region or r.region, account or r.account)
            for r in sorted(runs, key=lambda r: r.created_at, reverse=True)
            if r.provider == name
        ] or [Scope(name, region, account)]
        seen: set[tuple[str, str | None, str | None]] = set()
        for scope in found:
            key = (
                name,
                None if account_wide(name) else scope.region,
                None if declared(name).on_this_machine else scope.account,
            )
            if key not in seen:
                seen.add(key)
                out.append(scope)
    return out


def account_wide(provider: str) -> bool:
    """Whether the provider's inventory ignores the region (`ProviderInfo.inventory_scope` is
    "account": one scope per project/account). False for a provider this version does not
    know. Imports no SDK."""
    from cloudtrain.providers.registry import info

    try:
        return info(provider).inventory_scope == "account"
    except CloudtrainError:
        return False


def deadline(rec: RunRecord) -> float | None:
    """When the run had to end: its ledger `created_at` (just after the controller's own start,
    so never early) plus the plan's `max_hours`; None when the plan does not say. Pure."""
    try:
        plan = rec.plan
        hours = float(plan["max_hours"]) if isinstance(plan, dict) else None
    except (ValueError, TypeError, KeyError):
        return None
    return rec.created_at + hours * 3600 if hours and hours > 0 else None


def ledger_state(
    rec: RunRecord | None, now: float, grace_s: float = DEADLINE_GRACE_S
) -> tuple[str | None, str]:
    """(the state shown when the run may be collected, else None; why not). A run is collected
    when it is unknown, `done`, or past its deadline plus `grace_s`. Pure."""
    if rec is None:
        return UNKNOWN, ""
    if rec.status == "done":
        return "done", ""
    end = deadline(rec)
    if end is None:
        return None, f"{rec.status}; the ledger records no deadline"
    if now > end + grace_s:
        return f"{rec.status}, past deadline", ""
    if end > now:
        return None, f"{rec.status}; deadline in {format_age(end - now)}"
    return None, f"{rec.status}; deadline {format_age(now - end)} ago, within the grace period"


def select(
    items: Iterable[Tagged],
    records: Mapping[str, RunRecord | None],
    region: str | None,
    now: float,
    grace_s: float = DEADLINE_GRACE_S,
) -> tuple[list[LeakedRun], list[LiveRun]]:
    """Group `items` by run and sort the runs into leaked and live (see the module docstring).
    `records`: each run's ledger row (None: unknown); `region`: this scope's. Pure."""
    by_run: dict[str, list[Tagged]] = {}
    for item in items:
        by_run.setdefault(item.run_id, []).append(item)
    leaked: list[LeakedRun] = []
    live: list[LiveRun] = []
    for tag in sorted(by_run):
        run_id = read_run_ref(tag)  # a tag is untrusted: parsed here, the edge
        if run_id is None:  # no path or filter of it
            live.append(LiveRun(tag, "its tag is not a cloudtrain run id: left alone"))
            continue
        rec = records.get(run_id)
        run_items = tuple(sorted(by_run[run_id], key=lambda t: (t.kind != "node", t.kind, t.id)))
        state, reason = ledger_state(rec, now, grace_s)
        if state is not None and all(t.region is None for t in run_items):
            if rec is None:
                state, reason = None, "only global resources here: its region is unknown"
            elif rec.region != region:
                state, reason = None, f"only global resources here: the run was in {rec.region}"
        if state is None:
            live.append(LiveRun(run_id, reason))
        else:
            leaked.append(LeakedRun(run_id, state, run_items))
    return leaked, live


def survey(provider: Provider, ledger: Ledger, scope: Scope, now: float | None = None) -> Survey:
    """List every cloudtrain resource of the scope (retried on transient errors by the provider
    the registry built: `get_provider` wraps it in the one retry policy), then read the ledger
    for each run found, and select the leaked runs. Blocks; read-only."""
    items = provider.compute.inventory()
    records = {run_id: ledger.get_run(run_id) for run_id in {t.run_id for t in items}}
    region = _region_of(provider) or provider.config.region or scope.region
    leaked, live = select(items, records, region, time.time() if now is None else now)
    placeless = declared(scope.provider).on_this_machine  # this machine: no region, no account
    where = scope.provider if placeless else f"{scope.provider} {region or ''}"
    if scope.account and not placeless:
        where += f" ({scope.account})"
    return Survey(scope, where.strip(), region, tuple(leaked), tuple(live))


def _region_of(provider: Provider) -> str | None:
    """The region an adapter resolved (AWS: the SDK's default when none was given), looked up
    through the layers the registry wraps it in (each keeps the adapter as `inner`)."""
    layer: object = provider
    while layer is not None:
        region = getattr(layer, "region", None)
        if region:
            return str(region)
        layer = getattr(layer, "inner", None)
    return None


def hourly_price(catalog: Catalog, provider: str, item: Tagged) -> float | None:
    """A node's on-demand $/h from the catalog (its type in its region, else anywhere; the
    cheapest offer, so a GCP host's attached GPUs are not counted); 0 for network/identity;
    None for a node type the catalog lacks. Pure."""
    if item.kind != "node":
        return 0.0
    if not item.instance_type:
        return None
    offers = catalog.offers(provider, item.region, instance_type=item.instance_type)
    if not offers and item.region is not None:
        offers = catalog.offers(provider, instance_type=item.instance_type)
    return offers[0].price_hourly if offers else None


def rows(found: Survey, catalog: Catalog, now: float | None = None) -> list[Row]:
    """The table's rows: every resource of every leaked run, with its age and $/h. Pure."""
    at = time.time() if now is None else now
    return [
        Row(
            run.run_id,
            run.state,
            item.kind,
            item.id,
            None if item.created is None else max(0.0, at - item.created),
            hourly_price(catalog, found.scope.provider, item),
        )
        for run in found.leaked
        for item in run.items
    ]


def format_age(seconds: float | None) -> str:
    """`3d 4h`, `2h 5m`, `12m`, `40s`, or `?` for None. Pure."""
    if seconds is None:
        return "?"
    s = int(seconds)
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else f"{s}s"


def table(found: Survey, lines: list[Row]) -> Table:
    """The rich table of leaked resources, with the total $/h as its caption. Pure."""
    from rich.table import Table

    out = Table("run", "ledger", "kind", "id", "age", "$/h", title=f"leaked in {found.where}")
    for r in lines:
        price = "?" if r.hourly_usd is None else f"{r.hourly_usd:.4f}"
        out.add_row(r.run_id, r.state, r.kind, r.id, format_age(r.age_s), price)
    total = sum(r.hourly_usd or 0.0 for r in lines)
    unpriced = sum(1 for r in lines if r.hourly_usd is None)
    out.caption = f"total ${total:.4f}/h" + (
        f" (+ {unpriced} node(s) of a type the catalog lacks)" if unpriced else ""
    )
    return out


def collect(
    provider: Provider,
    ledger: Ledger,
    found: Survey,
    say: Callable[[str], None] = lambda _m: None,
    parallel: int = GC_PARALLEL,
) -> GcReport:
    """Tear every leaked run down (`teardown`, up to `parallel` runs at once), with the ledger
    when it knows the run, whose status becomes `done` (outcome `crashed` if it had none).
    Every run is attempted; failures are in the report. Idempotent; blocks."""
    started = time.monotonic()

    def one(run: LeakedRun) -> TeardownReport:
        rec = ledger.get_run(run.run_id)
        report = teardown(
            provider, ledger if rec else None, run.run_id, lambda m: say(f"{run.run_id}: {m}")
        )
        if rec is not None and rec.status != "done":
            ledger.finish_run(run.run_id)  # keeps an outcome a controller wrote meanwhile
        return report

    runs = list(found.leaked)
    results: list[Any] = parallel_map(one, runs, parallel)
    report = GcReport(found.where)
    for run, result in zip(runs, results, strict=True):
        if isinstance(result, BaseException):
            report.failed.append((run.run_id, result))
        else:
            report.deleted.append((run.run_id, result))
    report.seconds = time.monotonic() - started
    return report
