"""Retries happen in exactly one place: a throttled call is attempted at most the policy's number
of times through the stack the CLI uses (the registry's local provider, with the test-only fault
injector from $CLOUDTRAIN_FAULTS below the one retry layer), and a fan-out retries each node
once, not once per layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain import retry
from cloudtrain.errors import TransientError
from cloudtrain.providers import faults, get_provider
from cloudtrain.providers.base import Node, NodeRequest, Provider, Resource, RunInfo
from cloudtrain.providers.faults import FaultPlan, FaultyProvider
from cloudtrain.providers.retrying import DEADLINES_S, RetryingProvider, wrap_provider

RUN = "layer-abc123"
INFO = RunInfo(RUN, None, None, (2222, 2223))
ATTEMPTS = retry.MAX_ATTEMPTS


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.002)
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))


def cli_stack(monkeypatch: pytest.MonkeyPatch, plan: FaultPlan) -> tuple[Provider, FaultyProvider]:
    """The local provider as the CLI gets it, faults from $CLOUDTRAIN_FAULTS; and the fault
    layer, whose counters see every attempt that left the retry layer. (wrap_provider and
    faults.wrap are idempotent: no-ops where the registry has wrapped already.)"""
    monkeypatch.setenv(faults.FAULTS_ENV, plan.to_json())
    provider = wrap_provider(faults.wrap(get_provider("local"), plan))
    layer: object = provider
    while not isinstance(layer, FaultyProvider):
        layer = layer.inner  # type: ignore[attr-defined]
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
    plain = get_provider("local")
    while not isinstance(plain, RetryingProvider) and hasattr(plain, "inner"):
        plain = plain.inner  # type: ignore[attr-defined]
    if isinstance(plain, RetryingProvider):
        plain = plain.inner
    below = faults.wrap(wrap_provider(plain), plan)  # faults added later still go below
    assert isinstance(below, RetryingProvider) and isinstance(below.inner, FaultyProvider)
    with pytest.raises(TransientError):
        below.compute.list_nodes(RUN)
    assert below.inner.compute.calls["list_nodes"] == ATTEMPTS
