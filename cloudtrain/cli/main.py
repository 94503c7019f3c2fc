"""The `cloudtrain` command: parse, call, render. Thin on purpose.

Start-up imports only typer (and rich through it); every command imports what it needs when it
runs, so `cloudtrain --help`, `plan` and `schema` never load TensorFlow or a cloud SDK. A
CloudtrainError is printed as one line (no traceback) and sets the exit code.
"""

from __future__ import annotations

import atexit
import gc as _gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from cloudtrain.cli import common
from cloudtrain.cli import options as cli_options
from cloudtrain.core.errors import CloudtrainError
from cloudtrain.providers.registry import infos, names

if TYPE_CHECKING:
    from cloudtrain.api.results import Launch

app = typer.Typer(
    name="cloudtrain",
    help="Run a TensorFlow training job on the cheapest GPU VMs of AWS, GCP, Azure or this "
    "machine: planned and priced first, torn down always.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # click's plain help: typer's rich help panels import rich's markdown and syntax modules
    # (markdown-it, pygments), 40% of `cloudtrain --help`'s time
    rich_markup_mode=None,
)

# "GCP project / Azure subscription": the providers' own account fields (their INFO)
ACCOUNTS = " / ".join(f"{i.label} {i.account_field}" for i in infos() if i.account_field)
ProviderOpt = Annotated[
    str | None,
    typer.Option(
        "--provider",
        "-p",
        help=f"{', '.join(names())}, or cheapest of the clouds (overrides the spec)",
    ),
]
RegionOpt = Annotated[str | None, typer.Option("--region", help="Region (overrides the spec).")]
ZoneOpt = Annotated[str | None, typer.Option("--zone", help="Zone (overrides the spec).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
JobArg = Annotated[Path, typer.Argument(help="The job spec (job.yaml).", show_default=False)]
RunArg = Annotated[str, typer.Argument(help="A run id (or a unique prefix of one).")]


_console = common.console
_provider = common.provider
_ledger = common.ledger
_emit_json = common.emit_json


@app.command()
def plan(
    job: JobArg,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    zone: ZoneOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Price the job: the resources, the strategy and the estimate. Creates nothing."""
    from cloudtrain import api

    the_plan = api.plan(job, provider=provider, region=region, zone=zone)
    if as_json:
        _emit_json(the_plan.to_dict())
        return
    from cloudtrain.cli.plan_view import plan_table

    _console().print(plan_table(the_plan))


DetachOpt = Annotated[bool, typer.Option("--detach", help="Return once the nodes are created.")]
NoControllerOpt = Annotated[
    bool,
    typer.Option(
        "--no-controller",
        help="With --detach: no controller node; nobody replaces lost nodes or enforces the "
        "budget, and the nodes stop themselves at the deadline.",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream logs.")]


@app.command()
def run(
    job: JobArg,
    provider: ProviderOpt = None,
    region: RegionOpt = None,
    zone: ZoneOpt = None,
    detach: DetachOpt = False,
    no_controller: NoControllerOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Plan, create, train, stream logs, and always tear down. Exit 0 only on success.

    With --detach a small controller node in the cloud watches the run instead of this
    process: close the laptop; `cloudtrain attach RUN` takes it back."""
    from cloudtrain import api

    ready = api.prepare(job, provider=provider, region=region, zone=zone)
    _execute(ready, detach, quiet, as_json, controller=not no_controller)


@app.command()
def resume(
    run_id: RunArg,
    detach: DetachOpt = False,
    no_controller: NoControllerOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Start a new run from an ended run's checkpoints; training carries on from there.

    The run's job.yaml is read as it is now; the provider and region are the run's."""
    from cloudtrain import api

    _execute(api.prepare_resume(run_id), detach, quiet, as_json, controller=not no_controller)


def _execute(
    ready: Launch, detach: bool, quiet: bool, as_json: bool, controller: bool = True
) -> None:
    """Show the plan, run it and summarise it (run and resume); exits with the outcome's code."""
    from cloudtrain import api
    from cloudtrain.cli.plan_view import plan_table
    from cloudtrain.cli.ui import ConsoleObserver, gpu_less_roles, summary

    console = _console()
    if not as_json:
        console.print(plan_table(ready.plan))
        if detach and controller:
            console.print(_controller_line(ready))
    # with --json, stdout carries only the result; progress goes to stderr
    progress = _console(stderr=True) if as_json else console
    show_logs = not quiet and not as_json
    observer = ConsoleObserver(progress, show_logs, gpu_less=gpu_less_roles(ready.plan))
    with observer:
        result = api.launch(ready, detach=detach, observer=observer, controller=controller).result
    if as_json:
        _emit_json(result.__dict__)
    else:
        console.print(summary(result))
        if detach:
            console.print(
                f"follow with `cloudtrain attach {result.run_id}` (or `status`, `logs "
                f"--follow`); stop with `cloudtrain down {result.run_id}`"
            )
    raise typer.Exit(result.outcome.exit_code)


def _controller_line(ready: Launch) -> str:
    """The plan's line for the controller node of a detached run (its machine and $/h)."""
    from cloudtrain.managed.controller_offer import controller_offer

    the_plan = ready.plan
    offer = controller_offer(the_plan.provider, the_plan.region)
    total = the_plan.hourly_usd + offer.hourly_usd
    return (
        f"+ controller node {offer.instance_type}, on-demand: ${offer.hourly_usd:.4f}/h "
        f"(it watches the detached run); ${total:.4f}/h in all"
    )


@app.command()
def attach(
    run_id: RunArg,
    provider: cli_options.ProviderOpt = None,
    region: cli_options.RegionOpt = None,
    project: cli_options.ProjectOpt = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Hand the run to a new controller node and return.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Take control of a detached run back: follow it live to its end, and tear it down.

    A live controller node is asked to hand the run over; a lost one is replaced once its lease
    expires. Ctrl-C stops the run, as in `run`."""
    from cloudtrain.cli.ui import ConsoleObserver, summary
    from cloudtrain.managed.attach import attach as attach_run

    ref = common.run_ref(run_id)  # the edge: parsed once, before anything is shown or built
    console = _console()
    observer = ConsoleObserver(console, show_logs=not quiet)
    with observer:
        result = attach_run(
            ref, observer, provider=provider, region=region, account=project, detach=detach
        )
    console.print(summary(result))
    raise typer.Exit(result.outcome.exit_code)


@app.command()
def cost(
    run_id: Annotated[str | None, typer.Argument(help="One run (or a unique prefix).")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only runs started within, e.g. 30d, 12h.")
    ] = None,
    as_json: JsonOpt = False,
    provider: cli_options.ProviderOpt = None,
    region: cli_options.RegionOpt = None,
    project: cli_options.ProjectOpt = None,
) -> None:
    """What runs cost: compute from the ledger, and the storage their outputs keep.

    Per run and in total; storage is priced per month at the provider's standard rate. For one
    run, the ledger first takes in its journal's new entries (with --provider: a run this
    ledger has no record of)."""
    from cloudtrain import api
    from cloudtrain.insight.cost_report import totals
    from cloudtrain.run.journal_sync import sync_run

    if run_id is not None:
        ref = common.run_ref(run_id)  # the edge: parsed once, trusted below
        run_id = sync_run(
            ref, provider=provider, region=region, account=project, warn=common.warn
        ).run_id
    rows = api.cost(run_id, since=since)
    total = totals(rows)
    if as_json:
        _emit_json({"runs": [r.to_dict() for r in rows], "total": total})
        return
    from rich.table import Table

    table = Table("run", "provider", "outcome", "started", "node-h", "compute", "kept", "$/month")
    for r in rows:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started))
        kept = "?" if r.stored_gb is None else f"{r.stored_gb:.3f} GB"
        month = "?" if r.storage_usd_month is None else f"${r.storage_usd_month:.4f}"
        table.add_row(
            r.run_id,
            r.provider,
            r.outcome,
            started,
            f"{r.node_hours:.3f}",
            f"${r.compute_usd:.4f}",
            kept,
            month,
        )
    console = _console()
    console.print(table)
    console.print(
        f"total: {int(total['runs'])} run(s), {total['node_hours']:.3f} node-hours, "
        f"${total['compute_usd']:.4f} compute; {total['stored_gb']:.3f} GB kept, "
        f"${total['storage_usd_month']:.4f}/month (storage: '?' = bucket not readable)"
    )


@app.command("ls")
def list_runs(
    limit: Annotated[int, typer.Option(help="How many runs.")] = 20, as_json: JsonOpt = False
) -> None:
    """Recent runs from the ledger, newest first (a run not done reads its journal first)."""
    from cloudtrain.cli.listing import show

    show(limit, as_json)


@app.command()
def down(
    run_id: RunArg,
    provider: Annotated[
        str | None,
        typer.Option("--provider", "-p", help="Needed only when the ledger has no record of RUN."),
    ] = None,
    region: RegionOpt = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            help=f"{ACCOUNTS}, when the ledger has no record of RUN.",
        ),
    ] = None,
) -> None:
    """Tear a run down: stop its agents, delete its nodes, network and identity.

    Idempotent; works after a crash, and from the cloud's tags alone without a ledger."""
    from cloudtrain import api

    console = _console()
    report = api.down(
        run_id,
        provider=provider,
        region=region,
        account=project,
        say=lambda m: console.print(f"cloudtrain {m}"),
    )
    console.print(
        f"run {report.run_id}: {len(report.nodes_deleted)} node(s) and "
        f"{len(report.resources_deleted)} other resource(s) deleted in {report.seconds:.1f}s; "
        "nothing of it is left"
    )


@app.command()
def gc(
    provider: Annotated[
        str | None,
        typer.Option(
            "--provider",
            "-p",
            help="Where to look; default: every provider the ledger has runs for.",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete what is found.")] = False,
    region: Annotated[
        str | None,
        typer.Option("--region", help="Where to look; default: the regions of the ledger's runs."),
    ] = None,
    project: Annotated[str | None, typer.Option("--project", help=f"{ACCOUNTS}.")] = None,
) -> None:
    """Find resources of finished or unknown runs left in the cloud; delete them with --yes.

    Runs the ledger says are live are left alone until past their deadline. Idempotent."""
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.provider_config import read_once
    from cloudtrain.run import gc as gc_mod

    ledger = _ledger()
    console = _console()
    catalog = Catalog.bundled()
    pending = 0
    failed: list[gc_mod.GcReport] = []
    scopes = gc_mod.scopes(ledger.list_runs(limit=gc_mod.ALL_RUNS), provider, region, project)
    with read_once():  # config.yaml once per command: every scope's provider takes this read
        for scope in scopes:
            prov = _provider(scope.provider, scope.region, None, scope.account)
            found = gc_mod.survey(prov, ledger, scope)
            for run in found.live:
                console.print(f"left alone: run {run.run_id} ({run.reason})")
            if not found.leaked:
                console.print(f"no leaked cloudtrain resources in {found.where}")
                continue
            console.print(gc_mod.table(found, gc_mod.rows(found, catalog)))
            if not yes:
                pending += len(found.leaked)
                continue
            report = gc_mod.collect(prov, ledger, found, lambda m: console.print(f"cloudtrain {m}"))
            console.print(report.summary())
            if report.failed:
                failed.append(report)
    if pending:
        console.print(f"{pending} run(s) would be deleted; pass --yes to delete them")
    for report in failed:
        report.raise_for_errors()


def _register_catalog(target: typer.Typer) -> None:
    from cloudtrain.cli.catalog import catalog_app  # typer only: the SDKs load on refresh

    target.add_typer(catalog_app, name="catalog", help="The price catalog; refresh it live.")


def _register_runs(target: typer.Typer) -> None:
    from cloudtrain.cli import runs as cli_runs

    cli_runs.register(target)


def _register_check(target: typer.Typer) -> None:
    from cloudtrain.cli import check as cli_check

    cli_check.register(target)


def _register_insight(target: typer.Typer) -> None:
    from cloudtrain.cli import report as cli_report
    from cloudtrain.cli import scale as cli_scale
    from cloudtrain.cli import tensorboard as cli_tensorboard

    for module in (cli_scale, cli_tensorboard, cli_report):
        module.register(target)


# The commands of other modules, made when first asked for: `run` or `plan` neither imports
# those modules nor has typer build their options (tens of ms before a run's first create).
# `--help` and a mistyped command name see them all, in the same order as before.
_LAZY: dict[str, Callable[[typer.Typer], None]] = {
    "check": _register_check,
    "status": _register_runs,
    "logs": _register_runs,
    "scale": _register_insight,
    "tensorboard": _register_insight,
    "report": _register_insight,
}
_LAZY_GROUPS: dict[str, Callable[[typer.Typer], None]] = {"catalog": _register_catalog}


def _lazy_commands(register: Callable[[typer.Typer], None]) -> dict[str, Any]:
    """The click commands `register` adds, built as `app` would build them."""
    from typer.main import get_group

    sub = typer.Typer(
        rich_markup_mode=app.rich_markup_mode,
        pretty_exceptions_short=app.pretty_exceptions_short,
        suggest_commands=app.suggest_commands,
    )
    register(sub)
    return dict(get_group(sub).commands)


class _Commands(dict):  # type: ignore[type-arg]
    """The group's name -> click command, where a stand-in holds a lazy command's place until
    it is looked up (`get`, `[]`, `items`, `values`); `keys` and `in` never load one."""

    def __init__(self, commands: dict[str, Any]) -> None:
        super().__init__(commands)
        self._pending = {n: r for n, r in {**_LAZY, **_LAZY_GROUPS}.items() if n in commands}

    def _load(self, name: str) -> None:
        register = self._pending.get(name)
        if register is None:
            return
        for key, command in _lazy_commands(register).items():
            if self._pending.pop(key, None) is not None:
                super().__setitem__(key, command)

    def __getitem__(self, name: str) -> Any:
        self._load(name)
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        self._load(name)
        return super().get(name, default)

    def items(self) -> Any:
        for name in list(self._pending):
            self._load(name)
        return super().items()

    def values(self) -> Any:
        return [command for _, command in self.items()]


SHORT_HELP_LIMIT = 1000  # characters of a command's first sentence in `--help` (all of it)


class _Group(TyperGroup):
    """`app`'s click group, with the lazy commands of _LAZY and _LAZY_GROUPS (see _Commands)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands(self.commands)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The `Commands` section of `--help`: each command with the first sentence of its
        help whole, wrapped (click would cut it at the line's end with '...')."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=SHORT_HELP_LIMIT)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _later() -> None:
    """A lazy command's stand-in until it is looked up; never called."""
    raise AssertionError("a lazy command's stand-in ran")  # pragma: no cover


app.info.cls = _Group
for _name in _LAZY:
    app.command(_name, add_help_option=False)(_later)


@app.command()
def schema() -> None:
    """Print the job spec's JSON Schema."""
    from cloudtrain.jobspec.job import json_schema

    _emit_json(json_schema())


for _name in _LAZY_GROUPS:  # after every command, where typer puts a group
    app.command(_name, add_help_option=False)(_later)


def _show_version(value: bool) -> None:
    if value:
        from cloudtrain import __version__

        sys.stdout.write(f"cloudtrain {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Show the version.", is_eager=True, callback=_show_version),
    ] = False,
) -> None:
    """Run a TensorFlow training job on the cheapest GPU VMs of AWS, GCP, Azure or this
    machine: planned and priced first, torn down always."""
    from cloudtrain import api

    api.set_warning_handler(common.warn)  # the API logs them; a command line shows them


CONTROLLER_MIN_PYTHON = (3, 11)  # the nodes run on 3.10 (requires-python); the controller is
# tested on 3.11 and newer only


def controller_python_error(version: tuple[int, ...] = tuple(sys.version_info)) -> str | None:
    """The one-line error for a Python too old to run the controller, or None. Pure."""
    if tuple(version[:2]) >= CONTROLLER_MIN_PYTHON:
        return None
    have = ".".join(map(str, version[:3]))
    need = ".".join(map(str, CONTROLLER_MIN_PYTHON))
    return (
        f"error: cloudtrain's controller needs Python {need} or newer; this is Python {have}"
        " (the nodes run on 3.10 and newer)"
    )


def main() -> None:
    """Console-script entry point: user mistakes and cloud errors are one line, no traceback."""
    # registered first, so it runs last: the interpreter's final collection then skips every
    # object alive at exit, the cloud SDKs' above all (0.5-1.2 s after a run on a cloud box;
    # google.cloud.compute_v1 alone 0.7 s). Nothing of ours relies on a cycle's finalizer at exit
    atexit.register(_gc.freeze)
    too_old = controller_python_error()
    if too_old:
        sys.stderr.write(too_old + "\n")
        sys.exit(2)
    clicks = _click_exceptions()
    try:
        code = app(standalone_mode=False)
    except CloudtrainError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except clicks.NoArgsIsHelpError as exc:  # a bare command: its help, as before
        exc.show()
        sys.exit(exc.exit_code)
    except clicks.UsageError as exc:  # an unknown option, a missing argument...
        sys.stderr.write(f"error: {usage_error_line(exc)}\n")
        sys.exit(exc.exit_code)
    except clicks.ClickException as exc:
        from cloudtrain.jobspec.yaml_source import one_line

        sys.stderr.write(f"error: {one_line(exc.format_message())}\n")
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _click_exceptions() -> Any:
    """Click's exceptions module: typer's own copy of click where it vendors one."""
    try:
        from typer._click import exceptions
    except ImportError:  # a typer that uses the click package
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


def usage_error_line(exc: Any) -> str:
    """Click's usage error as one line: the problem, and where the command's help is. A run id
    that starts with '-' reads as an option: say so. Pure."""
    from cloudtrain.jobspec.yaml_source import (
        one_line,  # the one "one line" rule (errors only: no cost)
    )

    message = one_line(exc.format_message())
    path = exc.ctx.command_path if exc.ctx is not None else "cloudtrain"
    hint = f"see `{path} --help`"
    if "No such option" in message:
        hint += "; an argument that starts with '-' goes after `--`"
    return f"{message} ({hint})"


if __name__ == "__main__":
    main()
