"""AzureAccountProbe: a subscription asked, read-only, what a run needs (providers/account.py).

- `credentials()`: the link of azure-identity's DefaultAzureCredential chain that gave the token.
  The chain logs "DefaultAzureCredential acquired a token from <Credential>" at INFO on its
  `azure.identity` logger for every token it hands out (azure-identity's documented logging,
  TROUBLESHOOTING.md "Enable and configure logging"; chained.py/default.py log it), so the probe
  listens to that logger while it asks for one token; never the token itself. The principal is
  the token's `oid` claim (the object id ARM names in AuthorizationFailed), the account the
  subscription.
- `apis()`: whether the subscription has registered the resource providers a run calls
  (`GET /subscriptions/{s}/providers/{namespace}`, ResourceManagementClient `providers.get`:
  `registrationState`); an unregistered one answers MissingSubscriptionRegistration.
- `missing_rights()`: run_rights.RUN_ACTIONS less what the caller's permissions allow, from
  `GET /subscriptions/{s}/providers/Microsoft.Authorization/permissions` (`value[]` of
  `{actions, notActions, dataActions, notDataActions}`). The 2022-04-01 spec and
  azure-mgmt-authorization have it only at a resource group or resource
  (`Permissions_ListForResourceGroup`), but a run's rights are the subscription's (it makes its
  own groups, and a new subscription has none to ask at); ARM answers it at the subscription
  too, as Azure's docs show ("Use Resource Manager authentication API to access
  subscriptions", azure-docs resource-manager-api-authentication.md: `GET .../subscriptions/
  {id}/providers/microsoft.authorization/permissions`), so the probe sends it through the
  management client's own pipeline (`ResourceManagementClient.send_request`). Azure's rule:
  an action is allowed when one permission's `actions` match it and that permission's
  `notActions` do not, `*` matching any run of characters, case-insensitively
  (learn.microsoft.com/azure/role-based-access-control/role-definitions, "Actions",
  "NotActions").
- `quotas(region, needs)`: `GET .../locations/{region}/usages` (ComputeManagementClient
  `usage.list`) for the limits and usage, the VM sizes' quota family from the resource SKUs
  (`resource_skus.list`, `family`): a regular VM counts against its family and `cores` ("Total
  Regional vCPUs"), a Spot VM against `lowPriorityCores` only (learn.microsoft.com/azure/
  virtual-machines/spot-vms, "Quota"). A size the SKUs do not offer in the region (absent, or
  restricted: NotAvailableForSubscription, what a create answers SkuNotAvailable for) is a line
  of limit 0 named "<size> (not offered in <region>)".

The azure SDKs are imported only when a method runs.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from cloudtrain.providers.account import (
    AccountProbe,
    ApiState,
    CredentialSource,
    QuotaLine,
    QuotaNeed,
)
from cloudtrain.providers.azure.run_rights import RUN_ACTIONS

if TYPE_CHECKING:
    from cloudtrain.providers.azure.clients import ArmClients, AzureAuth

ARM_SCOPE = "https://management.azure.com/.default"
PERMISSIONS = "/providers/Microsoft.Authorization/permissions"
PERMISSIONS_API = "2022-04-01"
NAMESPACES = ("Microsoft.Compute", "Microsoft.Network", "Microsoft.Storage")
REGIONAL, SPOT = "cores", "lowPriorityCores"
_ACQUIRED = re.compile(r"acquired a token from (?P<name>\w+)")
SOURCES = {  # DefaultAzureCredential's links, in its order (azure-identity's docs)
    "EnvironmentCredential": "environment variables (AZURE_CLIENT_ID, AZURE_TENANT_ID, ...)",
    "WorkloadIdentityCredential": "workload identity (AZURE_FEDERATED_TOKEN_FILE)",
    "ManagedIdentityCredential": "managed identity (instance metadata)",
    "SharedTokenCacheCredential": "shared token cache",
    "VisualStudioCodeCredential": "Visual Studio Code sign-in",
    "AzureCliCredential": "Azure CLI (az login)",
    "AzurePowerShellCredential": "Azure PowerShell (Connect-AzAccount)",
    "AzureDeveloperCliCredential": "Azure Developer CLI (azd auth login)",
    "InteractiveBrowserCredential": "interactive browser sign-in",
    "StaticToken": "the test endpoint's offline token (CLOUDTRAIN_ARM_ENDPOINT)",
}


class _Heard(logging.Handler):
    """Keeps the name of the credential the chain says gave the token."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = _ACQUIRED.search(record.getMessage())
        if match:
            self.names.append(match["name"])


@contextmanager
def _listening() -> Iterator[_Heard]:
    logger = logging.getLogger("azure.identity")
    heard, level = _Heard(), logger.level
    logger.addHandler(heard)
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    try:
        yield heard
    finally:
        logger.removeHandler(heard)
        logger.setLevel(level)


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT access token (its payload, unverified), or {} for any other token.
    Pure; the token is never kept or shown."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def action_matches(pattern: str, action: str) -> bool:
    """Whether an Actions/NotActions entry (`*` wildcards) covers `action`, case-insensitively
    (Azure docs role-definitions#actions). Pure."""
    return fnmatch.fnmatchcase(action.lower(), pattern.lower().replace("[", "[[]"))


def allowed(action: str, permissions: Sequence[dict[str, Any]]) -> bool:
    """Whether one of `permissions` (`{actions, notActions, ...}` as ARM answers them) allows
    `action`: its actions match and its notActions do not. Pure."""
    return any(
        any(action_matches(a, action) for a in p.get("actions") or [])
        and not any(action_matches(n, action) for n in p.get("notActions") or [])
        for p in permissions
    )


