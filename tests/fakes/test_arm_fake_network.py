"""The ARM fake's Microsoft.Network and Microsoft.Authorization routes, driven only through
the real azure-mgmt clients: virtual networks and subnets, NSGs, NICs and their private IPs,
public IPs, the checks and in-use refusals Azure makes, and role assignments at any scope.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("azure.mgmt.network")
pytest.importorskip("trustme")
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from tests.fakes.arm_fake import ArmFake, arm_fake
from tests.fakes.arm_testkit import LOCATION, SUB, ArmClients, az, az0, build_network, loopback_only

__all__ = ["arm_fake", "az", "az0", "loopback_only"]  # fixtures used by this module
pytestmark = pytest.mark.usefixtures("loopback_only")

RG = "ct-run-1"


# -- network ---------------------------------------------------------------------------------


def test_network_resources_and_back_references(arm_fake: ArmFake, az: ArmClients) -> None:
    nic_ids = build_network(az, RG, nics=("nic-0", "nic-1"))
    net = az.network
    vnet = net.virtual_networks.get(RG, "vnet")
    assert vnet.address_space.address_prefixes == ["10.0.0.0/16"]
    assert len(vnet.subnets[0].ip_configurations) == 2
    nics = [net.network_interfaces.get(RG, n) for n in ("nic-0", "nic-1")]
    assert [n.id for n in nics] == nic_ids
    assert [n.ip_configurations[0].private_ip_address for n in nics] == ["10.0.0.4", "10.0.0.5"]
    assert nics[0].ip_configurations[0].subnet.id == vnet.subnets[0].id
    assert nics[0].network_security_group.id.endswith("/networkSecurityGroups/nsg")
    assert nics[0].virtual_machine is None
    pip = net.public_ip_addresses.get(RG, "nic-0-ip")
    assert pip.ip_configuration.id == nics[0].ip_configurations[0].id
    nsg = net.network_security_groups.get(RG, "nsg")
    assert [r.name for r in nsg.security_rules] == ["ssh"]
    assert len(nsg.default_security_rules) == 6
    assert len(nsg.network_interfaces) == 2
    assert [n.name for n in net.network_interfaces.list(RG)] == ["nic-0", "nic-1"]
    assert [p.name for p in net.public_ip_addresses.list(RG)] == ["nic-0-ip", "nic-1-ip"]
    assert len(arm_fake.resources("Microsoft.Network/networkInterfaces", group=RG)) == 2


def test_subnets_get_put_and_list(az: ArmClients, az0: ArmClients) -> None:
    build_network(az, RG)
    subnets = az.network.subnets
    nsg_id = az.network.network_security_groups.get(RG, "nsg").id
    body = {"properties": {"addressPrefix": "10.0.1.0/24", "networkSecurityGroup": {"id": nsg_id}}}
    made = subnets.begin_create_or_update(RG, "vnet", "gpu", body).result()
    assert made.provisioning_state == "Succeeded" and made.address_prefix == "10.0.1.0/24"
    assert subnets.get(RG, "vnet", "gpu").network_security_group.id == nsg_id
    assert [s.name for s in subnets.list(RG, "vnet")] == ["default", "gpu"]
    with pytest.raises(HttpResponseError) as caught:
        az0.network.subnets.get(RG, "vnet", "missing")
    assert caught.value.error.code == "NotFound"
    clash = {"properties": {"addressPrefix": "10.0.1.128/25"}}
    with pytest.raises(HttpResponseError) as caught:
        az0.network.subnets.begin_create_or_update(RG, "vnet", "clash", clash)
    assert caught.value.error.code == "NetcfgSubnetRangesOverlap"
    outside = {"properties": {"addressPrefix": "192.168.0.0/24"}}
    with pytest.raises(HttpResponseError) as caught:
        az0.network.subnets.begin_create_or_update(RG, "vnet", "out", outside)
    assert caught.value.error.code == "NetcfgInvalidSubnet"


def _nic(subnet_id: str, **config: Any) -> dict[str, Any]:
    ip_config = {"name": "c", "properties": {"subnet": {"id": subnet_id}, **config}}
    return {"location": LOCATION, "properties": {"ipConfigurations": [ip_config]}}


def _vnet(prefix: str, location: str = LOCATION) -> dict[str, Any]:
    return {"location": location, "properties": {"addressSpace": {"addressPrefixes": [prefix]}}}


def test_network_puts_are_checked(az: ArmClients, az0: ArmClients) -> None:
    build_network(az, RG)
    subnet_id = az.network.subnets.get(RG, "vnet", "default").id
    static = {"privateIPAllocationMethod": "Static", "privateIPAddress": "10.0.0.4"}
    dynamic_ip = {"location": LOCATION, "properties": {"publicIPAllocationMethod": "Dynamic"}}
    rule = {"name": "r", "properties": {"priority": 99, "direction": "Inbound", "access": "Allow"}}
    nsg = {"location": LOCATION, "properties": {"securityRules": [rule]}}
    cases: list[tuple[str, str, str, Any, str]] = [
        ("network_interfaces", RG, "n", _nic(subnet_id + "x"), "InvalidResourceReference"),
        ("network_interfaces", RG, "n", _nic(subnet_id, **static), "PrivateIPAddressInUse"),
        ("network_interfaces", RG, "n", _nic("not-an-id"), "InvalidResourceReference"),
        ("network_interfaces", RG, "n", {"location": LOCATION}, "InvalidParameter"),
        ("public_ip_addresses", RG, "p", dynamic_ip, "StandardSkuPublicIPAddressesMustBeStatic"),
        ("network_security_groups", RG, "s", nsg, "SecurityRuleInvalidPriority"),
        ("virtual_networks", RG, "v", _vnet("10.0.0.0/33"), "InvalidAddressPrefixFormat"),
        ("virtual_networks", RG, "v", {"properties": {}}, "LocationRequired"),
        ("virtual_networks", RG, "vnet", _vnet("10.0.0.0/16", "westus"), "InvalidResourceLocation"),
        ("virtual_networks", "nope", "v", _vnet("10.0.0.0/16"), "ResourceGroupNotFound"),
        ("virtual_networks", RG, "bad name!", _vnet("10.0.0.0/16"), "InvalidResourceName"),
        ("virtual_networks", RG, "vnet", _vnet("10.0.0.0/16"), "InUseSubnetCannotBeDeleted"),
    ]
    for attr, group, name, body, code in cases:
        with pytest.raises(HttpResponseError) as caught:
            getattr(az0.network, attr).begin_create_or_update(group, name, body)
        assert caught.value.error.code == code, (attr, name)
    assert (
        az.network.virtual_networks.begin_create_or_update(RG, "v", _vnet("10.9.0.0/16", "westus"))
        .result()
        .location
        == "westus"
    )


def test_deletes_refused_while_in_use_and_idempotent(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients
) -> None:
    build_network(az, RG)
    net0 = az0.network
    expected = [
        (
            lambda: net0.public_ip_addresses.begin_delete(RG, "nic-0-ip"),
            "PublicIPAddressCannotBeDeleted",
        ),
        (
            lambda: net0.network_security_groups.begin_delete(RG, "nsg"),
            "InUseNetworkSecurityGroupCannotBeDeleted",
        ),
        (lambda: net0.virtual_networks.begin_delete(RG, "vnet"), "InUseSubnetCannotBeDeleted"),
    ]
    for call, code in expected:
        with pytest.raises(HttpResponseError) as caught:
            call()
        assert caught.value.status_code == 400 and caught.value.error.code == code
    az.network.network_interfaces.begin_delete(RG, "nic-0").result()
    with pytest.raises(ResourceNotFoundError) as caught:
        az0.network.network_interfaces.get(RG, "nic-0")
    assert caught.value.error.code == "ResourceNotFound"
    az.network.network_interfaces.begin_delete(RG, "nic-0").result()  # 204: already gone
    for name in ("nic-0-ip", "nsg", "vnet"):
        kind = {
            "nic-0-ip": "public_ip_addresses",
            "nsg": "network_security_groups",
            "vnet": "virtual_networks",
        }[name]
        getattr(az.network, kind).begin_delete(RG, name).result()
    assert arm_fake.resources(group=RG) == []


# -- role assignments ---------------------------------------------------------------------------


def _container_scope(account: str = "ctstore", container: str = "runs") -> str:
    return (
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/"
        f"{account}/blobServices/default/containers/{container}"
    )


def _assign(az: ArmClients, scope: str, name: str, principal: str) -> Any:
    body = {
        "properties": {
            "roleDefinitionId": az.role_definition(),
            "principalId": principal,
            "principalType": "ServicePrincipal",
        }
    }
    return az.auth.role_assignments.create(scope, name, body)


PRINCIPAL = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
OTHER = "9e8d7c6b-5a49-4382-b716-05f4e3d2c1b0"
NAMES = [
    "1a2b3c4d-0000-4000-8000-000000000001",
    "1a2b3c4d-0000-4000-8000-000000000002",
    "1a2b3c4d-0000-4000-8000-000000000003",
]


def test_role_assignments_at_a_container_scope(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients
) -> None:
    az.group(RG)
    scope = _container_scope()
    made = _assign(az, scope, NAMES[0], PRINCIPAL)
    assert made.id == f"{scope}/providers/Microsoft.Authorization/roleAssignments/{NAMES[0]}"
    assert made.scope == scope and made.principal_id == PRINCIPAL
    assert made.role_definition_id == az.role_definition()
    got = az.auth.role_assignments.get(scope, NAMES[0])
    assert got.principal_type == "ServicePrincipal"
    _assign(az, f"/subscriptions/{SUB}/resourceGroups/{RG}", NAMES[1], OTHER)
    _assign(az, _container_scope(container="other"), NAMES[2], PRINCIPAL)
    ras = az.auth.role_assignments
    assert [r.name for r in ras.list_for_scope(scope, filter="atScope()")] == NAMES[:2]
    assert [
        r.name for r in ras.list_for_scope(f"/subscriptions/{SUB}/resourceGroups/{RG}")
    ] == NAMES
    flt = f"principalId eq '{PRINCIPAL}'"
    assert [r.name for r in ras.list_for_resource_group(RG, filter=flt)] == [NAMES[0], NAMES[2]]
    assert len(arm_fake.role_assignments()) == 3
    assert ras.delete(scope, NAMES[0]).name == NAMES[0]
    assert ras.delete(scope, NAMES[0]) is None  # 204: already gone
    with pytest.raises(ResourceNotFoundError) as caught:
        az0.auth.role_assignments.get(scope, NAMES[0])
    assert caught.value.error.code == "RoleAssignmentNotFound"


def test_role_assignment_errors(arm_fake: ArmFake, az: ArmClients, az0: ArmClients) -> None:
    az.group(RG)
    scope = _container_scope()
    _assign(az, scope, NAMES[0], PRINCIPAL)
    assert _assign(az, scope, NAMES[0], PRINCIPAL).name == NAMES[0]  # same again: fine
    arm_fake.fail_next_role_assignment()
    cases = [
        (NAMES[1], PRINCIPAL, scope, "PrincipalNotFound", 400),
        (NAMES[1], PRINCIPAL, scope, "RoleAssignmentExists", 409),
        (NAMES[0], OTHER, scope, "RoleAssignmentUpdateNotPermitted", 409),
        ("not-a-guid", PRINCIPAL, scope, "InvalidRoleAssignmentId", 400),
        (NAMES[1], "someone", scope, "InvalidPrincipalId", 400),
        (
            NAMES[1],
            PRINCIPAL,
            f"/subscriptions/{SUB}/resourceGroups/nope",
            "ResourceGroupNotFound",
            404,
        ),
    ]
    for name, principal, at, code, status in cases:
        with pytest.raises(HttpResponseError) as caught:
            _assign(az0, at, name, principal)
        assert (caught.value.error.code, caught.value.status_code) == (code, status)
        if code == "PrincipalNotFound":
            assert "replication delay" in caught.value.error.message
