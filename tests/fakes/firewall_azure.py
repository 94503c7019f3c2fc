"""Azure network security groups, enforced: read back what the ARM fake holds and compile them.

    snapshot = read_azure(fake.url, fake.ca_path, SUB, token)      # ARM's REST API, as JSON
    rulesets = compile_azure(snapshot, {vm["properties"]["vmId"]: host.ip})
    host.apply_nft(rulesets[vm_id])

Keys are the VMs' `vmId` (what the box's boot harness calls a VM's id). The semantics, from
"Network security groups" (https://learn.microsoft.com/azure/virtual-network/
network-security-groups-overview) and "How network security groups filter network traffic"
(https://learn.microsoft.com/azure/virtual-network/network-security-group-how-it-works):
- rules are processed in priority order, lowest number first (user rules 100..4096), and
  "once traffic matches a rule, processing stops"; each NSG ends in Azure's default rules, which
  cannot be removed: AllowVnetInBound (65000, VirtualNetwork -> VirtualNetwork, any port),
  AllowAzureLoadBalancerInBound (65001, AzureLoadBalancer -> any), DenyAllInBound (65500);
- inbound traffic meets the NSG of the NIC's subnet first, then the NSG of the NIC itself; it
  must be allowed by both. A NIC with neither NSG is not filtered at all;
- NSGs are stateful; outbound is not compiled (AllowVnetOutBound/AllowInternetOutBound);
- the service tag VirtualNetwork is the VNet's address space (plus peered and connected ranges,
  none here); AzureLoadBalancer is the platform's health probe address 168.63.129.16
  (https://learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16);
  Internet is everything outside the virtual network.

In the box a VM's address is its namespace's (`vm_to_ip`), not the 10.0.0.x the fake gave its
NIC. So the VirtualNetwork tag becomes the box addresses of the VMs whose NIC is in the VNet,
Internet becomes every address but those, and an address prefix as the fake holds it (the
adapter's 10.0.0.0/16) becomes itself plus the box address of every VM whose NIC's private IP
falls in it (firewall_nft.Addresses); only VMs of the same VNet count, as VNets are isolated
from each other unless peered (cloudtrain peers none). A rule applies to a VM when its
destination (`*`, VirtualNetwork, or a prefix holding the VM's private IP) names the VM.
Application security groups and source port ranges other than `*` are not modelled (cloudtrain
uses neither).
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.firewall_nft import ACCEPT, ANY, DROP, Addresses, Layer, Rule, port_range, render

NETWORK_API, COMPUTE_API, RESOURCES_API = "2024-05-01", "2024-07-01", "2021-04-01"
LOAD_BALANCER = "168.63.129.16"  # the AzureLoadBalancer tag's health probes come from here
# Azure's default inbound rules of every NSG, appended as Azure applies them (overview, above):
# (name, priority, access, source, destination)
DEFAULT_INBOUND = (
    ("AllowVnetInBound", 65000, "Allow", "VirtualNetwork", "VirtualNetwork"),
    ("AllowAzureLoadBalancerInBound", 65001, "Allow", "AzureLoadBalancer", "*"),
    ("DenyAllInBound", 65500, "Deny", "*", "*"),
)
PROTOCOLS = {"tcp": "tcp", "udp": "udp", "icmp": "icmp", "esp": "esp", "ah": "ah", "*": ANY}
ANYWHERE = ("*", "any", "0.0.0.0/0", "internet/0")


@dataclass(frozen=True)
class AzureSnapshot:
    """NSGs, VNets, NICs and VMs as ARM's REST API answers them (camelCase JSON)."""

    nsgs: list[dict[str, Any]]
    vnets: list[dict[str, Any]]
    nics: list[dict[str, Any]]
    vms: list[dict[str, Any]]


def _get(url: str, context: ssl.SSLContext, token: str) -> Iterator[dict[str, Any]]:
    while url:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            page = json.loads(answer.read())
        yield from page.get("value", [])
        url = page.get("nextLink") or ""


