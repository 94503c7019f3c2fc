"""Turn a job spec into a priced plan: the offer of every node, one region and zone, and the cost.

`make_plan(spec, catalog)` is pure: it reads only the spec's attributes and the Catalog passed in
(no files, no environment, no network). GPU roles (chief, worker, evaluator) get the cheapest offer
matching the spec's accelerator and count per node (or its instance_type); `ps` gets the cheapest
CPU-only offer. All nodes share one region and zone, chosen to minimise the cluster's $/h.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.catalog import Catalog, Offer, canonical_accelerator
from cloudtrain.errors import PlanError

if TYPE_CHECKING:
    from cloudtrain.spec import JobSpec

ROLE_ORDER = ("chief", "worker", "ps", "evaluator")
CPU_ROLES = frozenset({"ps"})
MAX_ALTERNATIVES = 3
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
class Alternative:
    """A runner-up choice for the GPU roles, with the whole cluster's $/h and estimate."""

    description: str
    hourly_usd: float
    estimate_usd: float


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
        )


@dataclass(frozen=True)
class _Request:
    """What the GPU roles need: an accelerator and count, an instance type, or neither (CPU)."""

    accelerator: str | None
    count: int | None
    instance_type: str | None
    spot: bool

    def matches(self, offer: Offer) -> bool:
        if self.instance_type and offer.instance_type.lower() != self.instance_type.lower():
            return False
        if self.accelerator is None:
            return not offer.attached if self.instance_type else offer.accelerator is None
        if offer.accelerator != self.accelerator:
            return False
        return self.count is None or offer.accelerator_count == self.count

    def describe(self) -> str:
        gpus = f"{self.accelerator} x{self.count}" if self.count else f"{self.accelerator}"
        if self.instance_type:
            text = f"instance type {self.instance_type}"
            return f"{text} with {gpus}" if self.accelerator else text
        return f"{gpus} per node" if self.accelerator else "a CPU-only machine"


@dataclass(frozen=True)
class _Choice:
    main: Offer | None  # the offer for the GPU roles (None when the cluster has none)
    ps: Offer | None  # the CPU-only offer for `ps` (None when there is no ps)
    hourly: float
    region: str
    zone: str | None


def make_plan(spec: JobSpec, catalog: Catalog) -> Plan:
    """Price `spec` against `catalog` and return the cheapest feasible plan. Pure.

    Raises PlanError when the cluster is empty, nothing in the catalog fits (the message names the
    nearest feasible alternatives), or the estimate exceeds `max_cost_usd` (the message says how
    many hours the budget affords).
    """
    counts = _ordered_roles(spec.cluster.roles())
    if not counts:
        raise PlanError("the cluster has no nodes", hint="give the cluster at least a chief")
    max_hours = float(spec.max_hours)
    if not max_hours > 0 or math.isinf(max_hours):
        raise PlanError(f"max_hours must be a positive number, not {spec.max_hours!r}")
    request = _request_of(spec)
    n_main = sum(n for role, n in counts if role not in CPU_ROLES)
    n_ps = sum(n for role, n in counts if role in CPU_ROLES)

    alternatives: tuple[Alternative, ...] = ()
    if spec.provider == "local":
        choice, notes, spot = _local_choice(spec, catalog, request, n_main + n_ps)
    else:
        combos, notes = _cloud_combos(spec, catalog, request, n_main, n_ps)
        choice, spot = combos[0], request.spot
        alternatives = _alternatives(combos, max_hours)
        notes += _offer_notes(choice, spot)

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
    return Plan(
        run_name=spec.name,
        provider=spec.provider,
        region=choice.region,
        zone=choice.zone,
        strategy=spec.cluster.strategy,
        nodes=tuple(nodes),
        hourly_usd=hourly,
        max_hours=max_hours,
        estimate_usd=estimate,
        max_cost_usd=max_cost,
        alternatives=alternatives,
        notes=tuple(notes),
    )


def _ordered_roles(roles: dict[str, int]) -> list[tuple[str, int]]:
    """(role, count) pairs with count > 0: chief, worker, ps, evaluator, then any other role."""
    known = [(role, int(roles[role])) for role in ROLE_ORDER if role in roles]
    others = [(role, int(n)) for role, n in roles.items() if role not in ROLE_ORDER]
    return [(role, n) for role, n in known + others if n > 0]


