"""A gang compute's run recovers as a whole: one lost node of a Slurm allocation takes the
others with it, so a restart deletes and creates every node of the plan (a new allocation),
while a per-node compute creates only the lost one again."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.jobs import protocol
from cloudtrain.jobspec.runrules import Verdict
from cloudtrain.providers.base import Node
from cloudtrain.providers.local_store import LocalStore, _path_to_uri
from cloudtrain.run.recovery import Recovery

RUN = "job-abc123"


class _Compute:
    """The compute's side a restart touches: what it was asked to delete."""

    def __init__(self, gang: bool) -> None:
        self.gang = gang
        self.deleted: list[list[str] | None] = []

    def delete_nodes(self, run_id: str, names: list[str] | None = None) -> None:
        self.deleted.append(names)


def recovery(tmp_path: Path, gang: bool) -> tuple[Recovery, _Compute, list[list[str]]]:
    compute = _Compute(gang)
    plan = [
        SimpleNamespace(role="chief", index=0),
        *(SimpleNamespace(role="worker", index=i) for i in range(2)),
    ]
    store = LocalStore(_path_to_uri(tmp_path / "bucket"))
    store.put(protocol.bootstrap_log_key(RUN, "worker-1"), b"the lost node's log\n")
    state = SimpleNamespace(
        attempt=1, job_end=None, plan=SimpleNamespace(nodes=plan), store=store,
        provider=SimpleNamespace(compute=compute), view=SimpleNamespace(attempt=1),
    )  # fmt: skip
    created: list[list[str]] = []
    provisioner = SimpleNamespace(
        write_cluster=lambda: None,
        create_nodes=lambda nodes: created.append([f"{n.role}-{n.index}" for n in nodes]),
        end_allocations=lambda: None,  # tests/unit/run/test_gang_billing.py
    )
    spec = SimpleNamespace(max_restarts=2)
    ledger = SimpleNamespace(event=lambda *a: None, mark_deleted=lambda *a: None)
    observer = SimpleNamespace(event=lambda line: None)
    rec = Recovery(state, spec, ledger, observer, None, RUN, provisioner)  # type: ignore[arg-type]
    return rec, compute, created


@pytest.mark.parametrize("gang", [True, False])
def test_a_lost_node_restarts_the_whole_gang_or_only_itself(tmp_path: Path, gang: bool) -> None:
    rec, compute, created = recovery(tmp_path, gang)
    rec.restart(Verdict("restart", lost=("worker-1",)), ["worker-1"])
    if gang:
        assert created == [["chief-0", "worker-0", "worker-1"]]
        every = [f"ct-{RUN}-{n}" for n in ("chief-0", "worker-0", "worker-1")]
        assert compute.deleted == [every]
    else:
        assert created == [["worker-1"]]
        assert compute.deleted == [[f"ct-{RUN}-worker-1"]]
    # the lost node's log was archived before its successor could write its own
    archived = protocol.archived_bootstrap_log_key(RUN, 1, "worker-1")
    assert rec.state.store.get(archived) == b"the lost node's log\n"


@pytest.mark.parametrize("gang", [True, False])
def test_a_node_waiting_in_the_queue_is_not_lost_and_boots_from_its_allocation(
    tmp_path: Path, gang: bool
) -> None:
    rec, _, _ = recovery(tmp_path, gang)
    names = [f"ct-{RUN}-{n}" for n in ("chief-0", "worker-0", "worker-1")]
    listed: list[Node] = []
    rec.provisioner = SimpleNamespace(  # type: ignore[assignment]
        list_nodes=lambda: listed, bill_allocations=lambda nodes: None
    )
    rec.state.view.nodes = [
        SimpleNamespace(role=n.rsplit("-", 2)[-2], index=int(n[-1]), name=n, cloud_state="")
        for n in names
    ]
    rec.options = SimpleNamespace(boot_timeout_s=60.0, heartbeat_timeout_s=30.0)  # type: ignore[assignment]
    snap = SimpleNamespace(heartbeats={})
    hour_ago = time.time() - 3600  # the attempt began an hour ago: the job waited in the queue

    def nodes(state: str) -> list[Node]:
        return [Node(n, RUN, n.rsplit("-", 2)[-2], int(n[-1]), state) for n in names]  # type: ignore[arg-type]

    listed[:] = nodes("pending")
    if not gang:  # a VM pending for an hour never booted: lost
        assert rec.lost_nodes(snap, hour_ago) == ["chief-0", "worker-0", "worker-1"]
        return
    listed[:] = [
        replace(n, detail="PENDING (Resources), start 2026-11-29 18:40:00") for n in listed
    ]
    assert rec.lost_nodes(snap, hour_ago) == []  # waiting for its allocation
    # the live view shows the scheduler's own words
    assert rec.state.view.nodes[0].cloud_state == "PENDING (Resources), start 2026-11-29 18:40:00"
    listed[:] = nodes("running")  # the allocation started: its boot timeout starts now
    assert rec.lost_nodes(snap, hour_ago) == []
    rec._queued_at = {k: v - 61 for k, v in rec._queued_at.items()}  # 61 s later, still silent
    assert rec.lost_nodes(snap, hour_ago) == ["chief-0", "worker-0", "worker-1"]
