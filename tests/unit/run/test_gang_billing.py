"""A gang compute's bill (cloudtrain/run/provisioning.py bill_allocations, end_allocations) in a
real ledger: its nodes wait in the queue for free; the allocation bills at the plan's $/h from
when its job is first seen running to when it is cancelled; a restart's new job is a new
allocation; a VM compute records none (its nodes bill from their intent)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import Node, Resource
from cloudtrain.run.provisioning import Provisioner
from cloudtrain.run.teardown import settle_allocations
from cloudtrain.state.ledger import ALLOCATION, Ledger

RUN = "digits-0a1b2c"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def setup(tmp_path: Path, gang: bool) -> tuple[Provisioner, Ledger, Clock]:
    clock = Clock()
    ledger = Ledger(tmp_path / "ledger.db", clock=clock)
    ledger.create_run(RUN, "digits", "slurm", "gpu", None, "", "slurm:///b", "{}")
    plan = SimpleNamespace(
        region="gpu", nodes=[SimpleNamespace(price_hourly=0.5) for _ in range(3)]
    )
    state = SimpleNamespace(
        plan=plan, provider=SimpleNamespace(name="slurm", compute=SimpleNamespace(gang=gang))
    )
    prov = Provisioner(state, None, ledger, None, None, RUN, None, None)  # type: ignore[arg-type]
    return prov, ledger, clock


def nodes(state: str, job: str) -> list[Node]:
    return [
        Node(f"ct-{RUN}-worker-{i}", RUN, "worker", i, state, cloud_id=job)  # type: ignore[arg-type]
        for i in range(3)
    ]


def test_queue_time_is_free_and_each_allocation_bills_while_its_job_runs(tmp_path: Path) -> None:
    prov, ledger, clock = setup(tmp_path, gang=True)
    for i in range(3):  # the nodes' intents, as create_nodes records them on a gang compute
        ledger.record_intent(Resource("slurm", "node", f"ct-{RUN}-worker-{i}", "gpu", RUN), 0.0)
    prov.bill_allocations(nodes("pending", "41"))
    clock.now += 7200  # two hours in the queue
    prov.bill_allocations(nodes("pending", "41"))
    assert ledger.billed_cost(RUN) == 0.0
    prov.bill_allocations(nodes("running", "41"))  # it starts: 3 nodes x $0.5/h from now
    clock.now += 1800
    prov.bill_allocations(nodes("running", "41"))  # seen again: still one allocation
    assert ledger.billed_cost(RUN) == pytest.approx(0.75)
    prov.end_allocations()  # a restart cancelled it
    clock.now += 3600  # the next job waits an hour: free
    prov.bill_allocations(nodes("pending", "42"))
    assert ledger.billed_cost(RUN) == pytest.approx(0.75)
    prov.bill_allocations(nodes("running", "42"))
    clock.now += 3600
    prov.end_allocations()
    assert ledger.billed_cost(RUN) == pytest.approx(0.75 + 1.5)
    rows = [r for r in ledger.resources(RUN) if r.kind == ALLOCATION]
    assert [(r.resource_id, r.state) for r in rows] == [
        ("job-41", "deleted"),
        ("job-42", "deleted"),
    ]
    assert set(ledger.node_bills(RUN)) >= {"job-41", "job-42"}


def test_a_vm_compute_records_no_allocation(tmp_path: Path) -> None:
    prov, ledger, _ = setup(tmp_path, gang=False)
    prov.bill_allocations(nodes("running", "i-0abc"))
    assert [r for r in ledger.resources(RUN) if r.kind == ALLOCATION] == []


def Accounting(answer: dict[str, float] | Exception) -> Any:
    """A gang compute's accounting as a cluster answers it (the double is at the Compute
    interface; SlurmCompute's reading of sacct runs against the box's real Slurm in
    tests/e2e/test_slurm_runs.py)."""

    def allocation_seconds(run_id: str) -> dict[str, float]:
        assert run_id == RUN
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    return SimpleNamespace(gang=True, allocation_seconds=allocation_seconds)


def test_the_bill_is_settled_to_the_clusters_accounting(tmp_path: Path) -> None:
    prov, ledger, clock = setup(tmp_path, gang=True)
    prov.bill_allocations(nodes("running", "41"))  # seen 15 s after it started
    clock.now += 600
    prov.end_allocations()
    said: list[str] = []
    # 41 ran 612 s; 42 started and ended between two listings; 43 was cancelled queued
    settle_allocations(Accounting({"41": 612.0, "42": 30.0, "43": 0.0}), ledger, RUN, said.append)
    rows = {r.resource_id: r for r in ledger.resources(RUN) if r.kind == ALLOCATION}
    assert sorted(rows) == ["job-41", "job-42"]
    assert {k: r.deleted_at - r.created_at for k, r in rows.items()} == {
        "job-41": 612.0,
        "job-42": 30.0,
    }
    assert ledger.billed_cost(RUN) == pytest.approx(1.5 * (612 + 30) / 3600)
    assert rows["job-42"].state == "deleted" and rows["job-42"].cloud_id == "42"
    assert said == []
    # again: the same bill
    settle_allocations(Accounting({"41": 612.0, "42": 30.0}), ledger, RUN, said.append)
    assert ledger.billed_cost(RUN) == pytest.approx(1.5 * (612 + 30) / 3600)


def test_without_the_accounting_the_controllers_count_stays_and_is_said(tmp_path: Path) -> None:
    prov, ledger, clock = setup(tmp_path, gang=True)
    prov.bill_allocations(nodes("running", "41"))
    clock.now += 600
    prov.end_allocations()
    said: list[str] = []
    refused = Accounting(ProviderError("sacct: error: Problem talking to the database"))
    settle_allocations(refused, ledger, RUN, said.append)
    assert ledger.billed_cost(RUN) == pytest.approx(1.5 * 600 / 3600)
    assert said == [
        "warning: the bill stays the controller's own count:"
        " sacct: error: Problem talking to the database"
    ]
    # an absurd answer changes nothing
    settle_allocations(Accounting({"41": 1e12}), ledger, RUN, said.append)
    assert ledger.billed_cost(RUN) == pytest.approx(1.5 * 600 / 3600)
