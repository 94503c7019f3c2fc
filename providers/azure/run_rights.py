"""The Azure RBAC actions a run's caller needs (the laptop, or whoever runs `cloudtrain run`):
the one list `cloudtrain check` compares with the caller's permissions (account_probe.py).

Each action is named as Azure names it ("Azure resource provider operations",
learn.microsoft.com/azure/role-based-access-control/resource-provider-operations) for a call
the adapter makes (the module in the comment). The `join/action`s are the linked checks ARM makes
when a resource refers to another (a NIC in a subnet, a VM on a NIC: LinkedAuthorizationFailed
without them; "Azure permissions for Networking", .../permissions/networking). A managed run's
controller VM needs nothing here: controller_identity.py grants it its own roles, and those
grants are made by this caller (roleAssignments/write).

Pure data; Contributor holds all of these but the role definition and role assignment writes,
which Owner, or Contributor plus Role Based Access Control Administrator, adds.
"""

from __future__ import annotations

RUN_ACTIONS: tuple[str, ...] = (
    # network.py, owned.py, account.py: the run's group and the region's shared group
    "Microsoft.Resources/subscriptions/resourceGroups/read",
    "Microsoft.Resources/subscriptions/resourceGroups/write",
    "Microsoft.Resources/subscriptions/resourceGroups/delete",
    # network.py: the run's network; compute.py: a node's NIC and a controller's public IP
    "Microsoft.Network/virtualNetworks/read",
    "Microsoft.Network/virtualNetworks/write",
    "Microsoft.Network/virtualNetworks/delete",
    "Microsoft.Network/virtualNetworks/subnets/read",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
    "Microsoft.Network/networkSecurityGroups/read",
    "Microsoft.Network/networkSecurityGroups/write",
    "Microsoft.Network/networkSecurityGroups/join/action",
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/join/action",
    "Microsoft.Network/publicIPAddresses/write",
    "Microsoft.Network/publicIPAddresses/join/action",
    # compute.py: the VMs, their driver extension and serial log
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/virtualMachines/extensions/read",
    "Microsoft.Compute/virtualMachines/extensions/write",
    "Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action",
    # account.py: the region's default storage account
    "Microsoft.Storage/storageAccounts/read",
    "Microsoft.Storage/storageAccounts/write",
    # node_role.py: the subscription's node role; identity.py, controller_identity.py: grants
    "Microsoft.Authorization/roleDefinitions/write",
    "Microsoft.Authorization/roleAssignments/read",
    "Microsoft.Authorization/roleAssignments/write",
    "Microsoft.Authorization/roleAssignments/delete",
)
