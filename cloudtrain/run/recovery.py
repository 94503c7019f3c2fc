"""How a run recovers, or ends, when nodes are lost or fail: the orchestrator's side of the
rules in `runrules` (which nodes are lost, which failed, what a restart or a retry re-creates).

`Recovery` is a part the Orchestrator holds; its inputs are stated in its constructor. Every
method blocks on the cloud or the bucket; those that end the run raise `Stop`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cloudtrain.core.redact import Redactor
from cloudtrain.jobs.protocol import node_id
from cloudtrain.jobspec.runrules import Verdict, node_lost
from cloudtrain.providers.base import node_name
from cloudtrain.run.view import Outcome
from cloudtrain.state.failures import NodeFailure, describe, not_retried, repeats
from cloudtrain.state.runstate import Snapshot, archive_bootstrap_log

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.jobspec.run_options import RunOptions
    from cloudtrain.plan.planner import NodePlan
    from cloudtrain.run.provisioning import Provisioner
    from cloudtrain.run.run_state import RunState
    from cloudtrain.run.view import Observer
    from cloudtrain.state.ledger import Ledger


class Stop(Exception):
    """End the watch with an outcome (Outcome.FAILED, Outcome.DEADLINE, ...) and its detail."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome, self.detail = Outcome(outcome), detail


