"""The TPU API fake refuses what Cloud TPU refuses, in its shapes, through google-cloud-tpu.

Bad arguments (400), a stingy account (TPU quota 429, a sold-out zone, a denied permission, the
API disabled: tests/fakes/tpu_account.py), and the box's one caller: a TPU permission denied or
the TPU API disabled shows in the GCE fake's Resource Manager and Service Usage answers too.
"""

from __future__ import annotations

import contextlib
import time

import pytest

tpu_v2 = pytest.importorskip("google.cloud.tpu_v2")
import requests  # noqa: E402
from google.api_core import exceptions  # noqa: E402

from tests.fakes.arm_testkit import loopback_only  # noqa: E402
from tests.fakes.tpu_testkit import FAST, PARENT, PROJECT, TpuBench, tpu_bench  # noqa: E402

__all__ = ["loopback_only", "tpu_bench"]  # fixtures used by this module
pytestmark = pytest.mark.usefixtures("loopback_only")  # nothing here reaches Google
QState = tpu_v2.QueuedResourceState.State


@pytest.mark.parametrize(
    ("node_id", "fields", "match"),
    [
        ("Bad_Id", {}, "node_id"),
        ("a" * 64, {}, "node_id"),
        ("n1", {"accelerator_type": "v6e-8"}, "not available in zone us-west4-a"),
        ("n1", {"accelerator_type": "v5litepod-3"}, "not available"),
        ("n1", {"runtime_version": "tpu-vm-tf-2.21.0"}, "Runtime version"),
        ("n1", {"runtime_version": ""}, "Runtime version"),
        ("n1", {"runtime_version": "tpu-vm-tf-2.16.1-se"}, "does not support"),
        ("n1", {"runtime_version": "v2-alpha-tpuv6e"}, "does not support"),
        ("n1", {"labels": {"Bad": "x"}}, "Label"),
        ("n1", {"tags": ["Not_A_Tag"]}, "tags"),
        ("n1", {"metadata": {"bad key": "x"}}, "metadata key"),
        ("n1", {"network_config": tpu_v2.NetworkConfig(network="other")}, "does not exist"),
        (
            "n1",
            {"network_config": tpu_v2.NetworkConfig(subnetwork="other")},
            "Subnetwork",
        ),
        (
            "n1",
            {
                "service_account": tpu_v2.ServiceAccount(
                    email="ghost@ct-test.iam.gserviceaccount.com"
                )
            },
            "ghost@ct-test.iam.gserviceaccount.com does not exist",
        ),
        (
            "n1",
            {"scheduling_config": tpu_v2.SchedulingConfig(spot=True, preemptible=True)},
            "spot and preemptible",
        ),
        (
            "n1",
            {"accelerator_config": tpu_v2.AcceleratorConfig(type_="V5LITE_POD", topology="2x4")},
            "Exactly one",
        ),
    ],
)
def test_bad_arguments_are_400_and_create_nothing(
    tpu_bench: TpuBench, node_id: str, fields: dict, match: str
) -> None:
    with pytest.raises(exceptions.BadRequest, match=match) as caught:
        tpu_bench.create(node_id, **fields)
    assert caught.value.response.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert tpu_bench.tpu.nodes() == [] and tpu_bench.tpu.operations() == []


def test_a_known_network_and_service_account_are_accepted(tpu_bench: TpuBench) -> None:
    tpu_bench.tpu.add_network(PROJECT, "ct-net")
    answer = requests.post(
        f"{tpu_bench.gce.url}/v1/projects/{PROJECT}/serviceAccounts",
        json={"accountId": "ct-node-1", "serviceAccount": {"displayName": "n"}},
        timeout=10,
    )
    email = answer.json()["email"]
    node = tpu_bench.create(
        "n1",
        network_config=tpu_v2.NetworkConfig(network="ct-net", subnetwork="ct-net"),
        service_account=tpu_v2.ServiceAccount(email=email),
    ).result(polling=FAST)
    assert node.network_config.network == f"projects/{PROJECT}/global/networks/ct-net"
    assert node.service_account.email == email


