"""Cross-references between the ARM fake's Microsoft.Network resources: `NetRefsMixin`.

Resources refer to each other by id (a NIC to its subnet, public IP and NSG; a subnet to its NSG;
a VM to its NICs). This mixin resolves such references (`_must_exist()`, `_subnet_at()`: 400
InvalidResourceReference if the target is missing), answers the read-only back references Azure
shows on GET (`_decorate()`: a NIC's `virtualMachine`, a public IP's `ipConfiguration`, an
NSG's `networkInterfaces`/`subnets`, a subnet's `ipConfigurations`), refuses to delete what is
still referenced (`_check_unused()`: 400 NicInUse, PublicIPAddressCannotBeDeleted,
InUseNetworkSecurityGroupCannotBeDeleted, InUseSubnetCannotBeDeleted, the last also for a
subnet dropped from a vnet PUT), and hands out private IPs (`_private_ip()`: the first free
address of the subnet from its fifth on, Azure keeping .0-.3, so 10.0.0.4 first in 10.0.0.0/24;
kept on update; a Static one must be in the subnet and free, else 400
PrivateIPAddressNotInSubnet / PrivateIPAddressInUse; 400 SubnetIsFull when none is left).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

from tests.fakes.arm_errors import ArmApiError, in_use
from tests.fakes.arm_netbodies import network
from tests.fakes.arm_resources import ResourcesMixin
from tests.fakes.arm_state import Resource

VNET = "Microsoft.Network/virtualNetworks"
NSG = "Microsoft.Network/networkSecurityGroups"
NIC = "Microsoft.Network/networkInterfaces"
PIP = "Microsoft.Network/publicIPAddresses"
KINDS = {kind.split("/")[1].lower(): kind for kind in (VNET, NSG, NIC, PIP)}


def ref_id(item: dict[str, Any], key: str) -> str:
    """The id in `item.properties[key].id`, or ''."""
    return str(((item.get("properties") or {}).get(key) or {}).get("id") or "")


def _missing_reference(ref: str, by: str) -> ArmApiError:
    return ArmApiError(
        400,
        "InvalidResourceReference",
        f"Resource {ref} referenced by resource {by} was not found. Please make sure that the "
        "referenced resource exists, and that both resources are in the same region.",
    )


class NetRefsMixin(ResourcesMixin):
    """References between network resources (see the module docstring)."""

    def _nic_configs(self) -> Iterator[tuple[Resource, dict[str, Any]]]:
        for res in list(self._state.resources.values()):
            if res.kind == NIC:
                for config in res.body["properties"].get("ipConfigurations") or []:
                    yield res, config

    def _vms_using(self, nic_id: str) -> list[str]:
        return [
            res.id
            for res in self._state.resources.values()
            if res.kind == "Microsoft.Compute/virtualMachines"
            and any(
                str(n.get("id", "")).lower() == nic_id.lower()
                for n in (res.body["properties"].get("networkProfile") or {}).get(
                    "networkInterfaces"
                )
                or []
            )
        ]

    def _must_exist(self, ref: str, by: str) -> Resource:
        """The resource `ref` points at; 400 InvalidResourceReference if there is none."""
        found = self._by_id(ref)
        if found is None:
            raise _missing_reference(ref, by)
        return found

    def _subnet_at(self, ref: str, by: str) -> dict[str, Any]:
        """The stored subnet `ref` points at; 400 InvalidResourceReference if there is none."""
        vnet_id, marker, name = ref.rpartition("/subnets/")
        vnet = self._by_id(vnet_id) if marker else None
        subnets = vnet.body["properties"].get("subnets") or [] if vnet is not None else []
        for subnet in subnets:
            if subnet["name"].lower() == name.lower():
                return subnet
        raise _missing_reference(ref, by)

    def _decorate(self, res: Resource, body: dict[str, Any]) -> None:
        props = body["properties"]
        if res.kind == NIC:
            vms = self._vms_using(res.id)
            if vms:
                props["virtualMachine"] = {"id": vms[0]}
        elif res.kind == PIP:
            users = [
                c["id"]
                for _, c in self._nic_configs()
                if ref_id(c, "publicIPAddress").lower() == res.id.lower()
            ]
            if users:
                props["ipConfiguration"] = {"id": users[0]}
        elif res.kind == NSG:
            nics = [
                n.id
                for n in self._state.resources.values()
                if n.kind == NIC
                and ref_id(n.body, "networkSecurityGroup").lower() == res.id.lower()
            ]
            subnets = [
                s["id"]
                for v in self._state.resources.values()
                if v.kind == VNET
                for s in v.body["properties"]["subnets"]
                if ref_id(s, "networkSecurityGroup").lower() == res.id.lower()
            ]
            if nics:
                props["networkInterfaces"] = [{"id": i} for i in nics]
            if subnets:
                props["subnets"] = [{"id": i} for i in subnets]
        elif res.kind == VNET:
            for subnet in props["subnets"]:
                self._decorate_subnet(subnet)
        super()._decorate(res, body)

    def _decorate_subnet(self, subnet: dict[str, Any]) -> None:
        users = [
            c["id"]
            for _, c in self._nic_configs()
            if ref_id(c, "subnet").lower() == subnet["id"].lower()
        ]
        if users:
            subnet["properties"]["ipConfigurations"] = [{"id": i} for i in users]

    # -- PUT --------------------------------------------------------------------------------

    def _check_kept_subnets(self, old: dict[str, Any], props: dict[str, Any]) -> None:
        kept = {s["name"].lower() for s in props["subnets"]}
        for subnet in (old.get("properties") or {}).get("subnets") or []:
            if subnet["name"].lower() not in kept:
                self._subnet_unused(subnet)

    def _subnet_unused(self, subnet: dict[str, Any]) -> None:
        users = [
            c["id"]
            for _, c in self._nic_configs()
            if ref_id(c, "subnet").lower() == subnet["id"].lower()
        ]
        if users:
            raise in_use(
                "InUseSubnetCannotBeDeleted",
                f"Subnet {subnet['name']} is in use by {users[0]} and cannot be deleted. In order "
                "to delete the subnet, delete all the resources within the subnet. See "
                "aka.ms/deletesubnet.",
            )

    def _private_ip(self, nic_id: str, subnet: Any, p: dict[str, Any], old: str | None) -> str:
        sp = subnet["properties"]
        net = network(sp.get("addressPrefix") or (sp.get("addressPrefixes") or [""])[0], "subnet")
        used = {
            c["properties"].get("privateIPAddress")
            for nic, c in self._nic_configs()
            if nic.id.lower() != nic_id.lower()
            and ref_id(c, "subnet").lower() == subnet["id"].lower()
        }
        if p["privateIPAllocationMethod"] == "Static" and p.get("privateIPAddress"):
            wanted = str(p["privateIPAddress"])
            if ipaddress.ip_address(wanted) not in net:
                raise ArmApiError(
                    400,
                    "PrivateIPAddressNotInSubnet",
                    f"Private static IP address {wanted} does not belong to the range of subnet "
                    f"prefix {net}.",
                )
            if wanted in used:
                raise ArmApiError(
                    400,
                    "PrivateIPAddressInUse",
                    f"IP configuration {nic_id} is using the private IP address {wanted} which is "
                    "already allocated to another resource.",
                )
            return wanted
        if old and old not in used:
            return old
        for host in list(net.hosts())[3:]:
            if str(host) not in used:
                return str(host)
        raise ArmApiError(400, "SubnetIsFull", f"Subnet {subnet['name']} has no free IP address.")

    # -- GET, DELETE, list ------------------------------------------------------------------

    def _check_unused(self, res: Resource) -> None:
        body = self._public(res)
        props = body["properties"]
        if res.kind == NIC and props.get("virtualMachine"):
            raise in_use(
                "NicInUse",
                f"Network Interface {res.id} is used by existing resource "
                f"{props['virtualMachine']['id']}. In order to delete the network interface, it "
                "must be dissociated from the resource. To learn more, see aka.ms/deletenic.",
            )
        if res.kind == PIP and props.get("ipConfiguration"):
            raise in_use(
                "PublicIPAddressCannotBeDeleted",
                f"Public IP address {res.id} can not be deleted since it is still allocated to "
                f"resource {props['ipConfiguration']['id']}. In order to delete the public IP, "
                "disassociate/detach the Public IP address from the resource. To learn how to do "
                "this, see aka.ms/deletepublicip.",
            )
        users = [u["id"] for key in ("networkInterfaces", "subnets") for u in props.get(key) or []]
        if res.kind == NSG and users:
            raise in_use(
                "InUseNetworkSecurityGroupCannotBeDeleted",
                f"Network security group {res.id} cannot be deleted because it is in use by the "
                f"following resources: {', '.join(users)}. In order to delete the Network "
                "security group, remove the association with the resource(s). To learn how to do "
                "this, see aka.ms/deletensg.",
            )
        if res.kind == VNET:
            for subnet in res.body["properties"]["subnets"]:
                self._subnet_unused(subnet)

    # -- subnets ----------------------------------------------------------------------------
