"""The result a run's Orchestrator returns (cloudtrain/run/orchestrator.py): what the run made,
what it cost, where it went."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cloudtrain.jobs import protocol
from cloudtrain.run.view import Outcome, RunResult

if TYPE_CHECKING:
    from cloudtrain.run.run_state import RunState
    from cloudtrain.state.ledger import Ledger


def run_result(
    state: RunState,
    ledger: Ledger,
    run_id: str,
    outcome: Outcome,
    detail: str,
    route: str,
) -> RunResult:
    """The run's result as it stands: its model and checkpoints in `state.store` (where they
    exist), its cost per node from the ledger (billed until now, idle since `state.job_end`),
    its attempts, throughput and failover `route` (`Route.text()`, "" when it never moved).
    Blocks (two listings, a ledger read)."""
    model = protocol.model_prefix(run_id)
    checkpoints = protocol.checkpoints_prefix(run_id)
    uri = {key: state.store.uri.rstrip("/") + "/" + key for key in (model, checkpoints)}
    outputs = {key for key in (model, checkpoints) if state.store.list(key)}
    now = time.time()
    bills = ledger.node_bills(run_id, state.job_end, now)
    by_node = {name: cost for name, (cost, _) in bills.items()}
    idle = {name: s for name, (_, s) in bills.items() if s is not None}
    return RunResult(
        run_id=run_id,
        outcome=outcome,
        detail=detail,
        model_uri=uri[model] if model in outputs else "",
        checkpoints_uri=uri[checkpoints] if checkpoints in outputs else "",
        wall_s=now - state.started,
        cost_usd=sum(by_node.values()),
        cost_by_node=by_node,
        attempts=state.attempt,
        billed_idle_s=idle,
        throughput=state.view.throughput,
        route=route,
    )
