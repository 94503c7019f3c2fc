"""The Azure request bodies of providers/azure/bodies.py: pure checks of the VM, NSG, network,
image, customData, role assignment and SSH key builders, then one run of the bodies through the
real azure-mgmt clients against the ARM fake (which refuses what Azure refuses).
"""

from __future__ import annotations

import base64
import importlib.util
import uuid
from typing import Any

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.azure.bodies import (
    ADMIN_USER,
    CUSTOM_DATA_MAX,
    DRIVER_EXTENSION,
    STORAGE_BLOB_DATA_CONTRIBUTOR,
    SUBNET_CIDR,
    VNET_CIDR,
    computer_name,
    container_scope,
    custom_data,
    driver_extension_body,
    nic_body,
    nsg_body,
    public_ip_body,
    role_assignment_body,
    role_assignment_name,
    storage_account_body,
    throwaway_ssh_key,
    vm_body,
    vnet_body,
)
from cloudtrain.providers.azure.images import IMAGE_ALIASES, image_for, reference
from cloudtrain.providers.base import NodeRequest, RunInfo
from tests.fakes.arm_fake import ArmFake, arm_fake
from tests.fakes.arm_testkit import LOCATION, RG, SUB, ArmClients, az, loopback_only

__all__ = ["arm_fake", "az", "loopback_only"]  # fixtures used by the last test

SCRIPT = "#!/bin/bash\necho 'cloudtrain agent starting'\n"
TAGS = {"cloudtrain-run": "run-1", "owner": "me"}
NIC = "/subscriptions/s/resourceGroups/ct-run-1/providers/Microsoft.Network/networkInterfaces/n"
KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC0 test"
T4 = "Standard_NC4as_T4_v3"
JAMMY = {  # Canonical's Ubuntu 22.04 Gen2
    "publisher": "Canonical",
    "offer": "0001-com-ubuntu-server-jammy",
    "sku": "22_04-lts-gen2",
    "version": "latest",
}


def request(**kw: Any) -> NodeRequest:
    base: dict[str, Any] = {
        "run_id": "run-1",
        "role": "worker",
        "index": 1,
        "instance_type": T4,
        "startup_script": SCRIPT,
        "disk_gb": 128,
        "accelerator": "T4",
        "accelerator_count": 1,
    }
    return NodeRequest(**{**base, **kw})


def run_info(ssh: bool = False, ports: tuple[int, int] = (2222, 2229)) -> RunInfo:
    return RunInfo("run-1", "eastus", "1", ports, ssh=ssh)


def body(**kw: Any) -> dict[str, Any]:
    image = kw.pop("image", image_for(T4, True))
    zone = kw.pop("zone", "2")
    return vm_body(request(**kw), "eastus", zone, NIC, KEY, image, TAGS)


# -- the VM ----------------------------------------------------------------------------------


def test_vm_body_is_the_whole_create() -> None:
    b = body(spot=True)
    props = b["properties"]
    assert b["location"] == "eastus" and b["zones"] == ["2"]
    assert props["hardwareProfile"] == {"vmSize": T4}
    assert props["storageProfile"]["imageReference"] == JAMMY
    assert props["storageProfile"]["osDisk"] == {
        "createOption": "FromImage",
        "deleteOption": "Delete",
        "diskSizeGB": 128,
        "managedDisk": {"storageAccountType": "StandardSSD_LRS"},
    }
    os_profile = props["osProfile"]
    assert os_profile["computerName"] == "ct-run-1-worker-1"
    assert os_profile["adminUsername"] == ADMIN_USER
    assert base64.b64decode(os_profile["customData"]).decode() == SCRIPT
    linux = os_profile["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert linux["ssh"]["publicKeys"] == [
        {"path": "/home/cloudtrain/.ssh/authorized_keys", "keyData": KEY}
    ]
    assert props["networkProfile"]["networkInterfaces"] == [
        {"id": NIC, "properties": {"primary": True, "deleteOption": "Delete"}}
    ]
    assert props["diagnosticsProfile"] == {"bootDiagnostics": {"enabled": True}}
    assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete")
    assert props["billingProfile"] == {"maxPrice": -1}
    assert b["identity"] == {"type": "SystemAssigned"}
    assert b["tags"] == {
        "cloudtrain-run": "run-1",
        "owner": "me",
        "cloudtrain-role": "worker",
        "cloudtrain-index": "1",
    }


def test_regular_vm_without_zone_has_no_spot_fields() -> None:
    b = body(zone=None)
    assert "zones" not in b
    assert not {"priority", "evictionPolicy", "billingProfile"} & set(b["properties"])