def read_azure(endpoint: str, ca_path: str, subscription: str, token: str) -> AzureSnapshot:
    """Every NSG, VNet and NIC of every resource group and every VM of `subscription`, read
    back over ARM's REST API at `endpoint` (the fake's url, trusting `ca_path`) with a bearer
    `token`. Blocks; read-only."""
    context = ssl.create_default_context(cafile=ca_path)
    sub = f"{endpoint.rstrip('/')}/subscriptions/{subscription}"
    groups = [
        g["name"] for g in _get(f"{sub}/resourcegroups?api-version={RESOURCES_API}", context, token)
    ]

    def listed(kind: str) -> list[dict[str, Any]]:
        return [
            res
            for group in groups
            for res in _get(
                f"{sub}/resourceGroups/{group}/providers/Microsoft.Network/{kind}"
                f"?api-version={NETWORK_API}",
                context,
                token,
            )
        ]

    vms = list(
        _get(
            f"{sub}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API}",
            context,
            token,
        )
    )
    return AzureSnapshot(
        listed("networkSecurityGroups"),
        listed("virtualNetworks"),
        listed("networkInterfaces"),
        vms,
    )


@dataclass(frozen=True)
class _Vm:
    vm_id: str
    box_ip: str
    cloud_ip: str
    vnet: str  # the VNet's id, lower case
    subnet_nsg: str | None  # NSG ids, lower case
    nic_nsg: str | None


def _ref(body: Mapping[str, Any] | None, key: str) -> str | None:
    found = ((body or {}).get("properties") or {}).get(key) or {}
    return str(found["id"]).lower() if found.get("id") else None


def _vms(snapshot: AzureSnapshot, vm_to_ip: Mapping[str, str]) -> list[_Vm]:
    nics = {str(n["id"]).lower(): n for n in snapshot.nics}
    subnets: dict[str, tuple[str, str | None]] = {}  # subnet id -> (vnet id, its NSG id)
    for vnet in snapshot.vnets:
        for subnet in (vnet.get("properties") or {}).get("subnets") or []:
            subnets[str(subnet["id"]).lower()] = (
                str(vnet["id"]).lower(),
                _ref(subnet, "networkSecurityGroup"),
            )
    out = []
    for vm in snapshot.vms:
        props = vm.get("properties") or {}
        vm_id = str(props.get("vmId", ""))
        if vm_id not in vm_to_ip:
            continue
        refs = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        primary = next((r for r in refs if (r.get("properties") or {}).get("primary")), None)
        nic = nics.get(str((primary or (refs[0] if refs else {})).get("id", "")).lower())
        if nic is None:
            continue
        configs = (nic.get("properties") or {}).get("ipConfigurations") or [{}]
        config = configs[0].get("properties") or {}
        vnet, subnet_nsg = subnets.get(
            str((config.get("subnet") or {}).get("id", "")).lower(), ("", None)
        )
        out.append(
            _Vm(
                vm_id,
                vm_to_ip[vm_id],
                str(config.get("privateIPAddress") or ""),
                vnet,
                subnet_nsg,
                _ref(nic, "networkSecurityGroup"),
            )
        )
    return out


def _prefixes(props: Mapping[str, Any], side: str) -> list[str]:
    one = props.get(f"{side}AddressPrefix")
    return [
        str(p) for p in ([one] if one else []) + list(props.get(f"{side}AddressPrefixes") or [])
    ]


