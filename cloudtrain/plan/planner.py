"""Turn a job spec into a priced plan: the offer of every node, one region and zone, and the cost.

`make_plan(spec, catalog)` is pure: it reads only the spec's attributes and the Catalog passed in
(no network), and the provider's options as the command read them (config.yaml and the deprecated
variables, held by `provider_config.read_once`; outside one, read then). GPU roles (chief,
worker, evaluator) get the cheapest offer matching the spec's accelerator and count per node (or
its instance_type); `ps` gets the cheapest CPU-only offer. All nodes share one cloud, region and
zone, chosen to minimise the cluster's $/h; with `provider: cheapest` the cloud is the cheapest of
aws, gcp and azure. The search itself (choices, alternatives, infeasibility messages) is in
`cloudtrain.plan.search`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.catalog.offers import Catalog, canonical_accelerator
from cloudtrain.core.errors import PlanError
from cloudtrain.plan.search import (
    CLOUDS,
    MAX_ALTERNATIVES,
    Alternative,
    Choice,
    Place,
    Request,
    alternatives,
    cheapest_choices,
    cloud_choices,
    listed,
)
from cloudtrain.plan.tpu_plan import check_place, tpu_notes, tpu_request
from cloudtrain.providers.registry import declared

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec

__all__ = [
    "CHEAPEST",
    "CLOUDS",
    "LOCAL_GPU_NOTE",
    "MAX_ALTERNATIVES",
    "Alternative",
    "NodePlan",
    "Place",
    "Placement",
    "Plan",
    "make_plan",
    "on_demand_spec",
    "placements",
]

ROLE_ORDER = ("chief", "worker", "ps", "evaluator")
CPU_ROLES = frozenset({"ps"})
CHEAPEST = "cheapest"  # the spec's provider meaning "the cheapest of CLOUDS"
LOCAL_GPU_NOTE = (
    "local nodes are processes on this machine: GPUs are not simulated (accelerator ignored)"
)
_BUDGET_HINT = "lower max_hours, raise max_cost_usd, use spot: true, or pick a cheaper accelerator"
_BUDGET_HINT_SPOT = "lower max_hours, raise max_cost_usd, or pick a cheaper accelerator"


@dataclass(frozen=True)
class NodePlan:
    """One node of the plan: its role and index, the machine, where, and its $/h."""

    role: str
    index: int
    instance_type: str
    accelerator: str | None
    accelerator_count: int
    spot: bool
    region: str
    zone: str | None
    price_hourly: float

    @property
    def name(self) -> str:
        """`<role>-<index>`, e.g. `worker-1`."""
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class ProviderOption:
    """One option of the plan's provider in effect: its value and where it came from (`source`:
    job.yaml, config.yaml, env (deprecated) or default; `where`: FILE:LINE or $VAR, or "")."""

    name: str
    value: Any
    source: str
    where: str = ""


@dataclass(frozen=True)
class Plan:
    """A priced, feasible, affordable plan. Immutable; `to_dict()` is JSON-serialisable."""

    run_name: str
    provider: str
    region: str
    zone: str | None
    strategy: str
    nodes: tuple[NodePlan, ...]
    hourly_usd: float
    max_hours: float
    estimate_usd: float
    max_cost_usd: float | None
    alternatives: tuple[Alternative, ...]
    notes: tuple[str, ...]
    # the provider options in effect: (name, value, source, where), see provider_config.resolve
    provider_options: tuple[ProviderOption, ...] = ()
    # a spot plan whose spec allows the on-demand fallback (`cluster.spot_fallback`): the same
    # machines' on-demand $/h; None otherwise
    on_demand_hourly_usd: float | None = None
    # the places `make_plan` was told to avoid, each (provider, region, reason): failover keeps
    # avoiding them (cloudtrain/run/failover.py `places_for`)
    avoided: tuple[tuple[str, str, str], ...] = ()

    @property
    def node_count(self) -> int:
        """The number of nodes."""
        return len(self.nodes)

    def roles(self) -> dict[str, int]:
        """Node count per role, in node order (chief, worker, ps, evaluator). Pure."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.role] = counts.get(node.role, 0) + 1
        return counts

    def price_of(self, role: str) -> float:
        """The $/h of ONE node of `role` (all nodes of a role share an offer). Pure.

        Raises KeyError when the plan has no node with that role.
        """
        for node in self.nodes:
            if node.role == role:
                return node.price_hourly
        raise KeyError(role)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the plan (plus `node_count` and `roles`). Pure."""
        data = asdict(self)
        data["nodes"] = [asdict(node) for node in self.nodes]
        data["alternatives"] = [asdict(alt) for alt in self.alternatives]
        data["notes"] = list(self.notes)
        data["provider_options"] = [asdict(opt) for opt in self.provider_options]
        data["node_count"] = self.node_count
        data["roles"] = self.roles()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The inverse of `to_dict` (derived keys are ignored). Pure; KeyError on a missing key."""
        return cls(
            run_name=data["run_name"],
            provider=data["provider"],
            region=data["region"],
            zone=data["zone"],
            strategy=data["strategy"],
            nodes=tuple(NodePlan(**node) for node in data["nodes"]),
            hourly_usd=data["hourly_usd"],
            max_hours=data["max_hours"],
            estimate_usd=data["estimate_usd"],
            max_cost_usd=data["max_cost_usd"],
            alternatives=tuple(Alternative(**alt) for alt in data["alternatives"]),
            notes=tuple(data["notes"]),
            # absent from a plan recorded before options were kept
            provider_options=tuple(ProviderOption(**o) for o in data.get("provider_options", ())),
            on_demand_hourly_usd=data.get("on_demand_hourly_usd"),
            avoided=tuple((p, r, why) for p, r, why in data.get("avoided", ())),
        )

    @property
    def place(self) -> Place:
        """(provider, region): where the plan lands, the unit failover avoids."""
        return self.provider, self.region

    def avoided_places(self) -> dict[Place, str]:
        """The places the plan was made avoiding, with their reasons. Pure."""
        return {(p, r): why for p, r, why in self.avoided}


