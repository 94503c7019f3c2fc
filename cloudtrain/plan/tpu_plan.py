"""The planner's TPU part: what a TPU job asks of the catalog, where its TPU type is sold, and
the plan's line on the TPU and its runtime version.

A TPU job (its strategy runs on a TPU VM; the spec's rules, cloudtrain/jobspec/tpu_rules.py,
made sure it names a single-host type its provider sells) asks for the catalog offer whose
instance type is the TPU type (`v5litepod-8`). Pure: reads the spec, the Catalog passed in, the
provider's TPU module (standard library, no SDK) and the provider options as the command read
them (`provider_config.resolve`, config.yaml included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cloudtrain.catalog.offers import Catalog
from cloudtrain.core.errors import PlanError
from cloudtrain.jobspec.tpu_rules import given_runtime, tpu_module, tpu_of
from cloudtrain.plan.search import Request, listed

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec


def tpu_request(spec: JobSpec) -> Request | None:
    """The request of a TPU job: the offer of its TPU type (spot as the spec says), or None for
    any other job. Pure."""
    tpu = tpu_of(spec)
    if tpu is None:
        return None
    return Request(None, None, tpu.name, bool(spec.cluster.spot))


def check_place(spec: JobSpec, catalog: Catalog) -> None:
    """Raise PlanError when a TPU job's region (or zone) does not sell its TPU type (on spot
    when it asks for spot), naming the regions (or the region's zones) that do. Nothing for
    any other job, or one without a region. Pure."""
    tpu = tpu_of(spec)
    if tpu is None or not (spec.region or spec.zone):
        return
    spot = bool(spec.cluster.spot)
    sold = catalog.offers(spec.provider, instance_type=tpu.name, spot=spot)
    kind = " on spot" if spot else ""
    if not sold:
        raise PlanError(
            f"the {spec.provider} price catalog has no{kind} {tpu.name} offer",
            hint="spot: false" if spot else "add its rows to the catalog, or pick another type",
        )
    regions = sorted({o.region for o in sold})
    if spec.region and spec.region not in regions:
        raise PlanError(
            f"TPU {tpu.name} is not sold{kind} in {spec.region}; regions that sell it:"
            f" {listed(regions, 'and')}",
            hint="set region to one of them, or remove region to take the cheapest",
        )
    zones = sorted({o.zone for o in sold if o.zone and o.region == (spec.region or o.region)})
    if spec.zone and spec.zone not in zones:
        raise PlanError(
            f"TPU {tpu.name} is not sold{kind} in zone {spec.zone}; zones that sell it:"
            f" {listed(zones, 'and')}",
            hint="set zone to one of them, or remove zone",
        )


def tpu_notes(spec: JobSpec, provider: str) -> list[str]:
    """The plan's line on a TPU job: its type, chips, generation and host, and the runtime
    version it boots with the TensorFlow that runtime ships (the default when the options name
    none). Empty for any other job. Pure given the command's options read; PlanError for a
    runtime (from config.yaml: job.yaml's was checked with the spec) the type cannot run."""
    tpu = tpu_of(spec)
    module = tpu_module(provider)
    if tpu is None or module is None:
        return []
    given = _runtime_option(spec, provider, module)
    try:
        runtime = module.resolved_runtime(tpu, given)
    except ValueError as exc:
        raise PlanError(
            f"{provider}.{module.RUNTIME_OPTION}: {exc}",
            hint=f"fix {module.RUNTIME_OPTION} in config.yaml, or remove it for the default",
        ) from None
    default = " (the default of its generation)" if given is None else ""
    return [
        f"TPU {tpu.name}: {tpu.chips} chips of TPU {tpu.generation} on one host; runtime"
        f" {runtime}{default} ships TensorFlow {module.runtime_tensorflow(runtime)}, which the"
        " node runs"
    ]


def _runtime_option(spec: JobSpec, provider: str, module: Any) -> str | None:
    """The runtime the options name: job.yaml's, else config.yaml's (the command's read)."""
    given = given_runtime(spec, provider)
    if given is not None:
        return given
    from cloudtrain.jobspec.provider_config import resolve

    return getattr(resolve(spec, provider).options, module.RUNTIME_OPTION, None)
