"""Role definition routes of the ARM fake: `RoleDefinitionsMixin`, and the built-in roles.

`{scope}/providers/Microsoft.Authorization/roleDefinitions/{guid}` PUT/GET/DELETE and
`{scope}/providers/Microsoft.Authorization/roleDefinitions` GET ("Role Definitions",
https://learn.microsoft.com/rest/api/authorization/role-definitions). Custom roles live in the
fake's tenant (one namespace for every scope, as on Azure: a role is found by its GUID from any
scope); the built-in roles cloudtrain and its tests name (`BUILT_IN`) answer GET and list too.

- PUT (create or update; 201 either way, the only success the REST spec and the SDK know): the
  name must be a GUID and not a built-in's (400 InvalidRoleDefinitionId); `roleName` is
  required, `assignableScopes` must be non-empty, not the root `/` and without `*` ("Azure
  custom roles", https://learn.microsoft.com/azure/role-based-access-control/custom-roles,
  Custom role limits: 400 InvalidAssignableScope here; ARM's code for these is not
  documented); another custom role of the same `roleName` is 409
  RoleDefinitionWithSameNameExists, and a new one past the tenant's `custom_role_limit`
  (5000, the same page) 400 RoleDefinitionLimitExceeded ("No more role definitions can be
  created"; "Troubleshoot Azure RBAC", Custom roles).
- GET of a missing one: 404 RoleDefinitionDoesNotExist.
- DELETE answers 200 with the definition, or 204 if there is none; a role that a role assignment
  still names is 409 RoleDefinitionHasAssignments ("There are existing role assignments
  referencing role (code: RoleDefinitionHasAssignments)", custom-roles, "Find role assignments
  to delete a custom role").
- list: the built-in and custom roles; `$filter=type eq 'CustomRole'` / `'BuiltInRole'` and
  `roleName eq '...'` narrow it.

`BUILT_IN` also feeds the box's Blob front (tests/fakes/blob_authorizer.py), which takes a role's
(data) actions from its definition: Actions and DataActions from "Azure built-in roles for
Storage" (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/storage),
"... General" (Contributor, Owner, Reader: no data actions), "... Compute" (Virtual Machine
Contributor, abridged to what the box uses) and "... Privileged" (Role Based Access Control
Administrator).
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass
from typing import Any

from tests.fakes.arm_errors import ArmApiError
from tests.fakes.arm_http import Reply
from tests.fakes.arm_routes import Req

CONTAINERS = "Microsoft.Storage/storageAccounts/blobServices/containers"
BLOBS = f"{CONTAINERS}/blobs"
_DELEGATION_KEY = "Microsoft.Storage/storageAccounts/blobServices/generateUserDelegationKey/action"
_DEFS = "/providers/Microsoft.Authorization/roleDefinitions/"
CUSTOM_ROLE_LIMIT = 5000  # custom roles in a tenant ("Azure custom roles", Custom role limits)


@dataclass(frozen=True)
class Role:
    """A role definition's permissions (`*` wildcards; the Not* ones subtract)."""

    name: str
    actions: tuple[str, ...]
    data_actions: tuple[str, ...]
    not_actions: tuple[str, ...] = ()
    not_data_actions: tuple[str, ...] = ()


BUILT_IN = {
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": Role(
        "Storage Blob Data Contributor",
        (f"{CONTAINERS}/delete", f"{CONTAINERS}/read", f"{CONTAINERS}/write", _DELEGATION_KEY),
        (
            f"{BLOBS}/delete",
            f"{BLOBS}/read",
            f"{BLOBS}/write",
            f"{BLOBS}/move/action",
            f"{BLOBS}/add/action",
        ),
    ),
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": Role(
        "Storage Blob Data Owner", (f"{CONTAINERS}/*", _DELEGATION_KEY), (f"{BLOBS}/*",)
    ),
    "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1": Role(
        "Storage Blob Data Reader", (f"{CONTAINERS}/read", _DELEGATION_KEY), (f"{BLOBS}/read",)
    ),
    "b24988ac-6180-42a0-ab88-20f7382dd24c": Role(
        "Contributor",
        ("*",),
        (),
        (
            "Microsoft.Authorization/*/Delete",
            "Microsoft.Authorization/*/Write",
            "Microsoft.Authorization/elevateAccess/Action",
        ),
    ),
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": Role("Owner", ("*",), ()),
    "acdd72a7-3385-48ef-bd42-f606fba81ae7": Role("Reader", ("*/read",), ()),
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": Role(
        "Virtual Machine Contributor", ("Microsoft.Compute/virtualMachines/*",), ()
    ),
    "f58310d9-a9f6-439a-9e8d-f62e7b41a168": Role(
        "Role Based Access Control Administrator",
        (
            "Microsoft.Authorization/roleAssignments/write",
            "Microsoft.Authorization/roleAssignments/delete",
            "*/read",
        ),
        (),
    ),
}
GUID_RE = re.compile(r".*/providers/Microsoft\.Authorization/roleDefinitions/(?P<guid>[^/]+)", re.I)


def _is_guid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def role_from_body(body: dict[str, Any]) -> Role:
    """A stored definition's permissions as a Role (its permission blocks joined). Pure."""
    props = body["properties"]
    blocks = props.get("permissions") or []

    def joined(key: str) -> tuple[str, ...]:
        return tuple(a for b in blocks for a in (b.get(key) or []))

    return Role(
        str(props.get("roleName")),
        joined("actions"),
        joined("dataActions"),
        joined("notActions"),
        joined("notDataActions"),
    )


