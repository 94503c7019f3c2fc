"""The ARM fake's routing table: which handler serves a request's method and path.

Each `Route` maps an HTTP method and a path pattern to an action, the name of the fake's handler
method without its leading underscore (`put_vm` -> `ArmFake._put_vm`). Like ARM, literal path
segments match case-insensitively (`resourcegroups` and `resourceGroups` alike). `match_route()`
picks the route and its URL-decoded path parameters, answering 405 MethodNotAllowed for a known
path with another method and 404 InvalidResourceType for an unknown path. A handler gets one
`Req`: method, path parameters, query (last value of each name), JSON body, headers, path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from tests.fakes.arm_errors import ArmApiError


@dataclass
class Route:
    """One served method and path pattern, and the action that serves it."""

    method: str
    pattern: re.Pattern[str]
    action: str


@dataclass
class Req:
    """One parsed request, as handlers see it."""

    method: str
    params: dict[str, str]
    query: dict[str, str] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    path: str = ""


_SEG = r"[^/]+"
SUB = rf"/subscriptions/(?P<sub>{_SEG})"
RG = rf"{SUB}/resourcegroups/(?P<rg>{_SEG})"
NET = rf"{RG}/providers/Microsoft\.Network"
NET_TYPE = r"(?P<type>virtualNetworks|networkSecurityGroups|networkInterfaces|publicIPAddresses)"
VMS = rf"{RG}/providers/Microsoft\.Compute/virtualMachines"
VM = rf"{VMS}/(?P<vm>{_SEG})"
VM_ACTION = r"(?P<action>deallocate|powerOff|start|restart|simulateEviction)"
STORAGE = rf"{RG}/providers/Microsoft\.Storage/storageAccounts"
CONTAINER = rf"{STORAGE}/(?P<name>{_SEG})/blobServices/default/containers/(?P<container>{_SEG})"
AUTH = r"(?P<scope>/.*?)/providers/Microsoft\.Authorization/roleAssignments"
DEFS = r"(?P<scope>/.*?)/providers/Microsoft\.Authorization/roleDefinitions"
PERMISSIONS = r"(?P<scope>/.*?)/providers/Microsoft\.Authorization/permissions"

_TABLE = (
    ("GET", rf"{AUTH}", "list_role_assignments"),
    ("PUT", rf"{AUTH}/(?P<name>{_SEG})", "put_role_assignment"),
    ("GET", rf"{AUTH}/(?P<name>{_SEG})", "get_role_assignment"),
    ("DELETE", rf"{AUTH}/(?P<name>{_SEG})", "delete_role_assignment"),
    ("GET", rf"{DEFS}", "list_role_definitions"),
    ("GET", PERMISSIONS, "list_permissions"),
    ("GET", rf"{SUB}/providers/Microsoft\.Compute/locations/(?P<loc>{_SEG})/usages", "list_usages"),
    ("GET", rf"{SUB}/providers/Microsoft\.Compute/skus", "list_skus"),
    ("GET", rf"{SUB}/providers/(?P<ns>{_SEG})", "get_provider"),
    ("PUT", rf"{DEFS}/(?P<name>{_SEG})", "put_role_definition"),
    ("GET", rf"{DEFS}/(?P<name>{_SEG})", "get_role_definition"),
    ("DELETE", rf"{DEFS}/(?P<name>{_SEG})", "delete_role_definition"),
    (
        "GET",
        rf"{SUB}/providers/(?P<ns>{_SEG})/locations/(?P<loc>{_SEG})/operations/(?P<op>{_SEG})",
        "poll_async",
    ),
    ("GET", rf"{SUB}/operationresults/(?P<op>{_SEG})", "poll_location"),
    ("GET", rf"{SUB}/resourcegroups", "list_groups"),
    ("PUT", RG, "put_group"),
    ("GET", RG, "get_group"),
    ("HEAD", RG, "head_group"),
    ("PATCH", RG, "patch_group"),
    ("DELETE", RG, "delete_group"),
    ("GET", rf"{RG}/resources", "list_group_resources"),
    ("GET", rf"{SUB}/resources", "list_resources"),
    ("GET", rf"{NET}/{NET_TYPE}", "list_network"),
    ("PUT", rf"{NET}/{NET_TYPE}/(?P<name>{_SEG})", "put_network"),
    ("GET", rf"{NET}/{NET_TYPE}/(?P<name>{_SEG})", "get_network"),
    ("DELETE", rf"{NET}/{NET_TYPE}/(?P<name>{_SEG})", "delete_network"),
    ("GET", rf"{NET}/virtualNetworks/(?P<vnet>{_SEG})/subnets", "list_subnets"),
    ("PUT", rf"{NET}/virtualNetworks/(?P<vnet>{_SEG})/subnets/(?P<name>{_SEG})", "put_subnet"),
    ("GET", rf"{NET}/virtualNetworks/(?P<vnet>{_SEG})/subnets/(?P<name>{_SEG})", "get_subnet"),
    ("GET", rf"{SUB}/providers/Microsoft\.Compute/virtualMachines", "list_all_vms"),
    ("GET", VMS, "list_vms"),
    ("PUT", VM, "put_vm"),
    ("GET", VM, "get_vm"),
    ("DELETE", VM, "delete_vm"),
    ("GET", rf"{VM}/instanceView", "vm_instance_view"),
    ("POST", rf"{VM}/{VM_ACTION}", "vm_action"),
    ("POST", rf"{VM}/retrieveBootDiagnosticsData", "boot_diagnostics"),
    ("GET", rf"{VM}/extensions", "list_extensions"),
    ("PUT", rf"{VM}/extensions/(?P<name>{_SEG})", "put_extension"),
    ("GET", rf"{VM}/extensions/(?P<name>{_SEG})", "get_extension"),
    ("DELETE", rf"{VM}/extensions/(?P<name>{_SEG})", "delete_extension"),
    ("GET", rf"{RG}/providers/Microsoft\.Compute/disks", "list_disks"),
    ("GET", rf"{RG}/providers/Microsoft\.Compute/disks/(?P<name>{_SEG})", "get_disk"),
    ("DELETE", rf"{RG}/providers/Microsoft\.Compute/disks/(?P<name>{_SEG})", "delete_disk"),
    ("GET", rf"{SUB}/providers/Microsoft\.Storage/storageAccounts", "list_all_storage_accounts"),
    ("GET", STORAGE, "list_storage_accounts"),
    ("PUT", rf"{STORAGE}/(?P<name>{_SEG})", "put_storage_account"),
    ("GET", rf"{STORAGE}/(?P<name>{_SEG})", "get_storage_account"),
    ("DELETE", rf"{STORAGE}/(?P<name>{_SEG})", "delete_storage_account"),
    ("PUT", CONTAINER, "put_container"),
    ("GET", CONTAINER, "get_container"),
    ("DELETE", CONTAINER, "delete_container"),
    (
        "GET",
        rf"{SUB}/providers/Microsoft\.Storage/locations/(?P<loc>{_SEG})"
        rf"/asyncoperations/(?P<op>{_SEG})",
        "poll_location",
    ),
)
ROUTES = [Route(m, re.compile(p, re.IGNORECASE), a) for m, p, a in _TABLE]


def match_route(method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route serving `method` on `path` and its path parameters; ArmApiError if none."""
    known_path = False
    for route in ROUTES:
        match = route.pattern.fullmatch(path)
        if match is None:
            continue
        known_path = True
        if route.method == method:
            return route, {k: unquote(v) for k, v in match.groupdict().items()}
    if known_path:
        raise ArmApiError(
            405,
            "MethodNotAllowed",
            f"The requested resource does not support http method '{method}'.",
        )
    raise ArmApiError(
        404, "InvalidResourceType", f"The ARM fake serves no resource type at '{path}'."
    )
