"""An Azure node's container role: the subscription's custom role, blob data only (node_role.py).

The node's container assignment names a custom role with DataActions only, so the node's
identity holds no control-plane Action on the container: the ARM fake does not authorize ARM
requests per principal, so the refusal of a container delete through ARM is shown by evaluating
the role's definition, as the fake holds it, against ARM's action (the box's Blob front decides
data requests by the same definitions). The fake's role definition routes answer as ARM does
(RoleDefinitionHasAssignments, RoleDefinitionWithSameNameExists, RoleDefinitionLimitExceeded,
RoleDefinitionDoesNotExist), through the real azure-mgmt-authorization client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError

from cloudtrain.core.errors import TransientError
from cloudtrain.providers.azure import identity, node_role
from cloudtrain.providers.azure.bodies import STORAGE_BLOB_DATA_CONTRIBUTOR
from cloudtrain.providers.azure.compute import AzureCompute
from tests.fakes.arm_role_definitions import BUILT_IN, role_from_body
from tests.fakes.arm_testkit import ArmClients
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azurite, azurite_session
from tests.fakes.blob_authorizer import role_grants
from tests.unit.providers.azure.test_azure_compute import GROUP, RUN, compute, request, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session", "compute"]  # fixtures, for pytest
CONTAINERS = "Microsoft.Storage/storageAccounts/blobServices/containers"
BLOBS = f"{CONTAINERS}/blobs"
PRINCIPAL = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"


@pytest.fixture
def granted(compute: AzureCompute, azure_cloud: AzureCloud) -> Iterator[dict]:
    """A run's network and one node made for real; yields the node's container assignment."""
    compute.ensure_network(run_info())
    node = compute.create_node(run_info(), request(gpu=False))
    (vm,) = [v for v in azure_cloud.arm.resources(kind="virtualMachines") if v["name"] == node.name]
    principal = vm["identity"]["principalId"]
    (blob,) = [
        a
        for a in azure_cloud.arm.role_assignments()
        if a["properties"]["principalId"] == principal
        and "/containers/" in a["properties"]["scope"]
    ]
    yield blob


def test_a_nodes_role_holds_no_container_action_through_arm(
    granted: dict, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    role_id = granted["properties"]["roleDefinitionId"]
    assert role_id == node_role.role_id(compute.subscription)
    (definition,) = azure_cloud.arm.role_definitions()
    assert definition["name"] == node_role.role_guid(compute.subscription)
    assert definition["properties"]["assignableScopes"] == [
        f"/subscriptions/{compute.subscription}"
    ]
    role = azure_cloud.arm.role_of(role_id)
    assert role == role_from_body(definition)
    for action in ("delete", "write", "read"):  # ARM: Delete/Create/Get Container
        assert not role_grants(role, f"{CONTAINERS}/{action}", management=True), action
    assert not role_grants(role, "Microsoft.Storage/storageAccounts/listKeys/action", True)
    for action in ("read", "write", "delete", "add/action"):
        assert role_grants(role, f"{BLOBS}/{action}", management=False), action
    # what the node held before: the built-in's Actions let it delete the container
    built_in = BUILT_IN[STORAGE_BLOB_DATA_CONTRIBUTOR]
    assert role_grants(built_in, f"{CONTAINERS}/delete", management=True)


def test_the_role_is_the_subscriptions_and_outlives_the_run(
    granted: dict, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    before = azure_cloud.arm.role_definitions()
    compute.ensure_network(run_info())  # idempotent: the same role, updated in place
    other = dataclasses.replace(run_info(), run_id="unit-def456", store_uri=run_info().store_uri)
    compute.ensure_network(other)
    assert azure_cloud.arm.role_definitions() == before
    for res in compute.list_resources(RUN):
        assert "roleDefinitions" not in res.id, "not a run's resource: never in its ledger"
    for node in compute.list_nodes(RUN):
        compute.delete_node(node)
    compute.delete_resources(compute.list_resources(RUN))
    assert GROUP not in [g["name"] for g in azure_cloud.arm.groups()]
    assert azure_cloud.arm.role_definitions() == before, "other runs' nodes still need it"


def test_a_grant_naming_a_role_arm_has_not_replicated_yet_is_retried(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    compute.ensure_network(run_info())
    scope = compute._scope(run_info().store_uri)
    missing = "0d8f4c2a-1111-4e4e-9b9b-000000000001"
    with pytest.raises(TransientError, match="not replicated"):
        identity.grant(compute.clients, scope, missing, PRINCIPAL, f"ct-{RUN}-worker-0")


def test_the_fake_refuses_what_arm_refuses_for_role_definitions(azure_cloud: AzureCloud) -> None:
    az = ArmClients(azure_cloud.arm, retry_total=0)
    defs = az.auth.role_definitions
    sub = f"/subscriptions/{az.sub}"
    guid = node_role.role_guid(az.sub)
    made = defs.create_or_update(sub, guid, node_role.definition(az.sub))
    assert made.role_type == "CustomRole" and made.permissions[0].actions == []
    again = defs.create_or_update(sub, guid, node_role.definition(az.sub))  # an update: 201
    assert again.id == made.id
    assert defs.get(sub, guid).role_name == node_role.role_name(az.sub)
    customs = list(defs.list(sub, filter="type eq 'CustomRole'"))
    assert [d.name for d in customs] == [guid]
    # another role of the same name
    with pytest.raises(HttpResponseError) as err:
        defs.create_or_update(
            sub, "0d8f4c2a-1111-4e4e-9b9b-000000000002", node_role.definition(az.sub)
        )
    assert (
        err.value.status_code == 409 and err.value.error.code == "RoleDefinitionWithSameNameExists"
    )
    # the root scope cannot be assignable
    rooted = node_role.definition(az.sub)
    rooted["properties"].update(roleName="rooted", assignableScopes=["/"])
    with pytest.raises(HttpResponseError) as err:
        defs.create_or_update(sub, "0d8f4c2a-1111-4e4e-9b9b-000000000003", rooted)
    assert err.value.status_code == 400
    # a role an assignment names cannot be deleted, then can
    group = az.group("rg-roles")
    body = {
        "properties": {
            "roleDefinitionId": made.id,
            "principalId": PRINCIPAL,
            "principalType": "ServicePrincipal",
        }
    }
    assignment = az.auth.role_assignments.create(
        group.id, "0d8f4c2a-2222-4e4e-9b9b-000000000001", body
    )
    with pytest.raises(HttpResponseError) as err:
        defs.delete(sub, guid)
    assert err.value.status_code == 409 and err.value.error.code == "RoleDefinitionHasAssignments"
    az.auth.role_assignments.delete_by_id(assignment.id)
    defs.delete(sub, guid)
    with pytest.raises(HttpResponseError) as err:
        defs.get(sub, guid)
    assert err.value.status_code == 404 and err.value.error.code == "RoleDefinitionDoesNotExist"
    # an assignment naming no role at all
    with pytest.raises(HttpResponseError) as err:
        az.auth.role_assignments.create(group.id, "0d8f4c2a-2222-4e4e-9b9b-000000000002", body)
    assert err.value.error.code == "RoleDefinitionDoesNotExist"
    # the tenant's limit of custom roles (5000; the fake's is settable)
    azure_cloud.arm.custom_role_limit = 0
    with pytest.raises(HttpResponseError) as err:
        defs.create_or_update(sub, guid, node_role.definition(az.sub))
    assert err.value.error.code == "RoleDefinitionLimitExceeded"
