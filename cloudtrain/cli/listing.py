"""`cloudtrain ls`: the newest runs, each brought up to date with its journal first, within
one deadline (`cloudtrain.api.listing`), as a table whose run ids are always whole, or as
JSON."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cloudtrain.cli import common

UNBOUNDED = 100_000  # columns a pipe is measured with: a table's natural width is less
OTHER_COLUMNS = ("provider", "status", "outcome", "started", "live", "cost")

if TYPE_CHECKING:
    from rich.table import Table

    from cloudtrain.api.results import RunListing


def show(limit: int, as_json: bool) -> None:
    """Print the newest `limit` runs. First reads the journals of the listed runs that are not
    done and have a bucket, in parallel, for at most `journal_refresh.REFRESH_S` in all
    (`api.listing.list_runs`): a bucket that cannot be read is a `warning:` line on stderr,
    and so are all the runs not read by then together; such a run's row is the ledger's as
    it was (`refreshed: false` in the JSON, its status marked in the table)."""
    from cloudtrain.api.listing import list_runs

    runs = list_runs(limit=limit, sync=True, warn=common.warn)
    if as_json:
        common.emit_json([row.to_dict() for row in runs])
        return
    console = common.console()
    grid = table(runs)
    if not console.is_terminal:  # a pipe or a file: every value whole, however long the line
        unbounded = console.options.update_width(UNBOUNDED)
        console.width = max(console.width, console.measure(grid, options=unbounded).maximum)
    console.print(grid)


def table(runs: list[RunListing]) -> Table:
    """The runs as a rich table. The run id, the one value a user copies, never wraps and is
    never cut short, however narrow the terminal; the other values wrap in their cells rather
    than end in an ellipsis. Pure."""
    from rich.table import Column, Table

    widest = max((len(row.record.run_id) for row in runs), default=3)
    run = Column("run", no_wrap=True, min_width=widest)
    rest = [Column(name, overflow="fold") for name in OTHER_COLUMNS]
    grid = Table(run, *rest)
    for row in runs:
        r = row.record
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))
        grid.add_row(
            r.run_id,
            r.provider,
            r.status if _refreshed(row) else f"{r.status} (not refreshed)",
            r.outcome or "",
            started,
            str(row.live),
            f"${row.cost_usd:.4f}",
        )
    return grid


def _refreshed(row: RunListing) -> bool:
    """Whether the row is up to date with its run's journal (`api.listing.ListedRun`); a
    plain RunListing says nothing of it. Pure."""
    return bool(getattr(row, "refreshed", True))
