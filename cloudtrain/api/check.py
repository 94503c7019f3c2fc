"""`cloudtrain check`: ask the caller's accounts, read-only, whether a run can launch, and where.

Without a job: each cloud's credentials, APIs and missing rights. With a job: also, for each of
its feasible regions in price order (`plan.placements`, at most MAX_REGIONS per cloud), the
quotas the plan's machines count against, and the verdict: the cheapest region where the caller
may run it and the quotas hold it. Zone capacity is not knowable before a create call on any of
the clouds (providers/account.py): the verdict says so, and a run fails over when it meets it.

Loads each asked cloud's SDK; creates nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import UsageError
from cloudtrain.plan.account_check import (
    Candidate,
    CloudCheck,
    candidates,
    check_cloud,
    rights_error,
)

if TYPE_CHECKING:
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import Plan

MAX_REGIONS = 12  # per cloud: the regions a check asks about, cheapest first
CAPACITY_NOTE = (
    "zone capacity is known only at the create call: a full zone or region is failed over"
)


@dataclass(frozen=True)
class CheckReport:
    """The answers of every cloud asked, and with a job the verdict."""

    clouds: tuple[CloudCheck, ...]
    job: str | None = None  # the job file checked, if any

    def launch_at(self) -> tuple[str, str, float] | None:
        """(cloud, region, $/h) of the cheapest region where the run can launch now, with a
        job; None when none can (or no job was given). Pure."""
        places = [
            (r.hourly_usd, cloud.provider, r.region)
            for cloud in self.clouds
            if (r := cloud.launch_region()) is not None
        ]
        if not places:
            return None
        hourly, cloud, region = min(places)
        return cloud, region, hourly

    @property
    def ok(self) -> bool:
        """With a job: it can launch somewhere. Without: every cloud asked is usable."""
        if self.job is not None:
            return self.launch_at() is not None
        return all(cloud.usable for cloud in self.clouds)

    def rights_lines(self) -> list[str]:
        """The line `run` would refuse with, per cloud whose caller lacks rights. Pure."""
        from cloudtrain.providers.registry import info

        return [
            str(rights_error(info(c.provider).label, c.missing)) for c in self.clouds if c.missing
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable. Pure."""
        at = self.launch_at()
        return {
            "job": self.job,
            "ok": self.ok,
            "launch": None
            if at is None
            else {"provider": at[0], "region": at[1], "hourly_usd": at[2]},
            "clouds": [c.to_dict() for c in self.clouds],
            "note": CAPACITY_NOTE if self.job is not None else "",
        }


def check(
    job: str | Path | None = None,
    *,
    provider: str | None = None,
    region: str | None = None,
) -> CheckReport:
    """Ask the accounts (see the module docstring). `provider` narrows (or, with a job,
    overrides) the clouds asked; without either, every cloud `provider: cheapest` searches is
    asked. Raises SpecError/PlanError for a bad job, UsageError for an unknown provider. Blocks
    on the clouds' APIs; creates nothing."""
    from cloudtrain import api
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.provider_config import read_once
    from cloudtrain.plan.planner import make_plan

    if job is None:
        clouds = [provider] if provider else _searched()
        for name in clouds:
            _info(name)  # an unknown name is its own UsageError, before config.yaml is read
        with read_once():  # each cloud's options from one read of config.yaml
            return CheckReport(tuple(_check_bare(name, region) for name in clouds))

    spec, layers = api._loaded(job, provider=provider, region=region)
    catalog = Catalog.bundled()
    with read_once(layers):  # one read of config.yaml for every place planned
        first = make_plan(spec, catalog)
        per_cloud = _candidates(spec, catalog)
        clouds = list(per_cloud) or [first.provider]
        results = [
            _check_job(spec, first, name, per_cloud.get(name, []), catalog) for name in clouds
        ]
    return CheckReport(tuple(results), job=str(job))


def _info(name: str) -> None:
    from cloudtrain.providers.registry import info

    info(name)


def _searched() -> list[str]:
    from cloudtrain.providers.registry import infos

    return [i.name for i in infos() if i.searched_by_cheapest]


def _candidates(spec: JobSpec, catalog: Catalog) -> dict[str, list[Candidate]]:
    """The spec's feasible regions per cloud, cheapest first, at most MAX_REGIONS each."""
    found: dict[str, list[Candidate]] = {}
    for cand in candidates(spec, catalog, MAX_REGIONS):
        found.setdefault(cand.provider, []).append(cand)
    return found


def _check_bare(name: str, region: str | None) -> CloudCheck:
    from cloudtrain.providers.registry import info
    from cloudtrain.run.build import provider

    info(name)  # an unknown name is a UsageError of its own
    try:
        built = provider(name, region=region)
    except UsageError as exc:  # its SDK is not installed
        return CloudCheck(name, None, error=str(exc))
    return _ask(name, built.account_probe(), (), None)


def _check_job(
    spec: JobSpec, first: Plan, name: str, candidates: Sequence[Candidate], catalog: Catalog
) -> CloudCheck:
    from cloudtrain.plan.planner import options_of
    from cloudtrain.run.build import run_provider

    placed = dataclasses.replace(
        first,
        provider=name,
        region=candidates[0].region if candidates else first.region,
        provider_options=options_of(spec, name),
    )
    try:
        built = run_provider(spec, placed)
    except UsageError as exc:
        return CloudCheck(name, None, error=str(exc))
    probe = built.account_probe(tpu=spec.cluster.strategy_info.on_tpu)
    return _ask(name, probe, candidates, catalog)


def _ask(
    name: str, probe: Any, candidates: Sequence[Candidate], catalog: Catalog | None
) -> CloudCheck:
    if probe is None:
        return CloudCheck(name, None, error=f"{name} has no account to ask")
    if catalog is None:
        from cloudtrain.catalog.offers import Catalog

        catalog = Catalog.from_rows([])
    return check_cloud(name, probe, candidates, catalog)
