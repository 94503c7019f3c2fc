"""The role assignments of an Azure node's managed identity: its two grants and their removal.

A node's system-assigned identity gets the subscription's node role (node_role.py: blob data
actions only) on the run's container and "Virtual Machine Contributor" on its own VM (`grant`).
A role assignment's name must be a GUID; ARM refuses to reuse one for another principal (409
RoleAssignmentUpdateNotPermitted: "Tenant ID, application ID, principal ID, and scope are not
allowed to be updated"). So the name is derived from the scope, the role AND the principal
(`assignment_name`): a retried create makes one assignment, and a re-created VM of the same
name (a new identity) gets assignments of its own.

Azure removes no role assignment when their principal goes (MicrosoftDocs/azure-docs,
articles/role-based-access-control/role-assignments.md, "Role assignments with identity not
found": "The role assignments aren't removed automatically"), and a Spot VM with evictionPolicy
Delete is deleted by Azure, not by cloudtrain, so nothing would remove its grants. Each
assignment's description therefore names its node (`cloudtrain node NAME: ROLE`), and `stale()`
finds, at the run's container, the assignments of a node's earlier identities; the same
identity's assignment on the VM has a name computed from it (`vm_grant_id`).

The container grant is narrowed by an ABAC condition (`node_bucket_condition`, issue 29): the
node runs the user's code, so it may not read the run's key (`control/key`), and it writes and
deletes only its own keys and what its role owns (`jobs/node_rights.py`), never the controller's
documents or another node's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cloudtrain.core.errors import NotFound, ProviderError, TransientError
from cloudtrain.jobs import node_rights, protocol
from cloudtrain.providers.azure import node_role
from cloudtrain.providers.azure.bodies import (
    ROLE_NAMES,
    VIRTUAL_MACHINE_CONTRIBUTOR,
    role_assignment_body,
    role_assignment_name,
)
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors, error_codes

SUFFIX = "/providers/Microsoft.Authorization/roleAssignments/"
MARK_RE = re.compile(r"cloudtrain node (?P<node>[a-z0-9-]+): ")


@dataclass(frozen=True)
class Grant:
    """A role assignment cloudtrain made for a node: its id, principal and node name."""

    id: str
    principal: str
    node: str


def assignment_name(scope: str, role_guid: str, principal: str) -> str:
    """The GUID name of the assignment of `role_guid` at `scope` to `principal`: the same for the
    same three (case-insensitive, as Azure's ids are), another for a new principal. Pure."""
    return role_assignment_name(scope.rstrip("/"), role_guid, principal)


def assignment_id(scope: str, role_guid: str, principal: str) -> str:
    """The full id of that assignment. Pure."""
    return scope.rstrip("/") + SUFFIX + assignment_name(scope, role_guid, principal)


def vm_scope(subscription: str, group: str, node: str) -> str:
    """The resource id of node `node`'s VM: the scope of its self grant. Pure."""
    return (
        f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
        f"Microsoft.Compute/virtualMachines/{node}"
    )


def vm_grant_id(subscription: str, group: str, node: str, principal: str) -> str:
    """The id of the self grant of `principal` on node `node`'s VM. Pure."""
    scope = vm_scope(subscription, group, node)
    return assignment_id(scope, VIRTUAL_MACHINE_CONTRIBUTOR, principal)


def _role_name(subscription: str, role_guid: str) -> str:
    if role_guid == node_role.role_guid(subscription):
        return node_role.NAME
    return ROLE_NAMES.get(role_guid, f"role {role_guid}")


def assignment_body(
    subscription: str, role_guid: str, principal: str, node: str, condition: str | None = None
) -> dict[str, Any]:
    """The assignment of `role_guid` to node `node`'s identity (a service principal; saying so
    lets Azure assign to an identity its directory has not replicated yet), its description
    naming the node, narrowed by the ABAC `condition` when given. Pure."""
    body = role_assignment_body(subscription, role_guid, principal, condition)
    role = _role_name(subscription, role_guid)
    body["properties"]["description"] = f"cloudtrain node {node}: {role} for the node's identity"
    return body


def grant(
    clients: ArmClients,
    scope: str,
    role_guid: str,
    principal: str,
    node: str,
    condition: str | None = None,
) -> None:
    """Assign `role_guid` at `scope` to node `node`'s identity `principal`, under the ABAC
    `condition` when given (`node_bucket_condition` for the container grant). Idempotent (the
    name is derived from scope, role and principal; a PUT of the same name sets the condition);
    blocks. Raises TransientError while Azure has not replicated a new identity
    (PrincipalNotFound) or a new custom role (RoleDefinitionDoesNotExist) yet, ProviderError
    otherwise."""
    body = assignment_body(clients.auth.subscription, role_guid, principal, node, condition)
    name = assignment_name(scope, role_guid, principal)
    role = _role_name(clients.auth.subscription, role_guid)
    try:
        with azure_errors(f"grant {node}'s identity {role}"):
            clients.authorization.role_assignments.create(scope, name, body)
    except ProviderError as err:
        codes = error_codes(err)
        if "RoleAssignmentExists" in codes:
            return
        if "PrincipalNotFound" in codes:
            raise TransientError(f"{err.message} (the identity is not replicated yet)") from err
        if "RoleDefinitionDoesNotExist" in codes:  # a node role just made (node_role.py)
            raise TransientError(f"{err.message} (the role is not replicated yet)") from err
        raise


# --- the container grant's condition (issue 29) -----------------------------------------------
# Azure ABAC, version 2.0, on the node's container assignment (node_role.py): "Azure role
# assignment condition format and syntax"
# (https://learn.microsoft.com/azure/role-based-access-control/conditions-format: `!(ActionMatches
# {...}) OR (expression)` per targeted action; StringLike's `*` matches any run of characters
# and `\*` escapes it; three or more expressions need parentheses) and "Actions and attributes
# for Azure role assignment conditions for Azure Blob Storage"
# (https://learn.microsoft.com/azure/storage/blobs/storage-auth-abac-attributes: the role's data
# actions blobs/read, write, delete, add/action and move/action all carry the Resource attribute
# `...containers/blobs:path`, the blob's name without the container; a listing is blobs/read with
# suboperation Blob.List and has no path, so it is excluded with `NOT SubOperationMatches
# {'Blob.List'}` as that page's "Read a blob" example does). A listing names other runs' blobs,
# so it is narrowed by its own attribute, the Request attribute `...containers/blobs:prefix`
# ("Blob prefix": "Allowed prefix of blobs to be listed", type String, so conditions-format's
# string operators apply, StringStartsWith among them; the same page's example "Read or list
# blobs in named containers with a path" uses `!(ActionMatches{'.../blobs/read'} AND
# SubOperationMatches{'Blob.List'}) OR @Request[...blobs:prefix] StringStartsWith '...'`): a
# node lists only with a prefix inside its run's (a listing without one has no prefix to
# compare, and is refused). Every listing the agent makes passes one: BlobStore.list(prefix)
# sends `name_starts_with` = the store's folder + a key prefix from jobs/protocol (the run's
# status, registrations, metrics, checkpoints, `control/stop`), all under `run_prefix`.
# Every node has its own identity (its VM's system-assigned one), so the condition is per node:
# its writes are `node_rights.node_writes` for that node, one `StringLike` each. Those rules
# never reach a controller document (`node_rights.controller_rules`: the node rules all start
# with a folder of the node's own keys, the chief's checkpoints/model/tensorboard, an
# `attempt-` folder or `control/orphaned`), so no exclusion is needed for them. Limits: "A
# condition can be up to 8 KB long" (https://learn.microsoft.com/azure/role-based-access-control/
# conditions-faq, "What are the limits for a condition?"); the number of expressions is limited
# only in the portal's visual editor (5; "You can add more than five expressions using the code
# editor", conditions-overview, "Limits"). The chief's condition has 22 expressions (13 of
# them its StringLikes), ~2.7 KB without a store prefix; `node_bucket_condition` refuses one
# over 8 KB.
BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
_PATH = f"@Resource[{BLOBS}:path]"
_PREFIX = f"@Request[{BLOBS}:prefix]"
_WRITES = ("write", "add/action", "delete", "move/action")
MAX_CONDITION_BYTES = 8 * 1024


def _like(text: str) -> str:
    """`text` as a literal inside a StringLike pattern. Pure."""
    return text.replace("*", "\\*").replace("?", "\\?")


def node_bucket_condition(store_prefix: str, run_id: str, node: str, *, chief: bool) -> str:
    """The ABAC condition of node `node`'s container grant (`chief`: the run's chief, see
    `node_rights.chief_of`), for a store whose blobs sit under `store_prefix` ('' for the
    container's root): reads only under the run's prefix and never the run's key
    (`control/key`); lists only with a prefix inside the run's; writes and deletes only the
    keys `node_rights.node_writes` gives that node.
    Raises ProviderError for a prefix with a quote or a backslash (no condition can name it) or
    a condition over Azure's 8 KB. Pure."""
    prefix = store_prefix.strip("/")
    if "'" in prefix or "\\" in prefix:
        raise ProviderError(f"store prefix {prefix!r}: a ' or \\ cannot be named in a condition")
    root = f"{prefix}/" if prefix else ""
    run = root + protocol.run_prefix(run_id)
    key = run + protocol.KEY_NAME
    read = (
        f"( !(ActionMatches{{'{BLOBS}/read'}} AND NOT SubOperationMatches{{'Blob.List'}}) )"
        f" OR ( {_PATH} StringLike '{_like(run)}*' AND {_PATH} StringNotEquals '{key}' )"
    )
    listing = (
        f"( !(ActionMatches{{'{BLOBS}/read'}} AND SubOperationMatches{{'Blob.List'}}) )"
        f" OR ( {_PREFIX} StringStartsWith '{run}' )"
    )
    not_writes = " AND ".join(f"!(ActionMatches{{'{BLOBS}/{a}'}})" for a in _WRITES)
    rules = [rule.under(root) for rule in node_rights.node_writes(run_id, node, chief=chief)]
    if any("'" in r.suffix or "\\" in r.suffix for r in rules):  # node ids: [a-z0-9-]
        raise ProviderError(f"node {node!r}: a ' or \\ cannot be named in a condition")
    likes = " OR ".join(f"{_PATH} StringLike '{_like(r.prefix)}*{_like(r.suffix)}'" for r in rules)
    condition = f"( {read} ) AND ( {listing} ) AND ( ( {not_writes} ) OR ( {likes} ) )"
    if len(condition.encode()) > MAX_CONDITION_BYTES:
        raise ProviderError(
            f"the bucket condition of node {node} is {len(condition.encode())} bytes, over "
            f"Azure's {MAX_CONDITION_BYTES}",
            hint="use a shorter store prefix",
        )
    return condition


def stale(
    clients: ArmClients, scope: str, wanted: Callable[[str], bool], keep: Iterable[str] = ()
) -> list[Grant]:
    """The assignments at exactly `scope` that cloudtrain made for a node `wanted(name)` accepts,
    held by a principal not in `keep`. A missing scope has none. Blocks; read-only."""
    kept = {p.lower() for p in keep}
    try:
        with azure_errors(f"list the role assignments at {scope}"):
            found = list(
                clients.authorization.role_assignments.list_for_scope(scope, filter="atScope()")
            )
    except NotFound:
        return []
    out = []
    for assignment in found:
        mark = MARK_RE.match(str(getattr(assignment, "description", None) or ""))
        principal = str(assignment.principal_id or "")
        if (
            mark is not None
            and str(assignment.scope or "").rstrip("/").lower() == scope.rstrip("/").lower()
            and wanted(mark["node"])
            and principal.lower() not in kept
        ):
            out.append(Grant(str(assignment.id), principal, mark["node"]))
    return out


def revoke(clients: ArmClients, ids: Iterable[str]) -> None:
    """Delete the role assignments `ids`. Idempotent (a missing one is fine); blocks."""
    for assignment_id_ in sorted(set(ids)):
        try:
            with azure_errors("remove a node's role assignment"):
                clients.authorization.role_assignments.delete_by_id(assignment_id_)
        except NotFound:
            continue


def revoke_stale(
    clients: ArmClients,
    containers: Iterable[str],
    group: str,
    wanted: Callable[[str], bool],
    keep: Iterable[str] = (),
) -> list[Grant]:
    """Remove the grants of node identities `wanted` accepts, other than `keep`: those found at
    the container scopes, and the same identities' grants on their VMs. Idempotent; blocks.
    Returns what was found at the containers."""
    found = [g for scope in sorted(set(containers)) for g in stale(clients, scope, wanted, keep)]
    subscription = clients.auth.subscription
    vm_ids = [vm_grant_id(subscription, group, g.node, g.principal) for g in found]
    revoke(clients, [g.id for g in found] + vm_ids)
    return found
