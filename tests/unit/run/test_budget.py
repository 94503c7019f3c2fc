"""cloudtrain/run/budget.py on a real ledger: GPU-hours are the billed rows' lives times the plan's
GPUs (a VM node its own; a gang compute's allocation all of them, its queued nodes none); a cap
is reached once what is used plus the stop and teardown margin meets it, with a line naming it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.providers.base import Resource, node_name
from cloudtrain.run.budget import Budget
from cloudtrain.state.ledger import ALLOCATION, Ledger

RUN = "digits-0a1b2c"
OPTIONS = SimpleNamespace(stop_grace_s=30.0, teardown_margin_s=330.0)  # a 0.1 h margin


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def budget(
    tmp_path: Path,
    gang: bool,
    max_gpu_hours: float | None = None,
    max_cost_usd: float | None = None,
) -> tuple[Budget, Ledger, Clock, SimpleNamespace]:
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.db", clock=clock)
    ledger.create_run(RUN, "digits", "slurm", "gpu", None, "", "slurm:///b", "{}")
    plan = SimpleNamespace(
        hourly_usd=1.5,
        nodes=[SimpleNamespace(role="worker", index=i, accelerator_count=2) for i in range(2)]
        + [SimpleNamespace(role="ps", index=0, accelerator_count=0)],
    )
    state = SimpleNamespace(
        plan=plan,
        provider=SimpleNamespace(compute=SimpleNamespace(gang=gang)),
        view=SimpleNamespace(cost_usd=0.0),
    )
    spec = SimpleNamespace(max_gpu_hours=max_gpu_hours, max_cost_usd=max_cost_usd)
    made = Budget(state, spec, ledger, OPTIONS, RUN)  # type: ignore[arg-type]
    return made, ledger, clock, state


def record(ledger: Ledger, kind: str, rid: str) -> None:
    ledger.record_intent(Resource("slurm", kind, rid, "gpu", RUN))
    ledger.mark_created(RUN, kind, rid)


def test_a_vm_node_counts_its_own_gpus_from_its_intent(tmp_path: Path) -> None:
    spent, ledger, clock, _ = budget(tmp_path, gang=False)
    for role, index in (("worker", 0), ("worker", 1), ("ps", 0)):
        record(ledger, "node", node_name(RUN, role, index))
    clock.now += 1800
    ledger.mark_deleted(RUN, "node", node_name(RUN, "worker", 1))
    clock.now += 1800
    # worker-0: 2 GPUs x 1 h; worker-1: 2 x 0.5 h; the ps: none
    assert spent.gpu_hours(clock.now) == pytest.approx(3.0)


def test_a_gang_counts_its_allocations_not_its_queued_nodes(tmp_path: Path) -> None:
    spent, ledger, clock, _ = budget(tmp_path, gang=True)
    for index in (0, 1):
        record(ledger, "node", node_name(RUN, "worker", index))
    clock.now += 7200  # two hours in the queue: nothing
    assert spent.gpu_hours(clock.now) == 0.0
    record(ledger, ALLOCATION, "job-41")
    clock.now += 900
    ledger.mark_deleted(RUN, ALLOCATION, "job-41")
    record(ledger, ALLOCATION, "job-42")
    clock.now += 900
    assert spent.gpu_hours(clock.now) == pytest.approx(4 * 0.5)  # 4 GPUs x (0.25 + 0.25) h


def test_the_gpu_hour_cap_is_reached_with_its_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spent, ledger, clock, _ = budget(tmp_path, gang=True, max_gpu_hours=2.0)
    monkeypatch.setattr("cloudtrain.run.budget.time.time", clock)
    record(ledger, ALLOCATION, "job-41")
    clock.now += 0.39 * 3600  # 1.56 GPU-hours + 4 GPUs x 0.1 h of margin = 1.96
    assert spent.reached() is None
    clock.now += 0.02 * 3600  # 1.64 + 0.4 = 2.04
    assert (
        spent.reached()
        == "1.64 GPU-hours reached the budget (2 GPU-hours, less the teardown margin)"
    )


def test_the_dollar_cap_is_reached_with_its_margin(tmp_path: Path) -> None:
    spent, _, _, state = budget(tmp_path, gang=False, max_cost_usd=1.0)
    state.view.cost_usd = 0.84  # + $1.5/h x 0.1 h = 0.99
    assert spent.reached() is None
    state.view.cost_usd = 0.86
    assert spent.reached() == "cost $0.86 reached the budget ($1.00, less the teardown margin)"
    # a controller node's $/h counts in the margin: $0.84 + $2/h x 0.1 h
    state.view.cost_usd = 0.84
    assert spent.reached(extra_hourly_usd=0.5) is not None