@dataclass(frozen=True)
class Placement:
    """One feasible place of a spec: its cloud, region, best zone, and the cluster's $/h there."""

    provider: str
    region: str
    zone: str | None
    hourly_usd: float

    @property
    def place(self) -> Place:
        """(provider, region)."""
        return self.provider, self.region


def placements(spec: JobSpec, catalog: Catalog) -> list[Placement]:
    """Every feasible (provider, region) of `spec` with its cheapest choice, cheapest first (across
    the clouds with `provider: cheapest`; only the pinned region when the spec pins one). What
    `cloudtrain check JOB` walks, and the order failover follows. The budget is not applied.
    Pure. Raises PlanError as `make_plan` does when nothing fits at all."""
    counts = _ordered_roles(spec.cluster.roles())
    if not counts:
        raise PlanError("the cluster has no nodes", hint="give the cluster at least a chief")
    request = request_of(spec)
    if declared(spec.provider).on_this_machine:
        choice, _notes, _spot = _local_choice(spec, catalog, request, sum(n for _, n in counts))
        return [Placement(spec.provider, choice.region, choice.zone, round(choice.hourly, 6))]
    check_place(spec, catalog)
    choices, _notes = _choices(spec, catalog, request, counts, None)
    best: dict[Place, Placement] = {}
    for c in choices:  # cheapest first
        best.setdefault(
            (c.provider, c.region), Placement(c.provider, c.region, c.zone, round(c.hourly, 6))
        )
    return list(best.values())


def on_demand_spec(spec: JobSpec) -> JobSpec:
    """`spec` with `cluster.spot` and `cluster.spot_fallback` off: what a spot run falls back to
    when no region has spot capacity. Pure (a copy; `spec` is unchanged)."""
    update = {"spot": False, "spot_fallback": False}
    if hasattr(spec, "model_copy"):
        return spec.model_copy(update={"cluster": spec.cluster.model_copy(update=update)})
    clone, cluster = copy.copy(spec), copy.copy(spec.cluster)  # a stand-in spec (tests)
    for name, value in update.items():
        setattr(cluster, name, value)
    clone.cluster = cluster
    return clone


def _choices(
    spec: JobSpec,
    catalog: Catalog,
    request: Request,
    counts: list[tuple[str, int]],
    avoid: Mapping[Place, str] | None,
) -> tuple[list[Choice], list[str]]:
    """The spec's feasible choices on its cloud (or across CLOUDS), cheapest first, with the
    search's notes. Pure; PlanError as `make_plan` says."""
    n_main = sum(n for role, n in counts if role not in CPU_ROLES)
    n_ps = sum(n for role, n in counts if role in CPU_ROLES)
    if spec.provider == CHEAPEST:
        _refuse_place(spec.region, spec.zone)
        return cheapest_choices(catalog, request, n_main, n_ps, avoid)
    region, zone = spec.region or None, spec.zone or None
    pinned = _pinned_avoided(spec, catalog, request, n_main, n_ps, avoid)
    if pinned:
        raise pinned
    return cloud_choices(catalog, request, spec.provider, region, zone, n_main, n_ps, avoid)


