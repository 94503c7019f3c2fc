"""The controller node's machine: the cheapest on-demand CPU-only offer with >= 2 GB (issue 17).

`controller_offer(provider, region)` reads the same price catalog the planner prices nodes from
(`Catalog.bundled()`: the bundled CSVs, or `$CLOUDTRAIN_HOME/catalog/<provider>.csv`). The
controller runs only cloudtrain's watch loop (no TensorFlow), so it needs no accelerator and
little memory; 2 GB leaves room for Python, the cloud SDKs and the OS. It is never spot: a
preempted controller would lose nothing but time, but nothing would replace it until the lease
expires. Stdlib only (the catalog module), so planning stays fast: no cloud SDK, no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.catalog.offers import Catalog, Offer
from cloudtrain.core.errors import PlanError, UsageError
from cloudtrain.jobs.strategies import StrategyInfo
from cloudtrain.providers.registry import declared

MIN_MEMORY_GB = 2.0


@dataclass(frozen=True)
class ControllerOffer:
    """The controller node's machine type and its on-demand $/h."""

    instance_type: str
    hourly_usd: float
    memory_gb: float | None
    vcpus: float | None


def _fits(offer: Offer) -> bool:
    """CPU-only (no accelerator, not a GPU-priced row) with a known memory of >= 2 GB."""
    return (
        not offer.accelerator
        and offer.accelerator_count == 0
        and not offer.gpu_only
        and offer.memory_gib is not None
        and offer.memory_gib >= MIN_MEMORY_GB
    )


def controller_offer(
    provider_name: str, region: str | None, catalog: Catalog | None = None
) -> ControllerOffer:
    """The cheapest on-demand CPU-only offer of `provider_name` in `region` with at least 2 GB of
    memory (ties: the catalog's order). `local`: a fixed offer (this machine, $0/h). `region`
    None: any region of the provider. `catalog`: the planner's (default `Catalog.bundled()`,
    which reads the catalog files). Raises PlanError naming the provider and region when there
    is none. Pure but for that read; never imports a cloud SDK."""
    if declared(provider_name).on_this_machine:  # a process on this machine, named as local's
        return ControllerOffer(provider_name, hourly_usd=0.0, memory_gb=None, vcpus=None)
    catalog = catalog if catalog is not None else Catalog.bundled()
    # on-demand prices only (spot=False), CPU-only rows only: as the planner prices `ps`
    offers = [
        o
        for o in catalog.offers(provider_name, region=region, spot=False, cpu_only=True)
        if _fits(o)
    ]
    if not offers:
        where = f" in region {region}" if region else ""
        raise PlanError(
            f"no CPU-only {provider_name} machine with at least {MIN_MEMORY_GB:g} GB of memory"
            f"{where} in the price catalog, for the run's controller node",
            hint="pick another region, add such a machine to "
            f"$CLOUDTRAIN_HOME/catalog/{provider_name}.csv, or run with --detach --no-controller",
        )
    best = offers[0]  # catalog.offers sorts cheapest first
    return ControllerOffer(
        instance_type=best.instance_type,
        hourly_usd=best.price_hourly,
        memory_gb=best.memory_gib,
        vcpus=best.vcpus,
    )


def check_hand_off(strategy: StrategyInfo) -> None:
    """Raise UsageError when a run of `strategy` may not be handed to a controller node: a TPU
    run's, whose controller would need TPU rights over the whole project (Cloud TPU has no
    resource-level IAM to scope them to the run's TPU VMs, and the controller's identity may
    touch only its run: providers/gcp/controller_identity.py). Called before anything is
    created or a lease is taken. Pure."""
    if strategy.on_tpu:
        raise UsageError(
            f"a run of strategy {strategy.name!r} cannot be handed to a controller node: it "
            f"would need TPU rights over the whole project",
            hint="run it attached, or with --detach --no-controller (its nodes then stop "
            "themselves at the deadline)",
        )
