"""The controller node's identity on Azure (issue 17): its VM's system-assigned identity and four
role assignments that reach this run only.

At the run's resource group (cloudtrain's own `ct-<run>` group; never a user's group):
- Contributor (create, stop and delete the run's VMs, NICs, disks, the group itself);
- Role Based Access Control Administrator under an ABAC condition: it may create role
  assignments only of the two roles the nodes get (identity.py: the subscription's node role of
  node_role.py, Virtual Machine Contributor), only to service principals (the nodes' identities;
  a replacement node is granted by the controller), and delete
  only those (plus this role's own assignments, so it can remove its own grants last).
At the run's blob container:
- Storage Blob Data Contributor (the lease, the journal, checkpoints: this container only);
- Role Based Access Control Administrator under the same condition (a node's container grant).

The condition follows "Delegate Azure role assignment management to others with conditions"
(https://learn.microsoft.com/azure/role-based-access-control/delegate-role-assignments-portal,
and "Examples to delegate Azure role assignment management with conditions",
https://learn.microsoft.com/azure/role-based-access-control/delegate-role-assignments-examples:
"Constrain roles", "Constrain roles and principal types"): `!(ActionMatches{write}) OR
@Request[...:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals {...}`, the same for delete on
`@Resource[...]`, conditionVersion "2.0".

The VM's identity exists only once the VM does, so `grant` runs right after the controller VM is
made (as the nodes' grants do); the assignments' names are derived from scope, role and run (not
the principal), so the ledger can record them before, and a re-created controller VM's new
identity replaces the old one's assignment of the same name (ARM refuses to change a principal:
`grant` deletes, then creates).
"""

from __future__ import annotations

from typing import Any

from cloudtrain.core.errors import NotFound, ProviderError, TransientError
from cloudtrain.providers.azure import node_role
from cloudtrain.providers.azure.bodies import (
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    VIRTUAL_MACHINE_CONTRIBUTOR,
    role_assignment_name,
    role_definition_id,
)
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors, error_codes
from cloudtrain.providers.base import Resource

KIND = "controller-role-assignment"
CONTRIBUTOR = "b24988ac-6180-42a0-ab88-20f7382dd24c"  # built-in role ids (Azure built-in roles)
RBAC_ADMINISTRATOR = "f58310d9-a9f6-439a-9e8d-f62e7b41a168"
CONDITION_VERSION = "2.0"
_ASSIGNMENTS = "/providers/Microsoft.Authorization/roleAssignments"
_ATTR = "Microsoft.Authorization/roleAssignments"


def node_roles(subscription: str) -> tuple[str, str]:
    """The GUIDs of the two roles a node gets: the subscription's node role (node_role.py, on
    the run's container) and Virtual Machine Contributor (on its own VM). Pure."""
    return (node_role.role_guid(subscription), VIRTUAL_MACHINE_CONTRIBUTOR)


def delegation_condition(subscription: str) -> str:
    """The ABAC condition of the controller's RBAC Administrator assignments: write only the
    nodes' two roles (`node_roles`: never the built-in Storage Blob Data Contributor, whose
    container Actions a node must not hold), to service principals only; delete only those
    and this role. Pure."""
    write_roles = ", ".join(node_roles(subscription))
    delete_roles = ", ".join((*node_roles(subscription), RBAC_ADMINISTRATOR))
    return (
        "("
        f" ( !(ActionMatches{{'{_ATTR}/write'}}) )"
        " OR"
        f" ( @Request[{_ATTR}:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals {{{write_roles}}}"
        f" AND @Request[{_ATTR}:PrincipalType] ForAnyOfAnyValues:StringEqualsIgnoreCase"
        " {'ServicePrincipal'} )"
        " ) AND ("
        f" ( !(ActionMatches{{'{_ATTR}/delete'}}) )"
        " OR"
        f" ( @Resource[{_ATTR}:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals {{{delete_roles}}} )"
        " )"
    )


