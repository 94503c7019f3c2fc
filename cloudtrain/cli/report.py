"""The `cloudtrain report` command: one run's self-contained HTML page of plots
(cloudtrain/insight/report_data.py reads the run, cloudtrain/insight/report_html.py draws it).
Works during a run
and after it, for any provider; a run this ledger does not know is found as `status` finds it
(--provider/--region/--project: its journal in the provider's bucket). Imports typer only at
start-up; matplotlib (the `report` extra) when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cloudtrain.cli import common
from cloudtrain.cli.runs import ProjectOpt, ProviderOpt, RegionOpt, RunArg

HtmlOpt = Annotated[
    Path | None,
    typer.Option(
        "--html",
        help="Where to write the page (default: ./<run id>-report.html).",
        dir_okay=False,
    ),
]


def register(app: typer.Typer) -> None:
    """Add the command to `app`. Imports nothing heavy."""
    app.command()(report)


def report(
    run_id: RunArg,
    html: HtmlOpt = None,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    project: ProjectOpt = None,
) -> None:
    """Write one run's report: an HTML page with its loss and metrics per epoch, examples/s and
    GPU use per node, the timeline of its phases and its cost over time.

    The page is one file with inline SVG plots and no JavaScript. Reads the ledger and the
    run's bucket, live or ended; with no record of RUN in the ledger, --provider says where its
    journal is."""
    from cloudtrain.insight.report_html import require_matplotlib

    require_matplotlib()  # before any bucket is read: the missing extra is the first thing said
    from cloudtrain import api
    from cloudtrain.insight.report_data import collect
    from cloudtrain.insight.report_html import write
    from cloudtrain.run.journal_sync import sync_run

    ref = common.run_ref(run_id)  # the edge: parsed once
    rec = sync_run(ref, provider=provider, region=region, account=project, warn=common.warn)
    # the default name is the ledger's id: one this machine made, or the parsed id whose
    # journal was imported under it (a journal's entries never name their run's id)
    name = rec.run_id
    store = api.record_provider(rec).store(rec.store_uri) if rec.store_uri else None
    data = collect(api.ledger(), rec, store)
    out = html if html is not None else Path(f"{name}-report.html")
    if not out.parent.is_dir():
        from cloudtrain.core.errors import UsageError

        raise UsageError(f"--html {str(out)[:80]!r}: no folder {str(out.parent)[:80]!r}")
    write(data, out)
    if data.store_error:
        common.warn(f"the run's bucket could not be read: {data.store_error}")
    common.console().print(f"wrote {out}", markup=False)