def _pinned_avoided(
    spec: JobSpec,
    catalog: Catalog,
    request: Request,
    n_main: int,
    n_ps: int,
    avoid: Mapping[Place, str] | None,
) -> PlanError | None:
    """The error for a spec whose pinned region (or zone) is a place of `avoid`: a pinned place
    is never left. None otherwise. Pure."""
    if not avoid or not (spec.region or spec.zone):
        return None
    choices, _ = cloud_choices(
        catalog, request, spec.provider, spec.region or None, spec.zone or None, n_main, n_ps
    )
    for place in dict.fromkeys((c.provider, c.region) for c in choices):
        if place in avoid:
            field = "region" if spec.region else "zone"
            pin = spec.region or spec.zone
            return PlanError(
                f"{place[0]} {place[1]} is ruled out ({avoid[place]}), and the spec pins "
                f"{field} {pin}: a pinned {field} is never left",
                hint=f"remove {field} to let cloudtrain try the next-cheapest region",
            )
    return None


def make_plan(spec: JobSpec, catalog: Catalog, *, avoid: Mapping[Place, str] | None = None) -> Plan:
    """Price `spec` against `catalog` and return the cheapest feasible plan. Pure given the
    command's `provider_config.read_once` (outside one, config.yaml is read for the options).

    `avoid`: places (provider, region) ruled out, each with its reason in one short line (no
    quota there, already tried by failover): the plan is the cheapest feasible choice elsewhere,
    and each avoided place cheaper than it gets a note `skipped <provider> <region>: <reason>`.
    PlanError when every feasible place is avoided (listing the reasons), or when the spec pins
    a region or zone that is avoided (a pinned place is never left). `local` ignores it.

    A spot plan whose spec sets `cluster.spot_fallback` also carries the same machines'
    on-demand $/h (`on_demand_hourly_usd`) and a note giving both prices.

    With `spec.provider == "cheapest"` the search spans aws, gcp and azure (never local): the
    plan's `provider` is the chosen cloud, its notes name the runner-up cloud and its $/h, and
    its alternatives include the other clouds' best choices (their descriptions name the cloud).

    Raises PlanError when the cluster is empty, `provider: cheapest` comes with a region or zone,
    nothing in the catalog fits (the message names the nearest feasible alternatives), or the
    estimate exceeds `max_cost_usd` or its GPUs for `max_hours` exceed `max_gpu_hours` (the
    message says how many hours the budget affords).
    """
    counts = _ordered_roles(spec.cluster.roles())
    if not counts:
        raise PlanError("the cluster has no nodes", hint="give the cluster at least a chief")
    max_hours = float(spec.max_hours)
    if not max_hours > 0 or math.isinf(max_hours):
        raise PlanError(f"max_hours must be a positive number, not {spec.max_hours!r}")
    request = request_of(spec)

    runner_ups: tuple[Alternative, ...] = ()
    provider = spec.provider
    on_demand: float | None = None
    if declared(provider).on_this_machine:
        choice, notes, spot = _local_choice(spec, catalog, request, sum(n for _, n in counts))
    else:
        across = provider == CHEAPEST
        check_place(spec, catalog)
        choices, notes = _choices(spec, catalog, request, counts, avoid)
        choice, spot = choices[0], request.spot
        provider = choice.provider
        runner_ups = alternatives(choices, max_hours, across_clouds=across)
        notes += _offer_notes(choice, spot)
        if spot and getattr(spec.cluster, "spot_fallback", False):
            on_demand = _on_demand_hourly(choice, counts)
            notes.append(_fallback_note(on_demand, max_hours, spec.max_cost_usd))
    notes += _ignored_notes(spec, provider) + tpu_notes(spec, provider)

    nodes = []
    for role, count in counts:
        offer = choice.ps if role in CPU_ROLES else choice.main
        assert offer is not None  # a role with nodes always has an offer
        price = offer.price(spot)
        for index in range(count):
            nodes.append(
                NodePlan(
                    role=role,
                    index=index,
                    instance_type=offer.instance_type,
                    accelerator=offer.accelerator,
                    accelerator_count=offer.accelerator_count,
                    spot=spot,
                    region=choice.region,
                    zone=choice.zone,
                    price_hourly=float(price or 0.0),
                )
            )
    hourly = round(sum(node.price_hourly for node in nodes), 6)
    estimate = round(hourly * max_hours, 6)
    max_cost = None if spec.max_cost_usd is None else float(spec.max_cost_usd)
    if max_cost is not None and estimate > max_cost + 1e-9:
        raise PlanError(
            f"estimated ${estimate:.2f} for {_fmt_hours(max_hours)} exceeds max_cost_usd "
            f"${max_cost:.2f}; that budget affords {_fmt_affordable(max_cost, hourly)} "
            f"at ${hourly:.2f}/h",
            hint=_BUDGET_HINT_SPOT if spot else _BUDGET_HINT,
        )
    _check_gpu_hours(spec.max_gpu_hours, nodes, max_hours)
    return Plan(
        run_name=spec.name,
        provider=provider,
        region=choice.region,
        zone=choice.zone,
        strategy=spec.cluster.strategy,
        nodes=tuple(nodes),
        hourly_usd=hourly,
        max_hours=max_hours,
        estimate_usd=estimate,
        max_cost_usd=max_cost,
        alternatives=runner_ups,
        notes=tuple(notes),
        provider_options=options_of(spec, provider),
        on_demand_hourly_usd=on_demand,
        avoided=tuple((p, r, why) for (p, r), why in (avoid or {}).items()),
    )


