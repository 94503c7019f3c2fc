"""Tracked resources of the ARM fake: `ResourcesMixin`, the shared PUT/GET/DELETE/list logic.

Every resource lives in an existing resource group (else 404 ResourceGroupNotFound; a PUT into
a group being deleted is 409 ResourceGroupBeingDeleted) under its lower-cased id. A PUT
(`_put_context()` then `_commit_put()`) needs a JSON object body (400 InvalidRequestContent), a
`location` for top-level resources (400 LocationRequired; another location than the stored one is
400 InvalidResourceLocation) and valid `tags`; it is refused with 409 Conflict while the resource
is being deleted. It stores the resource at once with a transitional provisioningState and
answers 201 (new) or 200 (existing) with the body and an Azure-AsyncOperation LRO whose success
sets provisioningState `Succeeded` (plus the caller's `on_done` effect, which may fail it).
A DELETE of a missing resource answers 204 like ARM; else the resource turns `Deleting`, the
answer is 202 with an LRO, and when it succeeds the resource, its children (ids below it) and
what it owns (`_cascade()`: a VM's NIC, disk and public IP with deleteOption Delete) are gone.
GET answers copies without write-only fields (a VM's customData and adminPassword, an extension's
protectedSettings); lists answer `{"value": [...]}` in creation order, never paged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes.arm_errors import ArmApiError, conflict, group_not_found, not_found
from tests.fakes.arm_filters import check_tags, resource_filter
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import check_name, now, resource_id
from tests.fakes.arm_operations import OperationsMixin
from tests.fakes.arm_routes import Req
from tests.fakes.arm_state import Resource

WRITE_ONLY = {
    "microsoft.compute/virtualmachines": (
        ("osProfile", "customData"),
        ("osProfile", "adminPassword"),
    ),
    "microsoft.compute/virtualmachines/extensions": (("protectedSettings",),),
}


@dataclass
class PutContext:
    """What `_put_context()` found: the request body, its properties, location and tags, and
    the stored resource being replaced (None for a create)."""

    body: dict[str, Any]
    props: dict[str, Any]
    location: str
    tags: dict[str, str]
    existing: Resource | None


def bad_body() -> ArmApiError:
    return ArmApiError(
        400,
        "InvalidRequestContent",
        "The request content was invalid and could not be deserialized.",
    )


class ResourcesMixin(OperationsMixin):
    """Shared resource handling (see the module docstring)."""

    # -- lookups ----------------------------------------------------------------------------

    def _group(self, sub: str, rg: str) -> dict[str, Any]:
        group = self._state.groups.get((sub.lower(), rg.lower()))
        if group is None:
            raise group_not_found(rg)
        return group

    def _find(self, kind: str, sub: str, rg: str, *names: str) -> Resource | None:
        return self._state.resources.get(resource_id(sub, rg, kind, *names).lower())

    def _existing(self, kind: str, sub: str, rg: str, *names: str) -> Resource:
        """The resource, or 404 (ResourceGroupNotFound if its group is missing)."""
        self._group(sub, rg)
        res = self._find(kind, sub, rg, *names)
        if res is None:
            raise not_found(kind, "/".join(names), rg)
        return res

    def _by_id(self, rid: str) -> Resource | None:
        return self._state.resources.get(str(rid).lower())

    def _listed(self, kind: str, sub: str, rg: str | None = None) -> list[Resource]:
        """Resources of `kind` in the subscription (and group), in creation order."""
        return [
            r
            for r in self._state.resources.values()
            if r.kind.lower() == kind.lower()
            and r.sub.lower() == sub.lower()
            and (rg is None or r.group.lower() == rg.lower())
        ]

    def _decorate(self, res: Resource, body: dict[str, Any]) -> None:
        """Add computed read-only fields to a copy of `res` (mixins override it)."""

    def _public(self, res: Resource) -> dict[str, Any]:
        """A copy of `res` as GET answers it (write-only fields left out)."""
        body = copy.deepcopy(res.body)
        self._decorate(res, body)
        for path in WRITE_ONLY.get(res.kind.lower(), ()):
            node = body.get("properties") or {}
            for key in path[:-1]:
                node = node.get(key) or {}
            node.pop(path[-1], None)
        return body

    def _value(self, resources: list[Resource]) -> dict[str, Any]:
        return {"value": [self._public(r) for r in resources]}

    # -- PUT --------------------------------------------------------------------------------

    def _put_context(self, req: Req, kind: str, names: list[str], top: bool = True) -> PutContext:
        sub, rg = req.params["sub"], req.params["rg"]
        group = self._group(sub, rg)
        if group["properties"]["provisioningState"] == "Deleting":
            raise ArmApiError(
                409,
                "ResourceGroupBeingDeleted",
                f"The resource group '{rg}' is in deprovisioning state and cannot perform this "
                "operation.",
            )
        check_name(names[-1], kind)
        body = req.body
        if not isinstance(body, dict):
            raise bad_body()
        existing = self._find(kind, sub, rg, *names)
        if existing is not None and existing.body["properties"].get("provisioningState") == (
            "Deleting"
        ):
            raise conflict(f"The resource '{names[-1]}' is being deleted; try again later.")
        location = str(body.get("location") or "").replace(" ", "").lower()
        if top and not location:
            raise ArmApiError(
                400, "LocationRequired", "The location property is required for this definition."
            )
        old = existing.body.get("location") if existing is not None else None
        if top and old and old != location:
            raise ArmApiError(
                400,
                "InvalidResourceLocation",
                f"The resource '{names[-1]}' already exists in location '{old}' in resource group "
                f"'{rg}'. A resource with the same name cannot be created in location "
                f"'{location}'. Please select a new resource name.",
            )
        props = body.get("properties") or {}
        if not isinstance(props, dict):
            raise bad_body()
        return PutContext(
            body, copy.deepcopy(props), location, check_tags(body.get("tags")), existing
        )

    def _commit_put(
        self,
        req: Req,
        kind: str,
        names: list[str],
        ctx: PutContext,
        extra: dict[str, Any] | None = None,
        on_done: Callable[[Resource], dict[str, Any] | None] | None = None,
        creating: str = "Updating",
    ) -> Reply:
        """Store the resource `Creating`/`Updating` and start the LRO that settles it."""
        sub, rg = req.params["sub"], req.params["rg"]
        rid = resource_id(sub, rg, kind, *names)
        body: dict[str, Any] = {"id": rid, "name": names[-1], "type": kind}
        if ctx.location:
            body["location"] = ctx.location
        if ctx.tags or "tags" in ctx.body:
            body["tags"] = ctx.tags
        body.update(extra or {})
        ctx.props["provisioningState"] = creating if ctx.existing is None else "Updating"
        body["properties"] = ctx.props
        body["etag"] = f'W/"{now()}"'
        res = Resource(body, kind, sub, rg, names[-1])
        self._state.resources[rid.lower()] = res

        def settle() -> dict[str, Any] | None:
            if self._state.resources.get(rid.lower()) is not res:
                return None
            error = on_done(res) if on_done else None
            res.body["properties"]["provisioningState"] = "Failed" if error else "Succeeded"
            return error

        namespace = kind.split("/")[0]
        headers = self._start_lro(
            sub, namespace, ctx.location or self._group(sub, rg)["location"], settle
        )
        return Reply(201 if ctx.existing is None else 200, self._public(res), headers)

    # -- DELETE -----------------------------------------------------------------------------

    def _begin_delete(
        self,
        req: Req,
        kind: str,
        names: list[str],
        check: Callable[[Resource], None] | None = None,
    ) -> Reply:
        sub, rg = req.params["sub"], req.params["rg"]
        self._group(sub, rg)
        res = self._find(kind, sub, rg, *names)
        if res is None:
            return Reply(204)
        if check is not None:
            check(res)
        res.body["properties"]["provisioningState"] = "Deleting"

        def gone() -> None:
            self._remove(res)

        location = res.body.get("location") or self._group(sub, rg)["location"]
        return Reply(202, None, self._start_lro(sub, kind.split("/")[0], location, gone))

    def _remove(self, res: Resource) -> None:
        """Forget `res`, its children and what it owns (no-op if already gone)."""
        key = res.id.lower()
        if self._state.resources.get(key) is not res:
            return
        del self._state.resources[key]
        for child in [k for k in self._state.resources if k.startswith(key + "/")]:
            del self._state.resources[child]
        self._cascade(res)

    def _cascade(self, res: Resource) -> None:
        """Delete what `res` owned with deleteOption Delete (VM: NICs, OS disk; NIC: IPs)."""
        props = res.body.get("properties") or {}
        owned: list[tuple[Any, Any]] = []  # (resource id, deleteOption)
        if res.kind.lower() == "microsoft.compute/virtualmachines":
            for nic in (props.get("networkProfile") or {}).get("networkInterfaces") or []:
                owned.append((nic.get("id"), (nic.get("properties") or {}).get("deleteOption")))
            disk = (props.get("storageProfile") or {}).get("osDisk") or {}
            owned.append(((disk.get("managedDisk") or {}).get("id"), disk.get("deleteOption")))
        elif res.kind.lower() == "microsoft.network/networkinterfaces":
            for config in props.get("ipConfigurations") or []:
                pip = (config.get("properties") or {}).get("publicIPAddress") or {}
                owned.append((pip.get("id"), (pip.get("properties") or {}).get("deleteOption")))
        for rid, option in owned:
            target = self._by_id(rid or "")
            if option == "Delete" and target is not None:
                self._remove(target)

    # -- generic lists ----------------------------------------------------------------------

    def _generic(self, res: Resource) -> dict[str, Any]:
        keys = ("id", "name", "type", "location", "tags", "zones")
        return {k: copy.deepcopy(res.body[k]) for k in keys if k in res.body}

    def _list_resources(self, req: Req) -> dict[str, Any]:
        keep = resource_filter(req.query.get("$filter"))
        rg = req.params.get("rg")
        if rg is not None:
            self._group(req.params["sub"], rg)
        found = [
            self._generic(r)
            for r in self._state.resources.values()
            if r.sub.lower() == req.params["sub"].lower()
            and (rg is None or r.group.lower() == rg.lower())
        ]
        return {"value": [b for b in found if keep(b)]}

    def _list_group_resources(self, req: Req) -> dict[str, Any]:
        return self._list_resources(req)