def test_security_profile_trusted_launch_without_secure_boot_where_documented() -> None:
    trusted = {
        "securityType": "TrustedLaunch",
        "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True},
    }
    assert body()["properties"]["securityProfile"] == trusted  # NCasT4_v3 + Ubuntu 22.04 Gen2
    cpu = body(instance_type="Standard_D4s_v5", image=image_for("Standard_D4s_v5", False))
    assert cpu["properties"]["securityProfile"] == trusted
    for kw in (
        {"instance_type": "Standard_ND96asr_v4"},  # not in Azure's Trusted Launch table
        {"image": image_for(T4, True, "ubuntu-hpc")},
        {"image": image_for(T4, True, "/subscriptions/s/resourceGroups/g/images/mine")},
        {"image": image_for(T4, True, "Canonical:0001-com-ubuntu-server-jammy:22_04-lts:latest")},
    ):
        assert "securityProfile" not in body(**kw)["properties"], kw


def test_computer_name_fits_64_characters() -> None:
    assert computer_name("ct-run-1-worker-0") == "ct-run-1-worker-0"
    long_a, long_b = "ct-" + "r" * 70 + "-worker-0", "ct-" + "r" * 70 + "-worker-1"
    a, b = computer_name(long_a), computer_name(long_b)
    assert len(a) <= 64 and len(b) <= 64 and a != b
    assert computer_name(long_a) == a


# -- customData ------------------------------------------------------------------------------


def test_custom_data_limit() -> None:
    assert CUSTOM_DATA_MAX == 87380  # base64 of Azure's 65535-byte limit
    largest = "x" * 65535
    assert len(custom_data(largest)) == CUSTOM_DATA_MAX
    with pytest.raises(ProviderError) as caught:
        custom_data(largest + "x")
    assert "bundle" in str(caught.value.hint)
    with pytest.raises(ProviderError, match="ct-run-1-worker-1"):
        body(startup_script=largest + "x")


# -- images ----------------------------------------------------------------------------------


def test_default_images() -> None:
    t4 = image_for(T4, True)
    assert (reference(t4), t4.driver_extension) == (JAMMY, True)
    cpu = image_for("Standard_D4s_v5", False)
    assert (reference(cpu), cpu.driver_extension) == (JAMMY, False)
    nd = image_for("Standard_ND96asr_v4", True)  # the extension's manifest does not list ND
    assert (nd.key, nd.driver_extension, nd.ships_driver) == ("ubuntu-hpc", False, True)
    assert image_for("Standard_NC40ads_H100_v5", True).key == "ubuntu-hpc"


def test_image_aliases() -> None:
    assert set(IMAGE_ALIASES) == {
        "ubuntu-22.04",
        "ubuntu-24.04",
        "ubuntu-hpc",
        "ubuntu-22.04-nvidia",
    }
    plain = image_for(T4, True, "ubuntu-22.04")
    assert (reference(plain), plain.driver_extension) == (JAMMY, False)
    assert image_for(T4, True, "ubuntu-22.04-nvidia").driver_extension
    cpu = image_for("Standard_D4s_v5", False, "ubuntu-22.04-nvidia")
    assert (reference(cpu), cpu.driver_extension) == (JAMMY, False)  # no GPU
    noble = image_for(T4, True, "ubuntu-24.04")
    assert reference(noble) == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    assert not noble.driver_extension
    hpc = image_for(T4, True, "ubuntu-hpc")
    assert reference(hpc) == {
        "publisher": "microsoft-dsvm",
        "offer": "ubuntu-hpc",
        "sku": "2204",
        "version": "latest",
    }
    assert not hpc.driver_extension


def test_explicit_images_and_unknown_names() -> None:
    urn = image_for(T4, True, "Canonical:ubuntu-24_04-lts:server:24.04.202601010")
    assert reference(urn) == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "24.04.202601010",
    }
    assert not urn.driver_extension
    image_id = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/mine"
    mine = image_for(T4, True, image_id)
    assert (reference(mine), mine.driver_extension) == ({"id": image_id}, False)
    for name in ("ubuntu", "dlvm", "a:b:c", "a:b:c:d:e", "a::c:d"):
        with pytest.raises(ProviderError) as caught:
            image_for(T4, True, name)
        assert "ubuntu-hpc" in str(caught.value.hint)


def test_aliases_are_not_shared_mutable_state() -> None:
    ref = reference(image_for(T4, True, "ubuntu-22.04"))
    ref["version"] = "changed"
    assert reference(image_for(T4, True, "ubuntu-22.04"))["version"] == "latest"


# -- network ---------------------------------------------------------------------------------