class Recovery:
    """Lost nodes restart the attempt; failed nodes end the run or, within
    max_restarts_on_errors, retry it.

    Inputs: the run's shared `state`, its `spec` (the restart limits, the secrets to redact),
    `ledger`, `observer`, `options` (the timeouts), `run_id`, and the `provisioner` that lists,
    re-creates and moves the nodes to a new attempt (`list_nodes`, `create_nodes`,
    `write_cluster`). It changes `state.attempt`, `state.job_end` (a run it ends),
    `state.view` (the attempt, each node's cloud state) and its own counters `restarts` and
    `error_retries` (an adopted run's are set from its events)."""

    def __init__(
        self,
        state: RunState,
        spec: JobSpec,
        ledger: Ledger,
        observer: Observer,
        options: RunOptions,
        run_id: str,
        provisioner: Provisioner,
    ) -> None:
        self.state, self.spec, self.ledger, self.observer = state, spec, ledger, observer
        self.options, self.run_id, self.provisioner = options, run_id, provisioner
        self.restarts = 0  # of lost nodes (max_restarts)
        # node -> when it was last seen pending in a gang compute's queue (`lost_nodes`)
        self._queued_at: dict[str, float] = {}
        self.error_retries = 0  # of failed nodes (max_restarts_on_errors)

    def noticed(self, snap: Snapshot) -> list[str]:
        """Nodes whose agent reported a preemption notice in this attempt: replaced at once,
        not when the cloud finally reports them gone."""
        noticed = [k for k, v in snap.notices.items() if v.attempt == self.state.attempt]
        for short in noticed:
            self.observer.event(f"{short}: preemption notice from the cloud")
        return sorted(noticed)

    def lost_nodes(self, snap: Snapshot, attempt_started: float) -> list[str]:
        """Nodes gone from the cloud, preempted, silent past the heartbeat timeout, or never
        booted within the boot timeout. On a gang compute (a scheduler's queue: Slurm) a node
        still pending waits for its allocation, not for a machine: it is never lost for that,
        and its boot timeout counts from when it was last seen pending."""
        opts = self.options
        listed = self.provisioner.list_nodes()
        self.provisioner.bill_allocations(listed)  # a gang's bill starts when its job runs
        live = {n.name: n for n in listed}
        lost = []
        now = time.time()
        queued = self.state.provider.compute.gang
        for nv in self.state.view.nodes:
            short = node_id(nv.role, nv.index)
            node = live.get(nv.name)
            nv.cloud_state = node.state if node else "missing"
            if node is not None and node.detail:  # the cloud's words: why it waits
                nv.cloud_state = node.detail[:120]
            if queued and node is not None and node.state == "pending":
                self._queued_at[short] = now
                continue
            beat = snap.heartbeats.get(short)
            beat_time = beat.time if beat else None
            started = max(attempt_started, self._queued_at.get(short, 0.0))
            if node_lost(node is not None and node.alive, beat_time, started, now, opts):
                lost.append(short)
                if node is not None and node.state == "preempted":  # the cloud's, or Slurm's
                    self.observer.event(f"{short}: preempted ({node.detail or 'by the cloud'})")
        return lost

    def heard(self, snap: Snapshot) -> dict[str, float]:
        """When this controller last read a new heartbeat of each node beating in this
        attempt (judge_attempt's `heard`)."""
        return {
            node: snap.heartbeat_seen[node]
            for node, beat in snap.heartbeats.items()
            if beat.attempt == self.state.attempt and node in snap.heartbeat_seen
        }

    def check_bootstrap(self, snap: Snapshot) -> None:
        """A node whose startup script failed is not restarted (it would fail the same way):
        the run ends at once with the script's own reason. Raises Stop."""
        for short, reason in sorted(snap.bootstrap_failures.items()):
            self.state.job_end = time.time()
            raise Stop(
                Outcome.FAILED,
                f"{short} failed to bootstrap: {reason} "
                f"(`cloudtrain logs {self.run_id} --bootstrap` has the whole log)",
            )

    def after_failure(self, failures: list[NodeFailure]) -> None:
        """Nodes failed on their own (runrules.judge_attempt): a new attempt while
        `max_restarts_on_errors` allows (the failed nodes' agents follow it; a node that is
        gone, as a crashed agent's is, is created again), else the run ends; a failure that
        would repeat (failures.repeats: the firewall) ends it at once. Raises Stop."""
        told = describe(failures, Redactor(self.spec.secret_values()))
        allowed = self.spec.max_restarts_on_errors
        if self.error_retries >= allowed or any(repeats(f) for f in failures):
            self.state.job_end = time.time()
            self.observer.event(f"{told.splitlines()[0]}; ending the run")
            raise Stop(Outcome.FAILED, f"{told}\n{not_retried(allowed, self.run_id, failures)}")
        self.error_retries += 1
        what = ", ".join(f.node for f in failures)
        self.state.attempt += 1
        self.observer.event(
            f"{told.splitlines()[0]}; retry {self.error_retries}/{allowed} "
            f"(max_restarts_on_errors): attempt {self.state.attempt}"
        )
        live = {n.name for n in self.provisioner.list_nodes() if n.alive}
        dead = [
            node_id(n.role, n.index) for n in self.state.plan.nodes if self._name(n) not in live
        ]
        self._next_attempt("retry", what, dead, detail=f"{what} failed")

    def restart(self, verdict: Verdict, recreate: list[str]) -> None:
        """Recreate lost nodes and move every agent to the next attempt (they resume from
        `checkpoints/`). Raises Stop when max_restarts is used up."""
        self.restarts += 1
        what = ", ".join(verdict.lost)
        if self.restarts > self.spec.max_restarts:
            self.state.job_end = time.time()
            raise Stop(
                Outcome.FAILED, f"{what} lost again after {self.spec.max_restarts} restart(s)"
            )
        self.state.attempt += 1
        with_it = f" ({', '.join(verdict.failed)} failed with it)" if verdict.failed else ""
        self.observer.event(
            f"{what} lost{with_it}; restart {self.restarts}/{self.spec.max_restarts}: "
            f"attempt {self.state.attempt}"
        )
        self._next_attempt("restart", what, recreate)

    def _next_attempt(
        self, kind: str, what: str, recreate: list[str], detail: str | None = None
    ) -> None:
        """Record `kind` ("restart", "retry") of attempt `state.attempt` (with `detail`, else
        `what`), move every agent to it (they resume from `checkpoints/`), and create the
        `recreate` nodes again. Blocks."""
        self.ledger.event(self.run_id, kind, f"attempt {self.state.attempt}: {detail or what}")
        self.provisioner.write_cluster()
        self._recreate(recreate)
        self.state.view.attempt = self.state.attempt

    def _name(self, node: NodePlan) -> str:
        return node_name(self.run_id, node.role, node.index)

    def _recreate(self, shorts: list[str]) -> None:
        """Delete these nodes (e.g. "worker-1") and create them again, each bootstrap log
        archived first (`archive_bootstrap_log`); on a gang compute (`Compute.gang`: one
        allocation holds them all) every node of the plan, whichever were lost. Blocks until
        the create calls return."""
        if not shorts:
            return
        by_short = {node_id(n.role, n.index): n for n in self.state.plan.nodes}
        if self.state.provider.compute.gang:
            shorts = list(by_short)
        names = [self._name(by_short[s]) for s in shorts]
        self.state.provider.compute.delete_nodes(self.run_id, names)  # retried by the provider
        for name in names:
            self.ledger.mark_deleted(self.run_id, "node", name)
        self.provisioner.end_allocations()  # the cancelled job's bill stops
        for short in shorts:  # the old log must not speak for the new node
            archive_bootstrap_log(self.state.store, self.run_id, short, self.state.attempt - 1)
        self.provisioner.create_nodes([by_short[s] for s in shorts])
