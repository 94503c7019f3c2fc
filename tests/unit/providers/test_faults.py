"""The fault-injecting provider wrapper, over the in-memory test provider."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from cloudtrain.core import retry
from cloudtrain.core.errors import NoCapacityError, TransientError, UsageError
from cloudtrain.core.retry import retrying
from cloudtrain.providers import faults
from cloudtrain.providers.base import Node, NodeRequest, RunInfo
from cloudtrain.providers.faults import FaultPlan, FaultyCompute, FaultyProvider, FaultyStore, wrap
from cloudtrain.providers.parallel import parallel_map
from cloudtrain.providers.retrying import RetryingCompute, RetryingProvider, wrap_provider
from tests.fakes.memory_provider import MemoryProvider

RUN = RunInfo(run_id="r1", region="mem-1", zone="zone-a", port_range=(2222, 2230))


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def requests(n: int, zone: str | None = None, role: str = "worker") -> list[NodeRequest]:
    return [NodeRequest("r1", role, i, "m.large", "#!/bin/sh", zone=zone) for i in range(n)]


def make(plan: FaultPlan, clock: FakeClock | None = None) -> tuple[MemoryProvider, FaultyCompute]:
    inner = MemoryProvider()
    provider = wrap(inner, plan, clock) if clock else wrap(inner, plan)
    return inner, provider.compute


def test_no_faults_is_transparent() -> None:
    inner, compute = make(FaultPlan())
    nodes = compute.create_nodes(RUN, requests(3))
    assert [n.name for n in compute.list_nodes("r1")] == [n.name for n in nodes]
    assert compute.ensure_network(RUN) == compute.list_resources("r1")
    compute.delete_nodes("r1")
    assert inner.compute.nodes == {}


def test_latency_applies_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call that reaches the cloud sleeps the plan's latency once; a pure call never does.
    The sleeps are recorded (no wall-clock bound a loaded machine could break)."""
    slept: list[float] = []
    clock = SimpleNamespace(sleep=slept.append, monotonic=time.monotonic)
    monkeypatch.setattr(faults, "time", clock)
    _, compute = make(FaultPlan(latency_s=0.05))
    for call in (
        lambda: compute.create_node(RUN, requests(1)[0]),
        lambda: compute.list_nodes("r1"),
        lambda: compute.ensure_network(RUN),
        lambda: compute.list_resources("r1"),
    ):
        slept.clear()
        call()
        assert slept == [0.05]
    slept.clear()
    compute.planned_network(RUN)  # pure: no latency
    assert slept == []


def test_32_nodes_fan_out_in_parallel() -> None:
    """All 32 creates are in the cloud at once: each waits in the fake until all 32 have
    arrived (a serial or narrower fan-out breaks the barrier), and the fake counts the peak."""
    inner, compute = make(FaultPlan(latency_s=0.01))
    arrived = threading.Barrier(32, timeout=60)
    inner.compute.create_hook = arrived.wait
    nodes = compute.create_nodes(RUN, requests(32))
    assert len(nodes) == 32 and len(inner.compute.nodes) == 32
    assert inner.compute.peak_creates_in_flight == 32
    assert compute.calls["create_node"] == 32
    assert sorted(compute.created) == sorted(r.name for r in requests(32))


def test_error_rate_one_throttles_before_the_inner_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.002)
    inner, compute = make(FaultPlan(error_rate=1.0))
    with pytest.raises(TransientError, match="throttled"):
        compute.create_node(RUN, requests(1)[0])
    with pytest.raises(TransientError):
        compute.list_nodes("r1")
    with pytest.raises(TransientError):
        RetryingCompute(compute).create_nodes(RUN, requests(4))
    assert sum(inner.compute.calls.values()) == 0
    assert inner.compute.nodes == {}
    assert compute.created == []
    # create_nodes retries each node by the one policy (8 attempts) before giving up
    assert compute.calls["create_node"] == 1 + 4 * 8 and compute.calls["list_nodes"] == 1


def test_retried_creates_make_each_node_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.002)
    plan = FaultPlan(error_rate=0.3, lost_reply_rate=0.2, seed=7)
    inner, compute = make(plan)
    reqs = requests(16)
    results = [
        retrying(lambda r=r: compute.create_node(RUN, r), what="create", max_attempts=30)
        for r in reqs
    ]
    names = sorted(r.name for r in reqs)
    assert sorted(n.name for n in results) == names
    assert sorted(inner.compute.nodes) == names
    assert all(inner.compute.creations[name] == 1 for name in names)
    assert sorted(compute.created) == names  # no duplicates
    assert compute.calls["create_node"] > 16  # faults were injected and retried
    assert inner.compute.calls["create_node"] > 16  # some replies were lost after the create


