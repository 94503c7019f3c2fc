"""Helpers for tests that drive the ARM fake through the real azure-mgmt clients.

`ArmClients(fake, **options)` builds the resource, network, compute, authorization and storage
management clients for subscription `SUB` the way an adapter would, pointed at the fake, with
`polling_interval=0` so LROs poll at once (`retry_total=0` in `options` makes failing calls
fast). `vm_body()` is a VM create body shaped like a cloudtrain adapter's (NC T4 size, Ubuntu
22.04 from Canonical, base64 cloud-init customData, Spot with evictionPolicy Delete,
SystemAssigned identity, boot diagnostics, tags `cloudtrain-run`/`role`/`index`, NIC and disk
deleted with the VM). `build_network()` creates a group, an NSG allowing SSH, a vnet with one
subnet, and per name a Standard public IP and a NIC, answering the NIC ids.

`create_vm()` creates a VM from `vm_body()` in group `RG` and waits for it; `error_of()` answers
the HttpResponseError a call raises.

Fixtures (import them into a test module beside `arm_fake`): `az` (ArmClients on the module's
`arm_fake`), `az0` (the same with `retry_total=0`), `nics` (`build_network()` in `RG` with NICs
nic-0, nic-1, nic-2) and `loopback_only` (fails any name lookup other than loopback, so a test
cannot reach Azure; use it with autouse or usefixtures).
"""

from __future__ import annotations

import base64
import socket
from typing import Any

import pytest

from tests.fakes.arm_fake import ArmFake

SUB = "8f0c9a1e-2b3d-4c5e-9f60-7a8b9c0d1e2f"
RG = "ct-run-1"
LOCATION = "eastus"
GPU_SIZE = "Standard_NC4as_T4_v3"
UBUNTU_2204 = {
    "publisher": "Canonical",
    "offer": "0001-com-ubuntu-server-jammy",
    "sku": "22_04-lts-gen2",
    "version": "latest",
}
CLOUD_INIT = "#cloud-config\nruncmd:\n  - [sh, -c, 'echo cloudtrain agent starting']\n"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly cloudtrain@test"
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"


class ArmClients:
    """The azure-mgmt clients of one subscription, pointed at an ARM fake."""

    def __init__(self, fake: ArmFake, subscription: str = SUB, **options: Any) -> None:
        from azure.mgmt.authorization import AuthorizationManagementClient
        from azure.mgmt.compute import ComputeManagementClient
        from azure.mgmt.network import NetworkManagementClient
        from azure.mgmt.resource.resources import ResourceManagementClient
        from azure.mgmt.storage import StorageManagementClient

        kwargs = {**fake.client_kwargs(), "polling_interval": 0, **options}
        cred = fake.credential()
        self.fake = fake
        self.sub = subscription
        self.resource = ResourceManagementClient(cred, subscription, **kwargs)
        self.network = NetworkManagementClient(cred, subscription, **kwargs)
        self.compute = ComputeManagementClient(cred, subscription, **kwargs)
        self.auth = AuthorizationManagementClient(cred, subscription, **kwargs)
        self.storage = StorageManagementClient(cred, subscription, **kwargs)

    def group(self, name: str, location: str = LOCATION, **tags: str) -> Any:
        """Create (or update) resource group `name` with `tags`."""
        return self.resource.resource_groups.create_or_update(
            name, {"location": location, "tags": tags}
        )

    def role_definition(self, guid: str = STORAGE_BLOB_DATA_CONTRIBUTOR) -> str:
        """The id of built-in role `guid` in this subscription."""
        return f"/subscriptions/{self.sub}/providers/Microsoft.Authorization/roleDefinitions/{guid}"


