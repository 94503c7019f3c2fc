"""Bodies of the ARM fake's Microsoft.Network resources: checks and read-only fields.

Each `*_props()` takes the properties a client PUT and answers what the fake stores, refusing
what Azure refuses with 400: a virtual network needs `addressSpace.addressPrefixes` (valid CIDRs;
InvalidAddressPrefixFormat) and subnets inside them (NetcfgInvalidSubnet) that do not overlap
(NetcfgSubnetRangesOverlap); a security rule needs a priority in 100..4096 unique per direction
(SecurityRuleInvalidPriority, SecurityRulesConflictingPriority), a direction and an access
(InvalidParameter); a Standard public IP must be Static
(StandardSkuPublicIPAddressesMustBeStatic). Children get their ids, types and a
provisioningState; NSGs get Azure's six default rules. `settle()` marks every child Succeeded.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from tests.fakes.arm_errors import ArmApiError, invalid_parameter

DEFAULT_RULES = (
    ("AllowVnetInBound", 65000, "Inbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
    ("AllowAzureLoadBalancerInBound", 65001, "Inbound", "Allow", "AzureLoadBalancer", "*"),
    ("DenyAllInBound", 65500, "Inbound", "Deny", "*", "*"),
    ("AllowVnetOutBound", 65000, "Outbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
    ("AllowInternetOutBound", 65001, "Outbound", "Allow", "*", "Internet"),
    ("DenyAllOutBound", 65500, "Outbound", "Deny", "*", "*"),
)


def child(parent_id: str, kind: str, item: Any, state: str) -> dict[str, Any]:
    """A child resource (subnet, rule, IP configuration) with its id, type and state."""
    if not isinstance(item, dict) or not item.get("name"):
        raise invalid_parameter(f"Every item of '{kind}' needs a name.", kind)
    props = dict(item.get("properties") or {})
    props["provisioningState"] = state
    namespace, parent_type = parent_id.split("/providers/")[1].split("/")[:2]
    return {
        "name": item["name"],
        "id": f"{parent_id}/{kind}/{item['name']}",
        "type": f"{namespace}/{parent_type}/{kind}",
        "properties": props,
    }


def network(prefix: Any, what: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.ip_network(str(prefix), strict=True)  # type: ignore[return-value]
    except ValueError as exc:
        raise ArmApiError(
            400, "InvalidAddressPrefixFormat", f"Address prefix {prefix} of {what} is invalid."
        ) from exc


def vnet_props(vnet_id: str, props: dict[str, Any], state: str) -> dict[str, Any]:
    prefixes = (props.get("addressSpace") or {}).get("addressPrefixes") or []
    if not prefixes:
        raise invalid_parameter(
            "The virtual network needs addressSpace.addressPrefixes.", "addressSpace"
        )
    spaces = [network(p, "the virtual network") for p in prefixes]
    subnets = [child(vnet_id, "subnets", s, state) for s in props.get("subnets") or []]
    check_subnets(vnet_id, spaces, subnets)
    return {**props, "subnets": subnets}


def check_subnets(vnet_id: str, spaces: list[Any], subnets: list[dict[str, Any]]) -> None:
    """400 unless every subnet lies in the address space, no two overlap and names are unique."""
    seen: list[tuple[str, Any]] = []
    for subnet in subnets:
        prefix = (
            subnet["properties"].get("addressPrefix")
            or (subnet["properties"].get("addressPrefixes") or [None])[0]
        )
        net = network(prefix, f"subnet {subnet['name']}")
        if not any(net.subnet_of(space) for space in spaces):
            raise ArmApiError(
                400,
                "NetcfgInvalidSubnet",
                f"Subnet '{subnet['name']}' is not valid in virtual network "
                f"'{vnet_id.rsplit('/', 1)[1]}'.",
            )
        for name, other in seen:
            if name.lower() == subnet["name"].lower():
                raise invalid_parameter(f"Subnet name {name} is used twice.", "subnets")
            if net.overlaps(other):
                raise ArmApiError(
                    400,
                    "NetcfgSubnetRangesOverlap",
                    f"Subnet '{subnet['name']}' is not valid because its IP address range "
                    f"overlaps with that of an existing subnet '{name}' in virtual network "
                    f"'{vnet_id.rsplit('/', 1)[1]}'.",
                )
        seen.append((subnet["name"], net))


def nsg_props(nsg_id: str, props: dict[str, Any], state: str) -> dict[str, Any]:
    rules = [child(nsg_id, "securityRules", r, state) for r in props.get("securityRules") or []]
    taken: dict[tuple[str, int], str] = {}
    for rule in rules:
        p = rule["properties"]
        priority, direction = p.get("priority"), p.get("direction")
        if not isinstance(priority, int) or not 100 <= priority <= 4096:
            raise ArmApiError(
                400,
                "SecurityRuleInvalidPriority",
                f"Security rule {rule['name']} has invalid Priority. Value provided: {priority}. "
                "Allowed range 100-4096.",
            )
        if direction not in ("Inbound", "Outbound") or p.get("access") not in ("Allow", "Deny"):
            raise invalid_parameter(
                f"Security rule {rule['name']} needs a direction (Inbound/Outbound) and an "
                "access (Allow/Deny).",
                "securityRules",
            )
        other = taken.setdefault((direction, priority), rule["name"])
        if other != rule["name"]:
            raise ArmApiError(
                400,
                "SecurityRulesConflictingPriority",
                f"Security rule {rule['name']} conflicts with rule {other}. Rules cannot have the "
                "same Priority and Direction.",
            )
    defaults = [
        child(
            nsg_id,
            "defaultSecurityRules",
            {
                "name": name,
                "properties": {
                    "priority": priority,
                    "direction": direction,
                    "access": access,
                    "protocol": "*",
                    "sourceAddressPrefix": source,
                    "destinationAddressPrefix": dest,
                    "sourcePortRange": "*",
                    "destinationPortRange": "*",
                },
            },
            "Succeeded",
        )
        for name, priority, direction, access, source, dest in DEFAULT_RULES
    ]
    return {**props, "securityRules": rules, "defaultSecurityRules": defaults}


def pip_props(props: dict[str, Any], sku: str, address: str, pip_id: str) -> dict[str, Any]:
    method = props.get("publicIPAllocationMethod") or "Static"
    if sku == "Standard" and method != "Static":
        raise ArmApiError(
            400,
            "StandardSkuPublicIPAddressesMustBeStatic",
            f"Standard sku publicIp {pip_id} must have AllocationMethod set to Static.",
        )
    return {
        "publicIPAddressVersion": "IPv4",
        "idleTimeoutInMinutes": 4,
        **props,
        "publicIPAllocationMethod": method,
        "ipAddress": props.get("ipAddress") or address,
    }


def settle(body: dict[str, Any]) -> None:
    """Mark the children (lists of sub-resources in `properties`) Succeeded."""
    for value in (body.get("properties") or {}).values():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and isinstance(item.get("properties"), dict):
                    item["properties"]["provisioningState"] = "Succeeded"
