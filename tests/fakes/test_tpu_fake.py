"""The TPU API fake (tests/fakes/tpu_fake.py), driven only through google-cloud-tpu's REST client.

They also pin down how the real client sees the fake, which the GCP provider's TPU code relies
on: `create_node(...).result()` polls the operation on the client's own endpoint and answers
the READY node; request errors are `google.api_core.exceptions`; queued resources move with
time (each GET one step); a preempted spot node stays listed, PREEMPTED.
"""

from __future__ import annotations

import pytest

tpu_v2 = pytest.importorskip("google.cloud.tpu_v2")
from google.api_core import exceptions  # noqa: E402

from tests.fakes.arm_testkit import loopback_only  # noqa: E402
from tests.fakes.gce_instances import default_service_account  # noqa: E402
from tests.fakes.tpu_testkit import (  # noqa: E402
    FAST,
    PARENT,
    PROJECT,
    RUNTIME,
    TpuBench,
    tpu_bench,
)

__all__ = ["loopback_only", "tpu_bench"]  # fixtures used by this module
pytestmark = pytest.mark.usefixtures("loopback_only")  # nothing here reaches Google
Node = tpu_v2.Node
QState = tpu_v2.QueuedResourceState.State


def test_create_polls_its_operation_to_a_ready_node_with_googles_defaults(
    tpu_bench: TpuBench,
) -> None:
    op = tpu_bench.create(
        "n1",
        labels={"cloudtrain-run": "r1"},
        metadata={"startup-script": "#!/bin/sh\necho hi"},
        tags=["ct-r1"],
        scheduling_config=tpu_v2.SchedulingConfig(spot=True),
        network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
    )
    assert not op.done()
    assert tpu_bench.tpu.nodes()[0]["state"] == "CREATING"
    node = op.result(polling=FAST)
    assert node.state == Node.State.READY and node.health == Node.Health.HEALTHY
    assert node.name == f"{PARENT}/nodes/n1"
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD
    assert node.accelerator_config.topology == "2x4"
    assert node.network_config.network == f"projects/{PROJECT}/global/networks/default"
    assert node.service_account.email == default_service_account(PROJECT)
    assert node.metadata["startup-script"] == "#!/bin/sh\necho hi"
    assert node.scheduling_config.spot and list(node.tags) == ["ct-r1"]
    endpoint = node.network_endpoints[0]
    assert endpoint.port == 8470 and endpoint.ip_address and endpoint.access_config.external_ip
    ops = tpu_bench.tpu.operations(PROJECT)
    assert [o["metadata"]["verb"] for o in ops] == ["create"] and ops[0]["done"]


def test_a_node_get_moves_its_pending_create_along(tpu_bench: TpuBench) -> None:
    tpu_bench.create("n1")
    states = [tpu_bench.client.get_node(name=f"{PARENT}/nodes/n1").state for _ in range(2)]
    assert states == [Node.State.CREATING, Node.State.READY]


def test_accelerator_config_names_the_same_type(tpu_bench: TpuBench) -> None:
    config = tpu_v2.AcceleratorConfig(type_="V6E", topology="2x2")
    node = tpu_bench.client.create_node(
        parent="projects/ct-test/locations/us-east5-a",
        node_id="n6",
        node=Node(accelerator_config=config, runtime_version=RUNTIME),
    ).result(polling=FAST)
    assert node.accelerator_type == "v6e-4"


def test_list_pages_and_delete_leaves_nothing(tpu_bench: TpuBench) -> None:
    for name in ("a1", "a2", "a3"):
        tpu_bench.create(name).result(polling=FAST)
    pager = tpu_bench.client.list_nodes(request={"parent": PARENT, "page_size": 2})
    assert [n.name.rsplit("/", 1)[1] for n in pager] == ["a1", "a2", "a3"]
    first = tpu_bench.client.list_nodes(request={"parent": PARENT, "page_size": 2})
    assert first.next_page_token
    op = tpu_bench.client.delete_node(name=f"{PARENT}/nodes/a2")
    assert tpu_bench.client.get_node(name=f"{PARENT}/nodes/a2").state == Node.State.DELETING
    op.result(polling=FAST)
    with pytest.raises(exceptions.NotFound):
        tpu_bench.client.get_node(name=f"{PARENT}/nodes/a2")
    assert [n["name"].rsplit("/", 1)[1] for n in tpu_bench.tpu.nodes()] == ["a1", "a3"]


def test_a_taken_node_id_is_409(tpu_bench: TpuBench) -> None:
    tpu_bench.create("n1").result(polling=FAST)
    with pytest.raises(exceptions.Conflict, match="already exists"):
        tpu_bench.create("n1")


