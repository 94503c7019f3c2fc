"""GcpCompute's TPU VMs (strategy tpu) against the box's TPU API fake, through google-cloud-tpu:
on-demand nodes and spot queued resources created with the run's labels, tag, network, account
and startup script, listed, preempted, deleted with nothing left, and the account's refusals
(sold-out zone, quota, permission, API off) as the project's error types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.tpu_v2")

from cloudtrain.core.errors import CredentialsError, NoCapacityError, ProviderError, QuotaError
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from cloudtrain.providers.gcp.compute import GcpCompute
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.providers.gcp.tpu_nodes import tpu_zones
from cloudtrain.run.startup import StartupParams, render_startup
from tests.fakes.gce_fake import GceFake, start_gce_fake
from tests.fakes.gce_instances import default_service_account
from tests.fakes.shell import check_script
from tests.fakes.tpu_fake import TpuFake, start_tpu_fake

PROJECT = "ct-test"
REGION = "us-west4"
ZONE = "us-west4-a"
RUN = "tpu-abc123"
TYPE = "v5litepod-8"
SCRIPT = "#!/bin/bash\necho boot\n"


@pytest.fixture
def fakes() -> Iterator[tuple[GceFake, TpuFake]]:
    gce = start_gce_fake()
    tpu = start_tpu_fake(gce)
    gce.operation_polls_to_done = 2
    try:
        yield gce, tpu
    finally:
        tpu.stop()
        gce.stop()


@pytest.fixture
def compute(fakes: tuple[GceFake, TpuFake], monkeypatch: pytest.MonkeyPatch) -> GcpCompute:
    gce, tpu = fakes
    monkeypatch.setenv("CLOUDTRAIN_GCE_ENDPOINT", gce.url)
    monkeypatch.setenv("CLOUDTRAIN_IAM_ENDPOINT", gce.url)
    monkeypatch.setenv("CLOUDTRAIN_TPU_ENDPOINT", tpu.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    # the project's default account: the fake's IAM holds it, no run account to make here
    options = {"service_account": default_service_account(PROJECT)}
    config = ProviderConfig(name="gcp", region=REGION, zone=ZONE, options=options)
    made = GcpProvider(config).compute
    made.tpus.queued_wait_s = 1.0  # a sold-out spot request gives up fast here
    return made


def run_info() -> RunInfo:
    return RunInfo(RUN, REGION, ZONE, (2222, 2232), nodes=("worker-0",))


def request(spot: bool = False, index: int = 0) -> NodeRequest:
    return NodeRequest(
        RUN, "worker", index, TYPE, SCRIPT, zone=ZONE, spot=spot,
        accelerator="TPU-v5e", accelerator_count=8,
    )  # fmt: skip


def test_on_demand_tpu_vm_carries_the_runs_labels_tag_network_account_and_script(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    _, tpu = fakes
    node = compute.create_node(run_info(), request())
    assert (node.name, node.state, node.zone, node.instance_type) == (
        f"ct-{RUN}-worker-0", "running", ZONE, TYPE
    )  # fmt: skip
    assert node.private_ip and not node.spot
    [stored] = tpu.nodes(PROJECT, ZONE)
    assert stored["labels"] == {
        "cloudtrain-run": RUN, "cloudtrain-role": "worker", "cloudtrain-index": "0"
    }  # fmt: skip
    assert stored["tags"] == [f"cloudtrain-{RUN}"]  # the run's firewall rules' target
    assert stored["metadata"] == {"startup-script": SCRIPT}
    assert stored["runtimeVersion"] == "tpu-vm-tf-2.16.1-pjrt"  # tpu_types' default
    assert stored["networkConfig"]["network"].endswith("/global/networks/default")
    assert stored["serviceAccount"]["email"] == default_service_account(PROJECT)
    assert tpu.queued_resources(PROJECT) == []  # on demand: no queued resource
    # idempotent: the same name again is adopted, not a second VM nor an error
    assert compute.create_node(run_info(), request()).name == node.name
    assert len(tpu.nodes(PROJECT)) == 1
    assert [n.name for n in compute.list_nodes(RUN)] == [node.name]
    assert [n.name for n in compute.list_nodes("other-run")] == []
    compute.delete_node(node)
    assert tpu.nodes(PROJECT) == [] and compute.list_nodes(RUN) == []
    compute.delete_node(node)  # idempotent


def test_the_runtime_option_is_the_vms_runtime(
    fakes: tuple[GceFake, TpuFake], compute: GcpCompute
) -> None:
    _, tpu = fakes
    options = {**dict(compute.config.options), "tpu_runtime": "tpu-vm-tf-2.15.0-pjrt"}
    other = GcpProvider(ProviderConfig("gcp", REGION, ZONE, options=options)).compute
    other.create_node(run_info(), request())
    assert [n["runtimeVersion"] for n in tpu.nodes(PROJECT)] == ["tpu-vm-tf-2.15.0-pjrt"]


def test_spot_is_a_queued_resource_that_a_preemption_shows_and_delete_removes(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    _, tpu = fakes
    node = compute.create_node(run_info(), request(spot=True))
    assert node.state == "running" and node.spot
    [queued] = tpu.queued_resources(PROJECT, ZONE)
    assert "spot" in queued and queued["name"].endswith(f"/queuedResources/{node.name}")
    assert queued["tpu"]["nodeSpec"][0]["nodeId"] == node.name
    assert queued["state"]["state"] == "ACTIVE"
    tpu.preempt(node.name)
    [seen] = compute.list_nodes(RUN)
    assert (seen.name, seen.state, seen.alive) == (node.name, "preempted", False)
    compute.delete_node(seen)
    assert tpu.nodes(PROJECT) == [] and tpu.queued_resources(PROJECT) == []
    # the run recreates it under the same name (Recovery's replacement)
    again = compute.create_node(run_info(), request(spot=True))
    assert again.state == "running" and len(tpu.queued_resources(PROJECT)) == 1


def test_a_sold_out_zone_is_no_capacity_on_demand_and_spot_and_leaves_nothing(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    _, tpu = fakes
    tpu.account.sell_out(ZONE)
    with pytest.raises(NoCapacityError) as on_demand:
        compute.create_node(run_info(), request())
    assert on_demand.value.zone == ZONE and "no more capacity" in on_demand.value.message
    with pytest.raises(NoCapacityError) as spot:  # the queued request waits: given up
        compute.create_node(run_info(), request(spot=True, index=1))
    assert spot.value.zone == ZONE and "WAITING_FOR_RESOURCES" in spot.value.message
    assert tpu.nodes(PROJECT) == [] and tpu.queued_resources(PROJECT) == []
    # a zone of the region that does not sell the type: no capacity there, with no call
    calls = len(tpu.requests)
    elsewhere = NodeRequest(RUN, "worker", 2, TYPE, SCRIPT, zone="us-west4-b")
    with pytest.raises(NoCapacityError, match="does not sell") as unsold:
        compute.create_node(run_info(), elsewhere)
    assert unsold.value.zone == "us-west4-b" and len(tpu.requests) == calls


def test_quota_permission_and_a_disabled_api_are_the_projects_errors(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    _, tpu = fakes
    tpu.account.new_project()  # every TPU quota 0
    with pytest.raises(QuotaError):
        compute.create_node(run_info(), request())
    tpu.account.set_quota(REGION, "v5litepod", 8)
    tpu.account.deny("tpu.nodes.create")
    with pytest.raises(CredentialsError, match=r"tpu\.nodes\.create"):
        compute.create_node(run_info(), request())
    tpu.account.disable()
    with pytest.raises(ProviderError, match=r"tpu\.googleapis\.com"):
        compute.create_node(run_info(), request())
    assert compute.list_nodes(RUN) == []  # an API that is off has no TPU VMs: not an error


def test_gc_inventory_names_tpu_vms_and_bare_queued_resources(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    _, tpu = fakes
    node = compute.create_node(run_info(), request())
    tpu.account.sell_out(ZONE, spot_only=True)
    compute.tpus.queued_wait_s = 600.0
    # a spot request still waiting (the controller was killed while it waited)
    compute.tpus._create_once(
        compute.tpus.client, request(spot=True, index=1), ZONE,
        {"acceleratorType": TYPE, "runtimeVersion": "tpu-vm-tf-2.16.1-pjrt",
         "labels": {"cloudtrain-run": RUN, "cloudtrain-role": "worker", "cloudtrain-index": "1"}},
        600.0, "queue",
    )  # fmt: skip
    tagged = {(t.run_id, t.kind, t.id, t.instance_type) for t in compute.inventory()}
    waiting = f"ct-{RUN}-worker-1"
    assert {(RUN, "node", node.name, TYPE), (RUN, "node", waiting, TYPE)} <= tagged
    listed = {n.name: n.state for n in compute.list_nodes(RUN)}
    assert listed == {node.name: "running", waiting: "pending"}
    compute.delete_nodes(RUN)  # what down does
    assert tpu.nodes(PROJECT) == [] and tpu.queued_resources(PROJECT) == []


def test_a_box_without_the_tpu_fake_lists_no_tpus_and_refuses_to_create(
    compute: GcpCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_TPU_ENDPOINT")
    bare = GcpProvider(compute.config).compute
    assert bare.list_nodes(RUN) == []
    with pytest.raises(ProviderError, match="CLOUDTRAIN_TPU_ENDPOINT"):
        bare.create_node(run_info(), request())


def test_the_tpu_vms_bootstrap_uses_the_images_tensorflow_and_tpu_name_local(
    compute: GcpCompute,
) -> None:
    blocks = compute.startup_blocks(run_info(), request())
    assert blocks.env["CT_TF_FROM_IMAGE"] == "2.16.1"  # tpu-vm-tf-2.16.1-pjrt's
    assert blocks.env["CT_TPU_RUNTIME"] == "tpu-vm-tf-2.16.1-pjrt"
    assert "CT_GPU_COUNT" not in blocks.env  # the provisioner passes 0 for a TPU device
    assert "export TPU_NAME=local" in blocks.metadata
    gpu = compute.startup_blocks(run_info(), NodeRequest(RUN, "worker", 0, "n1-standard-8", ""))
    assert "CT_TF_FROM_IMAGE" not in gpu.env and "TPU_NAME" not in gpu.metadata


def test_tpu_zones_are_the_regions_that_sell_tpus() -> None:
    assert tpu_zones("us-west4") == ["us-west4-a"]
    assert tpu_zones("asia-east1") == []  # no call where no TPU is sold
    assert "europe-west4-a" in tpu_zones(None)


def test_a_tpu_vms_script_takes_the_images_tensorflow_and_passes_shellcheck(
    compute: GcpCompute, tmp_path: Path
) -> None:
    scripts = {}
    for kind, req in (("tpu", request()), ("cpu", NodeRequest(RUN, "ps", 0, "n2-standard-4", ""))):
        params = StartupParams(
            run_id=RUN, role=req.role, index=0, node_name=req.name, store_uri="gs://b",
            bundle_url="https://storage.googleapis.com/b/k?X-Goog-Signature=ab",
            bundle_sha256="ab" * 32,
            log_put_url="https://storage.googleapis.com/b/l?X-Goog-Signature=cd",
            version="0.1.0", deadline_epoch=1767225600, gpu_count=0,  # a TPU (provisioning.py)
            pip_extra="gcp",
        )  # fmt: skip
        script = tmp_path / f"{kind}.sh"
        script.write_text(render_startup(params, compute.startup_blocks(run_info(), req)))
        check_script(script)
        scripts[kind] = script.read_text()
    assert "\nimage_stack\n" in scripts["tpu"]  # the image's TensorFlow, never the pinned one
    assert "\nCT_GPU_COUNT='0'\n" in scripts["tpu"]
    assert "image_stack" not in scripts["cpu"]  # other nodes' scripts are as they were
