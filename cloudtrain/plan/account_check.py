"""What the caller's account allows, asked read-only before anything exists (issue 30).

`check_cloud` asks one cloud's `AccountProbe` (providers/account.py) its credentials, APIs,
missing rights and, for each candidate region of a plan in price order, the quotas the plan's
machines count against. `cloudtrain check` shows the result; `run` refuses a caller whose rights
are missing with `rights_error`'s message (the same line `check` prints), and the account-aware
plan (`cloudtrain/plan/account_plan.py`) skips the regions whose quota cannot hold the plan.

A question the cloud refuses (a caller who may not read quotas, an API switched off) is said,
not raised: `check` goes on with the next question. Nothing here creates anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import CloudtrainError, RightsMissing

if TYPE_CHECKING:
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import NodePlan
    from cloudtrain.providers.account import (
        AccountProbe,
        ApiState,
        CredentialSource,
        QuotaLine,
        QuotaNeed,
    )

MAX_RIGHTS_SHOWN = 12  # a line names at most this many missing rights, then a count


@dataclass(frozen=True)
class Candidate:
    """A region a plan could run in: its cloud, region, the cluster's $/h there and its nodes."""

    provider: str
    region: str
    hourly_usd: float
    nodes: tuple[NodePlan, ...]


@dataclass(frozen=True)
class RegionCheck:
    """The quotas of one candidate region, or why they could not be read (`error`)."""

    provider: str
    region: str
    hourly_usd: float
    lines: tuple[QuotaLine, ...]
    error: str = ""

    @property
    def fits(self) -> bool:
        """Whether every quota the plan counts against holds it (False when unread)."""
        return not self.error and all(line.fits for line in self.lines)

    def reason(self) -> str:
        """Why the plan cannot launch here, in one line ("" when it fits). Pure."""
        if self.error:
            return f"quotas not read: {self.error}"
        for line in self.lines:
            if not line.fits:
                return quota_words(line)
        return ""


