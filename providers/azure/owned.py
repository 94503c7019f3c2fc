"""Whether a resource named in a run's record is the run's, before Azure deletes it (issue 29).

A ledger row may come from a forged journal entry, an edited ledger or an older cloudtrain: its
name could be any resource group, NSG, VNet or role assignment the caller may delete. So
`AzureCompute.delete_resources` asks `not_runs` first, and refuses (providers/ownership.py)
what it names:
- a resource group must be `cloudtrain-<run>`, never the configured `resource_group`, and carry
  the tag `cloudtrain-run` = the run id, read from ARM;
- an NSG or VNet must be `ct-<run>-nsg`/`ct-<run>-vnet` in the run's group, tagged the same;
- a controller role assignment (ARM gives assignments no tags) must have the id the run's id
  derives (`controller_identity.assignment_id`) at the run's own group, or at a blob container
  of this subscription, for one of the roles the controller gets there.
A resource already gone is not refused (there is nothing to delete).
"""

from __future__ import annotations

import re
from typing import Any

from cloudtrain.core.errors import NotFound
from cloudtrain.providers.azure import controller_identity as ctl
from cloudtrain.providers.azure.bodies import STORAGE_BLOB_DATA_CONTRIBUTOR
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors
from cloudtrain.providers.azure.network import (
    KIND_GROUP,
    KIND_NSG,
    KIND_VNET,
    TAG_RUN,
    group_name,
    nsg_name,
    user_group,
    vnet_name,
)
from cloudtrain.providers.base import Resource

_ASSIGNMENTS = "/providers/microsoft.authorization/roleassignments/"
_CONTAINER = re.compile(
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/[^/]+/providers/Microsoft\.Storage/"
    r"storageAccounts/[^/]+/blobServices/default/containers/[^/]+",
    re.IGNORECASE,
)


def not_runs(clients: ArmClients, res: Resource, rg: str | None = None) -> str | None:
    """Why `res` is not its run's (a short phrase for NotTheRuns), or None when it is, is gone,
    or is a kind this adapter does not delete. `rg`: the `resource_group` option. Blocks for
    one read of a group, NSG or VNet; pure for a role assignment. Other ARM errors propagate."""
    if not res.run_id:
        return "no run id"
    if res.kind == KIND_GROUP:
        return _group_not_runs(clients, res, rg)
    if res.kind in (KIND_NSG, KIND_VNET):
        return _network_not_runs(clients, res, rg)
    if res.kind == ctl.KIND:
        return assignment_not_runs(clients.auth.subscription, res)
    return None


def _tag_not_runs(found: Any, run_id: str) -> str | None:
    tagged = dict(getattr(found, "tags", None) or {}).get(TAG_RUN)
    return None if tagged == run_id else f"its {TAG_RUN} tag is {tagged!r}, not {run_id!r}"


def _group_not_runs(clients: ArmClients, res: Resource, rg: str | None) -> str | None:
    own = f"cloudtrain-{res.run_id}"
    configured = user_group(rg)
    if configured is not None and res.id.lower() == configured.lower():
        return "the configured resource group, never deleted"
    if res.id.lower() != own.lower():
        return f"not the run's name ({own!r} expected)"
    try:
        with azure_errors(f"read resource group {res.id}"):
            found = clients.resource.resource_groups.get(res.id)
    except NotFound:
        return None
    return _tag_not_runs(found, res.run_id)


def _network_not_runs(clients: ArmClients, res: Resource, rg: str | None) -> str | None:
    if res.kind == KIND_NSG:
        own, ops = nsg_name(res.run_id), clients.network.network_security_groups
    else:
        own, ops = vnet_name(res.run_id), clients.network.virtual_networks
    if res.id != own:
        return f"not the run's name ({own!r} expected)"
    group = group_name(res.run_id, rg)
    try:
        with azure_errors(f"read {res.kind} {res.id} in {group}"):
            found = ops.get(group, res.id)
    except NotFound:
        return None
    return _tag_not_runs(found, res.run_id)


def assignment_not_runs(subscription: str, res: Resource) -> str | None:
    """Why the controller role assignment `res.id` is not run `res.run_id`'s, or None: its id
    must be `controller_identity.assignment_id` of the run at the run's group (Contributor, RBAC
    Administrator) or at a blob container in `subscription` (Storage Blob Data Contributor, RBAC
    Administrator). Pure."""
    lowered = res.id.lower()
    at = lowered.find(_ASSIGNMENTS)
    if at < 0:
        return "not a role assignment id"
    scope = res.id[:at]
    container = _CONTAINER.fullmatch(scope)
    group = ctl.group_scope(subscription, f"cloudtrain-{res.run_id}").lower()
    if scope.lower() == group:
        roles: tuple[str, ...] = (ctl.CONTRIBUTOR, ctl.RBAC_ADMINISTRATOR)
    elif container is not None and container["sub"].lower() == subscription.lower():
        roles = (STORAGE_BLOB_DATA_CONTRIBUTOR, ctl.RBAC_ADMINISTRATOR)
    else:
        return "not at the run's resource group or a blob container of this subscription"
    if any(ctl.assignment_id(scope, role, res.run_id).lower() == lowered for role in roles):
        return None
    return "not an assignment the run's id derives"
