"""Compute usages, the caller's permissions and what a stingy subscription refuses: `UsagesMixin`
of the ARM fake (the account's data: tests/fakes/azure_account.py).

- `GET /subscriptions/{s}/providers/Microsoft.Compute/locations/{loc}/usages` answers the
  compute usages of a location as azure-rest-api-specs has them (Compute, `Usages_List`,
  ListUsagesResult: `value[]` of `{unit: "Count", currentValue, limit, name: {value,
  localizedValue}}`): `cores`, `lowPriorityCores` and one line per VM family (those of
  arm_faults.QUOTA_FAMILIES and of the catalog's sizes, and any other set or in use: Azure
  lists every family). Usage is the vCPUs of the fake's VMs
  in that location and subscription that did not fail (Azure counts a VM's vCPUs "both
  allocated and deallocated": virtual-machines/quotas.md), plus the account's scripted extra.
- `GET {scope}/providers/Microsoft.Authorization/permissions` (Authorization 2022-04-01,
  `Permissions_ListForResourceGroup` and `Permissions_ListForResource`; the spec has no
  subscription-scope listing) answers the caller's permissions: `value[]` of `{actions,
  notActions, dataActions, notDataActions}`. The scope's group must exist (404
  ResourceGroupNotFound).
- `_authorize(method, path)`: 403 AuthorizationFailed for a request whose action
  (azure_account.action_of) the same permissions do not allow; the permissions listing itself
  needs `Microsoft.Authorization/permissions/read`, which `*/read` and `*` hold.
- `_check_quota(...)`, on a VM create: a regular VM counts against its family and `cores`, a
  Spot VM against `lowPriorityCores` only (virtual-machines/spot-vms.md, "Quota": Spot VMs have
  their own quota, one for every VM series of a region); over either, 409 OperationNotAllowed in
  Azure's words (arm_faults.quota_message), synchronous, nothing stored.
- `_sold_out_fault(...)`: a create in a sold-out zone or region fails through its LRO with
  ZonalAllocationFailed (a zonal VM) or AllocationFailed, every time until restored.
- `GET /subscriptions/{s}/providers/Microsoft.Compute/skus` (`ResourceSkus_List`,
  `$filter=location eq '{loc}'`): one ResourceSku per Azure size of the bundled catalog
  (`resourceType` virtualMachines, `name`, `family`, `locations`, `locationInfo` zones 1-3,
  `capabilities` vCPUs), a withdrawn one with a `restrictions` entry `{type: "Location",
  values, restrictionInfo, reasonCode: "NotAvailableForSubscription"}`; a create of it there
  answers 409 SkuNotAvailable (arm_faults' text), synchronously.
- `GET /subscriptions/{s}/providers/{namespace}` (`Providers_Get`): `{id, namespace,
  registrationState}`; a PUT/PATCH/POST under an unregistered namespace answers 409
  MissingSubscriptionRegistration ("The subscription is not registered to use namespace
  '{ns}'. See https://aka.ms/rps-not-found for how to register subscriptions."; Azure docs,
  "Resolve errors for resource provider registration").
"""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path
from typing import Any

from tests.fakes.arm_errors import ArmApiError
from tests.fakes.arm_faults import (
    QUOTA_FAMILIES,
    VmFault,
    quota_family,
    quota_message,
    vm_cores,
    vm_fault_message,
)
from tests.fakes.arm_resources import ResourcesMixin
from tests.fakes.arm_routes import Req
from tests.fakes.azure_account import (
    LOCALIZED,
    REGIONAL,
    SPOT,
    AccountState,
    action_of,
    allowed,
    authorization_failed,
)

VM = "Microsoft.Compute/virtualMachines"
SPOT_PRIORITIES = ("Spot", "Low")
_EXEMPT = (
    "microsoft.authorization/permissions/",
    "microsoft.compute/locations/operations/",
    "microsoft.network/locations/operations/",
    "microsoft.storage/locations/asyncoperations/",
    "microsoft.resources/subscriptions/operationresults/",
)
CATALOG = Path(__file__).resolve().parents[2] / "cloudtrain" / "catalog" / "azure.csv"
_LOCATION_FILTER = re.compile(r"location\s+eq\s+'(?P<loc>[^']+)'", re.I)
_NAMESPACE_RE = re.compile(r"/providers/(?P<ns>[^/]+)/", re.I)