def test_retried_creates_under_fan_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.002)
    inner, compute = make(FaultPlan(error_rate=0.3, lost_reply_rate=0.2, seed=3))
    reqs = requests(32)

    def create(r: NodeRequest) -> Node:
        return retrying(lambda: compute.create_node(RUN, r), what="create", max_attempts=30)

    results = parallel_map(create, reqs)
    nodes = [n for n in results if isinstance(n, Node)]
    names = sorted(r.name for r in reqs)
    assert sorted(n.name for n in nodes) == names
    assert sorted(inner.compute.nodes) == names
    assert max(inner.compute.creations.values()) == 1
    assert sorted(compute.created) == names


def test_capacity_errors_per_zone() -> None:
    inner, compute = make(FaultPlan(capacity_errors={"zone-a": 2, "zone-c": 10**9}))
    [req] = requests(1, zone="zone-a")
    for _ in range(2):
        with pytest.raises(NoCapacityError) as raised:
            compute.create_node(RUN, req)
        assert raised.value.zone == "zone-a"
        assert "m.large" in str(raised.value) and "zone-a" in str(raised.value)
    assert inner.compute.nodes == {}
    assert compute.create_node(RUN, req).zone == "zone-a"  # the third try finds capacity
    assert compute.create_node(RUN, requests(2, zone="zone-b")[1]).zone == "zone-b"
    for _ in range(5):
        with pytest.raises(NoCapacityError):
            compute.create_node(RUN, requests(3, zone="zone-c")[2])
    # a request without a zone uses the run's zone (zone-a, capacity back by now)
    assert compute.create_node(RUN, requests(3, zone=None)[2]).zone == "zone-a"


def test_preemption_is_reported_by_list_nodes() -> None:
    clock = FakeClock()
    inner, compute = make(FaultPlan(preempt_after_s={"ct-r1-worker-1": 10.0}), clock)
    compute.create_nodes(RUN, requests(2))
    clock.t = 5.0
    assert {n.name: n.state for n in compute.list_nodes("r1")} == {
        "ct-r1-worker-0": "running",
        "ct-r1-worker-1": "running",
    }
    clock.t = 10.0
    states = {n.name: n.state for n in compute.list_nodes("r1")}
    assert states == {"ct-r1-worker-0": "running", "ct-r1-worker-1": "preempted"}
    assert "ct-r1-worker-1" not in inner.compute.nodes  # really gone below the wrapper
    clock.t = 20.0
    preempted = [n for n in compute.list_nodes("r1") if n.state == "preempted"]
    assert [n.name for n in preempted] == ["ct-r1-worker-1"] and not preempted[0].alive
    compute.delete_node(preempted[0])
    assert [n.name for n in compute.list_nodes("r1")] == ["ct-r1-worker-0"]
    # a replacement is not preempted again
    compute.create_node(RUN, requests(2)[1])
    clock.t = 100.0
    assert all(n.state == "running" for n in compute.list_nodes("r1"))
    assert compute.created.count("ct-r1-worker-1") == 2
    compute.delete_nodes("r1")
    assert inner.compute.nodes == {} and compute.list_nodes("r1") == []


def test_recreating_a_preempted_node_replaces_its_report() -> None:
    clock = FakeClock()
    _, compute = make(FaultPlan(preempt_after_s={"ct-r1-chief-0": 0.0}), clock)
    [req] = requests(1, role="chief")
    compute.create_node(RUN, req)
    assert [n.state for n in compute.list_nodes("r1")] == ["preempted"]
    compute.create_node(RUN, req)
    assert [n.state for n in compute.list_nodes("r1")] == ["running"]


def test_call_counters_are_thread_safe() -> None:
    _, compute = make(FaultPlan())
    compute.create_nodes(RUN, requests(64))
    compute.list_nodes("r1")
    compute.delete_nodes("r1")
    assert compute.calls["create_node"] == 64
    assert compute.calls["delete_node"] == 64
    assert compute.calls["list_nodes"] == 2  # ours plus the one delete_nodes makes


