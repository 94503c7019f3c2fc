"""Offers a provider reads live when a plan is made for it (INFO.live_offers: a Slurm cluster's
partitions, free GPUs and start estimate), added to the bundled catalog, with the notes it
gives the plan. A provider without live offers costs nothing here: no import, no network.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from cloudtrain.catalog.offers import Catalog, Offer
from cloudtrain.jobspec.provider_config import make_config, resolve
from cloudtrain.plan.planner import request_of
from cloudtrain.providers.registry import declared, load

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec

_FIELDS = frozenset(f.name for f in fields(Offer))


def with_live_offers(spec: JobSpec, catalog: Catalog) -> tuple[Catalog, tuple[str, ...]]:
    """`catalog` plus the live offers of the spec's provider, and its notes for the plan; the
    catalog unchanged and no notes when the provider declares none. Blocks on the provider
    (its login host) when it does; raises what it raises (PlanError: Slurm refuses the job;
    CredentialsError/ProviderError: the login host)."""
    ref = declared(spec.provider).live_offers
    if not ref:
        return catalog, ()
    request = request_of(spec)
    accelerator, gpus = request.accelerator, request.count or 0
    nodes = sum(spec.cluster.roles().values())
    options = resolve(spec, spec.provider).options
    config = make_config(spec.provider, spec.region, spec.zone, options)
    rows, notes = load(ref)(config, accelerator, nodes, gpus, float(spec.max_hours))
    offers = [Offer(**{k: v for k, v in row.items() if k in _FIELDS}) for row in rows]
    mine = [o for o in catalog.offers() if o.provider != spec.provider]
    return Catalog.from_rows([*mine, *offers]), tuple(notes)


def add_notes(plan: Any, notes: tuple[str, ...]) -> Any:
    """`plan` with `notes` after its own. Pure."""
    from dataclasses import replace

    return replace(plan, notes=(*plan.notes, *notes)) if notes else plan
