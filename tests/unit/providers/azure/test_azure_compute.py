"""AzureCompute against the ARM fake (through the real azure-mgmt clients) and Azurite.

The VM as ARM receives it, the two role assignments of a node's identity (the run's container,
the VM itself) and their removal, capacity and quota errors, failed and stopped VMs replaced,
the driver extension, the group deleted at teardown (never a user's), the serial log, and the
startup blocks: shellcheck, the SAS header, and the node deleting itself through its identity.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import NoCapacityError, ProviderError, QuotaError
from cloudtrain.providers.azure import node_role
from cloudtrain.providers.azure.bodies import (
    VIRTUAL_MACHINE_CONTRIBUTOR,
)
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.azure.startup import startup_blocks
from cloudtrain.providers.base import NodeRequest, RunInfo
from cloudtrain.providers.retrying import RetryingCompute
from cloudtrain.run.startup import StartupParams, render_startup
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azure_config, azurite, azurite_session
from tests.fakes.shell import check_script, run_with_curl_shim

__all__ = ["azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
RUN = "unit-abc123"
GROUP = f"cloudtrain-{RUN}"
STORE = f"az://devstoreaccount1/ct-{RUN}"
SCRIPT = "#!/bin/bash\necho boot\n"


@pytest.fixture
def compute(azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureCompute]:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", raising=False)
    provider = AzureProvider(azure_config("eastus"))
    provider.store(STORE).ensure_bucket()
    yield provider.compute


def run_info(zone: str | None = None) -> RunInfo:
    return RunInfo(RUN, "eastus", zone, (2222, 2232), store_uri=STORE)


def request(index: int = 0, gpu: bool = True, image: str | None = None) -> NodeRequest:
    return NodeRequest(
        RUN,
        "worker",
        index,
        "Standard_NC4as_T4_v3" if gpu else "Standard_D4s_v5",
        SCRIPT,
        spot=True,
        image=image,
        accelerator="T4" if gpu else None,
        accelerator_count=1 if gpu else 0,
    )


def vms(cloud: AzureCloud) -> list[dict[str, Any]]:
    return cloud.arm.resources(kind="virtualMachines")


def test_a_node_is_a_vm_whose_identity_gets_its_container_and_itself(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    node = compute.create_node(run_info(), request())
    assert node.state == "running" and node.private_ip and node.spot
    (vm,) = vms(azure_cloud)
    props = vm["properties"]
    assert props["hardwareProfile"]["vmSize"] == "Standard_NC4as_T4_v3"
    assert base64.b64decode(props["osProfile"]["customData"]).decode() == SCRIPT
    assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete")
    assert vm["identity"]["type"] == "SystemAssigned"
    assert vm["tags"] == {
        "cloudtrain-run": RUN,
        "cloudtrain-role": "worker",
        "cloudtrain-index": "0",
    }
    principal = vm["identity"]["principalId"]
    grants = {
        a["properties"]["scope"]: a["properties"]["roleDefinitionId"].rsplit("/", 1)[-1]
        for a in azure_cloud.arm.role_assignments()
        if a["properties"]["principalId"] == principal
    }
    container = [s for s in grants if s.endswith(f"/containers/ct-{RUN}")]
    blob_role = node_role.role_guid(compute.subscription)  # data actions only: node_role.py
    assert len(container) == 1 and grants[container[0]] == blob_role
    assert grants[vm["id"]] == VIRTUAL_MACHINE_CONTRIBUTOR
    assert len(grants) == 2, "nothing broader than the container and the VM itself"
    extensions = azure_cloud.arm.resources(kind="extensions")
    assert [e["name"].rsplit("/", 1)[-1] for e in extensions] == ["NvidiaGpuDriverLinux"]

    assert compute.create_node(run_info(), request()).cloud_id == node.cloud_id, "idempotent"
    compute.delete_nodes(RUN)
    assert vms(azure_cloud) == [] and compute.list_nodes(RUN) == []
    assert azure_cloud.arm.resources(kind="networkInterfaces") == [], "the NIC goes with the VM"
    assert not [a for a in azure_cloud.arm.role_assignments() if principal in str(a)]


def test_no_extension_without_a_gpu_or_on_an_image_with_the_driver(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    compute.create_nodes(run_info(), [request(0, gpu=False), request(1, image="ubuntu-hpc")])
    assert azure_cloud.arm.resources(kind="extensions") == []


def test_capacity_and_quota_errors(compute: AzureCompute, azure_cloud: AzureCloud) -> None:
    compute.ensure_network(run_info())
    azure_cloud.arm.fail_next_vm_create("*", "SkuNotAvailable")
    with pytest.raises(NoCapacityError):
        compute.create_node(run_info(), request())
    azure_cloud.arm.fail_next_vm_create("*", "ZonalAllocationFailed")
    with pytest.raises(NoCapacityError) as zonal:
        compute.create_node(run_info("2"), request())
    assert zonal.value.zone == "2"
    failed = compute.list_nodes(RUN)
    assert [n.state for n in failed] == ["terminated"], "a failed VM stays until deleted"
    compute.delete_listed(failed)
    azure_cloud.arm.fail_next_vm_create(
        "*",
        "OperationNotAllowed",
        "Operation could not be completed as it results in exceeding approved "
        "standardNCASv3_T4Family Cores quota. Current Limit: 0",
    )
    with pytest.raises(QuotaError, match="standardNCASv3_T4Family"):
        compute.create_node(run_info(), request())
    assert compute.zones() == ["1", "2", "3"]


def test_stopped_vms_are_replaced_and_slow_identities_retried(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    first = compute.create_node(run_info(), request())
    azure_cloud.arm.set_vm_power_state(first.name, "deallocated")
    assert compute.list_nodes(RUN)[0].state == "stopped"
    azure_cloud.arm.fail_next_role_assignment("PrincipalNotFound")  # replication lag
    (fresh,) = RetryingCompute(compute).create_nodes(run_info(), [request()])
    assert fresh.alive and fresh.cloud_id == first.cloud_id  # same name, same id path
    assert azure_cloud.arm.vm_power_state(first.name) == "running"


def test_teardown_deletes_the_group_but_never_a_users(
    compute: AzureCompute, azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = compute.ensure_network(run_info())
    assert [(r.kind, r.id) for r in made] == [("resource-group", GROUP)]
    assert compute.list_resources(RUN) == made
    compute.delete_resources(compute.list_resources(RUN))
    assert GROUP not in [g["name"] for g in azure_cloud.arm.groups()]
    compute.delete_resources(made)  # already gone: fine

    monkeypatch.setattr(compute, "rg", "team-ml")  # the `resource_group` option, as read
    compute.clients.resource.resource_groups.create_or_update("team-ml", {"location": "eastus"})
    made = compute.ensure_network(run_info())
    assert sorted(r.kind for r in made) == ["nsg", "vnet"]
    compute.create_node(run_info(), request())
    compute.delete_nodes(RUN)
    compute.delete_resources(compute.list_resources(RUN))
    assert "team-ml" in [g["name"] for g in azure_cloud.arm.groups()]
    assert azure_cloud.arm.resources(group="team-ml") == []


def test_serial_log_and_missing_subscription(
    compute: AzureCompute, azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    compute.ensure_network(run_info())
    node = compute.create_node(run_info(), request())
    azure_cloud.arm.set_serial(node.name, "cloudtrain-bootstrap[worker-0]: FAILED: no driver\n")
    assert "FAILED: no driver" in compute.console_output(node)
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID")
    with pytest.raises(ProviderError, match="no Azure subscription"):
        AzureProvider(azure_config("eastus")).compute  # noqa: B018


# --- startup blocks ----------------------------------------------------------------------------

CURL_SHIM = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$SHIM_LOG"
case "$*" in
  *oauth2/token*) [ -n "${SHIM_FAIL:-}" ] && exit 7
    echo '{"access_token":"eyJ.node","expires_on":"1","token_type":"Bearer"}' ;;
  *compute/resourceId*)
    printf '%s' '/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/v' ;;
esac
"""