def _on_demand_hourly(choice: Choice, counts: list[tuple[str, int]]) -> float:
    """The cluster's on-demand $/h on the machines of `choice`. Pure."""
    total = 0.0
    for role, count in counts:
        offer = choice.ps if role in CPU_ROLES else choice.main
        total += count * float((offer.price(False) if offer else None) or 0.0)
    return round(total, 6)


def _fallback_note(hourly: float, max_hours: float, max_cost: float | None) -> str:
    """The plan's note on the on-demand fallback: its price, and whether the budget allows it."""
    estimate = hourly * max_hours
    note = (
        f"spot_fallback: if no region has spot capacity the run goes on-demand at "
        f"${hourly:.2f}/h (${estimate:.2f} for {_fmt_hours(max_hours)})"
    )
    if max_cost is not None and estimate > float(max_cost) + 1e-9:
        note += f"; over max_cost_usd ${float(max_cost):.2f}, so it would not be taken"
    return note


def _ordered_roles(roles: dict[str, int]) -> list[tuple[str, int]]:
    """(role, count) pairs with count > 0: chief, worker, ps, evaluator, then any other role."""
    known = [(role, int(roles[role])) for role in ROLE_ORDER if role in roles]
    others = [(role, int(n)) for role, n in roles.items() if role not in ROLE_ORDER]
    return [(role, n) for role, n in known + others if n > 0]


def _refuse_place(region: str | None, zone: str | None) -> None:
    """Raise PlanError when `provider: cheapest` comes with a region or zone (spec validation
    refuses it too, with the file and line; this guards specs built another way)."""
    for field, value in (("region", region), ("zone", zone)):
        if value:
            raise PlanError(
                f"{field} {value!r} cannot be used with provider 'cheapest': a {field} belongs "
                "to one cloud",
                hint=f"remove {field}, or set provider to {listed(list(CLOUDS))}",
            )


def request_of(spec: JobSpec) -> Request:
    """What the spec asks of one GPU node: accelerator (canonical) and count, instance type,
    spot; a TPU job its TPU type's. Pure."""
    tpu = tpu_request(spec)  # a TPU job: its TPU type's offer
    if tpu is not None:
        return tpu
    cluster = spec.cluster
    name = cluster.accelerator_name
    accelerator = canonical_accelerator(name) if name and name.strip() else None
    count: int | None = int(cluster.accelerator_count or 0)
    if accelerator is None:
        count = None
    elif count is not None and count < 1:
        count = None if cluster.instance_type else 1
    itype = cluster.instance_type.strip() if cluster.instance_type else None
    return Request(accelerator, count, itype or None, bool(cluster.spot))


def _local_choice(
    spec: JobSpec, catalog: Catalog, request: Request, node_count: int
) -> tuple[Choice, list[str], bool]:
    """Every node runs the local offer; spot, instance type and accelerator are ignored."""
    offers = catalog.offers(provider=spec.provider)
    if not offers:
        raise PlanError(
            "the price catalog has no local offer",
            hint="remove the override file $CLOUDTRAIN_HOME/catalog/local.csv or add a local row",
        )
    offer = offers[0]
    notes = []
    if request.accelerator or (spec.cluster.accelerator_count or 0) > 0:
        notes.append(LOCAL_GPU_NOTE)
    if request.instance_type:
        notes.append(f"instance_type {request.instance_type} ignored: local nodes are processes")
    if request.spot:
        notes.append("spot ignored: local nodes cannot be preempted")
    if offer.price_hourly:
        notes.append(f"local nodes priced at ${offer.price_hourly:.2f} per node-hour")
    choice = Choice(offer, offer, offer.price_hourly * node_count, offer.region, offer.zone)
    return choice, notes, False


