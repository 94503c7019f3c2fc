"""The plan that knows the account: skip the regions whose quota cannot hold it (issue 30).

`plan_for_account` walks the spec's feasible places in price order (`plan.placements`) and asks
each cloud's AccountProbe the quotas of each region until one holds the plan; the regions that
cannot are handed to `make_plan(avoid=...)`, which chooses the cheapest of the rest and says in
one note each why a cheaper region was skipped. A cloud whose credentials are not visible here
(providers/credential_hints.py) is not asked, and the plan says so: offline, `plan` is what it
always was, with no SDK loaded.

Blocks on the clouds' quota APIs; creates nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.core.errors import CloudtrainError
from cloudtrain.plan.account_check import candidates, needs_of, quota_words, rights_error
from cloudtrain.plan.planner import CHEAPEST

if TYPE_CHECKING:
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import Plan
    from cloudtrain.providers.account import AccountProbe

# (provider name, a plan placed on it) -> its probe, or None where the account cannot be asked
ProbeOf = Callable[[str, "Plan"], "AccountProbe | None"]
MAX_REGIONS_ASKED = 12  # per cloud: a plan asks at most this many regions' quotas


def not_looked_note(provider: str) -> str:
    """The note of a plan that did not ask `provider`'s account. Pure."""
    return (
        f"{provider}: no credentials found in the environment or files; quotas not checked "
        f"(cloudtrain check asks the account)"
    )


def plan_for_account(spec: JobSpec, catalog: Catalog, probe_of: ProbeOf) -> Plan:
    """The cheapest plan of `spec` whose region's quotas hold it, as far as the clouds that can
    be asked say. Raises PlanError as `make_plan` does, and when no region's quota holds the
    plan (the reasons named). Blocks on the quota APIs; creates nothing."""
    from cloudtrain.plan.planner import make_plan, options_of
    from cloudtrain.providers.registry import info

    first = make_plan(spec, catalog)
    avoid: dict[tuple[str, str], str] = {}
    notes: list[str] = []
    probes: dict[str, AccountProbe | None] = {}

    def probe_for(cloud: str) -> AccountProbe | None:
        if cloud not in probes:
            placed = dataclasses.replace(
                first, provider=cloud, provider_options=options_of(spec, cloud)
            )
            probes[cloud] = probe_of(cloud, placed)
            has_account = info(cloud).credential_env or info(cloud).credential_files
            if probes[cloud] is None and has_account:
                notes.append(not_looked_note(cloud))
        return probes[cloud]

    if spec.provider == CHEAPEST:  # a cloud whose caller lacks rights is no place to go
        avoid.update(_clouds_without_rights(spec, catalog, probe_for))
    for place in candidates(spec, catalog, MAX_REGIONS_ASKED):
        cloud = place.provider
        if (cloud, place.region) in avoid:
            continue
        probe = probe_for(cloud)
        if probe is None:
            break  # the cheapest place left cannot be asked: the plan takes it as it is
        try:
            lines = probe.quotas(place.region, needs_of(cloud, place.nodes, catalog))
        except CloudtrainError as exc:
            notes.append(f"{cloud} {place.region}: quotas not read ({exc.message})")
            break
        short = next((line for line in lines if not line.fits), None)
        if short is None:
            break
        avoid[(cloud, place.region)] = quota_words(short)
    chosen = make_plan(spec, catalog, avoid=avoid) if avoid else first
    return dataclasses.replace(chosen, notes=(*chosen.notes, *notes))


def _clouds_without_rights(
    spec: JobSpec, catalog: Catalog, probe_for: Callable[[str], AccountProbe | None]
) -> dict[tuple[str, str], str]:
    """Every place of each cloud (of `provider: cheapest`) whose caller lacks a right a run
    needs, with the line `check` prints; a cloud not asked, or refusing the question, is kept
    (its create calls will say). Blocks on each asked cloud's rights API."""
    from cloudtrain.plan.planner import placements
    from cloudtrain.providers.registry import info

    every = placements(spec, catalog)
    ruled: dict[tuple[str, str], str] = {}
    for cloud in dict.fromkeys(p.provider for p in every):
        probe = probe_for(cloud)
        if probe is None:
            continue
        try:
            missing = probe.missing_rights()
        except CloudtrainError:
            continue
        if missing:
            why = rights_error(info(cloud).label, sorted(missing)).message
            ruled.update({p.place: why for p in every if p.provider == cloud})
    return ruled
