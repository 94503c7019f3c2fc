"""The controller node's identity on Azure (issue 17), through the real azure-mgmt clients
against the ARM fake (which checks a role assignment's ABAC condition and its version strictly):
what AzureCompute really sends.

The role assignment PUTs are taken from the HTTP requests the SDK sent (security_kit); their
scopes, roles and condition are checked, and the condition is evaluated (arm_conditions) for
the writes and deletes a controller might attempt: only the nodes' two roles, only to service
principals, may be assigned; nothing is granted above the run's group or container. The
controller VM runs under its own identity, on demand, on the CPU image; teardown removes every
controller-role-assignment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.azure import controller_identity as ctl
from cloudtrain.providers.azure import node_role
from cloudtrain.providers.azure.bodies import (
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    VIRTUAL_MACHINE_CONTRIBUTOR,
)
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.base import NodeRequest
from tests.fakes.arm_conditions import Request, evaluate
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azure_config, azurite, azurite_session
from tests.unit import security_kit as kit
from tests.unit.providers.azure.test_azure_compute import (
    GROUP,
    RUN,
    SCRIPT,
    compute,
    request,
    run_info,
)

__all__ = ["azure_cloud", "azurite", "azurite_session", "compute"]  # fixtures, for pytest
WRITE = "Microsoft.Authorization/roleAssignments/write"
DELETE = "Microsoft.Authorization/roleAssignments/delete"
OWNER = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"
USER_ACCESS_ADMIN = "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9"


def _controller(**kw: Any) -> NodeRequest:
    ask = dict(spot=True, image="dlvm", accelerator="T4", accelerator_count=1, **kw)
    return NodeRequest(RUN, "controller", 0, "Standard_B2s", SCRIPT, **ask)


@pytest.fixture
def ready(compute: AzureCompute, azure_cloud: AzureCloud) -> Iterator[tuple[Any, Any, list[Any]]]:
    compute.ensure_network(run_info())
    assert compute.ensure_controller_identity(run_info()) == []
    with kit.record_requests() as sent:
        node = compute.create_node(run_info(), _controller())
    puts = [
        (what.split(" ", 1)[1], json.loads(body))
        for api, what, body in sent.items
        if api == "http" and what.startswith("PUT ") and "/roleAssignments/" in what
    ]
    yield node, puts, compute.planned_controller_identity(run_info())


def _principal(cloud: AzureCloud, name: str) -> str:
    (vm,) = [v for v in cloud.arm.resources(kind="virtualMachines") if v["name"] == name]
    return str(vm["identity"]["principalId"])


def test_assignments_as_sent_reach_the_run_group_and_container_only(
    ready: Any, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    node, puts, planned = ready
    principal = _principal(azure_cloud, node.name)
    sub = compute.subscription
    seen = {}
    for url, body in puts:
        scope = url.split("/providers/Microsoft.Authorization/roleAssignments/")[0]
        scope = "/" + scope.split("/", 3)[3] if scope.startswith("http") else scope
        props = body["properties"]
        assert props["principalId"] == principal and props["principalType"] == "ServicePrincipal"
        seen[(scope.lower(), props["roleDefinitionId"].rsplit("/", 1)[1])] = props
    rg = f"/subscriptions/{sub}/resourcegroups/{GROUP}".lower()
    scopes = {s for s, _ in seen}
    group_scopes = {s for s in scopes if s.endswith(f"/resourcegroups/{GROUP}".lower())}
    container_scopes = {s for s in scopes if s.endswith(f"/containers/ct-{RUN}")}
    assert len(group_scopes) == 1 and len(container_scopes) == 1
    assert scopes == group_scopes | container_scopes  # nothing wider, nothing else
    assert group_scopes == {rg}
    (g,), (c,) = group_scopes, container_scopes
    assert set(seen) == {
        (g, ctl.CONTRIBUTOR),
        (g, ctl.RBAC_ADMINISTRATOR),
        (c, STORAGE_BLOB_DATA_CONTRIBUTOR),
        (c, ctl.RBAC_ADMINISTRATOR),
    }
    for (_scope, role), props in seen.items():
        if role == ctl.RBAC_ADMINISTRATOR:
            assert props["conditionVersion"] == "2.0"
            assert props["condition"] == ctl.delegation_condition(sub)
        else:
            assert props.get("condition") is None and props.get("conditionVersion") is None
    # the ids the ledger recorded before are the ones made
    held = {a["id"].lower() for a in azure_cloud.arm.role_assignments()}
    assert {r.id.lower() for r in planned} <= held
    assert {r.kind for r in planned} == {"controller-role-assignment"}


def test_the_condition_delegates_only_the_two_node_roles_to_service_principals(
    ready: Any, compute: AzureCompute
) -> None:
    _, puts, _ = ready
    blob_role = node_role.role_guid(compute.subscription)  # the nodes' container role
    (cond,) = {b["properties"]["condition"] for _, b in puts if b["properties"].get("condition")}

    def write(role: str, kind: str = "ServicePrincipal") -> bool:
        return evaluate(cond, Request(WRITE, {"RoleDefinitionId": role, "PrincipalType": kind}, {}))

    def delete(role: str) -> bool:
        return evaluate(cond, Request(DELETE, {}, {"RoleDefinitionId": role}))

    assert write(blob_role) and write(VIRTUAL_MACHINE_CONTRIBUTOR)
    # the built-in Storage Blob Data Contributor has container Actions (delete, write) that a
    # node must not hold: the controller cannot grant it either
    roles = (ctl.CONTRIBUTOR, OWNER, USER_ACCESS_ADMIN, ctl.RBAC_ADMINISTRATOR)
    for role in (*roles, STORAGE_BLOB_DATA_CONTRIBUTOR):
        assert not write(role), role
    assert not write(blob_role, "User")
    assert not write(VIRTUAL_MACHINE_CONTRIBUTOR, "Group")
    assert delete(blob_role) and delete(VIRTUAL_MACHINE_CONTRIBUTOR)
    assert delete(ctl.RBAC_ADMINISTRATOR)  # its own grants, last
    for role in (ctl.CONTRIBUTOR, OWNER, USER_ACCESS_ADMIN, STORAGE_BLOB_DATA_CONTRIBUTOR):
        assert not delete(role), role
    # any other action is not this condition's business (the role's own actions bound it)
    assert evaluate(cond, Request("Microsoft.Compute/virtualMachines/write", {}, {}))


def test_the_fake_refuses_a_condition_without_version_2(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    scope = f"/subscriptions/{compute.subscription}/resourceGroups/{GROUP}"
    auth = compute.clients.authorization.role_assignments
    body = ctl.body(
        compute.subscription,
        ctl.RBAC_ADMINISTRATOR,
        "1" * 8 + "-1111-1111-1111-" + "1" * 12,
        RUN,
        True,
    )
    body["properties"]["conditionVersion"] = "1.0"
    with pytest.raises(Exception, match="InvalidConditionVersion"):
        auth.create(scope, "0b3f3f3c-1111-4a4a-8b8b-1234567890ab", body)
    body["properties"]["conditionVersion"] = "2.0"
    body["properties"]["condition"] = "@Request[Microsoft.Authorization/roleAssignments:Foo] X {1}"
    with pytest.raises(Exception, match="InvalidRoleAssignmentCondition"):
        auth.create(scope, "0b3f3f3c-1111-4a4a-8b8b-1234567890ab", body)
    # well formed but over Azure's 8 KB (conditions-faq)
    blob_path = "@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path]"
    body["properties"]["condition"] = f"{blob_path} StringLike '{'a' * 8200}'"
    with pytest.raises(Exception, match="at most 8 KB"):
        auth.create(scope, "0b3f3f3c-1111-4a4a-8b8b-1234567890ab", body)


def test_controller_vm_runs_on_demand_on_cpu_under_its_own_grants(
    ready: Any, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    node, _, _ = ready
    worker = compute.create_node(run_info(), request(0))
    vms = {v["name"]: v for v in azure_cloud.arm.resources(kind="virtualMachines")}
    ctl_vm, wk = vms[node.name], vms[worker.name]
    assert ctl_vm["properties"].get("priority") in (None, "Regular")
    assert wk["properties"].get("priority") == "Spot"
    image = json.dumps(ctl_vm["properties"]["storageProfile"]["imageReference"]).lower()
    assert "ubuntu" in image and "dsvm" not in image and "hpc" not in image
    assert node.role == "controller" and not node.spot
    assert node.name in {n.name for n in compute.list_nodes(RUN)}
    mine = _principal(azure_cloud, node.name)
    worker_roles = {
        a["properties"]["roleDefinitionId"].rsplit("/", 1)[1]
        for a in azure_cloud.arm.role_assignments()
        if a["properties"]["principalId"] == _principal(azure_cloud, worker.name)
    }
    assert worker_roles == {node_role.role_guid(compute.subscription), VIRTUAL_MACHINE_CONTRIBUTOR}
    assert all(
        a["properties"]["principalId"] != mine
        or a["properties"]["roleDefinitionId"].rsplit("/", 1)[1] != VIRTUAL_MACHINE_CONTRIBUTOR
        for a in azure_cloud.arm.role_assignments()
    )


def test_teardown_removes_every_controller_assignment(
    ready: Any, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    node, _, planned = ready
    mine = _principal(azure_cloud, node.name)
    listed = compute.list_resources(RUN)
    # the controller deletes the group (and with it its own VM) last, after its grants
    assert compute.holds_nodes_kinds == {"resource-group"}
    assert "resource-group" in {r.kind for r in listed}
    found = {r.id.lower() for r in listed if r.kind == "controller-role-assignment"}
    assert found == {r.id.lower() for r in planned} and len(found) == 4
    compute.delete_nodes(RUN)
    compute.delete_resources(listed)
    compute.delete_resources(listed)  # idempotent
    assert [
        a for a in azure_cloud.arm.role_assignments() if a["properties"]["principalId"] == mine
    ] == []
    assert [r for r in compute.list_resources(RUN) if r.kind.startswith("controller-")] == []


def test_a_recreated_controller_replaces_the_old_identity_grants(
    ready: Any, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    node, _, _ = ready
    old = _principal(azure_cloud, node.name)
    # the VM goes without cloudtrain (a user's delete in the portal): its grants stay behind
    compute.clients.compute.virtual_machines.begin_delete(GROUP, node.name).result()
    assert any(a["properties"]["principalId"] == old for a in azure_cloud.arm.role_assignments())
    fresh = compute.create_node(run_info(), _controller())
    new = _principal(azure_cloud, fresh.name)
    assert new != old
    holders = {a["properties"]["principalId"] for a in azure_cloud.arm.role_assignments()}
    assert old not in holders and new in holders


def test_a_users_resource_group_is_refused(azure_cloud: AzureCloud, monkeypatch: Any) -> None:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    provider = AzureProvider(azure_config("eastus", resource_group="shared-rg"))
    with pytest.raises(ProviderError, match="own resource group"):
        provider.compute.planned_controller_identity(run_info())
