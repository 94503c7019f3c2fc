"""The run lifecycle: the only module that sequences a provider (ARCHITECTURE.md, "lifecycle").

`Orchestrator.run()` blocks from the first ledger row to the last deleted node: provision (bucket,
bundle, cluster.json, network, all nodes at once), watch (statuses, heartbeats, logs, node states),
recover lost nodes through a new attempt and end the run when a node failed on its own (the
rules: `runrules.judge_attempt`; the acts: `recovery.Recovery`), stop (chief done, failure,
deadline, budget, or a stop signal: Ctrl-C, SIGTERM, SIGHUP) and tear down on every path. Every
resource is in the ledger before its create call.

The Orchestrator sequences; its parts act, each made here with what it needs and sharing only
the run's `RunState` (cloudtrain/run/run_state.py): `LeaseHolder` (the lease, the fencing, the
journal), `Provisioner` (bucket, documents, network, nodes), `Failover` (another place when one
cannot hold the run) and `Recovery` (lost and failed nodes, new attempts). The run's values that
callers read and set on the Orchestrator (`plan`, `provider`, `attempt`, ...) are the state's.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import CloudtrainError, LeaseLost
from cloudtrain.core.paths import cloudtrain_home
from cloudtrain.insight.run_trace import RunTrace, read_node_traces
from cloudtrain.insight.throughput import of_attempt
from cloudtrain.insight.trace_view import to_json as trace_json
from cloudtrain.jobs import protocol
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.protocol import FINAL_STATES, ClusterDoc, NodeState, node_id
from cloudtrain.jobspec.run_ids import new_run_id
from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.jobspec.runrules import judge_attempt, port_range_for
from cloudtrain.providers.base import Provider, RunInfo, node_name
from cloudtrain.providers.change_wait import ChangeWaiter
from cloudtrain.run.budget import Budget
from cloudtrain.run.bundle import build_spec_bundle
from cloudtrain.run.failover import Failover, Places
from cloudtrain.run.lease_holder import STOPPED_BY_DOWN, LeaseHolder
from cloudtrain.run.observer_guard import guarded
from cloudtrain.run.provisioning import Provisioner
from cloudtrain.run.recovery import Recovery, Stop
from cloudtrain.run.resume import ResumeSource
from cloudtrain.run.run_result import run_result
from cloudtrain.run.run_state import RunState, part_value
from cloudtrain.run.stop_signals import StopSignals, signal_name, stop_detail
from cloudtrain.run.teardown import request_stop, scrub_secrets, teardown
from cloudtrain.run.view import NodeView, Observer, Outcome, RunResult, RunView
from cloudtrain.state.failures import read_reports
from cloudtrain.state.lease import Lease
from cloudtrain.state.ledger import Ledger
from cloudtrain.state.runstate import RunReader, Snapshot

# the log lines one poll shows at most (the latest): the rest are said as a count
LINES_PER_POLL = 200
MAX_CRASH_DETAIL = 500  # characters of an unexpected error in the run's detail
MAX_CRASH_TRACE = 8000  # characters of its traceback in the ledger

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import NodePlan, Plan
    from cloudtrain.providers.base import NodeRequest


class Orchestrator:
    """Runs one job spec through its whole lifecycle on one provider. Not reusable."""

    # the run's values, held by its RunState (adopt.py sets an adopted run's)
    plan = part_value("state", "plan")
    provider = part_value("state", "provider")
    store_uri = part_value("state", "store_uri")
    store = part_value("state", "store")
    zone = part_value("state", "zone")
    info = part_value("state", "info")
    view = part_value("state", "view")
    started = part_value("state", "started")
    deadline = part_value("state", "deadline")
    attempt = part_value("state", "attempt")
    job_end = part_value("state", "job_end")
    bundle = part_value("state", "bundle")
    cluster = part_value("state", "cluster")
    restarts = part_value("recovery", "restarts")  # of lost nodes (max_restarts)
    error_retries = part_value("recovery", "error_retries")  # of failed nodes
    journal = part_value("lease_holder", "journal")  # attach.py hands it its own
    lease = part_value("lease_holder", "lease", settable=False)
    fenced_out = part_value("lease_holder", "fenced_out", settable=False)

    def __init__(
        self,
        spec: JobSpec,
        plan: Plan,
        provider: Provider,
        ledger: Ledger,
        observer: Observer,
        options: RunOptions | None = None,
        run_id: str | None = None,
        resume_from: ResumeSource | None = None,
        store_uri: str | None = None,
        places: Places | None = None,
        hand_off: Callable[[Orchestrator], str] | None = None,
    ) -> None:
        self.spec, self.ledger = spec, ledger
        # what creates the controller node a detached run is handed to (the layer above:
        # cloudtrain/managed/controller_launch.launch_controller); None: this run never detaches
        # to one
        self.hand_off = hand_off
        # how to reach another region or cloud when the plan's has no capacity or quota
        # (cloudtrain/run/failover.py); None: the run stays in its plan's region
        self.places = places
        # the display renders the nodes' text: a bug of its never ends the run (issue 29)
        self.observer = guarded(observer, self._display_failed)
        self.options = options or RunOptions.for_provider(provider.name)
        self.run_id = run_id = run_id or new_run_id(spec.name)
        # an adopted run's store is known (the controller node may not list the accounts)
        store_uri = store_uri or spec.checkpoint or provider.default_store_uri(run_id)
        started = time.time()
        deadline = started + spec.max_hours * 3600
        self.state = RunState(
            plan=plan,
            provider=provider,
            store_uri=store_uri,
            # the provider retries each call itself (the registry wraps it once): nothing here
            store=provider.store(store_uri),
            zone=plan.zone,
            info=RunInfo(
                run_id=run_id,
                region=plan.region,
                zone=plan.zone,
                port_range=port_range_for(spec),
                ssh=spec.cluster.ssh,
                store_uri=store_uri,
                deadline=deadline,
                nodes=tuple(node_id(n.role, n.index) for n in plan.nodes),
            ),
            view=RunView(
                run_id,
                "planned",
                1,
                [NodeView(node_name(run_id, n.role, n.index), n.role, n.index) for n in plan.nodes],
                started,
                plan.hourly_usd,
            ),
            started=started,
            deadline=deadline,
            cluster=ClusterDoc(),  # the run's cluster.json, made by provision()
        )
        self.reader: RunReader | None = None  # the watch's, once it began
        self.resume_from = resume_from
        self._cost_at = 0.0
        self.spare = ""  # the controller node's own name, when it is this process's host
        self.extra_hourly_usd = 0.0  # the controller node's $/h (budget margin)
        # the trace (jobs/trace.py): its first phase began with this process
        self.trace = RunTrace(ledger, run_id)
        self.trace.phases.next(tr.STARTUP, at=self.trace.start)
        # the parts, each with what it needs (their docstrings say what they change)
        owner = f"run:{socket.gethostname()}:{os.getpid()}"
        self.lease_holder = LeaseHolder(self.state, ledger, self.observer, run_id, owner)
        self.provisioner = Provisioner(
            self.state,
            spec,
            ledger,
            self.observer,
            self.options,
            run_id,
            self.trace,
            self.lease_holder,
            resume_from,
        )
        self.failover = Failover(
            self.state,
            spec,
            ledger,
            self.observer,
            run_id,
            places,
            self.provisioner,
            self.lease_holder,
            resume_from,
            self._budget_spent,
        )
        self.recovery = Recovery(
            self.state, spec, ledger, self.observer, self.options, run_id, self.provisioner
        )
        self.budget = Budget(self.state, spec, ledger, self.options, run_id)

    # --- what callers ask of the parts -----------------------------------------------------
    def provision(self) -> None:
        """Bucket, bundle, cluster.json, network, then every node at once, in the plan's place
        or, where it cannot hold them, the next one (`Failover.land`). Blocks until the create
        calls return (not until the nodes boot)."""
        self.provisioner.open_store()
        self.failover.land()

    def node_request(self, node: NodePlan) -> NodeRequest:
        """The create request of `node` (Provisioner.node_request). Blocks (presigning)."""
        return self.provisioner.node_request(node)

    def take_lease(self, lease: Lease) -> None:
        """Act only while `lease` (held) holds (LeaseHolder.take_lease). Idempotent per lease."""
        self.lease_holder.take_lease(lease)

    def watch_yield(self, key: str) -> None:
        """Hand the lease back once `key` exists in the bucket (LeaseHolder.watch_yield)."""
        self.lease_holder.watch_yield(key)

    def hand_over(self, successor: str = "", ttl_s: float | None = None) -> None:
        """Stop renewing and hand the lease over (LeaseHolder.hand_over)."""
        self.lease_holder.hand_over(successor, ttl_s)

    def close_journal(self) -> None:
        """Write what the journal still holds (LeaseHolder.close_journal). Blocks, bounded."""
        self.lease_holder.close_journal()

    # --- the whole run ---------------------------------------------------------------------
    def run(self) -> RunResult:
        """Provision, watch, stop, tear down. Blocks. Tears down on every exit path.

        SIGINT, SIGTERM and SIGHUP (those not ignored at the start) stop the run as Ctrl-C
        does: a graceful stop, the teardown, outcome "interrupted" with the signal named in
        the detail. During the stop and the teardown every signal only warns (stop_signals).
        Before the ledger row exists a signal ends the call with StopSignal (nothing made)."""
        with StopSignals(self._signal_notice) as signals:
            return self._run(signals)

    def _run(self, signals: StopSignals) -> RunResult:
        ledger = self.ledger
        self.trace.phase(tr.BUNDLE)
        # the workdir is user input: check and pack it before anything exists
        self.bundle = build_spec_bundle(self.spec, cloudtrain_home() / "bundles")
        ledger.create_run(
            self.run_id,
            self.spec.name,
            self.provider.name,
            self.plan.region,
            self.plan.zone,
            str(self.spec.source_path or ""),
            self.store_uri,
            json.dumps(self.plan.to_dict()),
            account=self.provider.account(),
        )
        self.trace.recorded()
        return self._control(signals, self._provision_and_watch)

    def follow(self) -> RunResult:
        """An adopted run (cloudtrain/managed/adopt.py: the lease is held, the provider fenced):
        watch it from where it is, stop, tear down, as `run` does from its watch on. Blocks."""
        self.trace.recorded()  # the run's ledger row exists
        with StopSignals(self._signal_notice) as signals:
            return self._control(signals, self._watch_adopted)

    def _watch_adopted(self, _signals: StopSignals) -> tuple[Outcome, str] | RunResult:
        self._set_phase("running")
        return self.watch()

    def _provision_and_watch(self, signals: StopSignals) -> tuple[Outcome, str] | RunResult:
        self.observer.event(f"run {self.run_id} on {self.provider.name}")
        crash_point("ledger-row")
        self._set_phase("provisioning")
        self.provision()
        if not self.options.detach:
            self._set_phase("running")
            return self.watch()
        if self.options.controller:
            if self.hand_off is None:
                raise CloudtrainError("this run has no way to start a controller node")
            self.hand_off(self)  # hands the lease to the controller node
        signals.defer()  # the nodes exist: from here the controller leaves on purpose
        self.ledger.set_status(self.run_id, "running")
        if not self.options.controller:
            self.hand_over()  # expired now: `cloudtrain attach` takes it at once
            self.observer.event("detached: the nodes stop themselves at the deadline")
        self.trace.close()
        return self._result(Outcome.DETACHED, "")

    def _control(
        self,
        signals: StopSignals,
        body: Callable[[StopSignals], tuple[Outcome, str] | RunResult],
    ) -> RunResult:
        """Run `body` (provision and/or watch); then stop and tear down on every exit path but
        a detached one, and none when the lease was lost (its new holder goes on)."""
        outcome, detail = Outcome.FAILED, ""
        detached = False
        try:
            got = body(signals)
            if isinstance(got, RunResult):
                detached = True
                return got
            outcome, detail = got
        except LeaseLost as exc:
            outcome, detail = Outcome.LEASE_LOST, str(exc)
        except KeyboardInterrupt as exc:  # Ctrl-C, or StopSignal: SIGTERM, SIGHUP
            outcome, detail = Outcome.INTERRUPTED, stop_detail(exc)
        except Stop as stop:
            outcome, detail = stop.outcome, stop.detail
        except CloudtrainError as exc:
            outcome, detail = Outcome.FAILED, str(exc)
        except Exception as exc:  # a bug meeting odd input: the run still ends in teardown
            outcome, detail = Outcome.FAILED, self._crashed(exc)
        finally:
            if not detached:
                # CPython runs a signal's Python handler only at a call or a backward jump
                # (ceval's eval breaker): none can raise between `finally:` and this `try`
                try:
                    signals.defer()
                except KeyboardInterrupt as exc:  # the first signal, just now
                    outcome, detail = Outcome.INTERRUPTED, stop_detail(exc)
                result = self._finish(outcome, detail)
            self.close_journal()
        return result

    def _crashed(self, exc: Exception) -> str:
        """The detail of a run an unexpected exception ended; its traceback goes to the
        ledger (bounded), so `cloudtrain status` keeps it. Blocks (one ledger write)."""
        detail = f"controller error: {type(exc).__name__}: {exc}"[:MAX_CRASH_DETAIL]
        with contextlib.suppress(Exception):
            tb = traceback.format_exc()[-MAX_CRASH_TRACE:]
            self.ledger.event(self.run_id, "crash", f"{detail}; tearing down\n{tb}")
        return detail

    def _display_failed(self, message: str) -> None:
        """The guarded observer's one report of a broken display (the run goes on)."""
        with contextlib.suppress(Exception):  # before the ledger row exists: nowhere to say it
            self.ledger.event(self.run_id, "display", f"{message}; the run goes on")

    def _signal_notice(self, signum: int) -> None:
        """The one warning for a signal that came during the stop or the teardown."""
        self.observer.event(
            f"{signal_name(signum)} received: the stop and teardown under way finish first "
            f"(`cloudtrain down {self.run_id}` also tears the run down)"
        )

    def _finish(self, outcome: Outcome, detail: str) -> RunResult:
        ledger = self.ledger
        if outcome == Outcome.LEASE_LOST:  # its holder stops and tears down, not this process
            return self._fenced_result(outcome, detail, detail)
        if self.trace.phases.current not in (tr.END, tr.STOP):
            self.trace.phase(tr.END)
        node_spans = []
        if self.reader is not None:  # the nodes' spans (written before their final status)
            nodes = [node_id(nv.role, nv.index) for nv in self.view.nodes]
            try:  # the nodes wrote them: nothing in them may stand before the teardown
                node_spans = read_node_traces(self.store, self.run_id, nodes)
            except Exception as exc:  # see above
                self.observer.event(f"warning: the nodes' traces are unreadable: {exc!r}"[:300])
        try:
            keep, teardown_s = self._stop_and_tear_down(outcome, detail)
        except LeaseLost as exc:  # taken meanwhile (`cloudtrain down`): its holder tears down
            return self._fenced_result(outcome, detail, str(exc))
        if not self.spare:  # the controller node hands over after deleting itself
            self.hand_over()  # expired now: the next `attach` or `down` takes it at once
        result = self._result(outcome, detail)
        result.teardown_s = teardown_s
        if self.job_end is not None and not keep:
            result.teardown_lag_s = time.time() - self.job_end
        ledger.event(self.run_id, "end", f"{outcome}: {detail}")
        self.trace.close()
        result.trace = trace_json([*self.trace.spans(), *node_spans], self._chief_name())
        return result

    def _fenced_result(self, outcome: Outcome, detail: str, why: str) -> RunResult:
        """The result of a run whose lease this process lost (see LeaseHolder.stop_acting)."""
        outcome, detail = self.lease_holder.stop_acting(outcome, detail, why)
        self.trace.close()
        return self._result(outcome, detail)

    def _stop_and_tear_down(self, outcome: Outcome, detail: str) -> tuple[bool, float]:
        """The graceful stop (when the run was stopped) and the teardown, unless the spec keeps
        a failed run's nodes. Returns (kept, teardown seconds). Raises LeaseLost. Blocks."""
        ledger = self.ledger
        if outcome in (Outcome.INTERRUPTED, Outcome.BUDGET_EXCEEDED, Outcome.DEADLINE):
            try:
                self._graceful_stop(outcome)
            except LeaseLost:
                raise
            except Exception as exc:  # best effort: the teardown is not
                self.observer.event(f"warning: the graceful stop failed ({exc!r}); tearing down")
            if self.job_end is None:  # the job ended when its agents had stopped
                self.job_end = time.time()
        keep = self.spec.teardown == "keep-on-failure" and outcome == Outcome.FAILED
        teardown_s = 0.0
        if keep:
            self.observer.event(
                f"keeping the nodes for inspection (teardown: keep-on-failure); "
                f"`cloudtrain down {self.run_id}` deletes them"
            )
            ledger.set_status(self.run_id, "running", outcome, detail)
        else:
            self.trace.phase(tr.TEARDOWN)
            self._set_phase("tearing down")
            ledger.set_status(self.run_id, "tearing_down")
            report = teardown(
                self.provider,
                ledger,
                self.run_id,
                self.observer.event,
                spare=self.spare,
                trace=self.trace.tracer,
            )
            teardown_s = report.seconds
            scrub_secrets(self.provider, self.store_uri, self.run_id)
            ledger.set_status(self.run_id, "done", outcome, detail)
        return keep, teardown_s

    def detached_result(self) -> RunResult:
        """The result of a run this process hands over (outcome detached). Blocks (a listing)."""
        return self._result(Outcome.DETACHED, "")

    def _result(self, outcome: Outcome, detail: str) -> RunResult:
        route = self.failover.route.text() if self.failover.route else ""
        return run_result(self.state, self.ledger, self.run_id, outcome, detail, route)

    def _set_phase(self, phase: str) -> None:
        self.view.phase = phase
        self.observer.update(self.view)

    # --- watching --------------------------------------------------------------------------
    def watch(self) -> tuple[Outcome, str]:
        """Poll the bucket and the cloud until the job ends; returns (outcome, detail).
        Raises Stop for deadline/budget/failure and KeyboardInterrupt for a stop signal."""
        nodes = [node_id(nv.role, nv.index) for nv in self.view.nodes]
        reader = self.reader = RunReader(self.store, self.run_id, nodes=nodes)
        opts = self.options
        self.trace.phase(tr.WATCH, self.attempt)
        waiter = self._waiter()
        self.ledger.set_status(self.run_id, "running")
        last_list = 0.0
        attempt_started = time.time()
        failed_since: float | None = None
        chief = self._chief_name()
        snap = reader.snapshot
        while True:
            self.lease_holder.check()
            now = time.time()
            gone: list[str] = []
            if now - last_list >= opts.list_nodes_s:
                last_list = now
                # the cloud first, then the bucket: a report a node wrote before it vanished
                # is read in the same round as its vanishing (runrules.judge_attempt, rule 1)
                gone = self.recovery.lost_nodes(snap, attempt_started)
            snap = reader.poll()
            self.recovery.check_bootstrap(snap)
            self._refresh_view(snap)
            self._show_lines(snap)  # after the statuses: the end is judged first
            if snap.stop_requested:  # only `cloudtrain down` writes it while a run is watched
                raise Stop(Outcome.INTERRUPTED, STOPPED_BY_DOWN)
            chief_status = snap.statuses.get(chief)
            if (
                chief_status is not None
                and chief_status.attempt == self.attempt
                and chief_status.state == NodeState.SUCCEEDED
            ):
                self.job_end = now
                self.trace.phase(tr.END)
                self._settle(reader)
                return Outcome.SUCCEEDED, f"{chief} finished"
            reports = read_reports(snap, self.attempt)
            if reports.failed and failed_since is None:
                failed_since = now
            noticed = self.recovery.noticed(snap)
            verdict = judge_attempt(
                set(gone),
                reports.reported_lost | set(noticed),
                set(reports.failed),
                failed_since,
                self.recovery.heard(snap),
                time.time(),
                opts.failure_grace_s,
            )
            if verdict.action == "restart":
                self.recovery.restart(verdict, sorted(set(gone) | set(noticed)))
                self.trace.phase(tr.WATCH, self.attempt)
                attempt_started, failed_since = time.time(), None
                continue
            if verdict.action == "failed":
                self.recovery.after_failure([reports.failed[n] for n in verdict.failed])
                self.trace.phase(tr.WATCH, self.attempt)
                attempt_started, failed_since = time.time(), None
                continue
            if now > self.deadline:
                raise Stop(Outcome.DEADLINE, f"max_hours ({self.spec.max_hours} h) reached")
            spent = self._budget_spent()
            if spent is not None:
                raise Stop(Outcome.BUDGET_EXCEEDED, spent)
            waiter.wait(opts.poll_s)  # on local: up as soon as a status, notice or control changes

    def _show_lines(self, snap: Snapshot) -> None:
        """Show the poll's new log lines, the last LINES_PER_POLL of them at most, and say how
        many were left out: a job printing a flood of lines would otherwise hold the watch for
        minutes of billed nodes on a terminal (issue 29). `cloudtrain logs` has them all."""
        lines = snap.new_lines
        left_out = len(lines) - LINES_PER_POLL
        if left_out > 0:
            nodes = sorted({node for node, _ in lines[:left_out]})
            self.observer.event(
                f"{left_out} lines not shown ({', '.join(nodes)[:200]}): "
                f"`cloudtrain logs {self.run_id}` has them all"
            )
            lines = lines[left_out:]
        for node, line in lines:
            self.observer.log_line(node, line)

    def _waiter(self) -> ChangeWaiter:
        """Wakes the watch when a node's status or notice, or the run's control, changes
        (providers/change_wait.py: at once on local, after the timeout elsewhere)."""
        run = protocol.run_prefix(self.run_id)
        folders = [protocol.status_prefix(self.run_id), f"{run}notice/", f"{run}control/"]
        return ChangeWaiter(self.store.uri, folders)

    def _budget_spent(self) -> str | None:
        """Why the budget stops the run, None while it may go on (cloudtrain/run/budget.py).
        Blocks (a ledger read)."""
        return self.budget.reached(self.extra_hourly_usd)

    def _settle(self, reader: RunReader) -> None:
        """After the chief's success, give the other agents `settle_s` to report their end
        (parameter servers and evaluators end themselves once they see the chief is done)."""
        end = time.time() + self.options.settle_s
        waiter = self._waiter()
        while time.time() < end:
            snap = reader.poll()
            self._show_lines(snap)
            self._refresh_view(snap)  # the nodes' last heartbeats carry their final figures
            final = {
                k
                for k, v in snap.statuses.items()
                if v.attempt == self.attempt and v.state in FINAL_STATES
            }
            if len(final) >= len(self.view.nodes):
                return
            waiter.wait(0.2)

    def _chief_name(self) -> str:
        roles = self.plan.roles()
        return "chief-0" if roles.get("chief") else "worker-0"

    def _refresh_view(self, snap: Snapshot) -> None:
        for nv in self.view.nodes:
            short = node_id(nv.role, nv.index)
            status = snap.statuses.get(short)
            beat = snap.heartbeats.get(short)
            if status:
                nv.agent_state = str(status.state)
                if nv.agent_state == NodeState.RENDEZVOUS:
                    crash_point("rendezvous")
                nv.attempt = status.attempt
            elif short in snap.bootstrap_phases:  # still booting: show the bootstrap's phase
                nv.agent_state = snap.bootstrap_phases[short]
            if beat:
                nv.epoch, nv.epochs = beat.epoch, beat.epochs
                if nv.epoch is not None:
                    crash_point("training")
                nv.last_line = beat.last_line
                nv.activity = beat.activity
        hourly = self.plan.hourly_usd + self.extra_hourly_usd
        self.view.throughput = of_attempt(snap.heartbeats, self.attempt, hourly)
        now = time.time()
        if now - self._cost_at >= 1.0:  # a ledger query: once a second is enough for the meter
            self._cost_at = now
            self.view.cost_usd = self.ledger.billed_cost(self.run_id)
        self.observer.update(self.view)

    def _graceful_stop(self, reason: Outcome) -> None:
        """Write control/stop and give the agents time to flush a checkpoint and report."""
        self.trace.phase(tr.STOP)
        self._set_phase("stopping")
        self.ledger.set_status(self.run_id, "stopping")
        if not request_stop(self.provider, self.store_uri, self.run_id, str(reason)):
            return
        live, queued = self.provisioner.agent_nodes()
        if queued and not live:
            self.observer.event("stop requested: the job still waits in the queue, no agent runs")
            return
        self.observer.event("stop requested: agents flush a checkpoint")
        crash_point("stop")
        # the watch's reader, where its cursors are: a new one would print every line again
        nodes = [node_id(nv.role, nv.index) for nv in self.view.nodes]
        reader = self.reader or RunReader(self.store, self.run_id, nodes=nodes)
        end = time.time() + self.options.stop_grace_s
        waiter = self._waiter()
        while time.time() < end and live:
            snap = reader.poll()
            self._show_lines(snap)
            done = {k for k, v in snap.statuses.items() if v.state == NodeState.STOPPED}
            if live <= done:
                break
            waiter.wait(min(0.5, self.options.poll_s))