def test_a_new_project_has_no_tpu_quota_429_names_the_limit(tpu_bench: TpuBench) -> None:
    account = tpu_bench.tpu.account
    account.new_project()
    with pytest.raises(exceptions.TooManyRequests) as caught:
        tpu_bench.create("n1", scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    assert caught.value.response.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert (
        "Quota limit 'TPUV5sLitepodPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
        "Limit: 0 in region us-west4." in str(caught.value)
    )
    account.set_quota("us-west4", "v5litepod", 8)
    tpu_bench.create("n1").result(polling=FAST)
    assert account.usage("us-west4", "v5litepod", PROJECT) == 8
    with pytest.raises(exceptions.TooManyRequests, match="TPUV5sLitepodPerProjectPerRegion"):
        tpu_bench.create("n2", accelerator_type="v5litepod-1")
    assert len(tpu_bench.tpu.nodes()) == 1


def test_a_queued_request_over_quota_fails_with_the_quota_error(tpu_bench: TpuBench) -> None:
    tpu_bench.tpu.account.set_quota("*", "v5litepod", 4, spot=True)
    tpu_bench.queue("q1", "n1").result(polling=FAST)
    state = tpu_bench.queued_state("q1")
    assert state.state == QState.FAILED
    assert state.failed_data.error.code == 8
    assert "TPUV5sLitepodPreemptiblePerProjectPerRegionForTPUAPI" in state.failed_data.error.message
    assert tpu_bench.tpu.nodes() == []


def test_a_sold_out_zone_fails_the_create_operation_with_code_8(tpu_bench: TpuBench) -> None:
    tpu_bench.tpu.account.sell_out("us-west4-a")
    op = tpu_bench.create("n1")
    with pytest.raises(exceptions.GoogleAPICallError) as caught:
        op.result(polling=FAST)
    assert caught.value.grpc_status_code is not None and caught.value.grpc_status_code.value[0] == 8
    assert 'There is no more capacity in the zone "us-west4-a"' in str(caught.value)
    assert tpu_bench.tpu.nodes() == []


def test_spot_only_sell_out_spares_on_demand(tpu_bench: TpuBench) -> None:
    tpu_bench.tpu.account.sell_out("us-west4-a", spot_only=True)
    tpu_bench.create("n1").result(polling=FAST)
    with pytest.raises(exceptions.GoogleAPICallError, match="no more capacity"):
        spot = tpu_v2.SchedulingConfig(spot=True)
        tpu_bench.create("n2", scheduling_config=spot).result(polling=FAST)


def test_a_queued_request_waits_for_capacity(tpu_bench: TpuBench) -> None:
    account = tpu_bench.tpu.account
    account.sell_out("*")
    tpu_bench.queue("q1", "n1").result(polling=FAST)
    states = [tpu_bench.queued_state("q1").state for _ in range(3)]
    assert states == [QState.WAITING_FOR_RESOURCES] * 3 and tpu_bench.tpu.nodes() == []
    account.restore("*")
    assert tpu_bench.queued_state("q1").state == QState.PROVISIONING
    assert tpu_bench.queued_state("q1").state == QState.ACTIVE


@pytest.mark.parametrize(
    ("permission", "call"),
    [
        ("tpu.nodes.create", lambda b: b.create("n1")),
        ("tpu.nodes.list", lambda b: list(b.client.list_nodes(parent=PARENT))),
        ("tpu.nodes.delete", lambda b: b.client.delete_node(name=f"{PARENT}/nodes/n1")),
        ("tpu.queuedResources.create", lambda b: b.queue("q1", "n1")),
        (
            "iam.serviceAccounts.actAs",
            lambda b: b.create("n1", service_account=tpu_v2.ServiceAccount(email="x@y.z")),
        ),
    ],
)
def test_a_denied_permission_is_403_naming_it(tpu_bench: TpuBench, permission: str, call) -> None:
    tpu_bench.tpu.account.deny(permission)
    with pytest.raises(exceptions.Forbidden, match=f"Permission '{permission}' denied"):
        call(tpu_bench)
    held = requests.post(
        f"{tpu_bench.gce.url}/v1/projects/{PROJECT}:testIamPermissions",
        json={"permissions": [permission, "tpu.nodes.get"]},
        timeout=10,
    ).json()
    assert held == {"permissions": ["tpu.nodes.get"]}
    tpu_bench.tpu.account.allow(permission)
    with contextlib.suppress(exceptions.NotFound, exceptions.BadRequest):  # past the check
        call(tpu_bench)


def test_an_unenforced_permission_cannot_be_denied(tpu_bench: TpuBench) -> None:
    with pytest.raises(ValueError, match="does not enforce"):
        tpu_bench.tpu.account.deny("tpu.nodes.reimage")


def test_the_tpu_api_disabled_refuses_every_call(tpu_bench: TpuBench) -> None:
    tpu_bench.tpu.account.disable()
    with pytest.raises(exceptions.Forbidden, match="Cloud TPU API has not been used") as e:
        list(tpu_bench.client.list_nodes(parent=PARENT))
    info = e.value.response.json()["error"]["details"][0]
    assert info["reason"] == "SERVICE_DISABLED"
    assert info["metadata"]["service"] == "tpu.googleapis.com"
    usage = requests.get(
        f"{tpu_bench.gce.url}/v1/projects/{PROJECT}/services/tpu.googleapis.com", timeout=10
    ).json()
    assert usage["state"] == "DISABLED"
    tpu_bench.tpu.account.enable()
    assert list(tpu_bench.client.list_nodes(parent=PARENT)) == []


def test_a_queued_request_past_its_valid_until_duration_fails(tpu_bench: TpuBench) -> None:
    tpu_bench.tpu.account.sell_out("*")
    policy = tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration={"nanos": 1_000_000})
    tpu_bench.queue("q1", "n1", queueing_policy=policy).result(polling=FAST)
    time.sleep(0.01)  # past its 1 ms: certain, not a race
    state = tpu_bench.queued_state("q1")
    assert state.state == QState.FAILED and state.failed_data.error.code == 4
    tpu_bench.tpu.account.restore("*")
    assert tpu_bench.queued_state("q1").state == QState.FAILED and tpu_bench.tpu.nodes() == []
    with pytest.raises(exceptions.BadRequest, match="valid_until_duration only"):
        later = tpu_v2.QueuedResource.QueueingPolicy(valid_after_duration={"seconds": 5})
        tpu_bench.queue("q2", "n2", queueing_policy=later)
