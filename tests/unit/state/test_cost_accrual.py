"""Cost accrual on a scripted clock: a node bills from its create intent to its confirmed delete
and never after, and the seconds between the job's end and the delete are reported as billed
idle time. The nodes live behind the faults wrapper (latency and throttled calls), so the delete
is confirmed late, as on a slow cloud; the ledger's clock is advanced by the test and by every
compute call the wrapper lets through."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.providers.base import NodeRequest, Resource, RunInfo
from cloudtrain.providers.faults import FaultPlan, wrap
from cloudtrain.providers.retrying import wrap_provider
from cloudtrain.run.teardown import teardown
from cloudtrain.state.ledger import Ledger
from tests.fakes.memory_provider import MemoryProvider

RUN = "acc-abc123"
PRICE = 36.0  # $/h per node: $0.01 per second


class ScriptedClock:
    """Seconds since the epoch that move only when told to."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def test_cost_accrues_only_while_nodes_exist_and_idle_is_billed(tmp_path: Path) -> None:
    clock = ScriptedClock()
    ledger = Ledger(tmp_path / "ledger.db", clock=clock)
    ledger.create_run(RUN, "acc", "memory", "r", None, None, "mem://b", None)
    memory = MemoryProvider()
    provider = wrap_provider(wrap(memory, FaultPlan(error_rate=0.3, seed=7)))
    compute = provider.compute
    slow_calls = {"n": 0}
    inner_delete = memory.compute.delete_node

    def delete_slowly(node):  # type: ignore[no-untyped-def]
        clock.advance(20.0)  # the cloud takes 20 s to confirm each delete
        slow_calls["n"] += 1
        inner_delete(node)

    memory.compute.delete_node = delete_slowly  # type: ignore[method-assign]
    run = RunInfo(RUN, "r", None, (2222, 2223))
    requests = [NodeRequest(RUN, "worker", i, "small", "#!/bin/sh\n") for i in range(2)]
    for req in requests:
        ledger.record_intent(Resource("memory", "node", req.name, "r", RUN), PRICE)
    compute.create_nodes(run, requests)  # throttled calls are retried by the retry layer
    for req in requests:
        ledger.mark_created(RUN, "node", req.name)

    clock.advance(100.0)  # 100 s of training
    assert ledger.billed_cost(RUN) == pytest.approx(2 * 100 * 0.01)
    job_end = clock()
    clock.advance(30.0)  # the controller notices the end 30 s later, then tears down
    report = teardown(provider, ledger, RUN)
    assert sorted(report.nodes_deleted) == sorted(r.name for r in requests)
    assert slow_calls["n"] >= 2
    deleted_at = clock()

    clock.advance(3600.0)  # an hour after the teardown: nothing accrues any more
    bills = ledger.node_bills(RUN, job_end=job_end)
    total = sum(cost for cost, _ in bills.values())
    assert total == pytest.approx(ledger.billed_cost(RUN))
    assert ledger.billed_cost(RUN) == ledger.billed_cost(RUN, now=deleted_at)
    idle = {name: s for name, (_, s) in bills.items()}
    assert all(s is not None and 30.0 < s <= deleted_at - job_end for s in idle.values()), idle
    assert total == pytest.approx(sum(0.01 * (100 + s) for s in idle.values() if s))  # type: ignore[operator]
