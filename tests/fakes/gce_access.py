"""The box caller's rights and the project's services: `AccessMixin` of the GCE fake.

The box's laptop calls the fake anonymously, so "the caller" is one principal: the project's
policy for the box's caller is every permission except those `AccountRules.denied` names
(tests/fakes/gcp_account.py scripts it). The fake enforces that policy on every Compute Engine,
IAM and Resource Manager call it serves, and answers Resource Manager's `testIamPermissions`
from the same set, so a probe and a refusal can never disagree. Cloud Storage (the GCS
emulator) enforces none of it: `GcpAccount.deny` refuses a `storage.*` permission.

Each route's permissions are the ones the API reference lists for the method ("IAM
Permissions" of each method page, e.g. cloud.google.com/compute/docs/reference/rest/v1/
instances/insert; an insert's extra ones by what its body sets: "Required permissions" of
cloud.google.com/compute/docs/instances/create-start-instance and of
.../access/create-enable-service-accounts-for-instances; an audit log of an insert lists
compute.instances.create, compute.disks.create, compute.subnetworks.use in that order).

Refusals, in each API's shape:

- Compute Engine: HTTP 403, `errors[0]` {domain global, reason "forbidden", "Required
  'compute.instances.create' permission for 'projects/P/zones/Z/instances/N'"} (GCE's legacy
  error body, gce_errors; as quoted in StreisandEffect/streisand#831: "Required
  'compute.networks.create' permission for 'projects/...'", reason forbidden, domain global);
- IAM and Resource Manager: HTTP 403 `status` PERMISSION_DENIED, "Permission
  'iam.serviceAccounts.create' denied on resource (or it may not exist).", with an ErrorInfo
  detail {reason IAM_PERMISSION_DENIED, domain iam.googleapis.com, metadata {permission}} (as
  gcloud prints it in everycure-org/matrix#75; the error model at
  cloud.google.com/apis/design/errors);
- a disabled service: HTTP 403 PERMISSION_DENIED, "Compute Engine API has not been used in
  project P before or it is disabled. ...", reason accessNotConfigured (legacy `errors[]`) and
  an ErrorInfo of reason SERVICE_DISABLED with metadata service and consumer
  (cloud.google.com/service-usage/docs/troubleshoot, "SERVICE_DISABLED").

Served on the fake's server: `POST /v1/projects/{p}:testIamPermissions` (Resource Manager v1:
`{"permissions": [...]}` -> the held subset, the key left out when none; needs no permission:
cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions) and
`GET /v1/projects/{p}/services/{name}` (Service Usage v1, services.get: `{name, parent,
state: ENABLED|DISABLED}`; needs serviceusage.services.get). Methods run under the fake's lock.
"""

from __future__ import annotations

import zlib
from typing import Any

from tests.fakes.gce_errors import GceApiError
from tests.fakes.gce_state import State

COMPUTE, IAM, CRM, USAGE = (
    "compute.googleapis.com",
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "serviceusage.googleapis.com",
)
TITLES = {
    COMPUTE: "Compute Engine API",
    IAM: "Identity and Access Management (IAM) API",
    CRM: "Cloud Resource Manager API",
    USAGE: "Service Usage API",
    "storage.googleapis.com": "Cloud Storage API",
}
# each route action (gce_routes) -> the permissions it needs (an insert's extras: INSERT_EXTRAS)
ACTION_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "insert_instance": ("compute.instances.create", "compute.disks.create"),
    "list_instances": ("compute.instances.list",),
    "aggregated_instances": ("compute.instances.list",),
    "get_instance": ("compute.instances.get",),
    "delete_instance": ("compute.instances.delete",),
    "serial_port": ("compute.instances.getSerialPortOutput",),
    "list_operations": ("compute.zoneOperations.list",),
    "get_region": ("compute.regions.get",),
    "list_zones": ("compute.zones.list",),
    "get_project": ("compute.projects.get",),
    "insert_firewall": ("compute.firewalls.create", "compute.networks.updatePolicy"),
    "list_firewalls": ("compute.firewalls.list",),
    "get_firewall": ("compute.firewalls.get",),
    "delete_firewall": ("compute.firewalls.delete", "compute.networks.updatePolicy"),
    "get_project_policy": ("resourcemanager.projects.getIamPolicy",),
    "set_project_policy": ("resourcemanager.projects.setIamPolicy",),
    "get_account_policy": ("iam.serviceAccounts.getIamPolicy",),
    "set_account_policy": ("iam.serviceAccounts.setIamPolicy",),
    "create_account": ("iam.serviceAccounts.create",),
    "list_accounts": ("iam.serviceAccounts.list",),
    "get_account": ("iam.serviceAccounts.get",),
    "delete_account": ("iam.serviceAccounts.delete",),
    "get_service": ("serviceusage.services.get",),
    "test_permissions": (),
}
# what an instance insert needs besides, by what its body sets
INSERT_EXTRAS = (
    ("networkInterfaces", "compute.subnetworks.use"),
    ("accessConfigs", "compute.subnetworks.useExternalIp"),
    ("metadata", "compute.instances.setMetadata"),
    ("labels", "compute.instances.setLabels"),
    ("tags", "compute.instances.setTags"),
    ("serviceAccounts", "compute.instances.setServiceAccount"),
    ("serviceAccounts", "iam.serviceAccounts.actAs"),
)
OPERATION_PERMISSIONS = {True: "compute.zoneOperations.get", False: "compute.globalOperations.get"}
ENFORCED = frozenset(
    {p for ps in ACTION_PERMISSIONS.values() for p in ps}
    | {p for _, p in INSERT_EXTRAS}
    | set(OPERATION_PERMISSIONS.values())
)