def group_scope(subscription: str, group: str) -> str:
    """The resource id of a resource group (a role assignment scope). Pure."""
    return f"/subscriptions/{subscription}/resourceGroups/{group}"


def grants(group: str, container: str, subscription: str) -> list[tuple[str, str, bool]]:
    """(scope, role guid, conditioned) of the four assignments. Pure."""
    rg = group_scope(subscription, group)
    return [
        (rg, CONTRIBUTOR, False),
        (rg, RBAC_ADMINISTRATOR, True),
        (container, STORAGE_BLOB_DATA_CONTRIBUTOR, False),
        (container, RBAC_ADMINISTRATOR, True),
    ]


def assignment_id(scope: str, role: str, run_id: str) -> str:
    """The id of the controller's assignment of `role` at `scope` (name from the three). Pure."""
    name = role_assignment_name(scope.rstrip("/"), role, f"controller:{run_id}")
    return f"{scope.rstrip('/')}{_ASSIGNMENTS}/{name}"


def planned(run_id: str, group: str, container: str, subscription: str) -> list[Resource]:
    """The four assignments as Resources (id: the assignment id). Pure."""
    return [
        Resource("azure", KIND, assignment_id(scope, role, run_id), None, run_id)
        for scope, role, _ in grants(group, container, subscription)
    ]


def body(subscription: str, role: str, principal: str, run_id: str, conditioned: bool) -> Any:
    """The PUT body of one assignment. Pure."""
    props: dict[str, Any] = {
        "roleDefinitionId": role_definition_id(subscription, role),
        "principalId": principal,
        "principalType": "ServicePrincipal",
        "description": f"cloudtrain controller {run_id}: this run only",
    }
    if conditioned:
        props["condition"] = delegation_condition(subscription)
        props["conditionVersion"] = CONDITION_VERSION
    return {"properties": props}


def grant(
    clients: ArmClients, run_id: str, group: str, container: str, principal: str
) -> list[Resource]:
    """Give the controller VM's identity `principal` the four assignments; an assignment of the
    same name held by an earlier identity is deleted first. Idempotent; blocks. Raises
    TransientError while Azure's directory has not replicated the new identity."""
    subscription = clients.auth.subscription
    made = []
    for scope, role, conditioned in grants(group, container, subscription):
        full = assignment_id(scope, role, run_id)
        name = full.rsplit("/", 1)[1]
        existing = _get(clients, full)
        if existing is not None and str(existing.principal_id).lower() != principal.lower():
            revoke(clients, [full])
        what = f"grant the controller of run {run_id} role {role} at {scope}"
        try:
            with azure_errors(what):
                clients.authorization.role_assignments.create(
                    scope, name, body(subscription, role, principal, run_id, conditioned)
                )
        except ProviderError as err:
            codes = error_codes(err)
            if "PrincipalNotFound" in codes:
                raise TransientError(f"{err.message} (the identity is not replicated yet)") from err
            if "RoleAssignmentExists" not in codes:
                raise
        made.append(Resource("azure", KIND, full, None, run_id, principal))
    return made


def _get(clients: ArmClients, full: str) -> Any | None:
    try:
        with azure_errors(f"read role assignment {full}"):
            return clients.authorization.role_assignments.get_by_id(full)
    except NotFound:
        return None


def find(clients: ArmClients, run_id: str, group: str, container: str) -> list[Resource]:
    """The controller's assignments that exist (by their derived ids). Blocks; read-only."""
    subscription = clients.auth.subscription
    out = []
    for res in planned(run_id, group, container, subscription):
        found = _get(clients, res.id)
        if found is not None:
            out.append(Resource("azure", KIND, res.id, None, run_id, str(found.principal_id)))
    return out


def revoke(clients: ArmClients, ids: list[str]) -> None:
    """Delete the assignments `ids`. Idempotent (missing is fine); blocks."""
    for full in ids:
        try:
            with azure_errors(f"remove the controller's role assignment {full}"):
                clients.authorization.role_assignments.delete_by_id(full)
        except NotFound:
            continue
