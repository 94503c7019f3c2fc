"""The `cloudtrain scale` command: run a job briefly at several worker counts, print the table.

Typer only at import; `cloudtrain.api`, the scale arithmetic and rich load when it runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cloudtrain.cli import common

DEFAULT_STEPS = 30  # --steps: enough past the first (traced) step for a steady rate

if TYPE_CHECKING:
    from cloudtrain.api.scale import ScaleRun, ScaleTable, Size


def _usd(value: float | None) -> str:
    if value is None:
        return "?"
    return f"${value:.4f}" if value >= 0.01 or value == 0 else f"${value:.6f}"


def _num(value: float | None, fmt: str) -> str:
    return "?" if value is None else format(value, fmt)


def render(tbl: ScaleTable, title: str) -> list[object]:
    """The table and its notes as rich renderables. Pure."""
    from rich.table import Table
    from rich.text import Text

    out = Table(title=title, title_justify="left")
    for col in ("workers", "examples/s", "speed-up", "efficiency", "$/h", "epoch", "$/epoch"):
        out.add_column(col, justify="right")
    out.add_column("mark")
    out.add_column("run")
    for r in tbl.rows:
        out.add_row(
            str(r.workers),
            _num(r.examples_per_s, ",.1f"),
            "?" if r.speedup is None else f"{r.speedup:.2f}x",
            "?" if r.efficiency is None else f"{r.efficiency:.0%}",
            _usd(r.hourly_usd),
            "?" if r.epoch_seconds is None else f"{r.epoch_seconds:.1f}s",
            _usd(r.usd_per_epoch),
            ", ".join(r.marks),
            r.run_id,
        )
    notes = [tbl.budget_rule, *tbl.notes, "epoch and $/epoch: projected from the short runs"]
    return [out, *(Text(f"  {line}") for line in notes)]


def _plans(sizes: list[Size]) -> object:
    """What will run: per size its nodes, machines and $/h (all planned already)."""
    from rich.table import Table

    out = Table(title="sizes to run (each planned; run one after the other)", title_justify="left")
    for col in ("workers", "nodes", "machines", "$/h"):
        out.add_column(col, justify="left" if col == "machines" else "right")
    for size in sizes:
        plan = size.ready.plan
        kinds = sorted({n.instance_type for n in plan.nodes})
        out.add_row(
            str(size.workers), str(plan.node_count), ", ".join(kinds), _usd(plan.hourly_usd)
        )
    return out


def _result(done: ScaleRun) -> dict[str, object] | None:
    stop = done.stopped_by
    if stop is not None:
        return {"run_id": stop.run_id, "outcome": str(stop.outcome), "detail": stop.detail}
    if done.error is not None:
        return {"run_id": None, "outcome": "error", "detail": str(done.error)}
    return None


def register(app: typer.Typer) -> None:
    """Add the `scale` command to `app`. Imports nothing heavy."""

    @app.command()
    def scale(
        job: Annotated[Path, typer.Argument(help="The job spec (job.yaml).", show_default=False)],
        workers: Annotated[
            str, typer.Option("--workers", "-w", help="Worker counts to try, e.g. 1,2,4.")
        ] = "1,2,4",
        steps: Annotated[
            int, typer.Option("--steps", min=1, help="Training steps per size (the short run).")
        ] = DEFAULT_STEPS,
        provider: Annotated[
            str | None, typer.Option("--provider", "-p", help="Where to run (overrides the spec).")
        ] = None,
        region: Annotated[str | None, typer.Option("--region", help="Region (overrides).")] = None,
        zone: Annotated[str | None, typer.Option("--zone", help="Zone (overrides).")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream logs.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="The rows as JSON.")] = False,
    ) -> None:
        """Run the job briefly at each worker count and print how it scales.

        Per size: examples/s, speed-up, efficiency, $/h (the plan's) and $ per epoch, with the
        cheapest size per epoch and the fastest within the budget marked. Every size is planned
        before the first runs; each is a real run, torn down before the next. The job must use
        runtime.callbacks() (it stops fit after --steps steps and reports the figures)."""
        from cloudtrain import api
        from cloudtrain.api import scale
        from cloudtrain.cli.ui import ConsoleObserver

        sizes = scale.parse_sizes(workers)
        spec = api.load(job, provider=provider, region=region, zone=zone)
        ready = scale.prepare_sizes(spec, sizes, steps)
        console = common.console()
        progress = common.console(stderr=True) if as_json else console
        progress.print(_plans(ready))

        def observer_for(_: Size) -> ConsoleObserver:
            return ConsoleObserver(progress, show_logs=not quiet and not as_json)

        done = scale.measure_sizes(ready, observer_for, lambda line: progress.print(line))
        tbl = scale.table(done.measured, max_cost_usd=spec.max_cost_usd, max_hours=spec.max_hours)
        if as_json:
            common.emit_json(
                {**tbl.to_dict(), "stopped": _result(done), "interrupted": done.interrupted}
            )
        else:
            title = f"scaling of {spec.name} on {ready[0].ready.plan.provider} ({steps} steps)"
            for part in render(tbl, title):
                console.print(part)
        if done.stopped_by is not None:
            stop, size = done.stopped_by, ready[len(done.measured)].workers
            sys.stderr.write(
                f"scale stopped: run {stop.run_id} ({size} worker(s)) ended {stop.outcome}: "
                f"{stop.detail or 'no reason given'} (the table has the sizes before it)\n"
            )
            raise typer.Exit(stop.outcome.exit_code)
        if done.error is not None:
            raise done.error  # one `error:` line, its exit code (cli.main)
        if done.interrupted:
            sys.stderr.write("scale interrupted (the table has the sizes measured before it)\n")
            raise typer.Exit(130)
