"""Azure resource provider operations that exist, as data: the operations of the resource types
a run's caller acts on (providers/azure/run_rights.py RUN_ACTIONS), so that a misspelt action,
or a verb its resource type has no operation for, is seen. Test-side; pure; no network.

Sources (read 2026-11-28):
- COMPUTE: "Azure permissions for Compute", https://learn.microsoft.com/azure/
  role-based-access-control/permissions/compute (MicrosoftDocs/azure-docs
  articles/role-based-access-control/permissions/compute.md, commit 03e5750a, ms.date
  03/08/2026), its Microsoft.Compute table: every Action row of `virtualMachines` and
  `virtualMachines/extensions` (copied whole, not only the ones cloudtrain uses).
- AUTHORIZATION: "Azure permissions for Management and governance", https://learn.microsoft.com/
  azure/role-based-access-control/permissions/management-and-governance (MicrosoftDocs/
  azure-docs, the "Management and governance resource provider operations" include, ms.date
  06/01/2023), its Microsoft.Authorization table: the rows of `roleAssignments` and
  `roleDefinitions`.
- ROLES: for Microsoft.Network, Microsoft.Resources and Microsoft.Storage, every action (no
  wildcard) Azure's built-in role definitions name on the resource types RUN_ACTIONS uses, as
  `az role definition list` gives them: github.com/iann0036/iam-dataset
  azure/built-in-roles-raw.json at commit 2073fa52 (2026-08-22). A built-in role names only
  operations that exist; not every operation is named by a role (the two above are not, hence
  the docs tables), so ROLES is a subset of each type's operations, and Azure's case varies
  between roles (`listKeys` and `listkeys` both appear): kept as found.
The whole reference, "Azure resource provider operations",
https://learn.microsoft.com/azure/role-based-access-control/resource-provider-operations, is
the same data as `az provider operation list` (12 MB in iam-dataset azure/provider-operations.json,
too large to bring here).
"""

from __future__ import annotations

_VM = "Microsoft.Compute/virtualMachines"


def _words(text: str) -> list[str]:
    return text.split()


COMPUTE = frozenset(
    f"{_VM}/{op}"
    for op in _words(
        "read write delete start/action powerOff/action reapply/action redeploy/action "
        "restart/action retrieveBootDiagnosticsData/action deallocate/action generalize/action "
        "capture/action runCommand/action diagnosticRunCommand/action "
        "convertToManagedDisks/action performMaintenance/action reimage/action "
        "installPatches/action assessPatches/action cancelPatchInstallation/action "
        "simulateEviction/action osUpgradeInternal/action rollbackOSDisk/action "
        "deletePreservedOSDisk/action upgradeVMAgent/action attachDetachDataDisks/action "
        "setVMHealth/action extensions/read extensions/write extensions/delete"
    )
)
AUTHORIZATION = frozenset(
    f"Microsoft.Authorization/{kind}/{verb}"
    for kind in ("roleAssignments", "roleDefinitions")
    for verb in ("read", "write", "delete")
)
ROLES = frozenset(
    {
        "Microsoft.Network/networkInterfaces/delete",
        "Microsoft.Network/networkInterfaces/effectiveNetworkSecurityGroups/action",
        "Microsoft.Network/networkInterfaces/effectiveRouteTable/action",
        "Microsoft.Network/networkInterfaces/join/action",
        "Microsoft.Network/networkInterfaces/read",
        "Microsoft.Network/networkInterfaces/write",
        "Microsoft.Network/networkSecurityGroups/delete",
        "Microsoft.Network/networkSecurityGroups/join/action",
        "Microsoft.Network/networkSecurityGroups/read",
        "Microsoft.Network/networkSecurityGroups/write",
        "Microsoft.Network/publicIPAddresses/delete",
        "Microsoft.Network/publicIPAddresses/join/action",
        "Microsoft.Network/publicIPAddresses/read",
        "Microsoft.Network/publicIPAddresses/write",
        "Microsoft.Network/virtualNetworks/delete",
        "Microsoft.Network/virtualNetworks/join/action",
        "Microsoft.Network/virtualNetworks/joinLoadBalancer/action",
        "Microsoft.Network/virtualNetworks/peer/action",
        "Microsoft.Network/virtualNetworks/read",
        "Microsoft.Network/virtualNetworks/write",
        "Microsoft.Network/virtualNetworks/subnets/delete",
        "Microsoft.Network/virtualNetworks/subnets/join/action",
        "Microsoft.Network/virtualNetworks/subnets/joinLoadBalancer/action",
        "Microsoft.Network/virtualNetworks/subnets/joinViaServiceEndpoint/action",
        "Microsoft.Network/virtualNetworks/subnets/prepareNetworkPolicies/action",
        "Microsoft.Network/virtualNetworks/subnets/read",
        "Microsoft.Network/virtualNetworks/subnets/unprepareNetworkPolicies/action",
        "Microsoft.Network/virtualNetworks/subnets/write",
        "Microsoft.Resources/subscriptions/resourceGroups/delete",
        "Microsoft.Resources/subscriptions/resourceGroups/read",
        "Microsoft.Resources/subscriptions/resourceGroups/write",
        "Microsoft.Storage/storageAccounts/ListAccountSas/action",
        "Microsoft.Storage/storageAccounts/PrivateEndpointConnectionsApproval/action",
        "Microsoft.Storage/storageAccounts/delete",
        "Microsoft.Storage/storageAccounts/listKeys/action",
        "Microsoft.Storage/storageAccounts/listServiceSas/action",
        "Microsoft.Storage/storageAccounts/listkeys/action",
        "Microsoft.Storage/storageAccounts/read",
        "Microsoft.Storage/storageAccounts/regeneratekey/action",
        "Microsoft.Storage/storageAccounts/restoreBlobRanges/action",
        "Microsoft.Storage/storageAccounts/write",
    }
)
OPERATIONS = COMPUTE | AUTHORIZATION | ROLES


def unknown(actions: list[str] | tuple[str, ...]) -> list[str]:
    """The actions not in OPERATIONS, spelt exactly as the reference spells them, in order. Pure."""
    return [a for a in actions if a not in OPERATIONS]
