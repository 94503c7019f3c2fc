"""`cloudtrain check [JOB]`: what the caller's accounts allow, asked read-only (api_check.py).

Prints, per cloud, where the credentials came from, the APIs, the rights a run needs that the
caller lacks and, with a job, each feasible region's quotas in price order, then the verdict.
Exit 0 when the job can launch (without a job: every cloud asked is usable), 1 otherwise.
Typer only at import; the SDKs load when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cloudtrain.cli import common

if TYPE_CHECKING:
    from cloudtrain.api.check import CheckReport
    from cloudtrain.plan.account_check import CloudCheck, RegionCheck

JobArg = Annotated[
    Path | None,
    typer.Argument(help="A job spec: can it launch now, and where.", show_default=False),
]
ProviderOpt = Annotated[
    str | None,
    typer.Option("--provider", "-p", help="Ask this cloud only (with a job: overrides the spec)."),
]
RegionOpt = Annotated[str | None, typer.Option("--region", help="Region (overrides the spec).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def register(app: typer.Typer) -> None:
    """Add `check` to the `cloudtrain` app."""
    app.command()(check)


def check(
    job: JobArg = None,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask your cloud accounts, read-only, before anything exists: credentials, APIs, the
    rights a run needs, and with JOB the GPU quotas of each region in price order: can it
    launch now, and where. Creates nothing."""
    from cloudtrain.api.check import check as ask

    report = ask(job, provider=provider, region=region)
    if as_json:
        common.emit_json(report.to_dict())
    else:
        console = common.console()
        for line in report_lines(report):
            console.print(line, markup=False)
    raise typer.Exit(0 if report.ok else 1)


def report_lines(report: CheckReport) -> list[str]:
    """The report as plain lines (no markup; the clouds' texts as they came). Pure."""
    from cloudtrain.api.check import CAPACITY_NOTE

    lines: list[str] = []
    for cloud in report.clouds:
        lines += _cloud_lines(cloud)
    lines += report.rights_lines()
    if report.job is None:
        lines.append("ready" if report.ok else "not ready: see above")
        return lines
    at = report.launch_at()
    if at is None:
        lines.append(f"{report.job}: cannot launch now: no region where the rights and quotas hold")
    else:
        cloud, region, hourly = at
        lines.append(f"{report.job}: can launch now in {cloud} {region} at ${hourly:.2f}/h")
    lines.append(f"note: {CAPACITY_NOTE}")
    return lines


def _cloud_lines(cloud: CloudCheck) -> list[str]:
    name = cloud.provider
    if cloud.credentials is None:
        return [f"{name}: {cloud.error}"]
    cred = cloud.credentials
    who = ", ".join(x for x in (cred.principal, cred.account and f"account {cred.account}") if x)
    lines = [f"{name}: credentials from {cred.source}" + (f" ({who})" if who else "")]
    if cloud.error:
        return [*lines, f"{name}: {cloud.error}"]
    off = [a for a in cloud.apis if not a.ok]
    if cloud.apis:
        on = len(cloud.apis) - len(off)
        lines.append(f"{name}: APIs: {on} of {len(cloud.apis)} answer")
    lines += [f"{name}: API {a.name} does not answer: {a.detail}" for a in off]
    if cloud.rights_error:
        lines.append(f"{name}: rights not asked: {cloud.rights_error}")
    elif not cloud.missing:
        lines.append(f"{name}: rights: the caller has every right a run needs")
    lines += [_region_line(name, r) for r in cloud.regions]
    return lines


def _region_line(name: str, region: RegionCheck) -> str:
    head = f"{name} {region.region} (${region.hourly_usd:.2f}/h)"
    if region.fits:
        held = "; ".join(f"{x.quota} {x.need:g} of {x.free:g} free" for x in region.lines)
        return f"{head}: quotas hold the plan" + (f" ({held})" if held else "")
    return f"{head}: cannot launch: {region.reason()}"
