"""The Azure box as stingy as a new subscription: quotas, usage, sold-out zones and the caller's
rights, held by the ARM fake and set through one test-side object, `AzureAccount`.

    account = AzureAccount(cloud.arm)          # or fake.account
    account.set_quota("eastus", "standardNCASv3_T4Family", 0)
    account.add_usage("westus2", "cores", 6)   # a scripted extra, on top of the fake's VMs
    account.sell_out("westus2", "1")           # zone 1; sell_out("westus2") for every zone
    account.restore("westus2", "1")
    account.deny("Microsoft.Compute/virtualMachines/write")

What the fake answers from it (arm_usages.py), each in Azure's own shape:
- `GET .../providers/Microsoft.Compute/locations/{loc}/usages` (ComputeManagementClient
  `usage.list`): per-family vCPUs, `cores` (Total Regional vCPUs) and `lowPriorityCores` (Total
  Regional Low-priority vCPUs), usage counted from the fake's VMs plus `add_usage`;
- a VM create over a quota: synchronous 409 OperationNotAllowed with Azure's text;
- a create in a sold-out zone (or region): its LRO fails with ZonalAllocationFailed (a zonal VM)
  or AllocationFailed, every time until `restore`;
- a request whose action the caller lacks: 403 AuthorizationFailed naming the action, and
  `GET {scope}/providers/Microsoft.Authorization/permissions` answers the same permissions;
- the resource SKUs (`GET .../providers/Microsoft.Compute/skus`): the catalog's Azure sizes in
  any location, with their quota family, restricted where `withdraw` took one (a create of it
  there: 409 SkuNotAvailable); resource providers (`GET .../providers/{namespace}`) registered
  unless `unregister`ed (a write under one: 409 MissingSubscriptionRegistration).

Untouched, the account refuses nothing: every quota is `DEFAULT_LIMIT` (not Azure's default,
which is per offer) and the caller holds `*` (as an Owner does), so the fake behaves as before.
The caller is whoever sends the ARM fake a bearer token (the laptop, and a managed run's
controller VM, which uses the same offline token); its object id is `CALLER_OID`.
"""

from __future__ import annotations

import copy
import fnmatch
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

CALLER_OID = "5d7c3e1a-9b2f-4c6d-8e0a-1f3b5c7d9e2b"  # the caller's object id (the token's oid)
DEFAULT_LIMIT = 10_000.0  # a quota no test reaches unless it sets one (the box's default)
REGIONAL = "cores"  # "Total Regional vCPUs"
SPOT = "lowPriorityCores"  # "Total Regional Low-priority vCPUs": what Spot VMs count against
# localizedValue of the regional quotas as `az vm list-usage` shows them (Azure docs, "Resolve
# errors for resource quotas": "Total Regional vCPUs"); the error texts name them differently:
# "Total Regional Cores quota" (seen in nforgeio/neonKUBE#1671) and "LowPriorityCores quota"
# (scylladb/scylla-cluster-tests#4994).
LOCALIZED = {REGIONAL: "Total Regional vCPUs", SPOT: "Total Regional Low-priority vCPUs"}
IN_ERRORS = {REGIONAL: "Total Regional Cores", SPOT: "LowPriorityCores"}


def _everything() -> list[dict[str, list[str]]]:
    return [{"actions": ["*"], "notActions": [], "dataActions": [], "notDataActions": []}]


@dataclass
class AccountState:
    """What the account allows, kept in the ARM fake's State (replaced by `reset()`). Keys are
    lower-cased (region, quota name); a zone "" means every zone of the region."""

    limits: dict[tuple[str, str], float] = field(default_factory=dict)
    extra_usage: dict[tuple[str, str], float] = field(default_factory=dict)
    sold_out: set[tuple[str, str]] = field(default_factory=set)
    permissions: list[dict[str, list[str]]] = field(default_factory=_everything)
    withdrawn: set[tuple[str, str]] = field(default_factory=set)  # (region, size) not offered
    unregistered: set[str] = field(default_factory=set)  # resource provider namespaces

    def limit(self, region: str, name: str) -> float:
        """The limit of quota `name` in `region` (DEFAULT_LIMIT unless set)."""
        return self.limits.get((region.lower(), name.lower()), DEFAULT_LIMIT)

    def is_sold_out(self, region: str, zones: list[str]) -> bool:
        """Whether a VM in `region` (and `zones`) finds no capacity."""
        region = region.lower()
        return (region, "") in self.sold_out or any((region, z) in self.sold_out for z in zones)