def _request_of(spec: JobSpec) -> _Request:
    cluster = spec.cluster
    name = cluster.accelerator_name
    accelerator = canonical_accelerator(name) if name and name.strip() else None
    count: int | None = int(cluster.accelerator_count or 0)
    if accelerator is None:
        count = None
    elif count is not None and count < 1:
        count = None if cluster.instance_type else 1
    itype = cluster.instance_type.strip() if cluster.instance_type else None
    return _Request(accelerator, count, itype or None, bool(cluster.spot))


def _local_choice(
    spec: JobSpec, catalog: Catalog, request: _Request, node_count: int
) -> tuple[_Choice, list[str], bool]:
    """Every node runs the local offer; spot, instance type and accelerator are ignored."""
    offers = catalog.offers(provider="local")
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
    choice = _Choice(offer, offer, offer.price_hourly * node_count, offer.region, offer.zone)
    return choice, notes, False


def _cloud_combos(
    spec: JobSpec, catalog: Catalog, request: _Request, n_main: int, n_ps: int
) -> tuple[list[_Choice], list[str]]:
    """Every feasible (location, offer) choice, cheapest cluster first, plus zone notes."""
    provider, region, spot = spec.provider, spec.region or None, request.spot
    if provider not in catalog.providers():
        raise PlanError(
            f"the price catalog has no offers for provider {provider!r}",
            hint=f"catalog providers: {', '.join(catalog.providers()) or 'none'}",
        )
    if region and region not in catalog.regions(provider):
        raise PlanError(
            f"region {region!r} is not in the {provider} price catalog",
            hint=f"{provider} regions in the catalog: {', '.join(catalog.regions(provider))}",
        )
    scope = catalog.offers(provider, region=region, spot=spot)
    zone_filter, forced_zone, notes = _zone_scope(spec.zone, provider, region, scope)
    if zone_filter:
        scope = [o for o in scope if o.zone == zone_filter]

    def location(offer: Offer) -> tuple[str, str | None]:
        return offer.region, forced_zone or offer.zone

    cpu_at: dict[tuple[str, str | None], Offer] = {}
    for offer in scope:  # cheapest first
        if offer.accelerator is None:
            cpu_at.setdefault(location(offer), offer)
    combos = []
    if n_main:
        candidates = [o for o in scope if request.matches(o)]
        for offer in candidates:
            ps = cpu_at.get(location(offer)) if n_ps else None
            if n_ps and ps is None:
                continue
            hourly = n_main * _price(offer, spot) + (n_ps * _price(ps, spot) if ps else 0.0)
            combos.append(_Choice(offer, ps, hourly, *location(offer)))
        if candidates and not combos:
            places = sorted({f"{o.region}/{o.zone}" if o.zone else o.region for o in candidates})
            raise PlanError(
                f"no CPU-only {provider} machine for the ps role where {request.describe()} is "
                f"offered ({', '.join(places)})",
                hint="add a CPU machine for that zone to the catalog, or drop the ps role",
            )
    else:
        combos = [_Choice(None, ps, n_ps * _price(ps, spot), *loc) for loc, ps in cpu_at.items()]
    if not combos:
        raise _infeasible(catalog, request, provider, region, zone_filter)
    combos.sort(key=lambda c: (round(c.hourly, 9), c.region, c.zone or "", _itype(c)))
    return combos, notes


def _zone_scope(
    zone: str | None, provider: str, region: str | None, scope: list[Offer]
) -> tuple[str | None, str | None, list[str]]:
    """(zone to filter offers by, zone to force on every node, notes) for the spec's zone."""
    if not zone:
        return None, None, []
    if provider == "azure":
        return None, None, [f"zone {zone} ignored: the Azure catalog has no zones"]
    known = sorted({o.zone for o in scope if o.zone})
    if zone in known:
        return zone, None, []
    if region:
        return (
            None,
            zone,
            [
                f"zone {zone} is not in the price catalog; priced from {region}'s catalog zones "
                f"({', '.join(known)})"
            ],
        )
    raise PlanError(
        f"zone {zone!r} is not in the {provider} price catalog",
        hint=f"set region as well, or use one of: {', '.join(known)}",
    )


def _price(offer: Offer | None, spot: bool) -> float:
    price = offer.price(spot) if offer else None
    return float(price or 0.0)


def _itype(choice: _Choice) -> str:
    offer = choice.main or choice.ps
    return offer.instance_type if offer else ""


def _where(region: str, zone: str | None) -> str:
    return f"{region}/{zone}" if zone else region


