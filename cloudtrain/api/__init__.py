"""cloudtrain as a Python library: plan, run, status, logs, down and cost, with typed results.

For notebooks and pipelines. Nothing here prints: results are values (`Plan`, `RunHandle`,
`RunResult`, `RunStatus`, `LogLine`, `DownReport`, `CostLine`), progress goes to the observer
you pass (default: `SilentObserver`, which keeps events in memory and logs them to the
`cloudtrain.api` logger), and every failure is a `cloudtrain.core.errors.CloudtrainError`
(`SpecError` with `FILE:LINE: field` for a bad spec, `UsageError` for a bad or unknown run id),
never SystemExit. The `cloudtrain` command is a thin layer over this module.

    from cloudtrain import api
    handle = api.run("job.yaml")                 # blocks; always tears down
    handle.result.outcome, handle.result.model_uri

Importing this module loads no TensorFlow and no cloud SDK; a provider's SDK loads when a
command first needs that provider. Thread safety: one run per call; `run` may be called off
the main thread, where stop signals (Ctrl-C, SIGTERM) cannot be handled: it says so through
the observer, and `down(run_id)` stops such a run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cloudtrain.api.listing import list_runs
from cloudtrain.api.log_stream import LogStream, job_over, poll
from cloudtrain.api.results import (
    CostLine,
    DownReport,
    Launch,
    LogEnd,
    LogLine,
    RunListing,
    RunStatus,
    SilentObserver,
)
from cloudtrain.core.errors import CloudtrainError, UsageError
from cloudtrain.run.build import (
    ledger,
    provider,
    record_provider,
    run_provider,
    set_warning_handler,
    warn,
    warn_deprecated,
)

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.jobspec.provider_config import OutsideLayers
    from cloudtrain.jobspec.run_options import RunOptions
    from cloudtrain.plan.planner import Plan
    from cloudtrain.providers.account import AccountProbe
    from cloudtrain.providers.base import Provider
    from cloudtrain.run.view import Observer, RunResult
    from cloudtrain.state.ledger import Ledger, RunRecord
    from cloudtrain.state.ledger_records import ResourceRecord

__all__ = [
    "CostLine",
    "DownReport",
    "Launch",
    "LogEnd",
    "LogLine",
    "RunHandle",
    "RunListing",
    "RunStatus",
    "SilentObserver",
    "bootstrap_logs",
    "cost",
    "down",
    "find_run",
    "launch",
    "ledger",
    "list_runs",
    "logs",
    "plan",
    "prepare",
    "prepare_resume",
    "provider",
    "record_provider",
    "resume",
    "run",
    "run_provider",
    "set_warning_handler",
    "status",
]
NO_SIGNALS_NOTE = (  # .format(run_id=...)
    "not on the main thread: stop signals (Ctrl-C, SIGTERM, SIGHUP) are not handled here; "
    "stop the run with cloudtrain.api.tear_down({run_id!r}) (the teardown at its end still runs)"
)


# --- plan and run -----------------------------------------------------------------------------
def load(
    job: str | Path | JobSpec,
    *,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
) -> JobSpec:
    """The validated spec: a job.yaml path (provider/region/zone override the file's, in effect
    from the first validation), or a `JobSpec` as is. Raises SpecError (`FILE:LINE: field`),
    for a bad config.yaml too (read after the spec, unless the command already holds it)."""
    return _loaded(job, provider=provider, region=region, zone=zone)[0]


def _loaded(
    job: str | Path | JobSpec,
    *,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
) -> tuple[JobSpec, OutsideLayers | None]:
    """`load`, and config.yaml and the deprecated variables as read for it (the command's one
    read, `provider_config.read_once`; None for a JobSpec given loaded: nothing is read)."""
    from cloudtrain.jobspec.job import JobSpec, load_spec
    from cloudtrain.jobspec.provider_config import command_layers

    if isinstance(job, JobSpec):
        if provider or region or zone:
            raise UsageError("provider/region/zone override a job file, not a loaded JobSpec")
        return job, None
    spec = load_spec(Path(job), provider=provider, region=region, zone=zone)
    # a bad config.yaml is the same one line, after the spec's and before anything is planned
    return spec, command_layers()


def plan(
    job: str | Path | JobSpec,
    *,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
    account: bool = True,
) -> Plan:
    """Price the job: the nodes, the strategy and the estimate. Creates nothing. Where a cloud's
    credentials are visible (providers/credential_hints.py) and `account` is true, asks its
    quotas and skips the regions that cannot hold the plan (cloudtrain/plan/account_plan.py; loads
    that SDK); otherwise loads no cloud SDK and the plan notes that it did not look. Raises
    SpecError for a bad spec, PlanError for a plan that cannot be (over budget, no quota)."""
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.jobspec.provider_config import read_once
    from cloudtrain.plan.live_offers import add_notes, with_live_offers
    from cloudtrain.plan.planner import make_plan

    spec, layers = _loaded(job, provider=provider, region=region, zone=zone)
    with read_once(layers):  # every place planned takes the options from this one read
        # a cluster's partitions and queue, read live (none for a cloud: its bundled catalog)
        catalog, live_notes = with_live_offers(spec, Catalog.bundled())
        if account:
            from cloudtrain.plan.account_plan import plan_for_account

            the_plan = plan_for_account(spec, catalog, account_probe_of(spec))
        else:
            the_plan = make_plan(spec, catalog)
        the_plan = add_notes(the_plan, live_notes)
        warn_deprecated(spec, the_plan)  # the plan shows the options: say what is deprecated
    return the_plan


def account_probe_of(spec: JobSpec) -> Callable[[str, Plan], AccountProbe | None]:
    """For the account-aware plan: a cloud's AccountProbe for `spec` (its options, the plan's
    place), or None where its credentials are not visible here or its SDK is not installed.
    Builds the provider (loads its SDK) only when credentials are visible."""

    def probe_of(cloud: str, placed: Plan) -> AccountProbe | None:
        from cloudtrain.providers.credential_hints import visible
        from cloudtrain.providers.registry import info

        if visible(info(cloud)) is None:
            return None
        try:
            return run_provider(spec, placed).account_probe(tpu=spec.cluster.strategy_info.on_tpu)
        except UsageError:  # the cloud's extra is not installed: nothing to ask with
            return None

    return probe_of


def check_rights(spec: JobSpec, the_plan: Plan) -> None:
    """Refuse a run whose caller lacks rights it needs, before anything exists: RightsMissing
    naming them (the line `cloudtrain check` prints). Asks only where the plan's cloud's
    credentials are visible; credentials that are visible but unusable (a key file that is
    gone) raise their CredentialsError now, the run's one error line; a cloud that refuses the
    rights question itself lets the run go on (its create calls will say what is refused).
    Blocks on the cloud's API; creates nothing."""
    from cloudtrain.core.errors import CredentialsError
    from cloudtrain.plan.account_check import rights_error

    probe = account_probe_of(spec)(the_plan.provider, the_plan)
    if probe is None:
        return
    try:
        probe.credentials()
    except CredentialsError:
        raise  # nothing could be created with them: said once, before anything exists
    except CloudtrainError as exc:
        warn(f"could not ask {the_plan.provider} who the caller is: {exc.message}")
        return
    try:
        missing = probe.missing_rights()
    except CloudtrainError as exc:
        warn(f"could not ask {the_plan.provider} which rights the caller has: {exc.message}")
        return
    if missing:
        raise rights_error(_label(the_plan.provider), sorted(missing))


