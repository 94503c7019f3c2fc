"""The building blocks of a command: the ledger, the providers (built from the typed provider
config of a spec or of a ledger record; their stores retry every call), and the run-id lookup.
Also where the API's warnings go (the `cloudtrain.api` logger, or a handler the CLI sets). Imports
no SDK at module level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

LOG = logging.getLogger("cloudtrain.api")  # the Python API's logger (cloudtrain/api/results.py)

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.jobspec.run_ids import RunRef
    from cloudtrain.plan.planner import Plan
    from cloudtrain.providers.base import Provider, ProviderConfig
    from cloudtrain.state.ledger import Ledger, RunRecord


def ledger() -> Ledger:
    """The ledger at $CLOUDTRAIN_HOME/ledger.db (created on first use)."""
    from cloudtrain.state.ledger import Ledger

    return Ledger()


def _log_warning(line: str) -> None:
    LOG.warning("%s", line)


_warn: Callable[[str], None] = _log_warning


def set_warning_handler(handler: Callable[[str], None] | None) -> None:
    """Where the API's warnings go (one line each, e.g. a deprecated CLOUDTRAIN_* variable in
    use): `handler`, or (None) the `cloudtrain.api` logger at WARNING, the default. The
    `cloudtrain` command sends them to stderr as `warning: ...`. Process-wide."""
    global _warn
    _warn = handler or _log_warning


def warn(line: str) -> None:
    """Say `line` through the warning handler in effect (`set_warning_handler`)."""
    _warn(line)


def warn_deprecated(spec: JobSpec, the_plan: Plan) -> None:
    """Warn (once per process, through the warning handler) about each deprecated CLOUDTRAIN_*
    variable the plan's options come from, or that was set to a value the option refuses.
    Creates nothing; reads config.yaml only outside a command's `provider_config.read_once`."""
    from cloudtrain.jobspec.provider_config import resolve, warn_once

    warn_once(resolve(spec, the_plan.provider), _warn)


def _built(config: ProviderConfig) -> Provider:
    """The provider `config` names, as the registry builds it: wrapped once by the test-only
    faults of $CLOUDTRAIN_FAULTS and the one retry layer (every compute and store call of it is
    retried; nothing here retries again)."""
    from cloudtrain.providers import get_provider

    return get_provider(config.name, config)


def provider(
    name: str, region: str | None = None, zone: str | None = None, account: str | None = None
) -> Provider:
    """The named provider with no job spec and no ledger record to take its options from
    (`down` of an unrecorded run, `gc`): config.yaml's and the deprecated variables' options,
    as for a run recorded before options were kept. `account`: the GCP project / Azure
    subscription (None: the options', else the SDK's default). Loads that provider's SDK;
    creates nothing. UsageError for an unknown provider, SpecError for a bad config.yaml."""
    from cloudtrain.providers import info
    from cloudtrain.state.ledger import RunRecord

    info(name)  # an unknown name is a UsageError before any options model is looked for
    unrecorded = RunRecord(
        run_id="",
        name="",
        provider=name,
        region=region,
        zone=zone,
        account=account,
        spec_path=None,
        store_uri=None,
        plan_json=None,
        status="",
        outcome=None,
        created_at=0.0,
        ended_at=None,
        detail=None,
    )
    return record_provider(unrecorded)


def run_provider(spec: JobSpec, the_plan: Plan) -> Provider:
    """The provider a run of `spec` uses: the plan's (with provider: cheapest, the cloud the
    plan chose), in the plan's region and zone, with the options the plan recorded
    (`configs.config_for`: config.yaml is not read again). Creates nothing."""
    from cloudtrain.run.configs import config_for

    return _built(config_for(spec, the_plan, warn=_warn))


def record_provider(rec: RunRecord) -> Provider:
    """The provider a ledger record's run was made with, with the options it recorded
    (`configs.config_for_record`): for status, logs, down, cost and resume."""
    from cloudtrain.run.configs import config_for_record

    return _built(config_for_record(rec, warn=_warn))


def find_run(ref: RunRef) -> RunRecord:
    """The ledger's run for a parsed run id or unique prefix of one (`run_ids.parse_run_ref`,
    at the edge). UsageError when it is unknown or ambiguous. Read-only."""
    return ledger().find_run(ref)
