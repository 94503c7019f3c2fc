"""Firewall routes of the GCE fake: `FirewallsMixin`.

Serves insert, list (with `filter`, see gce_listing), get and delete of `global/firewalls`. An
insert checks the rule's name like GCE does, stores the rule at once with GCE's defaults
(absolute network URL, priority 1000, INGRESS, enabled, logging off) and answers a global
operation; a delete removes the rule when its operation is DONE. An insert or delete repeating
an earlier `requestId` answers that request's operation and does nothing. Methods run under the
fake's lock.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fakes.gce_errors import GceApiError, invalid, invalid_field, not_found
from tests.fakes.gce_formats import API_ROOT, NAME_RE, expand, now
from tests.fakes.gce_listing import page
from tests.fakes.gce_operations import OperationsMixin


class FirewallsMixin(OperationsMixin):
    """The `global/firewalls` routes."""

    def _existing_firewall(self, params: dict[str, str]) -> dict[str, Any]:
        rule = self._state.firewalls.get((params["project"], params["name"]))
        if rule is None:
            raise not_found(f"projects/{params['project']}/global/firewalls/{params['name']}")
        return rule

    def _insert_firewall(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise invalid("Required field 'resource' not specified")
        project, name = params["project"], str(body.get("name", ""))
        replay = self._replayed(project, query)
        if replay is not None:
            return replay
        if not NAME_RE.fullmatch(name):
            raise invalid_field(
                "resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'"
            )
        resource = f"projects/{project}/global/firewalls/{name}"
        if (project, name) in self._state.firewalls:
            raise GceApiError(409, "alreadyExists", f"The resource '{resource}' already exists")
        rule = copy.deepcopy(body)
        rule_id = self._new_id()
        rule.update(
            kind="compute#firewall",
            id=rule_id,
            selfLink=f"{API_ROOT}/{resource}",
            creationTimestamp=now(),
            network=expand(rule.get("network") or "global/networks/default", project),
        )
        rule.setdefault("priority", 1000)
        rule.setdefault("direction", "INGRESS")
        rule.setdefault("disabled", False)
        rule.setdefault("logConfig", {"enable": False})
        self._state.firewalls[(project, name)] = rule
        return self._new_operation(
            project,
            "global",
            "insert",
            rule["selfLink"],
            rule_id,
            lambda: None,
            query.get("requestId", ""),
        )

    def _list_firewalls(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        items = [r for (p, _), r in sorted(self._state.firewalls.items()) if p == project]
        link = f"{API_ROOT}/projects/{project}/global/firewalls"
        return page(items, query, link, "compute#firewallList")

    def _get_firewall(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return copy.deepcopy(self._existing_firewall(params))

    def _delete_firewall(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        replay = self._replayed(params["project"], query)
        if replay is not None:
            return replay
        rule = self._existing_firewall(params)
        key, rule_id = (params["project"], params["name"]), rule["id"]

        def finish() -> None:
            current = self._state.firewalls.get(key)
            if current is not None and current["id"] == rule_id:
                del self._state.firewalls[key]

        return self._new_operation(
            params["project"],
            "global",
            "delete",
            rule["selfLink"],
            rule_id,
            finish,
            query.get("requestId", ""),
        )