def test_store_faults() -> None:
    inner = MemoryProvider()
    plain = wrap(inner, FaultPlan(latency_s=1.0)).store("mem://b")
    assert not isinstance(plain, FaultyStore)  # no store faults: the inner store itself

    provider = wrap(inner, FaultPlan(store_latency_s=0.05))
    store = provider.store("mem://b")
    assert isinstance(store, FaultyStore) and store.uri == "mem://b"
    start = time.monotonic()
    store.put("a/x", b"1")
    assert time.monotonic() - start >= 0.05
    assert store.get("a/x") == b"1"
    assert [o.key for o in store.list("a/")] == ["a/x"]
    assert store.calls["put"] == 1 and store.calls["get"] == 1

    broken = wrap(inner, FaultPlan(store_error_rate=1.0)).store("mem://b")
    with pytest.raises(TransientError):
        broken.put("a/y", b"2")
    assert [o.key for o in inner.store("mem://b").list("")] == ["a/x"]  # the put never landed
    assert broken.presign_get("a/x").startswith("mem://b/a/x")


def test_provider_passthrough() -> None:
    inner = MemoryProvider()
    provider = wrap(inner, FaultPlan())
    assert provider.name == "memory"
    assert provider.config is inner.config
    assert provider.compute is provider.compute
    assert provider.compute.provider_name == "memory"
    assert provider.default_store_uri("r1") == "mem://ct-r1"
    assert provider.owns_bucket("mem://ct-r1") and not provider.owns_bucket("mem://mine")


def test_plan_from_env() -> None:
    env = {
        "CLOUDTRAIN_FAULTS": '{"latency_s": 1, "error_rate": 0.2,'
        ' "capacity_errors": {"us-east-1a": 3}, "preempt_after_s": {"ct-r-worker-0": 30}}'
    }
    plan = FaultPlan.from_env(environ=env)
    assert plan == FaultPlan(
        latency_s=1.0,
        error_rate=0.2,
        capacity_errors={"us-east-1a": 3},
        preempt_after_s={"ct-r-worker-0": 30.0},
    )
    assert FaultPlan.from_env(environ={"CLOUDTRAIN_FAULTS": plan.to_json()}) == plan
    assert FaultPlan.from_env(environ={}) is None
    assert FaultPlan.from_env(environ={"CLOUDTRAIN_FAULTS": "  "}) is None


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "[1, 2]",
        '{"latncy_s": 1}',
        '{"error_rate": 1.5}',
        '{"latency_s": -1}',
        '{"latency_s": "slow"}',
        '{"capacity_errors": 3}',
    ],
)
def test_bad_plan_in_env_is_a_usage_error(raw: str) -> None:
    with pytest.raises(UsageError, match="CLOUDTRAIN_FAULTS"):
        FaultPlan.from_env(environ={"CLOUDTRAIN_FAULTS": raw})


def test_throttled_creates_throttle_one_node_only() -> None:
    plan = FaultPlan.from_dict({"throttled_creates": {"worker-1": 2}})
    inner, compute = make(plan)
    first, second = requests(2)
    assert compute.create_node(RUN, first).name == first.name
    for _ in range(2):
        with pytest.raises(TransientError, match="create ct-r1-worker-1"):
            compute.create_node(RUN, second)
    assert compute.create_node(RUN, second).name == second.name  # the third create gets through
    assert compute.throttled["create_node"] == 2 and inner.compute.calls["create_node"] == 2
    with pytest.raises(UsageError, match="throttled_creates"):
        FaultPlan.from_dict({"throttled_creates": {"worker-1": -1}})


def test_wrap_never_wraps_twice() -> None:
    inner = MemoryProvider()
    once = wrap(inner, FaultPlan(error_rate=1.0))
    assert wrap(once, FaultPlan()) is once
    retrying = wrap_provider(once)
    assert wrap(retrying, FaultPlan()) is retrying  # faults already below the retries
    later = wrap(wrap_provider(inner), FaultPlan(error_rate=1.0))  # goes below them too
    assert isinstance(later, RetryingProvider) and isinstance(later.inner, FaultyProvider)
    assert later.inner.inner is inner


def test_each_create_call_is_timed_for_the_trace_failed_ones_too() -> None:
    _, compute = make(FaultPlan(capacity_errors={"zone-c": 10**9}))
    heard: list[tuple[str, float, float]] = []
    compute.create_nodes(RUN, requests(2, zone="zone-a"), on_created=lambda *c: heard.append(c))
    with pytest.raises(NoCapacityError):
        compute.create_nodes(
            RUN, requests(1, zone="zone-c", role="chief"), on_created=lambda *c: heard.append(c)
        )
    assert sorted(name for name, _, _ in heard) == [
        "ct-r1-chief-0 (failed)",
        "ct-r1-worker-0",
        "ct-r1-worker-1",
    ]
    assert all(start <= end for _, start, end in heard)