@functools.cache
def catalog_sizes() -> dict[str, tuple[int, tuple[str, ...]]]:
    """The bundled catalog's Azure sizes: name -> (vCPUs, regions). Read once."""
    sizes: dict[str, tuple[int, tuple[str, ...]]] = {}
    with CATALOG.open(newline="") as handle:
        for row in csv.DictReader(handle):
            vcpus, regions = sizes.get(row["instance_type"], (0, ()))
            vcpus = int(float(row["vcpus"] or 0))
            if row["region"] not in regions:
                regions = (*regions, row["region"])
            sizes[row["instance_type"]] = (vcpus, regions)
    return sizes


class UsagesMixin(ResourcesMixin):
    """The usages and permissions routes, and the account's refusals (module docstring)."""

    @property
    def account_state(self) -> AccountState:
        """The account's data (replaced with the rest of the state by `reset()`)."""
        return self._state.account

    # -- usages -----------------------------------------------------------------------------

    def _vm_usage(self, sub: str, region: str) -> dict[str, float]:
        used: dict[str, float] = {}
        for res in self._listed(VM, sub):
            props = res.body["properties"]
            if str(res.body.get("location", "")).lower() != region.lower():
                continue
            if props.get("provisioningState") == "Failed":
                continue
            size = props["hardwareProfile"]["vmSize"]
            cores = float(vm_cores(size))
            if props.get("priority") in SPOT_PRIORITIES:
                names = [SPOT]
            else:
                names = [REGIONAL, quota_family(size)]
            for name in names:
                used[name.lower()] = used.get(name.lower(), 0.0) + cores
        return used

    def _usage_lines(self, sub: str, region: str) -> list[dict[str, Any]]:
        state = self.account_state
        used = self._vm_usage(sub, region)
        families = (*(f for _, f in QUOTA_FAMILIES), *map(quota_family, catalog_sizes()))
        names = {n.lower(): n for n in (REGIONAL, SPOT, *families)}
        for (where, name), _ in [*state.limits.items(), *state.extra_usage.items()]:
            if where == region.lower():
                names.setdefault(name, name)
        for name in used:
            names.setdefault(name, name)
        lines = []
        for key, name in names.items():
            current = used.get(key, 0.0) + state.extra_usage.get((region.lower(), key), 0.0)
            lines.append(
                {
                    "unit": "Count",
                    "currentValue": int(current),
                    "limit": int(state.limit(region, name)),
                    "name": {"value": name, "localizedValue": LOCALIZED.get(name, name)},
                }
            )
        return lines

    def usages(self, region: str, sub: str | None = None) -> list[dict[str, Any]]:
        """The usage lines the usages API answers for `region` (inspection)."""
        with self._lock:  # type: ignore[attr-defined]
            subs = {sub} if sub else {r.sub for r in self._state.resources.values()} or {""}
            return self._usage_lines(next(iter(subs)), region)

    def _list_usages(self, req: Req) -> dict[str, Any]:
        return {"value": self._usage_lines(req.params["sub"], req.params["loc"])}

    # -- permissions ------------------------------------------------------------------------

    def _list_permissions(self, req: Req) -> dict[str, Any]:
        scope = req.params["scope"]
        if "/resourcegroups/" in scope.lower():
            parts = scope.strip("/").split("/")
            self._group(parts[1], parts[3])
        # one role's permission per page, as a long listing is paged (`nextLink`, the spec's
        # x-ms-pageable nextLinkName), so a client that reads one page only misses the rest
        permissions = self.account_state.permissions
        skip = int(req.query.get("$skipToken") or 0)
        page: dict[str, Any] = {"value": [dict(p) for p in permissions[skip : skip + 1]]}
        if skip + 1 < len(permissions):
            page["nextLink"] = (
                f"https://{req.headers.get('host', '')}{req.path}"
                f"?api-version={req.query['api-version']}&$skipToken={skip + 1}"
            )
        return page

    def _authorize(self, method: str, path: str) -> None:
        """Refuse a request whose action the caller lacks (403 AuthorizationFailed). Not held to
        it: the permissions listing (what the caller may do, "Gets all permissions the caller
        has": the spec asks no right for it) and the status polls of an operation the caller
        started (an assumption: the docs name no right for them)."""
        action = action_of(method, path)
        if action.lower().startswith(_EXEMPT) or allowed(action, self.account_state.permissions):
            return
        scope = path.rstrip("/")
        if method.upper() == "POST":
            scope = scope.rsplit("/", 1)[0]
        status, code, message = authorization_failed(action, scope)
        raise ArmApiError(status, code, message)

    # -- quota and capacity on a VM create ---------------------------------------------------

    def _check_quota(self, sub: str, location: str, size: str, priority: str | None) -> None:
        cores = float(vm_cores(size))
        used = self._vm_usage(sub, location)
        state = self.account_state
        names = [SPOT] if priority in SPOT_PRIORITIES else [quota_family(size), REGIONAL]
        for name in names:
            current = used.get(name.lower(), 0.0)
            current += state.extra_usage.get((location.lower(), name.lower()), 0.0)
            limit = state.limit(location, name)
            if current + cores > limit:
                raise ArmApiError(
                    409,
                    "OperationNotAllowed",
                    quota_message(name, location, limit, current, cores),
                )

    def _check_offered(self, location: str, size: str, zones: list[str]) -> None:
        if (location.lower(), size.lower()) in self.account_state.withdrawn:
            raise ArmApiError(
                409, "SkuNotAvailable", vm_fault_message("SkuNotAvailable", size, location, zones)
            )

    def _check_registered(self, method: str, path: str) -> None:
        match = _NAMESPACE_RE.search(path)
        if method.upper() in ("GET", "HEAD", "DELETE") or match is None:
            return
        if match["ns"].lower() in self.account_state.unregistered:
            raise ArmApiError(
                409,
                "MissingSubscriptionRegistration",
                f"The subscription is not registered to use namespace '{match['ns']}'. See "
                "https://aka.ms/rps-not-found for how to register subscriptions.",
            )

    def _get_provider(self, req: Req) -> dict[str, Any]:
        ns = req.params["ns"]
        state = "NotRegistered" if ns.lower() in self.account_state.unregistered else "Registered"
        return {
            "id": f"/subscriptions/{req.params['sub']}/providers/{ns}",
            "namespace": ns,
            "registrationState": state,
            "resourceTypes": [],
        }

    def _list_skus(self, req: Req) -> dict[str, Any]:
        match = _LOCATION_FILTER.search(req.query.get("$filter") or "")
        value = []
        for size, (vcpus, regions) in catalog_sizes().items():
            for region in [match["loc"]] if match else regions:
                value.append(self._sku(size, vcpus, region))
        return {"value": value}

    def _sku(self, size: str, vcpus: int, region: str) -> dict[str, Any]:
        restricted = (region.lower(), size.lower()) in self.account_state.withdrawn
        restrictions = [
            {
                "type": "Location",
                "values": [region],
                "restrictionInfo": {"locations": [region]},
                "reasonCode": "NotAvailableForSubscription",
            }
        ]
        return {
            "resourceType": "virtualMachines",
            "name": size,
            "tier": "Standard",
            "size": size.removeprefix("Standard_"),
            "family": quota_family(size),
            "locations": [region],
            "locationInfo": [{"location": region, "zones": ["1", "2", "3"]}],
            "capabilities": [{"name": "vCPUs", "value": str(vcpus)}],
            "restrictions": restrictions if restricted else [],
        }

    def _sold_out_fault(self, location: str, zones: list[str]) -> VmFault | None:
        if not self.account_state.is_sold_out(location, zones):
            return None
        return VmFault("*", "ZonalAllocationFailed" if zones else "AllocationFailed", lro=True)