# -- actions and their wildcards ------------------------------------------------------------

_METHOD_VERB = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}
_PROVIDERS = "/providers/"
_CANONICAL = {"resourcegroups": "resourceGroups", "resources": "resources"}
_GROUP_RE = re.compile(r"^/subscriptions/[^/]+/resourcegroups/[^/]+(?P<rest>/resources)?$", re.I)


def action_of(method: str, path: str) -> str:
    """The Azure RBAC action a request needs, as Azure names it: `{Namespace}/{type}[/{child}
    ...]/{read|write|delete}`, or `.../{name}/action` for a POST (Azure docs, "Azure resource
    provider operations" and "Understand Azure role definitions: Actions format",
    learn.microsoft.com/azure/role-based-access-control/role-definitions#actions-format).
    Resource groups are `Microsoft.Resources/subscriptions/resourceGroups/...`. Pure."""
    path = path.rstrip("/")
    verb = _METHOD_VERB.get(method.upper(), "read")
    group = _GROUP_RE.match(path)
    if group is not None:
        rest = "/resources" if group["rest"] else ""
        return f"Microsoft.Resources/subscriptions/resourceGroups{rest}/{verb}"
    at = path.lower().rfind(_PROVIDERS)  # the last one: an extension type's, at a scope
    if at < 0:
        tail = path.split("/")[3:]  # /subscriptions/{s}/resourcegroups, /resources, ...
        kind = _CANONICAL.get(tail[0].lower(), tail[0]) if tail else ""
        return "/".join(["Microsoft.Resources/subscriptions", *([kind] if kind else []), verb])
    namespace, *segments = path[at + len(_PROVIDERS) :].split("/")
    # type/name/child/name/...: the types are the even segments; a POST's last one is its verb
    if method.upper() == "POST":
        types = [*segments[0:-1:2], segments[-1]]
        return f"{namespace}/{'/'.join(types)}/action"
    return f"{namespace}/{'/'.join(segments[0::2])}/{verb}"


def action_matches(pattern: str, action: str) -> bool:
    """Whether an Actions/NotActions entry (with `*` wildcards, which "extend a permission to
    everything that matches the action string", Azure docs role-definitions#actions; matched
    case-insensitively) covers `action`. Pure."""
    return fnmatch.fnmatchcase(action.lower(), pattern.lower().replace("[", "[[]"))


def allowed(action: str, permissions: list[dict[str, list[str]]]) -> bool:
    """Whether some permission allows `action`: it matches one of that permission's actions and
    none of its notActions ("NotActions ... subtracted from the Actions" of the same role; another
    role's Actions still grant it: Azure docs role-definitions#notactions). Pure."""
    return any(
        any(action_matches(a, action) for a in p.get("actions", []))
        and not any(action_matches(n, action) for n in p.get("notActions", []))
        for p in permissions
    )


def authorization_failed(action: str, scope: str) -> tuple[int, str, str]:
    """Azure's refusal of `action` at `scope` (status, code, message): 403 AuthorizationFailed,
    in ARM's words (Azure docs, "Troubleshoot Azure RBAC", learn.microsoft.com/azure/
    role-based-access-control/troubleshooting: "The client '<id>' with object id '<id>' does not
    have authorization to perform action '<action>' over scope '<scope>' or the scope is
    invalid.")."""
    return (
        403,
        "AuthorizationFailed",
        f"The client '{CALLER_OID}' with object id '{CALLER_OID}' does not have authorization "
        f"to perform action '{action}' over scope '{scope}' or the scope is invalid. If access "
        "was recently granted, please refresh your credentials.",
    )


# -- the test-side object -------------------------------------------------------------------


class _Holder(Protocol):
    _lock: threading.RLock

    @property
    def account_state(self) -> AccountState: ...

    def usages(self, region: str) -> list[dict[str, Any]]: ...


