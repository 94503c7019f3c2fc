"""Microsoft.Network routes of the ARM fake: `NetworkMixin`.

Served under `resourceGroups/{rg}/providers/Microsoft.Network`: `virtualNetworks`,
`networkSecurityGroups`, `networkInterfaces` and `publicIPAddresses` (PUT create-or-update as an
LRO, GET, DELETE as an LRO, GET list in the group; see arm_resources), and
`virtualNetworks/{vnet}/subnets[/{name}]` (GET list, GET, PUT as an LRO on the vnet's inline
subnet list). Bodies are checked and completed by arm_netbodies. A NIC needs IP configurations
whose subnet (and optional public IP) exist, as must its NSG and a subnet's NSG (else 400
InvalidResourceReference); each configuration gets a private IP from its subnet, the first free
one from the fifth address on (Azure keeps .0-.3: 10.0.0.4 first in 10.0.0.0/24), kept on
update; a Static one must be in the subnet and free (PrivateIPAddressNotInSubnet,
PrivateIPAddressInUse). Public IPs get 203.0.113.x addresses (Standard, Static by default).
GET answers the read-only back references Azure shows and a DELETE is refused with Azure's 400
while something still refers to the resource (see arm_netrefs).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.fakes.arm_errors import ArmApiError, conflict, invalid_parameter
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import check_name, now, resource_id
from tests.fakes.arm_netbodies import (
    check_subnets,
    child,
    network,
    nsg_props,
    pip_props,
    settle,
    vnet_props,
)
from tests.fakes.arm_netrefs import KINDS, NIC, NSG, VNET, NetRefsMixin, ref_id
from tests.fakes.arm_resources import bad_body
from tests.fakes.arm_routes import Req
from tests.fakes.arm_state import Resource


class NetworkMixin(NetRefsMixin):
    """The Microsoft.Network routes (see the module docstring)."""

    def _put_network(self, req: Req) -> Reply:
        kind, name = KINDS[req.params["type"].lower()], req.params["name"]
        ctx = self._put_context(req, kind, [name])
        rid = resource_id(req.params["sub"], req.params["rg"], kind, name)
        old = ctx.existing.body if ctx.existing else {}
        extra: dict[str, Any] = {}
        if ctx.body.get("zones"):
            extra["zones"] = [str(z) for z in ctx.body["zones"]]
        if kind == VNET:
            props = vnet_props(rid, ctx.props, "Updating")
            self._check_kept_subnets(old, props)
            for subnet in props["subnets"]:
                if ref_id(subnet, "networkSecurityGroup"):
                    self._must_exist(ref_id(subnet, "networkSecurityGroup"), subnet["id"])
        elif kind == NSG:
            props = nsg_props(rid, ctx.props, "Updating")
        elif kind == NIC:
            props = self._nic_props(rid, ctx.props, old)
        else:
            sku = str((ctx.body.get("sku") or {}).get("name") or "Standard")
            extra["sku"] = {"name": sku, "tier": "Regional"}
            address = (old.get("properties") or {}).get("ipAddress")
            address = address or f"203.0.113.{next(self._state.public_ips) % 250 + 1}"
            props = pip_props(ctx.props, sku, address, rid)
        props["resourceGuid"] = (old.get("properties") or {}).get("resourceGuid") or str(
            uuid.uuid4()
        )
        ctx.props = props
        return self._commit_put(req, kind, [name], ctx, extra, lambda r: settle(r.body))

    def _nic_props(self, rid: str, props: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        items = props.get("ipConfigurations") or []
        if not items:
            raise invalid_parameter(
                f"Network interface {rid} must have at least one IP configuration.",
                "ipConfigurations",
            )
        old_ips = {
            c["name"].lower(): c["properties"].get("privateIPAddress")
            for c in (old.get("properties") or {}).get("ipConfigurations") or []
        }
        configs = []
        for index, item in enumerate(items):
            config = child(rid, "ipConfigurations", item, "Updating")
            p = config["properties"]
            subnet_id = ref_id(config, "subnet")
            if not subnet_id:
                raise invalid_parameter(
                    f"IP configuration {config['name']} needs a subnet.", "subnet"
                )
            subnet = self._subnet_at(subnet_id, rid)
            if ref_id(config, "publicIPAddress"):
                self._must_exist(ref_id(config, "publicIPAddress"), rid)
            p.setdefault("privateIPAllocationMethod", "Dynamic")
            p.setdefault("primary", index == 0)
            p["privateIPAddressVersion"] = "IPv4"
            p["privateIPAddress"] = self._private_ip(
                rid, subnet, p, old_ips.get(config["name"].lower())
            )
            configs.append(config)
        if ref_id(props, "networkSecurityGroup"):
            self._must_exist(ref_id(props, "networkSecurityGroup"), rid)
        return {
            "enableAcceleratedNetworking": False,
            "enableIPForwarding": False,
            **props,
            "ipConfigurations": configs,
        }

    def _get_network(self, req: Req) -> dict[str, Any]:
        kind = KINDS[req.params["type"].lower()]
        res = self._existing(kind, req.params["sub"], req.params["rg"], req.params["name"])
        return self._public(res)

    def _list_network(self, req: Req) -> dict[str, Any]:
        self._group(req.params["sub"], req.params["rg"])
        kind = KINDS[req.params["type"].lower()]
        return self._value(self._listed(kind, req.params["sub"], req.params["rg"]))

    def _delete_network(self, req: Req) -> Reply:
        kind = KINDS[req.params["type"].lower()]
        return self._begin_delete(req, kind, [req.params["name"]], self._check_unused)

    def _vnet(self, req: Req) -> Resource:
        return self._existing(VNET, req.params["sub"], req.params["rg"], req.params["vnet"])

    def _subnet(self, vnet: Resource, name: str) -> dict[str, Any]:
        for subnet in vnet.body["properties"]["subnets"]:
            if subnet["name"].lower() == name.lower():
                return subnet
        raise ArmApiError(404, "NotFound", f"Resource {vnet.id}/subnets/{name} not found.")

    def _get_subnet(self, req: Req) -> dict[str, Any]:
        subnet = copy.deepcopy(self._subnet(self._vnet(req), req.params["name"]))
        self._decorate_subnet(subnet)
        return subnet

    def _list_subnets(self, req: Req) -> dict[str, Any]:
        subnets = copy.deepcopy(self._vnet(req).body["properties"]["subnets"])
        for subnet in subnets:
            self._decorate_subnet(subnet)
        return {"value": subnets}

    def _put_subnet(self, req: Req) -> Reply:
        vnet, name = self._vnet(req), req.params["name"]
        check_name(name, "subnets")
        if vnet.body["properties"].get("provisioningState") == "Deleting":
            raise conflict(f"The virtual network '{vnet.name}' is being deleted.")
        if not isinstance(req.body, dict):
            raise bad_body()
        subnet = child(
            vnet.id, "subnets", {"name": name, "properties": req.body.get("properties")}, "Updating"
        )
        props = vnet.body["properties"]
        existing = [s for s in props["subnets"] if s["name"].lower() != name.lower()]
        spaces = [
            network(p, "the virtual network") for p in props["addressSpace"]["addressPrefixes"]
        ]
        check_subnets(vnet.id, spaces, [*existing, subnet])
        if ref_id(subnet, "networkSecurityGroup"):
            self._must_exist(ref_id(subnet, "networkSecurityGroup"), subnet["id"])
        created = len(existing) == len(props["subnets"])
        props["subnets"] = [*existing, subnet]
        subnet["etag"] = f'W/"{now()}"'

        def settled() -> None:
            subnet["properties"]["provisioningState"] = "Succeeded"

        headers = self._start_lro(
            req.params["sub"], "Microsoft.Network", vnet.body["location"], settled
        )
        return Reply(201 if created else 200, copy.deepcopy(subnet), headers)
