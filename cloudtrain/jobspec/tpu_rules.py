"""The spec's TPU rules: a job whose strategy runs on a Cloud TPU VM names a single-host TPU type
its provider sells (`cluster.accelerator: v5litepod-8`) and, optionally, a runtime version of
that type's generation (the provider's option its TPU module names, e.g.
`providers.gcp.tpu_runtime`); a TPU type under any other strategy is refused.

What a provider sells comes from its INFO (`ProviderInfo.tpu_types`, a stdlib module such as
providers/gcp/tpu_types.py); which strategy runs on a TPU from the strategy registry
(jobs/strategies.py). Nothing here names a provider or compares a strategy's name. Each
refusal is one `FILE:LINE: FIELD: problem` SpecError, raised before anything is created.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from cloudtrain import providers as registry
from cloudtrain.core.errors import SpecError
from cloudtrain.jobs.strategies import TPU, StrategyInfo
from cloudtrain.jobspec.yaml_source import show
from cloudtrain.providers.registry import declared

# a cloudtrain.jobspec.job.JobSpec (job.py imports this module: no import back)
JobSpec = Any


@functools.cache
def tpu_module(provider: str) -> ModuleType | None:
    """The TPU types module provider `provider` declares (`ProviderInfo.tpu_types`), or None
    when it sells no TPUs (also for `cheapest` and an unknown name). Imports that module only
    (standard library, no SDK)."""
    ref = declared(provider).tpu_types
    return registry.load(ref) if ref else None


def sellers() -> list[str]:
    """The providers that sell TPUs, in registry order. Pure apart from reading INFO."""
    return [i.name for i in registry.infos() if i.tpu_types]


def tpu_of(spec: JobSpec) -> Any:
    """The TPU type a valid TPU job asks for (its provider's `TpuType`), or None for a job
    whose strategy is not the TPU one. Pure."""
    module = tpu_module(spec.provider)
    info = getattr(spec.cluster, "strategy_info", None)  # a stand-in spec (tests) may lack it
    if module is None or info is None or not info.on_tpu:
        return None
    return module.tpu_type(spec.cluster.accelerator_name or "")


def given_runtime(spec: JobSpec, provider: str) -> str | None:
    """The runtime version job.yaml gives in `provider`'s section, or None. Pure."""
    module = tpu_module(provider)
    section = spec.provider_section(provider)
    if module is None or section is None:
        return None
    return getattr(section, module.RUNTIME_OPTION, None)


def check_tpu(spec: JobSpec, filename: str) -> None:
    """Raise SpecError (`FILE:LINE: FIELD: problem`) when the spec breaks a TPU rule:
    the TPU strategy on a provider that sells no TPUs, without a TPU type, with a type its
    provider does not sell, a multi-host slice, a count, an instance type or image, or a
    runtime version not of the type's generation; or a TPU type under another strategy.
    Pure apart from importing the providers' TPU modules."""
    problem = _problem(spec)
    if problem is None:
        return
    loc, text = problem
    where = spec.where(*loc) or spec.where("cluster", "strategy") or spec.where("cluster")
    raise SpecError(f"{where or filename}: {'.'.join(loc)}: {text}")


def _problem(spec: JobSpec) -> tuple[tuple[str, ...], str] | None:
    cluster = spec.cluster
    info = cluster.strategy_info
    if not info.on_tpu:
        return _tpu_elsewhere(spec, info)
    module = tpu_module(spec.provider)
    if module is None:
        return ("cluster", "strategy"), (
            f"strategy {info.name!r} runs on Cloud TPU VMs, which provider {spec.provider} does"
            f" not sell; use provider: {' or '.join(sellers())}"
        )
    offered = ", ".join(module.single_host_types())
    accelerator = ("cluster", "accelerator")
    if not cluster.accelerator:
        return accelerator, f"strategy {info.name!r} needs a TPU type, one of: {offered}"
    name, _, count = cluster.accelerator.partition(":")
    tpu = module.tpu_type(name)
    if tpu is None:
        return accelerator, (
            f"{show(name)} is not a TPU type provider {spec.provider} sells; strategy"
            f" {info.name!r} takes one of: {offered}"
        )
    if count:
        return accelerator, (
            f"a TPU type takes no count ({tpu.name} is {tpu.chips} chips); write"
            f" accelerator: {tpu.name}"
        )
    multi_host = module.multi_host_problem(tpu)
    if multi_host:
        return accelerator, multi_host
    if cluster.instance_type:
        return ("cluster", "instance_type"), (
            f"a TPU VM's machine is its TPU type ({tpu.name}); remove instance_type"
        )
    option = f"providers.{spec.provider}.{module.RUNTIME_OPTION}"
    if cluster.image:
        return ("cluster", "image"), (
            f"a TPU VM boots its runtime version, not an image; set {option} instead"
        )
    runtime = given_runtime(spec, spec.provider)
    if runtime is not None:
        why = module.runtime_problem(tpu, runtime)
        if why:
            return ("providers", spec.provider, module.RUNTIME_OPTION), why
    return None


def _tpu_elsewhere(spec: JobSpec, info: StrategyInfo) -> tuple[tuple[str, ...], str] | None:
    """The refusal of a TPU type named under a strategy that does not run on TPUs."""
    cluster = spec.cluster
    for field, value in (
        ("accelerator", cluster.accelerator_name),
        ("instance_type", cluster.instance_type),
    ):
        for seller in sellers() if value else ():
            module = tpu_module(seller)
            if module is not None and module.tpu_type(value) is not None:
                tpu_strategy = TPU.name
                return ("cluster", field), (
                    f"{value} is a TPU type: it runs only under strategy {tpu_strategy!r}"
                    f" (got {info.name!r})"
                )
    return None