def test_nsg_tf_ports_only_from_the_vnet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    b = nsg_body(run_info(), "eastus", TAGS)
    assert b["location"] == "eastus" and b["tags"] == TAGS
    rule, deny = b["properties"]["securityRules"]
    p = rule["properties"]
    assert rule["name"] == "cloudtrain-tf"
    assert (p["priority"], p["direction"], p["access"], p["protocol"]) == (
        100,
        "Inbound",
        "Allow",
        "Tcp",
    )
    assert p["sourceAddressPrefix"] == VNET_CIDR
    assert p["destinationAddressPrefix"] == VNET_CIDR
    assert p["destinationPortRange"] == "2222-2229"
    assert (
        nsg_body(run_info(ports=(2222, 2222)), "eastus", TAGS)["properties"]["securityRules"][0][
            "properties"
        ]["destinationPortRange"]
        == "2222"
    )
    for rule in b["properties"]["securityRules"]:
        assert rule["properties"]["sourceAddressPrefix"] not in ("*", "Internet", "0.0.0.0/0")
    d = deny["properties"]  # every other port between the nodes (AllowVnetInBound would pass)
    assert (deny["name"], d["access"], d["sourceAddressPrefix"], d["destinationPortRange"]) == (
        "cloudtrain-deny-vnet",
        "Deny",
        "VirtualNetwork",
        "*",
    )
    assert d["priority"] > p["priority"]


def test_nsg_ssh_only_from_the_callers_cidr(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderError, match="CLOUDTRAIN_SSH_CIDR"):
        nsg_body(run_info(ssh=True), "eastus", TAGS)
    with pytest.raises(ProviderError, match="whole internet"):
        nsg_body(run_info(ssh=True), "eastus", TAGS, "0.0.0.0/0")
    rules = nsg_body(run_info(ssh=True), "eastus", TAGS, "203.0.113.7")["properties"][
        "securityRules"
    ]
    assert [r["name"] for r in rules] == ["cloudtrain-tf", "cloudtrain-ssh", "cloudtrain-deny-vnet"]
    ssh = rules[1]["properties"]
    assert ssh["sourceAddressPrefix"] == "203.0.113.7/32"
    assert (ssh["destinationPortRange"], ssh["protocol"], ssh["priority"]) == ("22", "Tcp", 110)
    assert rules[0]["properties"]["sourceAddressPrefix"] == VNET_CIDR


def test_nsg_refuses_bad_port_ranges() -> None:
    for ports in ((0, 10), (3000, 2000), (2000, 70000)):
        with pytest.raises(ProviderError, match="port range"):
            nsg_body(run_info(ports=ports), "eastus", TAGS)


def test_vnet_public_ip_and_nic() -> None:
    vnet = vnet_body("eastus", "/nsg-id", TAGS)
    assert vnet["properties"]["addressSpace"] == {"addressPrefixes": [VNET_CIDR]}
    [subnet] = vnet["properties"]["subnets"]
    assert subnet["name"] == "nodes"
    assert subnet["properties"]["addressPrefix"] == SUBNET_CIDR
    assert subnet["properties"]["networkSecurityGroup"] == {"id": "/nsg-id"}
    assert subnet["properties"]["defaultOutboundAccess"] is True
    pip = public_ip_body("eastus", "3", TAGS)
    assert pip["sku"]["name"] == "Standard" and pip["zones"] == ["3"]
    assert pip["properties"]["publicIPAllocationMethod"] == "Static"
    assert "zones" not in public_ip_body("eastus", None, TAGS)
    nic = nic_body("eastus", "/subnet-id", "/pip-id", TAGS)["properties"]
    assert nic["enableAcceleratedNetworking"] is False
    [config] = nic["ipConfigurations"]
    assert config["name"] == "ipconfig1"
    assert config["properties"]["subnet"] == {"id": "/subnet-id"}
    assert config["properties"]["privateIPAllocationMethod"] == "Dynamic"
    assert config["properties"]["publicIPAddress"]["id"] == "/pip-id"
    plain = nic_body("eastus", "/subnet-id", None, TAGS)["properties"]["ipConfigurations"][0]
    assert "publicIPAddress" not in plain["properties"]


# -- identity, storage, extension, key -------------------------------------------------------


def test_role_assignments() -> None:
    b = role_assignment_body("sub-1", STORAGE_BLOB_DATA_CONTRIBUTOR, "principal-1")["properties"]
    assert b["roleDefinitionId"] == (
        "/subscriptions/sub-1/providers/Microsoft.Authorization/roleDefinitions/"
        "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
    )
    assert (b["principalId"], b["principalType"]) == ("principal-1", "ServicePrincipal")
    assert "Storage Blob Data Contributor" in b["description"]
    name = role_assignment_name("/scope", STORAGE_BLOB_DATA_CONTRIBUTOR, "principal-1")
    assert str(uuid.UUID(name)) == name
    assert name == role_assignment_name("/SCOPE", STORAGE_BLOB_DATA_CONTRIBUTOR, "Principal-1")
    assert name != role_assignment_name("/scope", STORAGE_BLOB_DATA_CONTRIBUTOR, "principal-2")
    assert role_assignment_name("a/b", "c") != role_assignment_name("a", "b/c")