def service_of(action: str) -> str:
    """The API a route action belongs to. Pure."""
    if action.endswith("_account") or action.endswith("_accounts") or "account_policy" in action:
        return IAM
    if action in ("get_project_policy", "set_project_policy", "test_permissions"):
        return CRM
    return USAGE if action == "get_service" else COMPUTE


def project_number(project: str) -> str:
    """The made-up, stable project number of `project` (the default account's, gce_instances)."""
    return str(100_000_000_000 + zlib.crc32(project.encode()))


class PermissionDenied(GceApiError):
    """403 PERMISSION_DENIED in IAM's and Resource Manager's shape, naming the permission."""

    def __init__(self, permission: str, resource: str) -> None:
        super().__init__(
            403,
            "IAM_PERMISSION_DENIED",
            f"Permission '{permission}' denied on resource (or it may not exist).",
        )
        self.resource = resource
        self.permission = permission

    def body(self) -> dict[str, Any]:
        """The JSON body IAM sends for a denied permission."""
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "IAM_PERMISSION_DENIED",
            "domain": "iam.googleapis.com",
            "metadata": {"permission": self.permission},
        }
        error = {"code": 403, "message": self.message, "status": "PERMISSION_DENIED"}
        return {"error": {**error, "details": [info]}}


class ServiceDisabled(GceApiError):
    """403 for a call to a disabled API, in Google's shape for it (see the module docstring)."""

    def __init__(self, service: str, project: str) -> None:
        title = TITLES.get(service, service)
        number = project_number(project)
        super().__init__(
            403,
            "accessNotConfigured",
            f"{title} has not been used in project {number} before or it is disabled. Enable "
            f"it by visiting https://console.developers.google.com/apis/api/{service}/overview"
            f"?project={number} then retry. If you enabled this API recently, wait a few "
            "minutes for the action to propagate to our systems and retry.",
        )
        self.service, self.number = service, number

    def body(self) -> dict[str, Any]:
        """The JSON body Google sends for a disabled API."""
        legacy = {"message": self.message, "domain": "usageLimits", "reason": self.reason}
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "SERVICE_DISABLED",
            "domain": "googleapis.com",
            "metadata": {"service": self.service, "consumer": f"projects/{self.number}"},
        }
        error = {"code": 403, "message": self.message, "status": "PERMISSION_DENIED"}
        return {"error": {**error, "errors": [legacy], "details": [info]}}


def _resource(action: str, params: dict[str, str], body: Any) -> str:
    """The resource name a refusal names (GCE's relative resource names)."""
    project = params.get("project", "")
    if action == "insert_instance":
        name = body.get("name", "") if isinstance(body, dict) else ""
        return f"projects/{project}/zones/{params.get('zone')}/instances/{name}"
    if "name" in params and "zone" in params:
        return f"projects/{project}/zones/{params['zone']}/instances/{params['name']}"
    if "region" in params:
        return f"projects/{project}/regions/{params['region']}"
    if "account" in params:
        return f"projects/{project}/serviceAccounts/{params['account']}"
    return f"projects/{project}"


def needed(action: str, params: dict[str, str], body: Any) -> tuple[str, ...]:
    """The permissions serving `action` needs (an insert's by what its body sets). Pure."""
    if action in ("get_operation", "wait_operation"):
        return (OPERATION_PERMISSIONS["zone" in params],)
    out = list(ACTION_PERMISSIONS.get(action, ()))
    if action == "insert_instance" and isinstance(body, dict):
        nics = body.get("networkInterfaces") or []
        present = {
            "networkInterfaces": True,
            "accessConfigs": any(n.get("accessConfigs") for n in nics if isinstance(n, dict)),
            "metadata": bool((body.get("metadata") or {}).get("items")),
            "labels": bool(body.get("labels")),
            "tags": bool((body.get("tags") or {}).get("items")),
            "serviceAccounts": bool(body.get("serviceAccounts")),
        }
        out += [p for key, p in INSERT_EXTRAS if present[key]]
    return tuple(out)


class AccessMixin:
    """The caller's rights, the project's services and their routes."""

    _state: State

    def _check_access(self, action: str, params: dict[str, str], body: Any) -> None:
        """Refuse the request as GCP does when its service is disabled or the caller lacks a
        permission it needs (the first one, in the order the API checks them)."""
        project = params.get("project", "")
        service = service_of(action)
        if service in self._state.account.disabled:
            raise ServiceDisabled(service, project)
        for permission in needed(action, params, body):
            if permission not in self._state.account.denied:
                continue
            resource = _resource(action, params, body)
            if service == COMPUTE:
                message = f"Required '{permission}' permission for '{resource}'"
                raise GceApiError(403, "forbidden", message)
            raise PermissionDenied(permission, resource)

    def _test_permissions(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        asked = (body or {}).get("permissions") if isinstance(body, dict) else None
        if not isinstance(asked, list) or not all(isinstance(p, str) for p in asked):
            raise GceApiError(400, "badRequest", "permissions must be a list of strings")
        held = [p for p in asked if p not in self._state.account.denied]
        return {"permissions": held} if held else {}

    def _get_service(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        number = project_number(params["project"])
        name = params["service"]
        state = "DISABLED" if name in self._state.account.disabled else "ENABLED"
        return {
            "name": f"projects/{number}/services/{name}",
            "parent": f"projects/{number}",
            "config": {"name": name, "title": TITLES.get(name, name)},
            "state": state,
        }