def options_of(spec: JobSpec, provider: str) -> tuple[ProviderOption, ...]:
    """The options of `provider` in effect for `spec` with their sources: job.yaml, then
    config.yaml and the deprecated variables as the command read them once
    (`provider_config.read_once`; outside one, read now)."""
    from cloudtrain.jobspec.provider_config import resolve

    return tuple(ProviderOption(**shown) for shown in resolve(spec, provider).shown())


def _ignored_flags() -> tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...]:
    """(field path, the providers that ignore it, why) of each flag a provider does not use:
    the fields each INFO declares it ignores (`ignored_fields`), then the top-level account
    aliases (`project:`, `subscription:`), ignored by every provider whose INFO names another
    account field (or none)."""
    from cloudtrain.jobspec.provider_sections import account_field, users_of
    from cloudtrain.providers import infos, names

    flags = [(loc, (i.name,), why) for i in infos() for loc, why in i.ignored_fields]
    for field_name in dict.fromkeys(f for n in names() if (f := account_field(n))):
        users = users_of(field_name)
        others = tuple(n for n in names() if n not in users)
        flags.append(((field_name,), others, f"only {', '.join(users)} uses a {field_name}"))
    return tuple(flags)


def _ignored_notes(spec: JobSpec, provider: str) -> list[str]:
    """A note for each flag the spec sets that `provider` ignores, led by its `file:line`
    when the spec file sets it (`JobSpec.where`). Pure."""
    notes = []
    where_of = getattr(spec, "where", lambda *loc: None)  # a stand-in spec may lack it
    for loc, providers, why in _ignored_flags():
        where = where_of(*loc)
        value = getattr(spec.cluster if loc[0] == "cluster" else spec, loc[-1], None)
        if provider not in providers or value in (None, False):
            continue
        if where is None and loc == ("cluster", "disk_gb"):
            continue  # the default size, not the user's
        note = f"{'.'.join(loc)} ignored by provider {provider}: {why}"
        notes.append(f"{where}: {note}" if where else note)
    return notes


def _offer_notes(choice: Choice, spot: bool) -> list[str]:
    notes = []
    offers = [o for o in (choice.main, choice.ps) if o is not None]
    dates = sorted({o.prices_date for o in offers if o.prices_date})
    if dates:
        notes.append(f"prices from the catalog snapshot of {', '.join(dates)}; bills may differ")
    main = choice.main
    if main is not None and main.attached:
        notes.append(
            f"{main.accelerator} x{main.accelerator_count} attached to {main.instance_type}: "
            f"the price is the machine plus {main.accelerator_count} x the GPU price"
        )
    if spot:
        notes.append("spot nodes can be preempted; lost nodes are recreated from checkpoints")
        for offer in offers:
            if offer.spot_price_hourly == offer.price_hourly:
                notes.append(
                    f"the catalog's spot price for {offer.instance_type} in {offer.region} equals "
                    "its on-demand price (likely no real spot discount)"
                )
    return notes


def _fmt_hours(hours: float) -> str:
    """`2.0 h`, `0.25 h`: one decimal when exact, else two."""
    return f"{hours:.1f} h" if round(hours, 1) == hours else f"{hours:.2f} h"


def _check_gpu_hours(cap: float | None, nodes: list[NodePlan], max_hours: float) -> None:
    """PlanError when the plan's GPUs for `max_hours` exceed max_gpu_hours `cap`, saying how
    long the cap lasts on them. Pure."""
    gpus = sum(n.accelerator_count for n in nodes)
    if cap is None or gpus * max_hours <= cap + 1e-9:
        return
    raise PlanError(
        f"{gpus} GPU(s) for {_fmt_hours(max_hours)} is {gpus * max_hours:g} GPU-hours, over "
        f"max_gpu_hours {cap:g}; that budget affords {_fmt_hours(cap / gpus)} on them",
        hint="lower max_hours, raise max_gpu_hours, or ask for fewer GPUs",
    )


def _fmt_affordable(budget: float, hourly: float) -> str:
    """How long `budget` lasts at `hourly`, rounded down: `0.8 h`, or minutes under 0.1 h."""
    hours = budget / hourly if hourly > 0 else math.inf
    if hours >= 0.1:
        return f"{math.floor(hours * 10 + 1e-9) / 10:.1f} h"
    return f"{math.floor(hours * 60 + 1e-9):.0f} min"