def _label(provider: str) -> str:
    from cloudtrain.providers.registry import info

    return info(provider).label


def prepare(
    job: str | Path | JobSpec,
    *,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
) -> Launch:
    """The spec and its plan, ready for `launch` (what `run` does first): config.yaml and the
    deprecated variables are read once, and the plan carries the options to the launch.
    Creates nothing."""
    from cloudtrain.jobspec.provider_config import read_once

    started = time.time()
    spec, layers = _loaded(job, provider=provider, region=region, zone=zone)
    loaded = time.time()
    with read_once(layers):
        the_plan = plan(spec)
        planned = time.time()
        check_rights(spec, the_plan)
    timings = (
        ("spec", started, loaded),
        ("plan", loaded, planned),
        ("rights", planned, time.time()),
    )
    return Launch(spec, the_plan, timings=timings)


def prepare_resume(run_id: str) -> Launch:
    """A new run of an ended run's job.yaml (as it is now; the provider and region are the
    run's), starting from that run's checkpoints. UsageError while the run still runs, when it
    left no checkpoints, or when its job file is gone. Creates nothing; reads its bucket."""
    from cloudtrain.run.resume import resume_source

    rec = find_run(run_id)
    if not rec.spec_path or not Path(rec.spec_path).is_file():
        raise UsageError(
            f"run {rec.run_id}'s job file {rec.spec_path or '(unknown)'} is gone",
            hint="resume needs the job.yaml the run was started from",
        )
    from cloudtrain.jobspec.provider_config import read_once

    spec, layers = _loaded(
        Path(rec.spec_path), provider=rec.provider, region=rec.region, zone=rec.zone
    )
    prov = record_provider(rec)
    _, source = resume_source(ledger(), rec.run_id, prov.store(str(rec.store_uri)))
    with read_once(layers):
        return Launch(spec, plan(spec), resume_from=source)


