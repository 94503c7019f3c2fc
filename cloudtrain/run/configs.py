"""The ProviderConfig a run's provider is built with: from its spec and plan (`config_for`), or
from its ledger record (`config_for_record`), the options resolved as
`cloudtrain/jobspec/provider_config.py` says. Controller side only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from cloudtrain.jobspec.provider_config import (
    Warn,
    config_for_provider,
    make_config,
    options_of_plan,
    resolve,
    warn_once,
    warn_stderr,
)
from cloudtrain.jobspec.provider_sections import options_model

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import Plan
    from cloudtrain.providers.base import ProviderConfig
    from cloudtrain.state.ledger import RunRecord


def config_for(
    spec: JobSpec, plan: Plan | None = None, *, warn: Warn | None = warn_stderr
) -> ProviderConfig:
    """The ProviderConfig of the run of `spec`: the provider, region and zone of `plan` (the
    plan decides them with `provider: cheapest`; None: the spec's), the account and the typed
    options in effect: those the plan recorded (`Plan.provider_options`, resolved once when it
    was made), else `resolve` (what the command's `read_once` holds, else a read now). Each
    deprecated variable used is warned about once per process through `warn` (None: silent;
    the Python API passes its own)."""
    name = plan.provider if plan is not None else spec.provider
    region = plan.region if plan is not None else spec.region
    zone = plan.zone if plan is not None else spec.zone
    planned = options_of_plan(name, plan.provider_options) if plan is not None else None
    resolved = planned if planned is not None else resolve(spec, name)
    warn_once(resolved, warn)
    return make_config(name, region, zone, resolved.options)


def config_for_record(record: RunRecord, *, warn: Warn | None = warn_stderr) -> ProviderConfig:
    """The ProviderConfig a recorded run was made with, for `down`, `status`, `logs` and `resume`:
    the run's provider, region, zone and account, and the options its plan JSON recorded
    (`provider_options`), so teardown reaches the same resource group or network. A run recorded
    before options were kept gets today's config.yaml and deprecated variables instead. Reads
    config.yaml only for such an old run."""
    name, region, zone, account = record.provider, record.region, record.zone, record.account
    plan = record.plan if record.plan_json else None
    shown = plan.get("provider_options") if isinstance(plan, dict) else None
    if not isinstance(shown, list):  # recorded before options were kept
        return config_for_provider(name, region, zone, account, warn=warn)
    model = options_model(name)
    values = {o["name"]: o["value"] for o in shown if o.get("name") in model.model_fields}
    config = make_config(name, region, zone, model.model_validate(values))
    # the account the run was made in (the provider's own answer) wins over any option
    return replace(config, account=account) if account else config