def _alternatives(combos: list[_Choice], max_hours: float) -> tuple[Alternative, ...]:
    """The next cheapest distinct (region, offer) choices after the chosen one."""

    def key(c: _Choice) -> tuple[object, ...]:
        offer = c.main or c.ps
        assert offer is not None
        return c.region, offer.instance_type, offer.accelerator, offer.accelerator_count

    seen = {key(combos[0])}
    result: list[Alternative] = []
    for combo in combos[1:]:
        if key(combo) in seen:
            continue
        seen.add(key(combo))
        offer = combo.main or combo.ps
        assert offer is not None
        hourly = round(combo.hourly, 6)
        description = f"{offer.label()} in {_where(combo.region, combo.zone)}"
        result.append(Alternative(description, hourly, round(hourly * max_hours, 6)))
        if len(result) == MAX_ALTERNATIVES:
            break
    return tuple(result)


def _offer_notes(choice: _Choice, spot: bool) -> list[str]:
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


def _infeasible(
    catalog: Catalog, request: _Request, provider: str, region: str | None, zone: str | None
) -> PlanError:
    """A PlanError naming what was asked and up to 3 nearest feasible offers with their $/h."""
    spot = request.spot
    everywhere = catalog.offers(provider, spot=spot)
    local = [o for o in everywhere if (region is None or o.region == region)]
    local = [o for o in local if zone is None or o.zone == zone]
    acc, count = request.accelerator, request.count or 1
    groups: list[list[Offer]] = []
    if request.instance_type:
        itype = request.instance_type.lower()
        same = [o for o in everywhere if o.instance_type.lower() == itype]
        groups.append([o for o in same if o in local])  # other GPU counts of that type here
        groups.append(same)  # that type elsewhere
    if acc:

        def distance(offer: Offer) -> int:
            return abs(offer.accelerator_count - count)

        groups.append(sorted((o for o in local if o.accelerator == acc), key=distance))
        groups.append([o for o in everywhere if o.accelerator == acc and o not in local])
        others = [o for o in local if o.accelerator and o.accelerator != acc]
        groups.append(sorted(others, key=distance))
    elif not request.instance_type:
        groups.append([o for o in local if o.accelerator is None])
    picks = _round_robin(groups, MAX_ALTERNATIVES)

    spot_word = " spot" if spot else ""
    where = _where(region, zone) if region else f"any {provider} region"
    if acc and acc not in catalog.accelerators(provider):
        asked = f"{provider} offers no {acc} in the price catalog"
    else:
        asked = f"no {provider}{spot_word} offer with {request.describe()} in {where}"
    nearest = ", ".join(
        f"{o.label()} in {_where(o.region, o.zone)} at ${_price(o, spot):.2f}/h" for o in picks
    )
    message = f"{asked}; nearest: {nearest}" if picks else f"{asked}; nothing close in the catalog"
    hint = "pick one of these, or change cluster accelerator, accelerator_count or region"
    if spot:
        hint += "; spot: false also allows offers without a spot price"
    return PlanError(message, hint=hint)


def _round_robin(groups: list[list[Offer]], limit: int) -> list[Offer]:
    """Take one offer from each group in turn until `limit` are picked.

    An offer whose machine, GPU and count were already picked (in another region) is skipped.
    """
    picks: list[Offer] = []
    seen: set[tuple[object, ...]] = set()
    queues = [list(group) for group in groups]
    while len(picks) < limit and any(queues):
        for queue in queues:
            while queue:
                offer = queue.pop(0)
                key = (offer.instance_type, offer.accelerator, offer.accelerator_count)
                if key not in seen:
                    seen.add(key)
                    picks.append(offer)
                    break
            if len(picks) == limit:
                break
    return picks


def _fmt_hours(hours: float) -> str:
    """`2.0 h`, `0.25 h`: one decimal when exact, else two."""
    return f"{hours:.1f} h" if round(hours, 1) == hours else f"{hours:.2f} h"


def _fmt_affordable(budget: float, hourly: float) -> str:
    """How long `budget` lasts at `hourly`, rounded down: `0.8 h`, or minutes under 0.1 h."""
    hours = budget / hourly if hourly > 0 else math.inf
    if hours >= 0.1:
        return f"{math.floor(hours * 10 + 1e-9) / 10:.1f} h"
    return f"{math.floor(hours * 60 + 1e-9):.0f} min"