def test_container_scope_and_storage_account() -> None:
    assert container_scope("s", "g", "acct", "runs") == (
        "/subscriptions/s/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/acct/"
        "blobServices/default/containers/runs"
    )
    b = storage_account_body("eastus", TAGS)
    assert (b["kind"], b["sku"]) == ("StorageV2", {"name": "Standard_LRS"})
    assert b["properties"] == {
        "supportsHttpsTrafficOnly": True,
        "allowBlobPublicAccess": False,
        "minimumTlsVersion": "TLS1_2",
        "allowSharedKeyAccess": True,
    }


def test_driver_extension_body() -> None:
    p = driver_extension_body("eastus", TAGS)["properties"]
    assert (p["publisher"], p["type"], p["typeHandlerVersion"]) == (
        "Microsoft.HpcCompute",
        "NvidiaGpuDriverLinux",
        "1.6",
    )
    assert p["autoUpgradeMinorVersion"] is True and p["settings"] == {}


def test_throwaway_ssh_key_is_an_openssh_rsa_key() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    key = throwaway_ssh_key()
    assert key.startswith("ssh-rsa ")
    parsed = load_ssh_public_key(key.encode())
    assert isinstance(parsed, rsa.RSAPublicKey) and parsed.key_size == 3072
    assert throwaway_ssh_key() == key  # one per process


# -- through the real SDK clients, against the ARM fake ----------------------------------------


def _installed(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(
    not _installed("azure.mgmt.compute", "azure.mgmt.network", "trustme"),
    reason="needs the azure-mgmt SDKs and trustme",
)
@pytest.mark.usefixtures("loopback_only")
def test_the_arm_fake_accepts_the_bodies(
    arm_fake: ArmFake, az: ArmClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    tags = {"cloudtrain-run": "run-1"}
    az.group(RG, **tags)
    net = az.network
    nsg = net.network_security_groups.begin_create_or_update(
        RG, "ct-run-1-nsg", nsg_body(run_info(ssh=True), LOCATION, tags, "203.0.113.7/32")
    ).result()
    assert [r.name for r in nsg.security_rules] == [
        "cloudtrain-tf",
        "cloudtrain-ssh",
        "cloudtrain-deny-vnet",
    ]
    vnet = net.virtual_networks.begin_create_or_update(
        RG, "ct-run-1-vnet", vnet_body(LOCATION, nsg.id, tags)
    ).result()
    subnet = vnet.subnets[0]
    assert subnet.network_security_group.id == nsg.id
    pip = net.public_ip_addresses.begin_create_or_update(
        RG, "ct-run-1-worker-0-ip", public_ip_body(LOCATION, "1", tags)
    ).result()
    nic = net.network_interfaces.begin_create_or_update(
        RG, "ct-run-1-worker-0-nic", nic_body(LOCATION, subnet.id, pip.id, tags)
    ).result()
    assert nic.ip_configurations[0].private_ip_address.startswith("10.0.0.")

    req = request(index=0, spot=True)
    image = image_for(req.instance_type, True, req.image)
    vm_create = vm_body(req, LOCATION, "1", nic.id, throwaway_ssh_key(), image, tags)
    vm = az.compute.virtual_machines.begin_create_or_update(RG, req.name, vm_create).result()
    assert vm.provisioning_state == "Succeeded"
    assert vm.identity.type == "SystemAssigned"
    principal = vm.identity.principal_id
    assert str(uuid.UUID(principal)) == principal
    assert vm.tags["cloudtrain-role"] == "worker" and vm.priority == "Spot"
    stored = arm_fake.resources("virtualMachines")[0]
    assert base64.b64decode(stored["properties"]["osProfile"]["customData"]).decode() == SCRIPT

    assert image.driver_extension
    ext = az.compute.virtual_machine_extensions.begin_create_or_update(
        RG, req.name, DRIVER_EXTENSION, driver_extension_body(LOCATION, tags)
    ).result()
    assert ext.provisioning_state == "Succeeded"  # Secure Boot is off, the size is N-series

    account = az.storage.storage_accounts.begin_create(
        RG, "ctrun1store", storage_account_body(LOCATION, tags)
    ).result()
    assert account.provisioning_state == "Succeeded"
    scope = container_scope(SUB, RG, "ctrun1store", "runs")
    name = role_assignment_name(scope, STORAGE_BLOB_DATA_CONTRIBUTOR, principal)
    assignment = az.auth.role_assignments.create(
        scope, name, role_assignment_body(SUB, STORAGE_BLOB_DATA_CONTRIBUTOR, principal)
    )
    assert assignment.name == name and assignment.principal_id == principal
