"""The planner's search: every feasible choice, the alternatives shown, and infeasibility errors.

Pure, like `cloudtrain.plan.planner` (which uses it): everything here reads only its arguments and
the
Catalog passed in. A choice is one offer for the GPU roles plus one CPU-only offer for `ps`, in one
region and zone of one cloud. `cloud_choices` searches one provider; `cheapest_choices` searches
the clouds of CLOUDS together (`provider: cheapest`). What it knows of a provider comes from its
ProviderInfo (the registry's INFO objects; no SDK).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cloudtrain.catalog.offers import Catalog, Offer
from cloudtrain.core.errors import PlanError
from cloudtrain.providers.registry import info, infos

Place = tuple[str, str]  # (provider, region): where a run can land, the unit failover avoids
# what `provider: cheapest` searches (never local), in registry order: ties go to the first
CLOUDS = tuple(i.name for i in infos() if i.searched_by_cheapest)
MAX_ALTERNATIVES = 3
# A CPU-only machine that runs TensorFlow (ps, or any role of a CPU-only cluster) needs this much
# memory; the catalog's smaller machines are for the controller node
# (cloudtrain.managed.controller_offer).
TF_MIN_MEMORY_GB = 8.0


def runs_tensorflow(offer: Offer) -> bool:
    """False for a CPU-only offer known to have less than TF_MIN_MEMORY_GB (a controller-size
    machine); True otherwise (GPU offers, unknown memory). Pure."""
    memory = offer.memory_gib if offer.memory_gib is not None else TF_MIN_MEMORY_GB
    return offer.accelerator is not None or memory >= TF_MIN_MEMORY_GB


@dataclass(frozen=True)
class Alternative:
    """A runner-up choice for the GPU roles, with the whole cluster's $/h and estimate."""

    description: str
    hourly_usd: float
    estimate_usd: float


@dataclass(frozen=True)
class Request:
    """What the GPU roles need: an accelerator and count, an instance type, or neither (CPU)."""

    accelerator: str | None
    count: int | None
    instance_type: str | None
    spot: bool

    def matches(self, offer: Offer) -> bool:
        """True when `offer` can run the GPU roles (prices are not looked at). Pure."""
        if self.instance_type and offer.instance_type.lower() != self.instance_type.lower():
            return False
        if self.accelerator is None:
            return not offer.attached if self.instance_type else offer.accelerator is None
        if offer.accelerator != self.accelerator:
            return False
        return self.count is None or offer.accelerator_count == self.count

    def describe(self) -> str:
        """The request in words, e.g. `V100 x2 per node` or `instance type p3.2xlarge`. Pure."""
        gpus = f"{self.accelerator} x{self.count}" if self.count else f"{self.accelerator}"
        if self.instance_type:
            text = f"instance type {self.instance_type}"
            return f"{text} with {gpus}" if self.accelerator else text
        return f"{gpus} per node" if self.accelerator else "a CPU-only machine"


@dataclass(frozen=True)
class Choice:
    """One feasible cluster: the offers of the GPU roles and of `ps`, where, and its $/h."""

    main: Offer | None  # the offer for the GPU roles (None when the cluster has none)
    ps: Offer | None  # the CPU-only offer for `ps` (None when there is no ps)
    hourly: float
    region: str
    zone: str | None

    @property
    def offer(self) -> Offer:
        """The offer that describes the choice: the GPU roles', else the ps one."""
        offer = self.main or self.ps
        assert offer is not None  # a choice always has at least one offer
        return offer

    @property
    def provider(self) -> str:
        """The cloud of the choice."""
        return self.offer.provider


