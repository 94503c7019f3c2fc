"""The GCE fake's routing table: which handler serves a request's method and path.

Each `Route` maps an HTTP method and a path pattern under `/compute/v1/projects/{project}` (or,
for IAM service accounts, `/v1/projects/{project}/serviceAccounts`, and for Resource Manager's
project IAM policy, `/v1/projects/{project}:getIamPolicy|:setIamPolicy|:testIamPermissions`,
and for Service Usage, `/v1/projects/{project}/services/{service}`) to
an action, the name of the fake's handler method without its leading underscore (e.g.
`insert_instance` -> `GceFake._insert_instance`). `match_route()` picks the route and its
URL-decoded path parameters, answering like GCE 405 for a known path with another method and
404 for an unknown path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from tests.fakes.gce_errors import GceApiError


@dataclass
class Route:
    """One served method and path pattern, and the action that serves it."""

    method: str
    pattern: re.Pattern[str]
    action: str


_PROJECT = r"/compute/v1/projects/(?P<project>[^/]+)"
_ZONE = _PROJECT + r"/zones/(?P<zone>[^/]+)"
_IAM = r"/v1/projects/(?P<project>[^/]+)/serviceAccounts"
_CRM = r"/v1/projects/(?P<project>[^/:]+)"  # Resource Manager v1 (a project's IAM policy)
_USAGE = r"/v1/projects/(?P<project>[^/]+)/services/(?P<service>[^/]+)"  # Service Usage v1
ROUTES = [
    Route(m, re.compile(p), a)
    for m, p, a in (
        ("POST", _ZONE + r"/instances", "insert_instance"),
        ("GET", _ZONE + r"/instances", "list_instances"),
        ("GET", _ZONE + r"/instances/(?P<name>[^/]+)", "get_instance"),
        ("DELETE", _ZONE + r"/instances/(?P<name>[^/]+)", "delete_instance"),
        ("GET", _ZONE + r"/instances/(?P<name>[^/]+)/serialPort", "serial_port"),
        ("GET", _ZONE + r"/operations", "list_operations"),
        ("GET", _ZONE + r"/operations/(?P<op>[^/]+)", "get_operation"),
        ("POST", _ZONE + r"/operations/(?P<op>[^/]+)/wait", "wait_operation"),
        ("GET", _PROJECT + r"/aggregated/instances", "aggregated_instances"),
        ("GET", _PROJECT, "get_project"),
        ("GET", _PROJECT + r"/regions/(?P<region>[^/]+)", "get_region"),
        ("GET", _PROJECT + r"/zones", "list_zones"),
        ("POST", _PROJECT + r"/global/firewalls", "insert_firewall"),
        ("GET", _PROJECT + r"/global/firewalls", "list_firewalls"),
        ("GET", _PROJECT + r"/global/firewalls/(?P<name>[^/]+)", "get_firewall"),
        ("DELETE", _PROJECT + r"/global/firewalls/(?P<name>[^/]+)", "delete_firewall"),
        ("GET", _PROJECT + r"/global/operations/(?P<op>[^/]+)", "get_operation"),
        ("POST", _PROJECT + r"/global/operations/(?P<op>[^/]+)/wait", "wait_operation"),
        ("POST", _CRM + r":getIamPolicy", "get_project_policy"),
        ("POST", _CRM + r":setIamPolicy", "set_project_policy"),
        ("POST", _CRM + r":testIamPermissions", "test_permissions"),
        ("GET", _USAGE, "get_service"),
        ("POST", _IAM + r"/(?P<account>[^/:]+):getIamPolicy", "get_account_policy"),
        ("POST", _IAM + r"/(?P<account>[^/:]+):setIamPolicy", "set_account_policy"),
        ("POST", _IAM, "create_account"),
        ("GET", _IAM, "list_accounts"),
        ("GET", _IAM + r"/(?P<account>[^/]+)", "get_account"),
        ("DELETE", _IAM + r"/(?P<account>[^/]+)", "delete_account"),
    )
]


def match_route(method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route serving `method` on `path` and its path parameters; GceApiError if none."""
    known_path = False
    for route in ROUTES:
        match = route.pattern.fullmatch(path)
        if match is None:
            continue
        known_path = True
        if route.method == method:
            return route, {k: unquote(v) for k, v in match.groupdict().items()}
    if known_path:
        raise GceApiError(405, "httpMethodNotAllowed", f"{method} is not allowed on {path}")
    raise GceApiError(404, "notFound", f"The fake has no resource at {path}")