@dataclass
class RunHandle:
    """A run started by `run`, `resume` or `launch`. `result` is how the controller's part
    ended: the outcome (`Outcome.DETACHED` for a detached run, whose nodes go on), the model's
    URI, the cost. The methods ask the ledger, the bucket and the cloud about the run now."""

    run_id: str
    plan: Plan
    result: RunResult
    observer: Observer

    @property
    def detached(self) -> bool:
        from cloudtrain.run.view import Outcome

        return self.result.outcome is Outcome.DETACHED

    def status(self) -> RunStatus:
        """See `api.status`."""
        return status(self.run_id)

    def logs(self, *, follow: bool = False, node: str | None = None) -> LogStream:
        """See `api.logs`."""
        return logs(self.run_id, follow=follow, node=node)

    def down(self) -> DownReport:
        """See `api.down`. Idempotent."""
        return down(self.run_id)

    def wait(self, *, timeout_s: float | None = None, poll_s: float = 2.0) -> RunStatus:
        """Block until the run is over (the ledger says done, or every node reported a final
        state: a detached run's end) and return its status; an attached run is over already.
        TimeoutError after `timeout_s`. The nodes of a detached run are left for `down`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            now = status(self.run_id)
            if now.done or job_over(now.statuses):
                return now
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.run_id} still {now.status} after {timeout_s}s")
            time.sleep(poll_s)


def launch(
    ready: Launch,
    *,
    detach: bool = False,
    observer: Observer | None = None,
    options: RunOptions | None = None,
    controller: bool = True,
) -> RunHandle:
    """Start the prepared run. Attached (default): blocks until the job ends and the run is torn
    down, on every path (a failure, the budget, the deadline, Ctrl-C: the orchestrator does
    it). Detached: returns once the nodes and a controller node exist; the controller node
    watches the run as the attached process would (recovery, budget, deadline, teardown),
    `attach` takes it back and `down` ends it sooner (`controller=False`: no controller node;
    the nodes stop themselves at the deadline). Returns the handle; the outcome is in
    `handle.result`, not an exception. Progress goes to `observer` (default: a
    `SilentObserver`). On the main thread SIGINT (Ctrl-C, a notebook's interrupt), SIGTERM and
    SIGHUP stop the run gracefully and tear it down (outcome interrupted); one that lands
    before the run's ledger row exists raises KeyboardInterrupt, nothing made. Off the main
    thread no signal is handled: the observer is told so with the run id, and `down(run_id)`
    from elsewhere stops the run."""
    from cloudtrain.jobspec.run_options import RunOptions
    from cloudtrain.managed.controller_launch import launch_controller
    from cloudtrain.run.orchestrator import Orchestrator

    the_plan = ready.plan
    prov = run_provider(ready.spec, the_plan)
    from dataclasses import replace

    if options is None:
        options = RunOptions.for_provider(the_plan.provider, detach=detach, controller=controller)
    elif detach and not options.detach:  # detached if either says so
        options = replace(options, detach=True)
    if not controller and options.controller:
        options = replace(options, controller=False)
    if options.detach and options.controller:  # before anything exists
        from cloudtrain.managed.controller_offer import check_hand_off

        check_hand_off(ready.spec.cluster.strategy_info)
    seen = observer if observer is not None else SilentObserver()
    from cloudtrain.catalog.offers import Catalog
    from cloudtrain.run.failover import places_for

    orch = Orchestrator(
        ready.spec,
        the_plan,
        prov,
        ledger(),
        seen,
        options,
        resume_from=ready.resume_from,
        # another region's or cloud's; the places the plan avoided (the account's quotas) too
        places=places_for(ready.spec, Catalog.bundled(), the_plan.avoided_places()),
        hand_off=launch_controller,
    )
    for name, start, end in ready.timings:  # the run's trace: within its startup phase
        orch.trace.child(name, start, end, "startup")
    if threading.current_thread() is not threading.main_thread():
        seen.event(NO_SIGNALS_NOTE.format(run_id=orch.run_id))
    result = orch.run()
    return RunHandle(result.run_id, orch.plan, result, seen)  # the plan where it landed


def run(
    job: str | Path | JobSpec,
    *,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
    detach: bool = False,
    observer: Observer | None = None,
    options: RunOptions | None = None,
) -> RunHandle:
    """Plan and run a job (see `launch` for attached and detached). Raises SpecError for a
    bad spec and UsageError for a plan that cannot be, before anything exists."""
    ready = prepare(job, provider=provider, region=region, zone=zone)
    return launch(ready, detach=detach, observer=observer, options=options)


def resume(
    run_id: str,
    *,
    detach: bool = False,
    observer: Observer | None = None,
    options: RunOptions | None = None,
) -> RunHandle:
    """A new run from an ended run's checkpoints (see `prepare_resume` and `launch`)."""
    return launch(prepare_resume(run_id), detach=detach, observer=observer, options=options)


# --- a run's state -----------------------------------------------------------------------------
def status(run_id: str) -> RunStatus:
    """The run now: ledger record, bucket (node statuses, heartbeats, failures of the newest
    attempt; `store_error` when the bucket cannot be read), the cloud's node list, the live
    resources and the cost so far. Read-only; blocks for one poll of the bucket (five small
    listings, no log line: runstate.RunReader) and one listing of the cloud."""
    from cloudtrain.core.procid import controller
    from cloudtrain.insight.trace_view import load_spans
    from cloudtrain.insight.trace_view import to_json as trace_json
    from cloudtrain.state.failures import read_reports
    from cloudtrain.state.runstate import RunReader

    rec = find_run(run_id)
    the_ledger = ledger()
    prov = record_provider(rec)
    store = prov.store(str(rec.store_uri))
    nodes = ledger_nodes(the_ledger, rec.run_id)
    snap, unreadable = poll(RunReader(store, rec.run_id, logs=False, nodes=nodes))
    attempt = max((int(s.get("attempt", 0)) for s in snap.statuses.values()), default=0)
    chief = "chief-0" if "chief-0" in nodes else "worker-0"
    trace = trace_json(load_spans(the_ledger, store, rec.run_id, nodes), chief)
    nodes = {n.name: n for n in prov.compute.list_nodes(rec.run_id)}
    live = [r for r in the_ledger.resources(rec.run_id, live_only=True) if r.kind != "bucket"]
    return RunStatus(
        record=rec,
        cost_usd=the_ledger.billed_cost(rec.run_id),
        controller=controller(rec),
        statuses=dict(snap.statuses),
        heartbeats=dict(snap.heartbeats),
        bootstrap={
            k: {
                "phase": snap.bootstrap_phases.get(k),
                "durations_s": snap.bootstrap_durations.get(k),
            }
            for k in sorted(set(snap.bootstrap_phases) | set(snap.bootstrap_durations))
        },
        failures=dict(read_reports(snap, attempt).failed),  # the newest attempt's
        cloud_nodes={name: n.state for name, n in nodes.items()},
        live_resources=[f"{r.kind}/{r.resource_id}" for r in live],
        store_error=unreadable,
        lease=_lease(prov, str(rec.store_uri), rec.run_id),
        read_at=time.time(),
        hourly_usd=_hourly(the_ledger.resources(rec.run_id)),
        trace=trace,
    )


def ledger_nodes(the_ledger: Ledger, run_id: str) -> list[str]:
    """The run's training nodes ('worker-1') as the ledger names them, sorted; [] when it names
    none it can parse (a run poll then finds them in the bucket). Read-only."""
    from cloudtrain.providers.base import ROLES, parse_node_name

    found = set()
    for r in the_ledger.resources(run_id):
        parsed = parse_node_name(r.resource_id) if r.kind == "node" else None
        if parsed is not None and parsed[0] == run_id and parsed[1] in ROLES:
            found.add(f"{parsed[1]}-{parsed[2]}")
    return sorted(found)


def _hourly(resources: list[ResourceRecord]) -> float:
    """What the run's priced resources cost an hour together: each one's latest row once (a
    re-created node is one node). Pure."""
    latest: dict[tuple[str, str], float] = {}
    for r in sorted(resources, key=lambda r: r.created_at):
        latest[(r.kind, r.resource_id)] = r.price_hourly
    return sum(latest.values())


def _lease(prov: Provider, store_uri: str, run_id: str) -> dict[str, Any] | None:
    """The run's control/lease as a dict, or None (none, or the bucket unreadable). Blocks."""
    from cloudtrain.state.lease import read_lease

    try:
        doc = read_lease(prov.store(store_uri), run_id)
    except (CloudtrainError, OSError):
        return None
    return None if doc is None else doc.to_dict()


def logs(
    run_id: str,
    *,
    follow: bool = False,
    node: str | None = None,
    poll_s: float = 1.0,
    on_wait: Callable[[str], None] | None = None,
) -> LogStream:
    """An iterator of the run's log lines (`LogLine`), in order per node; `node` ('worker-1')
    keeps one node's. Without `follow` it ends once the bucket's lines are read (each node's
    closed segments in parallel, then its chunks: cloudtrain/state/log_reader.py); with it, it
    blocks and polls until the run is over or nobody is left to end it (`stream.end` says
    which). `on_wait` hears, once per change, what a follow waits for (default: logged)."""
    from cloudtrain.state.runstate import RunReader

    rec = find_run(run_id)
    _check_node(node)
    prov = record_provider(rec)
    the_ledger = ledger()
    stream = LogStream(
        rec,
        prov,
        RunReader(
            prov.store(str(rec.store_uri)),
            rec.run_id,
            log_node=node,
            nodes=ledger_nodes(the_ledger, rec.run_id),
        ),
        the_ledger,
        node=node,
        follow=follow,
        poll_s=poll_s,
    )
    if on_wait is not None:
        stream.on_wait = on_wait
    return stream


def bootstrap_logs(run_id: str, *, node: str | None = None) -> dict[str, str]:
    """Each node's bootstrap log (what ran before the agent: Python, packages), by node name.
    Read-only."""
    from cloudtrain.state.runstate import RunReader

    rec = find_run(run_id)
    _check_node(node)
    reader = RunReader(record_provider(rec).store(str(rec.store_uri)), rec.run_id)
    return {
        name: reader.bootstrap_log(name)
        for name in reader.bootstrap_nodes()
        if node is None or name == node
    }


def _check_node(node: str | None) -> None:
    from cloudtrain.jobspec.runrules import NODE_RE

    if node is not None and NODE_RE.fullmatch(node) is None:
        raise UsageError(f"--node {node[:40]!r} is not a node name such as worker-1 or chief-0")


# --- the ledger's view: runs and costs; and down --------------------------------------------
def find_run(run_id: str) -> RunRecord:
    """The ledger's run for a run id or a unique prefix of one, parsed here (the edge:
    `run_ids.parse_run_ref`) before anything is built from it. UsageError when it is not
    shaped like one, unknown, or ambiguous. Read-only."""
    from cloudtrain.jobspec.run_ids import parse_run_ref
    from cloudtrain.run import build

    return build.find_run(parse_run_ref(run_id))


def cost(run_id: str | None = None, *, since: str | None = None) -> list[CostLine]:
    """What runs cost, newest first: compute from the ledger, and what their buckets keep
    (priced per month; None where the bucket cannot be read). One run (a unique id prefix),
    or every run started within `since` ('30d', '12h', '2w'). Read-only; lists buckets."""
    from cloudtrain.insight.cost_report import parse_since, report
    from cloudtrain.jobs.protocol import run_prefix
    from cloudtrain.jobspec.run_ids import parse_run_ref

    def stored_bytes(rec: RunRecord) -> int:
        bucket = record_provider(rec).store(str(rec.store_uri))
        return sum(o.size for o in bucket.list(run_prefix(rec.run_id)))

    ref = parse_run_ref(run_id) if run_id is not None else None  # the edge: parsed once
    since_s = parse_since(since) if since else None
    return report(ledger(), stored_bytes, run_id=ref, since_s=since_s)


def down(
    run_id: str,
    *,
    provider: str | None = None,
    region: str | None = None,
    account: str | None = None,
    say: Callable[[str], None] | None = None,
) -> DownReport:
    """Tear a run down (see `api_down.down`). Idempotent; blocks until the cloud confirms."""
    from cloudtrain.api.tear_down import down as _down

    return _down(run_id, provider=provider, region=region, account=account, say=say)
