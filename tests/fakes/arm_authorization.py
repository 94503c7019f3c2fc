"""Role assignment routes of the ARM fake: `AuthorizationMixin`.

`{scope}/providers/Microsoft.Authorization/roleAssignments/{name}` PUT/GET/DELETE and
`{scope}/providers/Microsoft.Authorization/roleAssignments` GET, for any scope under
`/subscriptions/{sub}` (a subscription, a group, a resource, a storage container...). A scope
inside a resource group needs the group (404 ResourceGroupNotFound); resources named by a scope
are not checked. A PUT (synchronous, 201, or 200 when nothing changes) needs a GUID name (400
InvalidRoleAssignmentId), a `roleDefinitionId` that ends in `roleDefinitions/{guid}` (400
InvalidRoleDefinitionId, stored as given; one neither built in nor a custom role of
arm_role_definitions is 400 RoleDefinitionDoesNotExist) and a GUID `principalId` (400
InvalidPrincipalId);
another assignment of the same role to the same principal at the same scope is 409
RoleAssignmentExists, a changed one 409 RoleAssignmentUpdateNotPermitted (a PUT of the same
assignment updates its condition and description, as editing a condition does), and a scripted fault
(`fail_next_role_assignment`, e.g. PrincipalNotFound for a just-created identity) answers 400.
GET of a missing one is 404 RoleAssignmentNotFound; DELETE answers 200 with the assignment, or
204 if there is none, as ARM does. The list answers the assignments at, above and below the
scope; `$filter=atScope()` keeps those at or above it, `principalId eq '{id}'` and
`assignedTo('{id}')` those of one principal. Scopes compare case-insensitively. An ABAC
`condition` must come with `conditionVersion` "2.0", be at most 8 KB and parse (arm_conditions: 400
InvalidConditionVersion / InvalidRoleAssignmentCondition); a version without a condition is 400.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Callable
from typing import Any

from tests.fakes.arm_conditions import ConditionError
from tests.fakes.arm_conditions import parse as parse_condition
from tests.fakes.arm_errors import ArmApiError
from tests.fakes.arm_filters import role_filter
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import now
from tests.fakes.arm_resources import ResourcesMixin, bad_body
from tests.fakes.arm_routes import Req

SCOPE_RE = re.compile(r"/subscriptions/[^/]+(?:/resourceGroups/(?P<rg>[^/]+)(?:/.+)?)?", re.I)
ROLE_DEF_RE = re.compile(
    r".*/providers/Microsoft\.Authorization/roleDefinitions/(?P<guid>[^/]+)", re.I
)
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal", "ForeignGroup", "Device")
FAKE_ADMIN = "00000000-0000-0000-0000-00000000c0de"
MAX_CONDITION_BYTES = 8 * 1024


def _is_guid(value: Any) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def _within(inner: str, outer: str) -> bool:
    """True if scope `inner` is `outer` or below it."""
    inner, outer = inner.lower().rstrip("/"), outer.lower().rstrip("/")
    return inner == outer or inner.startswith(outer + "/")


class AuthorizationMixin(ResourcesMixin):
    """The role assignment routes (see the module docstring)."""

    tenant_id: str
    role_of: Callable[[str], Any]  # arm_role_definitions.RoleDefinitionsMixin

    def _scope(self, req: Req) -> str:
        scope = "/" + req.params["scope"].strip("/")
        match = SCOPE_RE.fullmatch(scope)
        if match is None:
            raise ArmApiError(
                400, "InvalidScope", f"The scope '{scope}' is not valid for role assignments."
            )
        if match["rg"]:
            self._group(scope.split("/")[2], match["rg"])
        return scope

    def _assignment_key(self, scope: str, name: str) -> str:
        return f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}".lower()

    def _put_role_assignment(self, req: Req) -> Reply:
        scope, name = self._scope(req), req.params["name"]
        if not _is_guid(name):
            raise ArmApiError(
                400,
                "InvalidRoleAssignmentId",
                f"The role assignment ID '{name}' is not valid. The role assignment ID must be a "
                "GUID.",
            )
        if not isinstance(req.body, dict) or not isinstance(req.body.get("properties"), dict):
            raise bad_body()
        props = req.body["properties"]
        role = str(props.get("roleDefinitionId") or "")
        match = ROLE_DEF_RE.fullmatch(role)
        if match is None or not _is_guid(match["guid"]):
            raise ArmApiError(
                400, "InvalidRoleDefinitionId", f"The role definition ID '{role}' is not valid."
            )
        if self.role_of(role) is None:  # arm_role_definitions: a built-in or a custom role
            raise ArmApiError(
                400,
                "RoleDefinitionDoesNotExist",
                f"The specified role definition with ID '{match['guid']}' does not exist.",
            )
        principal = str(props.get("principalId") or "")
        if not _is_guid(principal):
            raise ArmApiError(
                400,
                "InvalidPrincipalId",
                "A valid principal ID must be provided for role assignment.",
            )
        principal_type = props.get("principalType") or "User"
        if principal_type not in PRINCIPAL_TYPES:
            raise ArmApiError(
                400, "InvalidPrincipalType", f"Invalid principalType '{principal_type}'."
            )
        self._check_condition(props)
        if self._state.role_faults:
            code, message = self._state.role_faults.pop(0)
            raise ArmApiError(400, code, message or self._role_fault_message(code, principal))
        key = self._assignment_key(scope, name)
        for other_key, other in self._state.role_assignments.items():
            p = other["properties"]
            same = (
                p["roleDefinitionId"].lower() == role.lower()
                and p["principalId"].lower() == principal.lower()
                and p["scope"].lower() == scope.lower()
            )
            if other_key == key:
                if not same:
                    raise ArmApiError(
                        409,
                        "RoleAssignmentUpdateNotPermitted",
                        "Tenant ID, application ID, principal ID, and scope are not allowed to be "
                        "updated.",
                    )
                # the same assignment again: ARM updates what may change (its condition and
                # description: "Add or edit Azure role assignment conditions using the REST
                # API", https://learn.microsoft.com/azure/role-based-access-control/
                # conditions-role-assignments-rest, "Edit a condition": a PUT of the same name)
                changed = {
                    k: props.get(k)
                    for k in ("condition", "conditionVersion", "description")
                    if props.get(k) != p.get(k)
                }
                if changed:
                    p.update(changed, updatedOn=now())
                return Reply(200, copy.deepcopy(other))
            if same:
                raise ArmApiError(
                    409, "RoleAssignmentExists", "The role assignment already exists."
                )
        stamp = now()
        body = {
            "id": f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}",
            "name": name,
            "type": "Microsoft.Authorization/roleAssignments",
            "properties": {
                "roleDefinitionId": role,
                "principalId": principal,
                "principalType": principal_type,
                "scope": scope,
                "condition": props.get("condition"),
                "conditionVersion": props.get("conditionVersion"),
                "description": props.get("description"),
                "createdOn": stamp,
                "updatedOn": stamp,
                "createdBy": FAKE_ADMIN,
                "updatedBy": FAKE_ADMIN,
                "delegatedManagedIdentityResourceId": None,
            },
        }
        self._state.role_assignments[key] = body
        return Reply(201, copy.deepcopy(body))

    @staticmethod
    def _check_condition(props: dict[str, Any]) -> None:
        """An ABAC condition needs conditionVersion "2.0" (the only one ARM accepts) and must
        parse (arm_conditions); a conditionVersion without a condition is refused too."""
        condition, version = props.get("condition"), props.get("conditionVersion")
        if condition is None:
            if version is not None:
                raise ArmApiError(
                    400, "InvalidRoleAssignmentRequest", "conditionVersion without a condition."
                )
            return
        if version != "2.0":
            raise ArmApiError(
                400,
                "InvalidConditionVersion",
                f"The condition version {version!r} is not supported; use '2.0'.",
            )
        if len(str(condition).encode()) > MAX_CONDITION_BYTES:
            # "A condition can be up to 8 KB long" (learn.microsoft.com/azure/role-based-access-
            # control/conditions-faq); the code ARM answers for a longer one is not documented
            raise ArmApiError(
                400,
                "InvalidRoleAssignmentCondition",
                f"The condition is {len(str(condition).encode())} bytes; at most 8 KB.",
            )
        try:
            parse_condition(str(condition))
        except ConditionError as exc:
            raise ArmApiError(
                400, "InvalidRoleAssignmentCondition", f"The condition is not valid: {exc}"
            ) from exc

    def _role_fault_message(self, code: str, principal: str) -> str:
        if code == "PrincipalNotFound":
            return (
                f"Principal {principal.replace('-', '')} does not exist in the directory "
                f"{self.tenant_id}. Check that you have the correct principal ID. If you are "
                "creating this principal and then immediately assigning a role, this error might "
                "be related to a replication delay. In this case, set the role assignment "
                "principalType property to a value, such as ServicePrincipal, User, or Group. "
                "See https://aka.ms/docs-principaltype"
            )
        return f"The role assignment failed: {code}."

    def _get_role_assignment(self, req: Req) -> dict[str, Any]:
        scope, name = self._scope(req), req.params["name"]
        body = self._state.role_assignments.get(self._assignment_key(scope, name))
        if body is None:
            raise ArmApiError(
                404, "RoleAssignmentNotFound", f"The role assignment '{name}' is not found."
            )
        return copy.deepcopy(body)

    def _delete_role_assignment(self, req: Req) -> Reply:
        scope, name = self._scope(req), req.params["name"]
        body = self._state.role_assignments.pop(self._assignment_key(scope, name), None)
        return Reply(204) if body is None else Reply(200, body)

    def _list_role_assignments(self, req: Req) -> dict[str, Any]:
        scope = self._scope(req)
        wanted = role_filter(req.query.get("$filter"))
        found = []
        for body in self._state.role_assignments.values():
            p = body["properties"]
            above = _within(scope, p["scope"])
            if not above and (wanted.at_scope or not _within(p["scope"], scope)):
                continue
            if wanted.principal_id and p["principalId"].lower() != wanted.principal_id:
                continue
            found.append(copy.deepcopy(body))
        return {"value": found}