def test_stop_then_start(tpu_bench: TpuBench) -> None:
    tpu_bench.create("n1").result(polling=FAST)
    name = f"{PARENT}/nodes/n1"
    assert (
        tpu_bench.client.stop_node(request={"name": name}).result(polling=FAST).state
        == Node.State.STOPPED
    )
    with pytest.raises(exceptions.BadRequest, match="must be READY"):
        tpu_bench.client.stop_node(request={"name": name})
    assert (
        tpu_bench.client.start_node(request={"name": name}).result(polling=FAST).state
        == Node.State.READY
    )


def test_the_zone_lists_what_it_sells(tpu_bench: TpuBench) -> None:
    types = [t.type_ for t in tpu_bench.client.list_accelerator_types(parent=PARENT)]
    assert "v5litepod-8" in types and "v6e-8" not in types
    accel = tpu_bench.client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v5litepod-4")
    assert accel.accelerator_configs[0].topology == "2x2"
    with pytest.raises(exceptions.NotFound):
        tpu_bench.client.get_accelerator_type(name=f"{PARENT}/acceleratorTypes/v6e-8")
    versions = [v.version for v in tpu_bench.client.list_runtime_versions(parent=PARENT)]
    assert RUNTIME in versions and "tpu-vm-tf-2.21.0" not in versions
    with pytest.raises(exceptions.NotFound):
        tpu_bench.client.get_runtime_version(name=f"{PARENT}/runtimeVersions/tpu-vm-tf-9.9.9")


def test_queued_resource_is_accepted_then_provisions_its_node(tpu_bench: TpuBench) -> None:
    queued = tpu_bench.queue("q1", "n1").result(polling=FAST)
    assert queued.state.state == QState.ACCEPTED
    assert tpu_bench.tpu.nodes() == []
    assert tpu_bench.queued_state("q1").state == QState.PROVISIONING
    assert tpu_bench.tpu.nodes()[0]["state"] == "CREATING"
    assert tpu_bench.queued_state("q1").state == QState.ACTIVE
    node = tpu_bench.client.get_node(name=f"{PARENT}/nodes/n1")
    assert node.state == Node.State.READY and node.scheduling_config.spot
    assert node.queued_resource == f"{PARENT}/queuedResources/q1"
    listed = list(tpu_bench.client.list_queued_resources(parent=PARENT))
    assert [q.name for q in listed] == [f"{PARENT}/queuedResources/q1"]


def test_deleting_a_queued_resource_with_its_node_needs_force(tpu_bench: TpuBench) -> None:
    tpu_bench.queue("q1", "n1").result(polling=FAST)
    tpu_bench.queued_state("q1")
    name = f"{PARENT}/queuedResources/q1"
    with pytest.raises(exceptions.BadRequest, match="force"):
        tpu_bench.client.delete_queued_resource(name=name)
    tpu_bench.client.delete_queued_resource(request={"name": name, "force": True}).result(
        polling=FAST
    )
    assert tpu_bench.tpu.nodes() == [] and tpu_bench.tpu.queued_resources() == []


def test_deleting_the_node_suspends_its_queued_resource(tpu_bench: TpuBench) -> None:
    tpu_bench.queue("q1", "n1").result(polling=FAST)
    tpu_bench.queued_state("q1")
    tpu_bench.client.delete_node(name=f"{PARENT}/nodes/n1").result(polling=FAST)
    state = tpu_bench.queued_state("q1")
    assert state.state == QState.SUSPENDED
    assert state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.USER


def test_preempting_a_spot_node_keeps_it_listed_preempted_and_suspends_its_request(
    tpu_bench: TpuBench,
) -> None:
    tpu_bench.queue("q1", "n1").result(polling=FAST)
    tpu_bench.queued_state("q1"), tpu_bench.queued_state("q1")
    tpu_bench.tpu.preempt("n1")
    assert tpu_bench.client.get_node(name=f"{PARENT}/nodes/n1").state == Node.State.PREEMPTED
    state = tpu_bench.queued_state("q1")
    assert state.state == QState.SUSPENDED
    assert state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE


def test_an_on_demand_node_is_never_preempted(tpu_bench: TpuBench) -> None:
    tpu_bench.create("n1").result(polling=FAST)
    with pytest.raises(ValueError, match="not spot"):
        tpu_bench.tpu.preempt("n1")
    with pytest.raises(KeyError):
        tpu_bench.tpu.preempt("nobody")