class AzureAccount:
    """The test-side API of the box's subscription (see the module docstring). Every method
    takes effect at once, for every later request, until changed; `reset()` of the fake
    forgets it all."""

    def __init__(self, fake: _Holder) -> None:
        self._fake = fake

    @property
    def _state(self) -> AccountState:
        return self._fake.account_state

    principal = CALLER_OID

    def set_quota(self, region: str, name: str, limit: float) -> None:
        """Set quota `name` (a family such as `standardNCASv3_T4Family`, `cores` or
        `lowPriorityCores`) in `region` to `limit` vCPUs."""
        with self._fake._lock:
            self._state.limits[(region.lower(), name.lower())] = float(limit)

    def new_subscription(self, region: str, families: tuple[str, ...], cores: float = 10) -> None:
        """Make `region` as a new pay-as-you-go subscription has it: each GPU family of
        `families` at 0 (a new subscription has no GPU vCPUs: issue 30), `cores` and
        `lowPriorityCores` at `cores`."""
        for family in families:
            self.set_quota(region, family, 0)
        self.set_quota(region, REGIONAL, cores)
        self.set_quota(region, SPOT, cores)

    def add_usage(self, region: str, name: str, vcpus: float) -> None:
        """Count `vcpus` more against quota `name` in `region` (VMs the fake does not hold)."""
        with self._fake._lock:
            key = (region.lower(), name.lower())
            self._state.extra_usage[key] = self._state.extra_usage.get(key, 0.0) + vcpus

    def usage(self, region: str, name: str) -> float:
        """The current usage of quota `name` in `region`, as the usages API answers it."""
        for item in self._fake.usages(region):
            if item["name"]["value"].lower() == name.lower():
                return float(item["currentValue"])
        return 0.0

    def sell_out(self, region: str, zone: str | None = None) -> None:
        """No capacity in `zone` of `region` (every zone, and zoneless VMs, when None)."""
        with self._fake._lock:
            self._state.sold_out.add((region.lower(), str(zone or "")))

    def restore(self, region: str, zone: str | None = None) -> None:
        """Give back the capacity `sell_out(region, zone)` took."""
        with self._fake._lock:
            self._state.sold_out.discard((region.lower(), str(zone or "")))

    def withdraw(self, region: str, size: str) -> None:
        """VM size `size` is not offered to this subscription in `region`: the SKU list shows it
        restricted (NotAvailableForSubscription) and a create answers 409 SkuNotAvailable."""
        with self._fake._lock:
            self._state.withdrawn.add((region.lower(), size.lower()))

    def unregister(self, namespace: str) -> None:
        """Resource provider `namespace` (e.g. Microsoft.Compute) is not registered: its
        registrationState says so and a write under it answers 409
        MissingSubscriptionRegistration."""
        with self._fake._lock:
            self._state.unregistered.add(namespace.lower())

    def deny(self, *actions: str) -> None:
        """The caller lacks `actions` (added to its role's notActions): the fake refuses each
        request needing one with 403 AuthorizationFailed, and the permissions listing says so."""
        with self._fake._lock:
            for permission in self._state.permissions:
                permission.setdefault("notActions", []).extend(actions)

    def grant(self, *actions: str) -> None:
        """The caller gets one more role holding `actions` (one more permission entry: its
        actions are allowed whatever another role's notActions say)."""
        with self._fake._lock:
            self._state.permissions.append(
                {
                    "actions": list(actions),
                    "notActions": [],
                    "dataActions": [],
                    "notDataActions": [],
                }
            )

    def allow_only(self, *actions: str) -> None:
        """The caller holds exactly `actions` (wildcards allowed), as with a custom role."""
        with self._fake._lock:
            self._state.permissions[:] = [
                {
                    "actions": list(actions),
                    "notActions": [],
                    "dataActions": [],
                    "notDataActions": [],
                }
            ]

    def permissions(self) -> list[dict[str, list[str]]]:
        """A copy of the caller's permissions, as the permissions listing answers them."""
        with self._fake._lock:
            return copy.deepcopy(self._state.permissions)
