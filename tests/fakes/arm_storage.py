"""Storage account and blob container routes of the ARM fake: `StorageMixin` (a bonus).

Under `resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts`: GET lists the group's
accounts; `{name}` PUT creates an account the way Azure does, 202 with a `Location` LRO
(`.../providers/Microsoft.Storage/locations/{loc}/asyncoperations/{id}`: 202 until done, then
200 with the account), or answers 200 with the account at once if it exists; GET; DELETE
(synchronous: 200, or 204 if missing). Names are global like Azure's: 3-24 lower-case letters
and digits (400 AccountNameInvalid), taken anywhere else (409 StorageAccountAlreadyTaken). A PUT
needs `sku.name` and `kind` (400 InvalidParameter). Accounts answer `primaryEndpoints` on the
real `*.core.windows.net` hosts (point blob clients at Azurite instead).
`{name}/blobServices/default/containers/{c}`: PUT (synchronous, 201/200; names of 3-63
lower-case letters, digits and single hyphens, else 400 ContainerOperationFailure), GET, DELETE
(200, or 204 if missing).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from tests.fakes.arm_errors import ArmApiError, invalid_parameter
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import now, resource_id
from tests.fakes.arm_resources import ResourcesMixin
from tests.fakes.arm_routes import Req
from tests.fakes.arm_state import Resource

ACCOUNT = "Microsoft.Storage/storageAccounts"
CONTAINER = "Microsoft.Storage/storageAccounts/blobServices/containers"
ACCOUNT_RE = re.compile(r"[a-z0-9]{3,24}")
CONTAINER_RE = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")


class StorageMixin(ResourcesMixin):
    """The storage account and container routes (see the module docstring)."""

    def _account(self, req: Req) -> Resource:
        return self._existing(ACCOUNT, req.params["sub"], req.params["rg"], req.params["name"])

    def _put_storage_account(self, req: Req) -> Reply:
        name = req.params["name"]
        if not ACCOUNT_RE.fullmatch(name):
            raise ArmApiError(
                400,
                "AccountNameInvalid",
                f"{name} is not a valid storage account name. Storage account name must be "
                "between 3 and 24 characters in length and use numbers and lower-case letters "
                "only.",
            )
        ctx = self._put_context(req, ACCOUNT, [name])
        taken = [r for r in self._state.resources.values() if r.kind == ACCOUNT and r.name == name]
        if taken and taken[0] is not ctx.existing:
            raise ArmApiError(
                409,
                "StorageAccountAlreadyTaken",
                f"The storage account named {name} is already taken.",
            )
        sku = (ctx.body.get("sku") or {}).get("name")
        if not sku or not ctx.body.get("kind"):
            raise invalid_parameter("A storage account needs sku.name and kind.", "sku")
        if ctx.existing is not None:
            ctx.existing.body["tags"] = ctx.tags
            ctx.existing.body["properties"].update(ctx.props)
            return Reply(200, self._public(ctx.existing))
        sub, rg = req.params["sub"], req.params["rg"]
        endpoints = {
            svc: f"https://{name}.{svc}.core.windows.net/"
            for svc in ("blob", "queue", "table", "file", "dfs", "web")
        }
        body: dict[str, Any] = {
            "id": resource_id(sub, rg, ACCOUNT, name),
            "name": name,
            "type": ACCOUNT,
            "location": ctx.location,
            "tags": ctx.tags,
            "sku": {"name": sku, "tier": "Premium" if sku.startswith("Premium") else "Standard"},
            "kind": ctx.body["kind"],
            "properties": {
                "minimumTlsVersion": "TLS1_2",
                "allowBlobPublicAccess": False,
                "supportsHttpsTrafficOnly": True,
                "isHnsEnabled": False,
                **ctx.props,
                "provisioningState": "Creating",
                "creationTime": now(),
                "primaryLocation": ctx.location,
                "statusOfPrimary": "available",
                "primaryEndpoints": endpoints,
            },
        }
        res = Resource(body, ACCOUNT, sub, rg, name)
        self._state.resources[res.id.lower()] = res

        def created() -> None:
            body["properties"]["provisioningState"] = "Succeeded"

        headers = self._start_lro(
            sub, "Microsoft.Storage", ctx.location, created, "location", lambda: self._public(res)
        )
        return Reply(202, None, headers)

    def _get_storage_account(self, req: Req) -> dict[str, Any]:
        return self._public(self._account(req))

    def _delete_storage_account(self, req: Req) -> Reply:
        self._group(req.params["sub"], req.params["rg"])
        res = self._find(ACCOUNT, req.params["sub"], req.params["rg"], req.params["name"])
        if res is None:
            return Reply(204)
        self._remove(res)
        return Reply(200)

    def _list_storage_accounts(self, req: Req) -> dict[str, Any]:
        self._group(req.params["sub"], req.params["rg"])
        return self._value(self._listed(ACCOUNT, req.params["sub"], req.params["rg"]))

    def _list_all_storage_accounts(self, req: Req) -> dict[str, Any]:
        return self._value(self._listed(ACCOUNT, req.params["sub"]))

    # -- containers -------------------------------------------------------------------------

    def _container_names(self, req: Req) -> list[str]:
        return [req.params["name"], "default", req.params["container"]]

    def _put_container(self, req: Req) -> Reply:
        account = self._account(req)
        names = self._container_names(req)
        if not CONTAINER_RE.fullmatch(names[-1]):
            raise ArmApiError(
                400,
                "ContainerOperationFailure",
                "The specified resource name contains invalid characters.",
            )
        props = (req.body or {}).get("properties") or {} if isinstance(req.body, dict) else {}
        existing = self._find(CONTAINER, account.sub, account.group, *names)
        if existing is not None:
            existing.body["properties"].update(props)
            return Reply(200, self._public(existing))
        body = {
            "id": resource_id(account.sub, account.group, CONTAINER, *names),
            "name": names[-1],
            "type": CONTAINER,
            "etag": f'"0x{uuid.uuid4().hex[:15].upper()}"',
            "properties": {
                "publicAccess": "None",
                "leaseStatus": "Unlocked",
                "leaseState": "Available",
                "hasImmutabilityPolicy": False,
                "hasLegalHold": False,
                **props,
                "lastModifiedTime": now(),
            },
        }
        res = Resource(body, CONTAINER, account.sub, account.group, names[-1])
        self._state.resources[res.id.lower()] = res
        return Reply(201, self._public(res))

    def _get_container(self, req: Req) -> dict[str, Any]:
        self._account(req)
        return self._public(
            self._existing(
                CONTAINER, req.params["sub"], req.params["rg"], *self._container_names(req)
            )
        )

    def _delete_container(self, req: Req) -> Reply:
        self._account(req)
        res = self._find(
            CONTAINER, req.params["sub"], req.params["rg"], *self._container_names(req)
        )
        if res is None:
            return Reply(204)
        self._remove(res)
        return Reply(200)
