"""Retries happen in exactly one place: a throttled call is attempted at most the policy's number
of times through the stack the CLI uses (the registry's local provider, with the test-only fault
injector from $CLOUDTRAIN_FAULTS below the one retry layer), and a fan-out retries each node
once, not once per layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.core import retry
from cloudtrain.core.errors import TransientError
from cloudtrain.providers import faults, get_provider, open_store
from cloudtrain.providers.base import Node, NodeRequest, Provider, Resource, RunInfo
from cloudtrain.providers.faults import FaultPlan, FaultyProvider, FaultyStore
from cloudtrain.providers.retrying import (
    DEADLINES_S,
    RetryingCompute,
    RetryingProvider,
    RetryingStore,
    wrap_provider,
)
from tests.fakes.memory_provider import MemoryCompute

RUN = "layer-abc123"
INFO = RunInfo(RUN, None, None, (2222, 2223))
ATTEMPTS = retry.MAX_ATTEMPTS


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.002)
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))


def cli_stack(monkeypatch: pytest.MonkeyPatch, plan: FaultPlan) -> tuple[Provider, FaultyProvider]:
    """The local provider as the CLI gets it from the registry, with faults from
    $CLOUDTRAIN_FAULTS; and the fault layer below the retry layer, whose counters see every
    attempt that left the retry layer."""
    monkeypatch.setenv(faults.FAULTS_ENV, plan.to_json())
    provider = get_provider("local")
    assert isinstance(provider, RetryingProvider), "the registry must wrap in the retry layer"
    layer = provider.inner
    assert isinstance(layer, FaultyProvider), "the faults must sit right below the retries"
    return provider, layer


def request(index: int) -> NodeRequest:
    return NodeRequest(RUN, "worker", index, "local", "#!/bin/sh\nexit 0\n")


def test_every_compute_call_is_attempted_at_most_the_policys_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, layer = cli_stack(monkeypatch, FaultPlan(error_rate=1.0))
    compute = provider.compute
    node = Node("ct-layer-abc123-worker-0", RUN, "worker", 0, "running")
    network = [Resource("local", "firewall", "fw", None, RUN)]
    calls = {
        "ensure_network": lambda: compute.ensure_network(INFO),
        "create_node": lambda: compute.create_node(INFO, request(0)),
        "list_nodes": lambda: compute.list_nodes(RUN),
        "delete_node": lambda: compute.delete_node(node),
        "list_resources": lambda: compute.list_resources(RUN),
        "delete_resources": lambda: compute.delete_resources(network),
        "inventory": compute.inventory,
    }
    for method, call in calls.items():
        assert method in DEADLINES_S, f"{method} has no stated deadline"
        with pytest.raises(TransientError, match="throttled"):
            call()
        assert layer.compute.calls[method] == ATTEMPTS, method
    assert layer.compute.created == []


def test_every_store_call_is_attempted_at_most_the_policys_number_of_times(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    provider, layer = cli_stack(monkeypatch, FaultPlan(store_error_rate=1.0))
    store = provider.store((tmp_path / "bucket").as_uri())
    calls = {
        "ensure_bucket": store.ensure_bucket,
        "put": lambda: store.put("k", b"x"),
        "get": lambda: store.get("k"),
        "list": lambda: store.list(""),
        "delete_prefix": lambda: store.delete_prefix(""),
    }
    for method, call in calls.items():
        with pytest.raises(TransientError, match="throttled"):
            call()
        assert layer.store_faults.calls[method] == ATTEMPTS, method
    # the node agent's way in: open_store(uri), the same layers
    node_store = open_store((tmp_path / "bucket").as_uri())
    assert isinstance(node_store, RetryingStore) and isinstance(node_store.inner, FaultyStore)
    with pytest.raises(TransientError, match="throttled"):
        node_store.put("k", b"x")
    assert node_store.inner.calls["put"] == ATTEMPTS


def test_a_fan_out_retries_the_throttled_node_once_not_once_per_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four nodes, worker-2's creates always throttled: the three others are made with one call
    each, and worker-2 gets exactly MAX_ATTEMPTS calls (a retry nested in the fan-out would
    make it MAX_ATTEMPTS squared), then its error is raised after all have finished."""
    plan = FaultPlan(throttled_creates={"worker-2": 10**6})
    provider, layer = cli_stack(monkeypatch, plan)
    try:
        with pytest.raises(TransientError, match="create ct-layer-abc123-worker-2"):
            provider.compute.create_nodes(INFO, [request(i) for i in range(4)])
        assert layer.compute.throttled["create_node"] == ATTEMPTS
        assert layer.compute.calls["create_node"] == 3 + ATTEMPTS
        assert sorted(layer.compute.created) == [f"ct-{RUN}-worker-{i}" for i in (0, 1, 3)]
    finally:
        provider.compute.delete_nodes(RUN)
    assert provider.compute.list_nodes(RUN) == []


def test_the_layers_wrap_once_and_faults_stay_below_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = FaultPlan(error_rate=1.0)
    provider, layer = cli_stack(monkeypatch, plan)
    assert isinstance(provider, RetryingProvider) and provider.inner is layer
    assert wrap_provider(provider) is provider
    assert faults.wrap(provider, plan) is provider
    assert faults.wrap(layer, plan) is layer
    monkeypatch.delenv(faults.FAULTS_ENV)
    plain = get_provider("local")  # no faults asked for: the retry layer over the adapter
    assert isinstance(plain, RetryingProvider) and not isinstance(plain.inner, FaultyProvider)
    below = faults.wrap(plain, plan)  # faults added later still go below the retries
    assert isinstance(below, RetryingProvider) and isinstance(below.inner, FaultyProvider)
    with pytest.raises(TransientError):
        below.compute.list_nodes(RUN)
    assert below.inner.compute.calls["list_nodes"] == ATTEMPTS


class BatchDeletes(MemoryCompute):
    """An in-memory compute that deletes many nodes in one call (as AWS's terminate does), the
    first `throttled` such calls throttled."""

    def __init__(self, throttled: int) -> None:
        super().__init__()
        self.throttled = throttled
        self.batches: list[list[str]] = []

    def delete_listed(self, nodes: list[Node]) -> None:
        self.batches.append([n.name for n in nodes])
        if len(self.batches) <= self.throttled:
            raise TransientError("throttled (batch)")
        for node in nodes:
            MemoryCompute.delete_node(self, node)


def test_a_batch_delete_is_retried_as_one_call_not_per_node() -> None:
    inner = BatchDeletes(throttled=2)
    compute = RetryingCompute(inner)
    nodes = compute.create_nodes(INFO, [request(i) for i in range(3)])
    compute.delete_nodes(RUN)
    names = sorted(n.name for n in nodes)
    assert [sorted(b) for b in inner.batches] == [names] * 3  # two throttled, then done
    assert inner.calls["delete_node"] == 3 and compute.list_nodes(RUN) == []
    always = RetryingCompute(BatchDeletes(throttled=10**6))
    made = always.create_nodes(INFO, [request(0)])
    with pytest.raises(TransientError):
        always.delete_listed(made)
    assert len(always.inner.batches) == ATTEMPTS  # type: ignore[attr-defined]