@dataclass(frozen=True)
class CloudCheck:
    """One cloud's answers: the credentials (or why none), the APIs, the missing rights, and
    the candidate regions' quotas in price order."""

    provider: str
    credentials: CredentialSource | None
    error: str = ""  # no credentials, or the SDK missing: nothing else was asked
    apis: tuple[ApiState, ...] = ()
    missing: tuple[str, ...] = ()
    rights_error: str = ""  # the rights question itself was refused
    regions: tuple[RegionCheck, ...] = ()

    @property
    def usable(self) -> bool:
        """Credentials found, every API answering, no right missing."""
        return (
            not self.error
            and all(api.ok for api in self.apis)
            and not self.missing
            and not self.rights_error
        )

    def launch_region(self) -> RegionCheck | None:
        """The cheapest candidate region whose quotas hold the plan, when the cloud is usable."""
        if not self.usable:
            return None
        return next((r for r in self.regions if r.fits), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable. Pure."""
        regions = [
            {**asdict(r), "lines": [_line(x) for x in r.lines], "fits": r.fits}
            | {"reason": r.reason()}
            for r in self.regions
        ]
        return {
            "provider": self.provider,
            "credentials": asdict(self.credentials) if self.credentials else None,
            "error": self.error,
            "apis": [asdict(a) for a in self.apis],
            "missing_rights": list(self.missing),
            "rights_error": self.rights_error,
            "regions": regions,
            "usable": self.usable,
        }


def _line(line: QuotaLine) -> dict[str, Any]:
    return {**asdict(line), "free": line.free, "fits": line.fits}


def quota_words(line: QuotaLine) -> str:
    """`quota NVIDIA_T4_GPUS in us-central1: limit 0, in use 0, needs 2 GPU`. Pure."""
    return (
        f"quota {line.quota} in {line.region}: limit {_num(line.limit)}, in use "
        f"{_num(line.usage)}, needs {_num(line.need)} {line.unit}"
    )


def _num(value: float) -> str:
    return f"{value:g}"


def rights_error(label: str, missing: Sequence[str]) -> RightsMissing:
    """The error `run` refuses with, and the line `check` prints, for a caller missing rights:
    it names every right (up to MAX_RIGHTS_SHOWN, then a count). Pure."""
    shown = list(missing[:MAX_RIGHTS_SHOWN])
    more = len(missing) - len(shown)
    names = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    return RightsMissing(
        f"the {label} credentials lack {len(missing)} right(s) a run needs: {names}",
        hint="grant them to the caller (docs/getting-gpus.md), or use credentials that have them",
        missing=tuple(missing),
    )


def candidates(spec: JobSpec, catalog: Catalog, per_cloud: int) -> Iterator[Candidate]:
    """The spec's feasible, affordable places (`plan.placements`), cheapest first, at most
    `per_cloud` of each cloud, each with the nodes its plan would have there. Pure and lazy:
    each place's plan is made only when the caller asks for it (the account-aware plan stops at
    the first region whose quota holds)."""
    from cloudtrain.core.errors import PlanError
    from cloudtrain.plan.planner import make_plan, placements

    every = placements(spec, catalog)
    taken: dict[str, int] = {}
    for place in every:
        if taken.get(place.provider, 0) >= per_cloud:
            continue
        others = {p.place: "elsewhere" for p in every if p.place != place.place}
        try:
            placed = make_plan(spec, catalog, avoid=others)
        except PlanError:  # over the budget there
            continue
        taken[place.provider] = taken.get(place.provider, 0) + 1
        yield Candidate(place.provider, place.region, placed.hourly_usd, placed.nodes)


def needs_of(provider: str, nodes: Sequence[NodePlan], catalog: Catalog) -> list[QuotaNeed]:
    """What `nodes` (of `provider`) ask of their region's quotas: one QuotaNeed per (machine,
    spot), with the node count and the machine's vCPUs from the catalog (0 when the catalog
    does not say). Pure."""
    from cloudtrain.providers.account import QuotaNeed

    counts: dict[tuple[str, str | None, int, bool], list[NodePlan]] = {}
    for node in nodes:
        key = (node.instance_type, node.accelerator, node.accelerator_count, node.spot)
        counts.setdefault(key, []).append(node)
    needs = []
    for (itype, acc, acc_count, spot), same in counts.items():
        vcpus = _vcpus(catalog, provider, same[0])
        needs.append(QuotaNeed(itype, acc, acc_count, vcpus, nodes=len(same), spot=spot))
    return needs


def _vcpus(catalog: Catalog, provider: str, node: NodePlan) -> int:
    for offer in catalog.offers(provider, region=node.region, instance_type=node.instance_type):
        if offer.vcpus:
            return int(offer.vcpus)
    return 0


def check_cloud(
    provider: str, probe: AccountProbe, candidates: Sequence[Candidate], catalog: Catalog
) -> CloudCheck:
    """Ask `probe` everything, in order: credentials (none: stop there), APIs, missing rights,
    then the quotas of each candidate region (price order). Blocks on the cloud's APIs; a
    question it refuses is recorded, not raised. Creates nothing."""
    try:
        credentials = probe.credentials()
    except CloudtrainError as exc:
        return CloudCheck(provider, None, error=str(exc))
    try:
        apis = tuple(probe.apis())
    except CloudtrainError as exc:
        return CloudCheck(provider, credentials, error=f"the APIs could not be asked: {exc}")
    missing: tuple[str, ...] = ()
    refused = ""
    try:
        missing = tuple(sorted(probe.missing_rights()))
    except CloudtrainError as exc:
        refused = str(exc)
    regions = []
    for cand in candidates:
        try:
            lines = tuple(probe.quotas(cand.region, needs_of(provider, cand.nodes, catalog)))
            regions.append(RegionCheck(provider, cand.region, cand.hourly_usd, lines))
        except CloudtrainError as exc:
            regions.append(RegionCheck(provider, cand.region, cand.hourly_usd, (), str(exc)))
    return CloudCheck(provider, credentials, "", apis, missing, refused, tuple(regions))