def cloud_choices(
    catalog: Catalog,
    request: Request,
    provider: str,
    region: str | None,
    zone: str | None,
    n_main: int,
    n_ps: int,
    avoid: Mapping[Place, str] | None = None,
) -> tuple[list[Choice], list[str]]:
    """Every feasible choice within one provider (and `region`/`zone` when given), cheapest first,
    plus notes about the zone and the places of `avoid` skipped (see `avoiding`). Pure; never
    empty.

    Raises PlanError when the provider or region is not in the catalog, the zone is unknown
    without a region, the ps role has no CPU machine where the GPU offer is, or nothing fits (the
    message names the nearest feasible offers).
    """
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
    scope = catalog.offers(provider, region=region, spot=request.spot)
    zone_filter, forced_zone, notes = _zone_scope(zone, provider, region, scope)
    if zone_filter:
        scope = [o for o in scope if o.zone == zone_filter]
    choices, candidates = _choices_in(scope, request, forced_zone, n_main, n_ps)
    if candidates and not choices:
        raise _no_ps_machine(request, candidates, provider)
    if not choices:
        raise infeasible(catalog, request, provider, region, zone_filter)
    kept, skipped = avoiding(_sorted(choices), avoid or {})
    return kept, notes + skipped


def cheapest_choices(
    catalog: Catalog,
    request: Request,
    n_main: int,
    n_ps: int,
    avoid: Mapping[Place, str] | None = None,
) -> tuple[list[Choice], list[str]]:
    """Every feasible choice in the clouds of CLOUDS together, cheapest first, plus a note naming
    the chosen cloud and the runner-up cloud with its $/h, and the places of `avoid` skipped
    (see `avoiding`). Pure; never empty.

    Ties in $/h go to the cloud first in CLOUDS. Raises PlanError when the catalog has
    none of these clouds, or nothing fits in any of them (the message names the nearest feasible
    offers across the clouds).
    """
    clouds = [p for p in CLOUDS if p in catalog.providers()]
    if not clouds:
        raise PlanError(
            f"the price catalog has no {listed(CLOUDS)} offers",
            hint=f"catalog providers: {', '.join(catalog.providers()) or 'none'}",
        )
    choices: list[Choice] = []
    blocked: list[Offer] = []  # GPU offers that fit but have no CPU machine for ps beside them
    for cloud in clouds:
        scope = catalog.offers(cloud, spot=request.spot)
        found, candidates = _choices_in(scope, request, None, n_main, n_ps)
        choices += found
        if candidates and not found:
            blocked += candidates
    if not choices:
        if blocked:
            raise _no_ps_machine(request, blocked, None)
        raise infeasible(catalog, request, None, None, None)
    choices, skipped = avoiding(_sorted(choices), avoid or {})
    return choices, [_cheapest_note(choices, clouds), *skipped]


def avoiding(choices: list[Choice], avoid: Mapping[Place, str]) -> tuple[list[Choice], list[str]]:
    """(`choices` whose (provider, region) is not in `avoid`, a note `skipped <provider>
    <region>: <reason>` for each avoided place whose best choice ranks before the first kept one,
    as cheap as it included). `choices` are sorted cheapest first. Pure.

    Raises PlanError listing every avoided place with its reason when nothing is kept.
    """
    kept = [c for c in choices if (c.provider, c.region) not in avoid]
    if not kept:
        places = dict.fromkeys((c.provider, c.region) for c in choices)
        reasons = "; ".join(f"{p} {r}: {avoid[(p, r)]}" for p, r in places)
        raise PlanError(
            f"every feasible place is ruled out: {reasons}",
            hint="ask the cloud for quota, try later, or widen the search (another accelerator, "
            "provider: cheapest, or spot_fallback: true)",
        )
    first = choices.index(kept[0])  # every avoided place ranked before it (ties included)
    skipped = dict.fromkeys(
        (c.provider, c.region) for c in choices[:first] if (c.provider, c.region) in avoid
    )
    # one note per cloud and reason: a cloud ruled out whole (its caller's rights) is one line
    grouped: dict[tuple[str, str], list[str]] = {}
    for p, r in skipped:
        grouped.setdefault((p, avoid[(p, r)]), []).append(r)
    return kept, [f"skipped {p} {_regions(rs)}: {why}" for (p, why), rs in grouped.items()]


def _regions(regions: list[str], shown: int = 3) -> str:
    """`r1`, `r1, r2 and r3`, `r1, r2, r3 and 4 more regions`. Pure."""
    if len(regions) <= shown:
        return listed(regions, "and")
    return f"{', '.join(regions[:shown])} and {len(regions) - shown} more regions"