def _restricted(sku: Any, region: str) -> bool:
    """Whether a ResourceSku is restricted in `region` (type Location: not offered there)."""
    for item in sku.restrictions or []:
        # azure-mgmt-compute 39 names the field `values_property` (`values` is the mapping's)
        listed = getattr(item, "values_property", None) or item.get("values") or []
        values = [str(v).lower() for v in listed]
        if str(item.type).lower().endswith("location") and region.lower() in values:
            return True
    return False


class AzureAccountProbe(AccountProbe):
    """One subscription, asked through the provider's own credential and clients (`auth` and
    `clients` are called on first use; `region` is the plan's, if any). Every method blocks on
    ARM and creates nothing."""

    def __init__(self, auth: Any, clients: Any, region: str | None) -> None:
        self._auth, self._clients, self.region = auth, clients, region

    @property
    def clients(self) -> ArmClients:
        return self._clients()

    def credentials(self) -> CredentialSource:
        """The chain's link that gave an ARM token, its `oid`, and the subscription. Raises
        CredentialsError when the chain finds nothing (azure_errors)."""
        from cloudtrain.providers.azure.errors import azure_errors

        auth: AzureAuth = self._auth()
        with _listening() as heard, azure_errors("get an Azure token for Resource Manager"):
            token = auth.credential.get_token(ARM_SCOPE)
        name = heard.names[-1] if heard.names else type(auth.credential).__name__
        principal = str(token_claims(token.token).get("oid") or "")
        return CredentialSource(SOURCES.get(name, name), principal, auth.subscription)

    def apis(self) -> list[ApiState]:
        """Each resource provider a run calls, registered in the subscription or not."""
        from cloudtrain.providers.azure.errors import azure_errors

        states = []
        for namespace in NAMESPACES:
            with azure_errors(f"read resource provider {namespace}"):
                found = self.clients.resource.providers.get(namespace)
            state = str(found.registration_state or "")
            ok = state.lower() == "registered"
            detail = (
                ""
                if ok
                else (f"{state or 'NotRegistered'}: `az provider register --namespace {namespace}`")
            )
            states.append(ApiState(namespace, ok, detail))
        return states

    def missing_rights(self) -> list[str]:
        """RUN_ACTIONS the caller's permissions at the subscription do not allow, sorted."""
        permissions = self._permissions()
        return sorted(a for a in RUN_ACTIONS if not allowed(a, permissions))

    def _permissions(self) -> list[dict[str, Any]]:
        """The caller's permissions at the subscription scope, every page."""
        from azure.core.rest import HttpRequest

        from cloudtrain.providers.azure.errors import azure_errors

        subscription = self.clients.auth.subscription
        url: str | None = f"/subscriptions/{subscription}{PERMISSIONS}"
        params: dict[str, str] | None = {"api-version": PERMISSIONS_API}
        found: list[dict[str, Any]] = []
        with azure_errors(f"list the caller's permissions in subscription {subscription}"):
            while url:
                response = self.clients.resource.send_request(
                    HttpRequest("GET", url, params=params)
                )
                response.raise_for_status()
                page = response.json()
                found.extend(p for p in page.get("value") or [] if isinstance(p, dict))
                url, params = page.get("nextLink"), None  # a next link carries its own query
        return found

    def quotas(self, region: str, needs: Sequence[QuotaNeed]) -> list[QuotaLine]:
        """Family, `cores` and `lowPriorityCores` lines `needs` count against in `region`, each
        with limit, usage and the summed need."""
        if not needs:
            return []
        from cloudtrain.providers.azure.errors import azure_errors

        with azure_errors(f"read the compute usages of {region}"):
            usages = {str(u.name.value).lower(): u for u in self.clients.compute.usage.list(region)}
        families = self._families(region, {n.instance_type for n in needs})
        wanted: dict[str, float] = {}
        for need in needs:
            vcpus = float(need.vcpus * need.nodes)
            family = families.get(need.instance_type.lower())
            names = [SPOT] if need.spot else [family, REGIONAL]
            if family is None:
                names = [f"{need.instance_type} (not offered in {region})", *names[-1:]]
            for name in names:
                if name is not None:
                    wanted[name] = wanted.get(name, 0.0) + vcpus
        lines = []
        for name, need in wanted.items():
            usage = usages.get(name.lower())
            limit = float(usage.limit) if usage is not None else 0.0
            used = float(usage.current_value) if usage is not None else 0.0
            shown = str(usage.name.value) if usage is not None else name
            lines.append(QuotaLine(region, shown, "vCPU", limit, used, need))
        return lines

    def _families(self, region: str, sizes: set[str]) -> dict[str, str]:
        """The quota family of each of `sizes` (lower-cased) offered in `region`, from the
        SKUs (a restricted one is not offered)."""
        from cloudtrain.providers.azure.errors import azure_errors

        wanted = {s.lower() for s in sizes}
        found: dict[str, str] = {}
        with azure_errors(f"list the VM sizes of {region}"):
            for sku in self.clients.compute.resource_skus.list(filter=f"location eq '{region}'"):
                name = str(sku.name or "").lower()
                if sku.resource_type != "virtualMachines" or name not in wanted:
                    continue
                if sku.family and not _restricted(sku, region):
                    found[name] = str(sku.family)
        return found