def _rendered(driver_extension: bool) -> str:
    params = StartupParams(
        run_id=RUN,
        role="worker",
        index=0,
        node_name="n",
        store_uri=STORE,
        bundle_url="https://a.blob.core.windows.net/c/b.tar.gz?sv=1&sig=abc",
        bundle_sha256="ab" * 32,
        log_put_url="https://a.blob.core.windows.net/c/l.log?sv=1&sig=def",
        version="0.1.0",
        deadline_epoch=1767225600,
        gpu_count=1,
        pip_extra="azure",
    )
    return render_startup(params, startup_blocks(driver_extension))


@pytest.mark.parametrize("extension", [True, False], ids=["driver-extension", "plain"])
def test_startup_blocks_pass_shellcheck(extension: bool, tmp_path: Path) -> None:
    script = tmp_path / "startup.sh"
    script.write_text(_rendered(extension))
    assert ("NvidiaGpuDriverLinux" in script.read_text()) is extension
    check_script(script)


def _shell(tmp_path: Path, body: str, **env: str) -> tuple[int, list[str]]:
    rendered = _rendered(False)
    start = rendered.index("delete_self() {")
    functions = rendered[start : rendered.index("\n}\n", start) + 3]
    start = rendered.index("storage_headers() { :; }")
    functions += rendered[start : rendered.index("upload_log()")]
    start = rendered.index("storage_headers() { # Put Blob")
    functions += rendered[start : rendered.index("\n}\n", start) + 3]
    return run_with_curl_shim(tmp_path, CURL_SHIM, functions + body, **env)


def test_the_node_deletes_itself_through_its_identity(tmp_path: Path) -> None:
    rc, calls = _shell(tmp_path, "delete_self\n")
    assert rc == 0
    assert "Metadata:true" in calls[0] and "resource=https%3A%2F%2Fmanagement.azure.com" in calls[0]
    # bounded: a connect timeout and a total one (issue 29: every call of the script is)
    assert calls[-1].startswith(
        "-fsS --connect-timeout 10 --max-time 60 -X DELETE -H Authorization: Bearer eyJ.node"
    )
    assert calls[-1].endswith(
        "https://management.azure.com/subscriptions/s/resourceGroups/g/providers/"
        "Microsoft.Compute/virtualMachines/v?api-version=2024-07-01"
    )
    rc, calls = _shell(tmp_path, "delete_self || echo fallback\n", SHIM_FAIL="1")
    assert len(calls) == 1, "no token: no delete attempted (the caller powers off)"


def test_sas_uploads_say_the_blob_type(tmp_path: Path) -> None:
    url = "https://a.blob.core.windows.net/c/l.log?sv=1&sig=def"
    rc, calls = _shell(tmp_path, f"ct_curl -fsS -T f {url!r}\nct_curl -fsS file:///x\n")
    assert rc == 0
    assert calls == [f"-H x-ms-blob-type: BlockBlob -fsS -T f {url}", "-fsS file:///x"]
