"""Resource group routes of the ARM fake: `GroupsMixin`.

`resourcegroups/{rg}`: PUT creates (201) or updates (200) a group, synchronously as ARM does,
needing a `location` (400 LocationRequired) that never changes (409 InvalidResourceGroupLocation)
and storing `tags`; PATCH replaces its tags; GET answers it (404 ResourceGroupNotFound); HEAD
answers 204 or 404 without a body; DELETE answers 202 with a `Location` LRO (`operationresults`,
202 until done, then 200) during which the group is `Deleting` (a PUT into it is 409
ResourceGroupBeingDeleted); when it succeeds the group, every resource in it and every role
assignment scoped inside it are gone. A DELETE of a missing group is 404. `resourcegroups` GET
lists the subscription's groups (`$filter` on tagName/tagValue, `$top`), in creation order.
Group names compare case-insensitively and keep the case they were created with.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fakes.arm_errors import ArmApiError
from tests.fakes.arm_filters import check_tags, resource_filter
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import check_name
from tests.fakes.arm_resources import ResourcesMixin, bad_body
from tests.fakes.arm_routes import Req


class GroupsMixin(ResourcesMixin):
    """The `resourcegroups` routes (see the module docstring)."""

    def _put_group(self, req: Req) -> Reply:
        sub, rg = req.params["sub"], req.params["rg"]
        check_name(rg, "resourceGroups")
        if not isinstance(req.body, dict):
            raise bad_body()
        location = str(req.body.get("location") or "").replace(" ", "").lower()
        if not location:
            raise ArmApiError(
                400, "LocationRequired", "The location property is required for this definition."
            )
        tags = check_tags(req.body.get("tags"))
        key = (sub.lower(), rg.lower())
        group = self._state.groups.get(key)
        if group is not None:
            if group["properties"]["provisioningState"] == "Deleting":
                raise ArmApiError(
                    409,
                    "ResourceGroupBeingDeleted",
                    f"The resource group '{group['name']}' is in deprovisioning state and cannot "
                    "perform this operation.",
                )
            if group["location"] != location:
                raise ArmApiError(
                    409,
                    "InvalidResourceGroupLocation",
                    f"Invalid resource group location '{location}'. The Resource group already "
                    f"exists in location '{group['location']}'.",
                )
            group["tags"] = tags
            return Reply(200, copy.deepcopy(group))
        group = {
            "id": f"/subscriptions/{sub}/resourceGroups/{rg}",
            "name": rg,
            "type": "Microsoft.Resources/resourceGroups",
            "location": location,
            "tags": tags,
            "properties": {"provisioningState": "Succeeded"},
        }
        if req.body.get("managedBy"):
            group["managedBy"] = str(req.body["managedBy"])
        self._state.groups[key] = group
        return Reply(201, copy.deepcopy(group))

    def _get_group(self, req: Req) -> dict[str, Any]:
        return copy.deepcopy(self._group(req.params["sub"], req.params["rg"]))

    def _head_group(self, req: Req) -> Reply:
        key = (req.params["sub"].lower(), req.params["rg"].lower())
        return Reply(204 if key in self._state.groups else 404)

    def _patch_group(self, req: Req) -> dict[str, Any]:
        group = self._group(req.params["sub"], req.params["rg"])
        if not isinstance(req.body, dict):
            raise bad_body()
        if "tags" in req.body:
            group["tags"] = check_tags(req.body["tags"])
        return copy.deepcopy(group)

    def _delete_group(self, req: Req) -> Reply:
        sub, rg = req.params["sub"], req.params["rg"]
        group = self._group(sub, rg)
        group["properties"]["provisioningState"] = "Deleting"
        key = (sub.lower(), rg.lower())

        def gone() -> None:
            if self._state.groups.get(key) is group:
                self._purge_group(sub, rg)

        headers = self._start_lro(sub, "Microsoft.Resources", group["location"], gone, "location")
        return Reply(202, None, headers)

    def _purge_group(self, sub: str, rg: str) -> None:
        """Forget group `rg`, its resources and the role assignments scoped inside it."""
        self._state.groups.pop((sub.lower(), rg.lower()), None)
        prefix = f"/subscriptions/{sub}/resourcegroups/{rg}".lower()
        for store in (self._state.resources, self._state.role_assignments):
            for key in [k for k in store if k.startswith(prefix + "/")]:
                del store[key]

    def _list_groups(self, req: Req) -> dict[str, Any]:
        keep = resource_filter(req.query.get("$filter"))
        groups = [
            copy.deepcopy(g)
            for (s, _), g in self._state.groups.items()
            if s == req.params["sub"].lower() and keep(g)
        ]
        top = req.query.get("$top")
        if top:
            if not top.isdigit():
                raise ArmApiError(400, "InvalidTopInQueryString", f"Invalid $top '{top}'.")
            groups = groups[: int(top)]
        return {"value": groups}