def sources(
    prefixes: list[str], members: tuple[str, ...], addresses: Addresses
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """(sources, excluded) of a rule's source prefixes in the box (see the module docstring):
    ANY for `*`; the VNet's member addresses for VirtualNetwork; everything but them for
    Internet; 168.63.129.16 for AzureLoadBalancer; a prefix translated; other service tags:
    nobody. Pure."""
    found: set[str] = set()
    for prefix in prefixes:
        low = prefix.lower()
        if low in ANYWHERE:
            return ANY, ()
        if low == "internet":
            return ANY, members
        if low == "virtualnetwork":
            found.update(members)
        elif low == "azureloadbalancer":
            found.add(LOAD_BALANCER)
        elif low[0].isdigit() or ":" in low:
            found.update(addresses.translate([prefix]))
    return tuple(sorted(found)), ()


def targets(prefixes: list[str], vm: _Vm) -> bool:
    """Whether destination prefixes name `vm` (`*`, VirtualNetwork, or a prefix holding its
    private or box address). Pure."""
    from ipaddress import ip_address, ip_network

    for prefix in prefixes:
        low = prefix.lower()
        if low in ANYWHERE or (low == "virtualnetwork" and vm.vnet):
            return True
        if low[:1].isdigit() or ":" in low:
            net = ip_network(prefix, strict=False)
            if any(a and ip_address(a) in net for a in (vm.cloud_ip, vm.box_ip)):
                return True
    return False


def nsg_rules(nsg: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The NSG's inbound rules as Azure evaluates them: its own, then the defaults, by
    priority. Pure."""
    own = [
        {"name": r.get("name", ""), **(r.get("properties") or {})}
        for r in ((nsg or {}).get("properties") or {}).get("securityRules") or []
    ]
    defaults = [
        {
            "name": name,
            "priority": priority,
            "direction": "Inbound",
            "access": access,
            "protocol": "*",
            "sourceAddressPrefix": source,
            "destinationAddressPrefix": dest,
            "sourcePortRange": "*",
            "destinationPortRange": "*",
        }
        for name, priority, access, source, dest in DEFAULT_INBOUND
    ]
    inbound = [r for r in own if str(r.get("direction", "")).lower() == "inbound"]
    return sorted(inbound + defaults, key=lambda r: int(r.get("priority", 0)))


def layer_of(
    nsg: Mapping[str, Any] | None,
    vm: _Vm,
    members: tuple[str, ...],
    addresses: Addresses,
    where: str,
) -> Layer:
    """One NSG, as it filters traffic to `vm`, as a Layer. Pure."""
    rules = []
    for rule in nsg_rules(nsg):
        if not targets(_prefixes(rule, "destination"), vm):
            continue
        proto = PROTOCOLS.get(str(rule.get("protocol", "*")).lower(), str(rule.get("protocol")))
        ranges = [rule.get("destinationPortRange") or ""]
        ranges = [r for r in ranges if r] + list(rule.get("destinationPortRanges") or [])
        parsed = [port_range(str(r)) for r in ranges]
        ports = () if any(p is None for p in parsed) else tuple(p for p in parsed if p)
        srcs, excluded = sources(_prefixes(rule, "source"), members, addresses)
        action = ACCEPT if str(rule.get("access")).lower() == "allow" else DROP
        what = f"{rule['name']} p{rule.get('priority')}"
        rules.append(Rule(action, proto, ports, srcs, excluded, what))
    return Layer(f"{where} NSG {(nsg or {}).get('name', '')}", tuple(rules))


def layers_azure(snapshot: AzureSnapshot, vm_to_ip: Mapping[str, str]) -> dict[str, list[Layer]]:
    """Per `vmId` in `vm_to_ip` (-> its box address) that has a NIC, its firewall: the
    subnet's NSG, then the NIC's, as Layers (none of either: one Layer that allows all). Pure."""
    vms = _vms(snapshot, vm_to_ip)
    nsgs = {str(n["id"]).lower(): n for n in snapshot.nsgs}
    out: dict[str, list[Layer]] = {}
    for vm in vms:
        # only VMs of the same VNet can reach this one (VNets are isolated unless peered,
        # whatever an NSG says): they alone stand behind a prefix or the VirtualNetwork tag
        same = [v for v in vms if v.vnet and v.vnet == vm.vnet]
        members = tuple(sorted(v.box_ip for v in same))
        addresses = Addresses({v.cloud_ip: v.box_ip for v in same})
        layers = [
            layer_of(nsgs.get(nsg_id), vm, members, addresses, where)
            for where, nsg_id in (("subnet", vm.subnet_nsg), ("NIC", vm.nic_nsg))
            if nsg_id
        ]
        out[vm.vm_id] = layers or [Layer("no NSG: unfiltered", (Rule(ACCEPT),))]
    return out


def compile_azure(snapshot: AzureSnapshot, vm_to_ip: Mapping[str, str]) -> dict[str, str]:
    """Per `vmId` in `vm_to_ip`, its nftables ruleset (`layers_azure` rendered). Pure."""
    return {vm: render(layers, vm) for vm, layers in layers_azure(snapshot, vm_to_ip).items()}


def azure_rulesets(
    endpoint: str, ca_path: str, subscription: str, token: str, vm_to_ip: Mapping[str, str]
) -> dict[str, str]:
    """`compile_azure(read_azure(...), vm_to_ip)`. Blocks; read-only."""
    return compile_azure(read_azure(endpoint, ca_path, subscription, token), vm_to_ip)
