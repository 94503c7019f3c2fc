"""The role assignments of an Azure node's identity when Azure evicts the node (issue 13).

A Spot VM with evictionPolicy Delete is deleted by Azure, not by cloudtrain, so nothing removes
its role assignments; the replacement VM of the same name gets a new principal. Through the real
azure-mgmt clients against the ARM fake (which answers RoleAssignmentUpdateNotPermitted to a
known assignment name with another principal, as ARM does): the replacement gets its own two
grants, the evicted identity's are removed when the node is replaced and at teardown, and a
node that was never evicted keeps its grants.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from cloudtrain.providers.azure import node_role
from cloudtrain.providers.azure.bodies import (
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    VIRTUAL_MACHINE_CONTRIBUTOR,
)
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.identity import assignment_name
from cloudtrain.providers.retrying import RetryingCompute
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azurite, azurite_session
from tests.unit.providers.azure.test_azure_compute import RUN, compute, request, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session", "compute"]  # fixtures, for pytest


def principal_of(cloud: AzureCloud, name: str) -> str:
    (vm,) = [v for v in cloud.arm.resources(kind="virtualMachines") if v["name"] == name]
    return str(vm["identity"]["principalId"])


def grants_of(cloud: AzureCloud, principal: str) -> dict[str, str]:
    """scope (lower case) -> role guid of the principal's assignments."""
    return {
        a["properties"]["scope"].lower(): a["properties"]["roleDefinitionId"].rsplit("/", 1)[-1]
        for a in cloud.arm.role_assignments()
        if a["properties"]["principalId"] == principal
    }


def vm_and_container(grants: dict[str, Any], vm_id: str) -> bool:
    container = [s for s in grants if s.endswith(f"/containers/ct-{RUN}")]
    return (
        len(grants) == 2
        and grants.get(vm_id.lower()) == VIRTUAL_MACHINE_CONTRIBUTOR
        and len(container) == 1
        and grants[container[0]] == node_role.role_guid(container[0].split("/")[2])
    )


def test_assignment_names_are_unique_per_principal() -> None:
    scope = f"/subscriptions/s/resourceGroups/cloudtrain-{RUN}/providers/x/y/ct-{RUN}-worker-1"
    old, new = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
    first = assignment_name(scope, VIRTUAL_MACHINE_CONTRIBUTOR, old)
    assert str(uuid.UUID(first)) == first, "ARM wants a GUID"
    assert first == assignment_name(scope.upper() + "/", VIRTUAL_MACHINE_CONTRIBUTOR, old)
    assert first != assignment_name(scope, VIRTUAL_MACHINE_CONTRIBUTOR, new), "a new identity"
    assert first != assignment_name(scope, STORAGE_BLOB_DATA_CONTRIBUTOR, old)
    assert first != assignment_name(scope + "x", VIRTUAL_MACHINE_CONTRIBUTOR, old)


def test_an_evicted_node_is_replaced_with_grants_for_its_new_identity(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    kept, lost = compute.create_nodes(run_info(), [request(0), request(1)])
    kept_principal = principal_of(azure_cloud, kept.name)
    old = principal_of(azure_cloud, lost.name)
    azure_cloud.arm.evict(lost.name)  # Azure takes it back: the VM and its NIC and disk go
    assert [n.name for n in compute.list_nodes(RUN)] == [kept.name]
    assert vm_and_container(grants_of(azure_cloud, old), lost.cloud_id or ""), "Azure keeps them"

    # what the orchestrator does for a lost node: delete what is listed of it, then create it
    compute.delete_nodes(RUN, [lost.name])
    (fresh,) = compute.create_nodes(run_info(), [request(1)])
    new = principal_of(azure_cloud, fresh.name)
    assert new != old and fresh.alive
    assert vm_and_container(grants_of(azure_cloud, new), fresh.cloud_id or "")
    assert grants_of(azure_cloud, old) == {}, "nothing of the evicted identity is left"
    assert vm_and_container(grants_of(azure_cloud, kept_principal), kept.cloud_id or "")
    nics = [n["name"] for n in azure_cloud.arm.resources(kind="networkInterfaces")]
    assert sorted(nics) == sorted(f"{n}-nic" for n in (kept.name, fresh.name))
    assert len(azure_cloud.arm.resources(kind="disks")) == 2

    compute.delete_nodes(RUN)
    compute.delete_resources(compute.list_resources(RUN))
    left = [a["properties"]["scope"] for a in azure_cloud.arm.role_assignments()]
    assert left == [], left


def test_teardown_removes_the_grants_of_a_node_evicted_and_never_replaced(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    (node,) = compute.create_nodes(run_info(), [request(0)])
    old = principal_of(azure_cloud, node.name)
    azure_cloud.arm.evict(node.name)
    assert compute.list_nodes(RUN) == []
    # teardown: nothing to list, so only the run's resources are deleted
    compute.delete_resources(compute.list_resources(RUN))
    assert grants_of(azure_cloud, old) == {}
    assert azure_cloud.arm.role_assignments() == []


def test_a_create_retried_after_a_slow_identity_still_grants_it(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    azure_cloud.arm.fail_next_role_assignment("PrincipalNotFound")  # replication lag
    # the retry finds the VM running
    (node,) = RetryingCompute(compute).create_nodes(run_info(), [request(0)])
    principal = principal_of(azure_cloud, node.name)
    assert vm_and_container(grants_of(azure_cloud, principal), node.cloud_id or "")


def test_in_a_users_group_teardown_removes_the_evicted_nodes_vm_grant_too(
    compute: AzureCompute, azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the group is the user's and is kept: nothing deletes the grant on the evicted VM's scope
    monkeypatch.setattr(compute, "rg", "team-ml")  # the `resource_group` option, as read
    compute.clients.resource.resource_groups.create_or_update("team-ml", {"location": "eastus"})
    compute.ensure_network(run_info())
    (node,) = compute.create_nodes(run_info(), [request(0)])
    old = principal_of(azure_cloud, node.name)
    azure_cloud.arm.evict(node.name, "team-ml")
    compute.delete_nodes(RUN)
    compute.delete_resources(compute.list_resources(RUN))
    assert "team-ml" in [g["name"] for g in azure_cloud.arm.groups()]
    assert grants_of(azure_cloud, old) == {}
    assert azure_cloud.arm.role_assignments() == []


def test_a_grant_made_again_carries_the_new_condition(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    # the same assignment PUT again (a retried create finds the VM running) sets its condition,
    # as editing a condition does on ARM: here worker-0 becomes the run's chief
    with_chief = dataclasses.replace(run_info(), nodes=("chief-0", "worker-0"))
    compute.ensure_network(with_chief)
    (node,) = compute.create_nodes(with_chief, [request(0, gpu=False)])

    def condition() -> str:
        principal = principal_of(azure_cloud, node.name)
        (found,) = [
            a["properties"]["condition"]
            for a in azure_cloud.arm.role_assignments()
            if a["properties"]["principalId"] == principal and a["properties"]["condition"]
        ]
        return str(found)

    checkpoints = f"'cloudtrain/runs/{RUN}/checkpoints/*'"
    assert checkpoints not in condition()
    compute.create_nodes(dataclasses.replace(with_chief, nodes=("worker-0",)), [request(0, False)])
    assert checkpoints in condition()
