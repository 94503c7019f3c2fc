"""A run's budget: `max_cost_usd` (dollars) and `max_gpu_hours` (GPUs x hours, the unit a cluster
charges in: a Slurm allocation of 4 GPUs for 2 h uses 8), each spent from the ledger's bill and
each with the margin of what the graceful stop and the teardown will still use.

GPU-hours, like dollars, are the ledger's rule (Ledger.billed_cost): a billed row's life times its
GPUs, the plan's. A VM's node counts its own GPUs from its intent to its delete; a gang compute's
nodes count nothing (they wait in the queue for free) and its allocations count every GPU of the
plan while they run (cloudtrain/run/provisioning.py bill_allocations). A TPU slice's chips count
as its accelerators. `Budget` is a part the Orchestrator holds (cloudtrain/run/orchestrator.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cloudtrain.providers.base import node_name
from cloudtrain.state.ledger import ALLOCATION

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.jobspec.run_options import RunOptions
    from cloudtrain.run.run_state import RunState
    from cloudtrain.state.ledger import Ledger


class Budget:
    """The caps of `spec` for run `run_id`: `reached()` says which is spent. Inputs: the run's
    shared `state` (its plan, provider and metered cost `view.cost_usd`), the `ledger`, the
    `options` (the margins)."""

    def __init__(
        self, state: RunState, spec: JobSpec, ledger: Ledger, options: RunOptions, run_id: str
    ) -> None:
        self.state, self.spec, self.ledger, self.options = state, spec, ledger, options
        self.run_id = run_id

    def _margin_hours(self) -> float:
        """The hours the graceful stop and the teardown take. Pure."""
        return (self.options.stop_grace_s + self.options.teardown_margin_s) / 3600

    def gpu_hours(self, now: float | None = None) -> float:
        """The GPU-hours the run has used so far, every attempt and place (module docstring).
        Read-only; blocks (a ledger read)."""
        at = time.time() if now is None else now
        st = self.state
        gpus = {node_name(self.run_id, n.role, n.index): n.accelerator_count for n in st.plan.nodes}
        gang = st.provider.compute.gang
        used = 0.0
        for r in self.ledger.resources(self.run_id):
            hours = max(0.0, (r.deleted_at if r.deleted_at is not None else at) - r.created_at)
            if r.kind == ALLOCATION:
                used += hours / 3600 * sum(gpus.values())
            elif r.kind == "node" and not gang:
                used += hours / 3600 * gpus.get(r.resource_id, 0)
        return used

    def reached(self, extra_hourly_usd: float = 0.0) -> str | None:
        """Why the run must stop for its budget (the cap spent, less the margin; a controller
        node's `extra_hourly_usd` counts in the dollars' margin), None while it may go on.
        Blocks (a ledger read, only with max_gpu_hours)."""
        max_cost = self.spec.max_cost_usd
        if max_cost is not None:
            hourly = self.state.plan.hourly_usd + extra_hourly_usd
            if self.state.view.cost_usd + hourly * self._margin_hours() >= max_cost:
                return (
                    f"cost ${self.state.view.cost_usd:.2f} reached the budget "
                    f"(${max_cost:.2f}, less the teardown margin)"
                )
        max_gpu_hours = self.spec.max_gpu_hours
        if max_gpu_hours is not None:
            gpus = sum(n.accelerator_count for n in self.state.plan.nodes)
            used = self.gpu_hours()
            if used + gpus * self._margin_hours() >= max_gpu_hours:
                return (
                    f"{used:.2f} GPU-hours reached the budget "
                    f"({max_gpu_hours:g} GPU-hours, less the teardown margin)"
                )
        return None