def alternatives(
    choices: list[Choice], max_hours: float, across_clouds: bool = False
) -> tuple[Alternative, ...]:
    """Up to MAX_ALTERNATIVES runner-ups after `choices[0]`, cheapest first. Pure.

    Each is the cheapest of a distinct (cloud, region, offer). With `across_clouds`, the cheapest
    choice of every other cloud is always among them, and each description names its cloud.
    """

    def key(c: Choice) -> tuple[object, ...]:
        o = c.offer
        return c.provider, c.region, o.instance_type, o.accelerator, o.accelerator_count

    seen = {key(choices[0])}
    distinct: list[Choice] = []
    for choice in choices[1:]:
        if key(choice) not in seen:
            seen.add(key(choice))
            distinct.append(choice)
    keep: set[int] = set()
    if across_clouds:
        first_of: dict[str, int] = {}
        for i, choice in enumerate(distinct):
            if choice.provider != choices[0].provider:
                first_of.setdefault(choice.provider, i)
        keep = set(list(first_of.values())[:MAX_ALTERNATIVES])
    for i in range(len(distinct)):
        if len(keep) >= MAX_ALTERNATIVES:
            break
        keep.add(i)
    result = []
    for i in sorted(keep):
        choice = distinct[i]
        cloud = f" on {choice.provider}" if across_clouds else ""
        description = f"{choice.offer.label()}{cloud} in {where(choice.region, choice.zone)}"
        hourly = round(choice.hourly, 6)
        result.append(Alternative(description, hourly, round(hourly * max_hours, 6)))
    return tuple(result)


def infeasible(
    catalog: Catalog,
    request: Request,
    provider: str | None,
    region: str | None,
    zone: str | None,
) -> PlanError:
    """A PlanError naming what was asked and up to 3 nearest feasible offers with their $/h. Pure.

    `provider` None means the clouds of CLOUDS together (`provider: cheapest`); the offers named
    then say their cloud.
    """
    spot = request.spot
    if provider is None:
        everywhere = [o for o in catalog.offers(spot=spot) if o.provider in CLOUDS]
        offered = {a for p in CLOUDS for a in catalog.accelerators(p)}
    else:
        everywhere = catalog.offers(provider, spot=spot)
        offered = set(catalog.accelerators(provider))
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
    clouds = provider or listed(CLOUDS)
    place = (
        where(region, zone) if region else f"any {provider} region" if provider else "any region"
    )
    if acc and acc not in offered:
        asked = f"{provider} offers no {acc} in the price catalog"
        if provider is None:
            asked = f"no cloud ({listed(CLOUDS)}) offers {acc} in the price catalog"
    else:
        asked = f"no {clouds}{spot_word} offer with {request.describe()} in {place}"
    nearest = ", ".join(
        f"{_label(o, provider is None)} in {where(o.region, o.zone)} at ${price(o, spot):.2f}/h"
        for o in picks
    )
    message = f"{asked}; nearest: {nearest}" if picks else f"{asked}; nothing close in the catalog"
    hint = "pick one of these, or change cluster accelerator, accelerator_count or region"
    if provider is None:
        hint = "pick one of these, or change cluster accelerator or accelerator_count"
    if spot:
        hint += "; spot: false also allows offers without a spot price"
    return PlanError(message, hint=hint)


def listed(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """`a, b or c` (or `a, b and c` with `last="and"`). Pure."""
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} {last} {names[-1]}"


def price(offer: Offer | None, spot: bool) -> float:
    """The offer's $/h on spot or on demand; 0.0 for no offer or no price. Pure."""
    value = offer.price(spot) if offer else None
    return float(value or 0.0)


def where(region: str, zone: str | None) -> str:
    """`region/zone`, or `region` when there is no zone. Pure."""
    return f"{region}/{zone}" if zone else region


