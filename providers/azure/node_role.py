"""The custom role a node's identity holds on the run's container: blob data only (issue 29).

The built-in "Storage Blob Data Contributor" also has control-plane Actions on containers
(`.../blobServices/containers/delete`, `/write`, `/read`; "Azure built-in roles for Storage",
https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/storage), and an ABAC
condition narrows data actions only, so a node holding it could delete or reconfigure the whole
container through ARM. A node's container grant is this role instead: DataActions blobs/read,
write, delete and add/action (what the node's agent does: Get Blob, Put Blob/Block/Block List,
Delete Blob, and List Blobs, which is blobs/read; "Authorize with Microsoft Entra ID",
https://learn.microsoft.com/rest/api/storageservices/authorize-with-azure-active-directory) and
no Action at all, so no container or account operation through ARM.

Lifetime: ONE role per subscription, not one per run. "Although it's possible to create a
custom role with a resource instance in AssignableScopes ..., it's not recommended. Each tenant
supports a maximum of 5000 custom roles ... the level of access is determined by the custom
role assignment (scope + role permissions + security principal) and not the AssignableScopes
... create your custom roles with AssignableScopes of management group, subscription, or
resource group, but assign the custom roles with narrow scope" ("Understand Azure role
definitions", https://learn.microsoft.com/azure/role-based-access-control/role-definitions,
AssignableScopes; the 5000 limit: "Azure custom roles",
https://learn.microsoft.com/azure/role-based-access-control/custom-roles, Custom role limits;
past it ARM answers RoleDefinitionLimitExceeded). What reaches one run only is the assignment:
at the run's container, under the node's own condition (identity.py). A role per run would
spend one of the tenant's 5000 per live run (and each leaked one until `gc`), could not be
deleted while any assignment still names it ("Before you can delete a custom role, you must
remove any role assignments that use the custom role ... RoleDefinitionHasAssignments",
custom-roles, "Find role assignments to delete a custom role"), and would race its own
replication on every run's first grant. So the role lives as long as the subscription's
default storage account does (account.py: it outlives every run): it is never deleted, nor in a
run's ledger, and costs nothing. Its id is derived from the subscription (`role_guid`), so
every run, and the managed-run controller's delegation condition (controller_identity.py),
names the same role without looking it up.

`ensure` PUTs the definition at the subscription (REST: "Role Definitions - Create Or Update",
`PUT {scope}/providers/Microsoft.Authorization/roleDefinitions/{roleDefinitionId}`,
https://learn.microsoft.com/rest/api/authorization/role-definitions/create-or-update): a PUT of
the same id is an update, so it is idempotent and brings an older definition up to date. It
runs from `ensure_network` (the launching user: Owner or User Access Administrator hold
`Microsoft.Authorization/roleDefinitions/write`). A new definition may not be visible yet to
the first assignment naming it ("Troubleshoot Azure RBAC": changes can take several minutes to
be detected); `identity.grant` answers that (RoleDefinitionDoesNotExist) as a TransientError,
so the grant is retried.
"""

from __future__ import annotations

import uuid
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.azure.bodies import role_definition_id
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors, error_codes

BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
DATA_ACTIONS = (f"{BLOBS}/read", f"{BLOBS}/write", f"{BLOBS}/delete", f"{BLOBS}/add/action")
NAME = "cloudtrain node blob data"
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "cloudtrain:node-role")


def role_guid(subscription: str) -> str:
    """The GUID of the subscription's node role (the same for every run). Pure."""
    return str(uuid.uuid5(_NAMESPACE, subscription.lower()))


def role_id(subscription: str) -> str:
    """The role's full definition id (what an assignment's roleDefinitionId names). Pure."""
    return role_definition_id(subscription, role_guid(subscription))


def role_name(subscription: str) -> str:
    """The role's name: unique in the tenant (ARM refuses a second custom role of the same name,
    RoleDefinitionWithSameNameExists), so it names the subscription. Pure."""
    return f"{NAME} ({subscription})"


def definition(subscription: str) -> dict[str, Any]:
    """The PUT body: data actions only, assignable in the subscription. Pure."""
    scope = f"/subscriptions/{subscription}"
    return {
        "properties": {
            "roleName": role_name(subscription),
            "description": (
                "cloudtrain: a training node's identity on its run's container (each assignment "
                "carries the node's own ABAC condition); no container or account action"
            ),
            "type": "CustomRole",
            "permissions": [
                {
                    "actions": [],
                    "notActions": [],
                    "dataActions": list(DATA_ACTIONS),
                    "notDataActions": [],
                }
            ],
            "assignableScopes": [scope],
        }
    }


def ensure(clients: ArmClients) -> str:
    """Create or update the subscription's node role; return its GUID. Idempotent; blocks.
    Raises ProviderError (e.g. AuthorizationFailed without roleDefinitions/write)."""
    subscription = clients.auth.subscription
    guid = role_guid(subscription)
    try:
        with azure_errors(f"create the custom role {role_name(subscription)!r}"):
            clients.authorization.role_definitions.create_or_update(
                f"/subscriptions/{subscription}", guid, definition(subscription)
            )
    except ProviderError as err:
        if "RoleDefinitionWithSameNameExists" in error_codes(err):
            raise ProviderError(
                f"{err.message} (another custom role is named {role_name(subscription)!r})",
                hint="delete or rename that role",
            ) from err
        raise
    return guid