def built_in_body(guid: str, scope: str = "") -> dict[str, Any]:
    """A built-in role's definition as ARM answers it. Pure."""
    role = BUILT_IN[guid]
    return {
        "id": f"{scope}{_DEFS}{guid}",
        "name": guid,
        "type": "Microsoft.Authorization/roleDefinitions",
        "properties": {
            "roleName": role.name,
            "type": "BuiltInRole",
            "description": role.name,
            "assignableScopes": ["/"],
            "permissions": [
                {
                    "actions": list(role.actions),
                    "notActions": list(role.not_actions),
                    "dataActions": list(role.data_actions),
                    "notDataActions": list(role.not_data_actions),
                }
            ],
        },
    }


class RoleDefinitionsMixin:
    """The role definition routes (see the module docstring). `_state.role_definitions`: GUID
    (lower case) -> the stored definition."""

    _state: Any
    custom_role_limit = CUSTOM_ROLE_LIMIT

    def _def_scope(self, req: Req) -> str:
        return "/" + req.params["scope"].strip("/")

    def role_of(self, role_definition_id: str) -> Role | None:
        """The Role an assignment's roleDefinitionId names (built-in or custom), or None."""
        match = GUID_RE.fullmatch(role_definition_id)
        guid = (match["guid"] if match else role_definition_id).lower()
        if guid in BUILT_IN:
            return BUILT_IN[guid]
        with self._lock:  # type: ignore[attr-defined]
            body = self._state.role_definitions.get(guid)
            return None if body is None else role_from_body(body)

    def _put_role_definition(self, req: Req) -> Reply:
        scope, name = self._def_scope(req), req.params["name"]
        guid = name.lower()
        if not _is_guid(name) or guid in BUILT_IN:
            raise ArmApiError(
                400, "InvalidRoleDefinitionId", f"The role definition ID '{name}' is not valid."
            )
        body = req.body if isinstance(req.body, dict) else {}
        props = body.get("properties")
        if not isinstance(props, dict) or not str(props.get("roleName") or "").strip():
            raise ArmApiError(400, "InvalidRoleDefinition", "The role name must be provided.")
        scopes = props.get("assignableScopes") or []
        if not scopes or any(s.strip() == "/" or "*" in s for s in scopes):
            raise ArmApiError(
                400,
                "InvalidAssignableScope",
                "Assignable scopes must be given, and cannot be the root scope or have wildcards.",
            )
        for other_guid, other in self._state.role_definitions.items():
            same = str(other["properties"]["roleName"]).lower() == props["roleName"].lower()
            if same and other_guid != guid:
                raise ArmApiError(
                    409,
                    "RoleDefinitionWithSameNameExists",
                    f"A custom role with the same name '{props['roleName']}' already exists.",
                )
        existing = self._state.role_definitions.get(guid)
        if existing is None and len(self._state.role_definitions) >= self.custom_role_limit:
            raise ArmApiError(
                400,
                "RoleDefinitionLimitExceeded",
                "Role definition limit exceeded. No more role definitions can be created.",
            )
        stored = {
            "id": f"{scope}{_DEFS}{name}",
            "name": name,
            "type": "Microsoft.Authorization/roleDefinitions",
            "properties": {
                "roleName": props["roleName"],
                "type": "CustomRole",
                "description": props.get("description"),
                "assignableScopes": list(scopes),
                "permissions": copy.deepcopy(props.get("permissions") or []),
            },
        }
        self._state.role_definitions[guid] = stored
        return Reply(201, copy.deepcopy(stored))  # an update too: the REST spec has only 201

    def _get_role_definition(self, req: Req) -> dict[str, Any]:
        scope, guid = self._def_scope(req), req.params["name"].lower()
        if guid in BUILT_IN:
            return built_in_body(guid, scope)
        body = self._state.role_definitions.get(guid)
        if body is None:
            raise ArmApiError(
                404,
                "RoleDefinitionDoesNotExist",
                f"The specified role definition with ID '{req.params['name']}' does not exist.",
            )
        return copy.deepcopy(body)

    def _delete_role_definition(self, req: Req) -> Reply:
        guid = req.params["name"].lower()
        if guid in BUILT_IN:
            raise ArmApiError(
                400, "InvalidRoleDefinitionId", "A built-in role definition cannot be deleted."
            )
        if guid not in self._state.role_definitions:
            return Reply(204)
        for assignment in self._state.role_assignments.values():
            named = GUID_RE.fullmatch(str(assignment["properties"]["roleDefinitionId"]))
            if named is not None and named["guid"].lower() == guid:
                raise ArmApiError(
                    409,
                    "RoleDefinitionHasAssignments",
                    "There are existing role assignments referencing role.",
                )
        return Reply(200, self._state.role_definitions.pop(guid))

    def _list_role_definitions(self, req: Req) -> dict[str, Any]:
        scope = self._def_scope(req)
        wanted = req.query.get("$filter") or ""
        kind = re.search(r"type eq '(\w+)'", wanted)
        name = re.search(r"roleName eq '([^']*)'", wanted)
        found = [built_in_body(g, scope) for g in BUILT_IN]
        found += [copy.deepcopy(b) for b in self._state.role_definitions.values()]
        if kind:
            found = [b for b in found if b["properties"]["type"].lower() == kind[1].lower()]
        if name:
            found = [b for b in found if b["properties"]["roleName"].lower() == name[1].lower()]
        return {"value": found}

    def role_definitions(self) -> list[dict[str, Any]]:
        """Copies of the custom role definitions, in creation order."""
        with self._lock:  # type: ignore[attr-defined]
            return [copy.deepcopy(b) for b in self._state.role_definitions.values()]