def vm_body(
    nic_id: str,
    run: str = "run-1",
    role: str = "worker",
    index: int = 0,
    zone: str | None = "1",
    **props: Any,
) -> dict[str, Any]:
    """A VM create body like a cloudtrain adapter's; `props` override `properties` keys."""
    body: dict[str, Any] = {
        "location": LOCATION,
        "tags": {"cloudtrain-run": run, "role": role, "index": str(index)},
        "identity": {"type": "SystemAssigned"},
        "properties": {
            "hardwareProfile": {"vmSize": GPU_SIZE},
            "storageProfile": {
                "imageReference": dict(UBUNTU_2204),
                "osDisk": {
                    "createOption": "FromImage",
                    "deleteOption": "Delete",
                    "diskSizeGB": 128,
                    "managedDisk": {"storageAccountType": "StandardSSD_LRS"},
                },
            },
            "osProfile": {
                "computerName": f"{role}-{index}",
                "adminUsername": "cloudtrain",
                "customData": base64.b64encode(CLOUD_INIT.encode()).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [
                            {"path": "/home/cloudtrain/.ssh/authorized_keys", "keyData": SSH_KEY}
                        ]
                    },
                },
            },
            "networkProfile": {
                "networkInterfaces": [
                    {"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}
                ]
            },
            "priority": "Spot",
            "evictionPolicy": "Delete",
            "billingProfile": {"maxPrice": -1},
            "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
            "securityProfile": {
                "securityType": "TrustedLaunch",
                "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True},
            },
            **props,
        },
    }
    if zone is not None:
        body["zones"] = [zone]
    return body


def build_network(
    clients: ArmClients, group: str, nics: tuple[str, ...] = ("nic-0",), **tags: str
) -> list[str]:
    """Create `group`, an NSG, a vnet `vnet` with subnet `default` (10.0.0.0/24), and for each
    NIC name a public IP `{name}-ip` and the NIC; the NIC ids in order."""
    clients.group(group, **tags)
    net = clients.network
    nsg = net.network_security_groups.begin_create_or_update(
        group,
        "nsg",
        {
            "location": LOCATION,
            "properties": {
                "securityRules": [
                    {
                        "name": "ssh",
                        "properties": {
                            "priority": 1000,
                            "direction": "Inbound",
                            "access": "Allow",
                            "protocol": "Tcp",
                            "sourceAddressPrefix": "*",
                            "sourcePortRange": "*",
                            "destinationAddressPrefix": "*",
                            "destinationPortRange": "22",
                        },
                    }
                ]
            },
        },
    ).result()
    vnet = net.virtual_networks.begin_create_or_update(
        group,
        "vnet",
        {
            "location": LOCATION,
            "properties": {
                "addressSpace": {"addressPrefixes": ["10.0.0.0/16"]},
                "subnets": [{"name": "default", "properties": {"addressPrefix": "10.0.0.0/24"}}],
            },
        },
    ).result()
    ids = []
    for name in nics:
        pip = net.public_ip_addresses.begin_create_or_update(
            group,
            f"{name}-ip",
            {
                "location": LOCATION,
                "sku": {"name": "Standard"},
                "properties": {"publicIPAllocationMethod": "Static"},
            },
        ).result()
        config = {
            "subnet": {"id": vnet.subnets[0].id},
            "publicIPAddress": {"id": pip.id, "properties": {"deleteOption": "Delete"}},
        }
        nic = net.network_interfaces.begin_create_or_update(
            group,
            name,
            {
                "location": LOCATION,
                "properties": {
                    "ipConfigurations": [{"name": "ipconfig1", "properties": config}],
                    "networkSecurityGroup": {"id": nsg.id},
                },
            },
        ).result()
        ids.append(nic.id)
    return ids


@pytest.fixture
def az(arm_fake: ArmFake) -> ArmClients:
    """The azure-mgmt clients, pointed at this test's ARM fake."""
    return ArmClients(arm_fake)


@pytest.fixture
def az0(arm_fake: ArmFake) -> ArmClients:
    """Clients that never retry, for calls meant to fail."""
    return ArmClients(arm_fake, retry_total=0)


@pytest.fixture
def nics(az: ArmClients) -> list[str]:
    """A network in group `RG` with three NICs (nic-0..2, each with a public IP); their ids."""
    return build_network(az, RG, nics=("nic-0", "nic-1", "nic-2"))


def create_vm(az: ArmClients, name: str, nic: str, **kw: Any) -> Any:
    """Create VM `name` in `RG` from `vm_body(nic, **kw)` and wait for it."""
    return az.compute.virtual_machines.begin_create_or_update(RG, name, vm_body(nic, **kw)).result()


def error_of(call: Any) -> Any:
    """The azure.core HttpResponseError that `call()` raises (fails the test if none)."""
    from azure.core.exceptions import HttpResponseError

    with pytest.raises(HttpResponseError) as caught:
        call()
    return caught.value


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any name lookup other than loopback, so nothing can reach Azure."""
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", "localhost", b"127.0.0.1"):
            raise AssertionError(f"test tried to reach {host!r}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