def usd(amount: float) -> str:
    """`$9.25`, `$0.192`: two decimals, up to four when they matter. Pure."""
    whole, _, cents = f"{amount:.4f}".rstrip("0").partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def _choices_in(
    scope: list[Offer], request: Request, forced_zone: str | None, n_main: int, n_ps: int
) -> tuple[list[Choice], list[Offer]]:
    """(Feasible choices, offers matching the request) among `scope`, one provider's offers
    sorted cheapest first. A GPU offer without a CPU machine in its zone for ps is no choice."""
    spot = request.spot

    def location(offer: Offer) -> tuple[str, str | None]:
        return offer.region, forced_zone or offer.zone

    cpu_at: dict[tuple[str, str | None], Offer] = {}
    for offer in scope:  # cheapest first
        if offer.accelerator is None and runs_tensorflow(offer):
            cpu_at.setdefault(location(offer), offer)
    if not n_main:
        cpu = [Choice(None, ps, n_ps * price(ps, spot), *loc) for loc, ps in cpu_at.items()]
        return cpu, []
    candidates = [
        o for o in scope if request.matches(o) and (request.instance_type or runs_tensorflow(o))
    ]
    choices = []
    for offer in candidates:
        ps = cpu_at.get(location(offer)) if n_ps else None
        if n_ps and ps is None:
            continue
        hourly = n_main * price(offer, spot) + (n_ps * price(ps, spot) if ps else 0.0)
        choices.append(Choice(offer, ps, hourly, *location(offer)))
    return choices, candidates


def _sorted(choices: list[Choice]) -> list[Choice]:
    """Cheapest first; ties by cloud (CLOUDS order), region, zone and instance type."""

    def rank(provider: str) -> int:
        return CLOUDS.index(provider) if provider in CLOUDS else len(CLOUDS)

    return sorted(
        choices,
        key=lambda c: (
            round(c.hourly, 9),
            rank(c.provider),
            c.region,
            c.zone or "",
            c.offer.instance_type,
        ),
    )


def _cheapest_note(choices: list[Choice], clouds: list[str]) -> str:
    """Which cloud `provider: cheapest` chose, and the runner-up cloud with its $/h."""
    best: dict[str, float] = {}
    for choice in choices:  # cheapest first
        best.setdefault(choice.provider, choice.hourly)
    chosen, *others = best
    text = (
        f"provider cheapest: {chosen} chosen as the cheapest of the clouds "
        f"({', '.join(clouds)}) at {usd(best[chosen])}/h"
    )
    if others:
        text += f"; runner-up {others[0]} at {usd(best[others[0]])}/h"
    unfit = [cloud for cloud in clouds if cloud not in best]
    if unfit:
        text += f"; nothing fits on {' or '.join(unfit)}"
    return text


def _zone_scope(
    zone: str | None, provider: str, region: str | None, scope: list[Offer]
) -> tuple[str | None, str | None, list[str]]:
    """(zone to filter offers by, zone to force on every node, notes) for the spec's zone."""
    if not zone:
        return None, None, []
    if provider in CLOUDS and not info(provider).catalog_zones:
        return None, None, [f"zone {zone} ignored: the {info(provider).label} catalog has no zones"]
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


def _no_ps_machine(request: Request, candidates: list[Offer], provider: str | None) -> PlanError:
    """The error for GPU offers that fit but have no CPU-only machine beside them for ps."""
    places = sorted(
        {
            (f"{o.provider} " if provider is None else "") + where(o.region, o.zone)
            for o in candidates
        }
    )
    cloud = f"{provider} " if provider else ""
    return PlanError(
        f"no CPU-only {cloud}machine for the ps role where {request.describe()} is "
        f"offered ({', '.join(places)})",
        hint="add a CPU machine for that zone to the catalog, or drop the ps role",
    )


def _label(offer: Offer, with_cloud: bool) -> str:
    return f"{offer.label()} on {offer.provider}" if with_cloud else offer.label()


def _round_robin(groups: list[list[Offer]], limit: int) -> list[Offer]:
    """Take one offer from each group in turn until `limit` are picked.

    An offer whose cloud, machine, GPU and count were already picked (in another region) is
    skipped.
    """
    picks: list[Offer] = []
    seen: set[tuple[object, ...]] = set()
    queues = [list(group) for group in groups]
    while len(picks) < limit and any(queues):
        for queue in queues:
            while queue:
                offer = queue.pop(0)
                key = (
                    offer.provider,
                    offer.instance_type,
                    offer.accelerator,
                    offer.accelerator_count,
                )
                if key not in seen:
                    seen.add(key)
                    picks.append(offer)
                    break
            if len(picks) == limit:
                break
    return picks
