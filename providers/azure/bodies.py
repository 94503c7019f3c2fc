"""Azure Resource Manager request bodies for cloudtrain, as pure functions.

Every body is a plain dict in ARM's camelCase REST JSON shape (the azure-mgmt clients accept
dicts): the run's network security group (the TensorFlow port range from inside the virtual
network only, SSH from the caller's CIDR when asked), its virtual network with one subnet, a
node's public IP and NIC, and `vm_body()`, a node's whole VM create body: size, image (chosen by
`images.image_for`), OS disk, cloud-init `customData`, a throwaway SSH key (password login is
off), Spot, boot diagnostics, the VM's system-assigned identity and the run's tags. Then the
NVIDIA driver extension, the storage account, and role assignments for the VMs' identities.
"""

from __future__ import annotations

import base64
import functools
import re
import uuid
from collections.abc import Mapping
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.access import check_port_range, ssh_cidr
from cloudtrain.providers.azure.images import UBUNTU_2204, UBUNTU_2404, reference
from cloudtrain.providers.base import NodeRequest, RunInfo, run_labels
from cloudtrain.providers.images import ImageInfo

VNET_CIDR = "10.0.0.0/16"
SUBNET_CIDR = "10.0.0.0/24"
SUBNET_NAME = "nodes"
ADMIN_USER = "cloudtrain"
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"  # built-in role ids
VIRTUAL_MACHINE_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
CONDITION_VERSION = "2.0"  # of a role assignment's ABAC condition
ROLE_NAMES = {
    STORAGE_BLOB_DATA_CONTRIBUTOR: "Storage Blob Data Contributor",
    VIRTUAL_MACHINE_CONTRIBUTOR: "Virtual Machine Contributor",
}
# Azure decodes customData to at most 65535 bytes; as base64 that is 87380 characters, the limit
# its error names ("... with a maximum length of 87380 characters").
CUSTOM_DATA_MAX = 87380
DRIVER_EXTENSION = "NvidiaGpuDriverLinux"
DRIVER_PUBLISHER = "Microsoft.HpcCompute"
DRIVER_VERSION = "1.6"
OS_DISK_TYPE = "StandardSSD_LRS"
COMPUTER_NAME_MAX = 64  # Linux computerName
SSH_KEY_BITS = 3072
TF_RULE, TF_PRIORITY = "cloudtrain-tf", 100
SSH_RULE, SSH_PRIORITY = "cloudtrain-ssh", 110
DENY_RULE, DENY_PRIORITY = "cloudtrain-deny-vnet", 4000

# Trusted Launch with Secure Boot off (the NVIDIA driver extension refuses Secure Boot) and a
# vTPM, only where Azure documents it: Gen2 images below, on the size families its Trusted Launch
# table lists (NCasT4_v3, NCv3, NC A100 v4, Dsv5; ND A100 v4 is listed as unsupported). Any other
# image or size gets no securityProfile, i.e. securityType Standard, which every size accepts.
_TRUSTED_LAUNCH_IMAGES = frozenset(
    (r["publisher"].lower(), r["offer"].lower(), r["sku"].lower())
    for r in (reference(UBUNTU_2204), reference(UBUNTU_2404))
)
_TRUSTED_LAUNCH_SIZE = re.compile(
    r"^standard_(nc\d+as_t4_v3|nc\d+s_v3|nc\d+ads_a100_v4|d\d+s_v5)$", re.IGNORECASE
)


def custom_data(script: str) -> str:
    """The VM's `customData`: the script, base64-encoded (cloud-init on Azure decodes it; no
    gzip). Raises ProviderError when it is over Azure's limit. Pure."""
    encoded = base64.b64encode(script.encode()).decode()
    if len(encoded) > CUSTOM_DATA_MAX:
        raise ProviderError(
            f"the startup script is {len(script.encode())} bytes, over Azure's customData limit "
            "of 65535 bytes",
            hint="keep job env values short; large files belong in the bundle",
        )
    return encoded


def _rule(name: str, priority: int, source: str, ports: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "properties": {
            "description": what,
            "priority": priority,
            "direction": "Inbound",
            "access": "Allow",
            "protocol": "Tcp",
            "sourceAddressPrefix": source,
            "sourcePortRange": "*",
            "destinationAddressPrefix": VNET_CIDR,
            "destinationPortRange": ports,
        },
    }


def nsg_body(
    run: RunInfo, location: str, tags: dict[str, str], cidr: str | None = None
) -> dict[str, Any]:
    """The run's network security group: TCP on the run's port range from inside the virtual
    network, and SSH from `cidr` (the `ssh_cidr` option; None: the deprecated
    $CLOUDTRAIN_SSH_CIDR) when the run asks for it; any other port between the nodes is
    denied, and the internet meets Azure's own DenyAllInBound. Raises ProviderError for a bad
    port range or SSH CIDR. Pure apart from reading $CLOUDTRAIN_SSH_CIDR."""
    low, high = run.port_range
    check_port_range(low, high, run.run_id)
    ports = str(low) if low == high else f"{low}-{high}"
    rules = [_rule(TF_RULE, TF_PRIORITY, VNET_CIDR, ports, "TensorFlow between the run's nodes")]
    if run.ssh:
        rules.append(_rule(SSH_RULE, SSH_PRIORITY, ssh_cidr(cidr), "22", "SSH from the caller"))
    # Azure's own AllowVnetInBound (65000) would open every port between the nodes: the run's
    # ports are all they need, so everything else from inside the network is denied here.
    deny = _rule(DENY_RULE, DENY_PRIORITY, "VirtualNetwork", "*", "nothing else between nodes")
    deny["properties"].update(access="Deny", protocol="*")
    rules.append(deny)
    return {"location": location, "tags": dict(tags), "properties": {"securityRules": rules}}


def vnet_body(location: str, nsg_id: str, tags: Mapping[str, str]) -> dict[str, Any]:
    """The run's virtual network: VNET_CIDR with one subnet `nodes` (SUBNET_CIDR) behind the
    NSG. The subnet keeps default outbound access: from network API 2025-07-01 new subnets are
    private by default, and a node without a public IP could then reach neither the package
    mirrors, the driver extension's downloads nor Blob Storage. Pure."""
    subnet = {
        "name": SUBNET_NAME,
        "properties": {
            "addressPrefix": SUBNET_CIDR,
            "networkSecurityGroup": {"id": nsg_id},
            "defaultOutboundAccess": True,
        },
    }
    return {
        "location": location,
        "tags": dict(tags),
        "properties": {"addressSpace": {"addressPrefixes": [VNET_CIDR]}, "subnets": [subnet]},
    }


def public_ip_body(location: str, zone: str | None, tags: Mapping[str, str]) -> dict[str, Any]:
    """A node's public IP (only when the run asks for SSH): Standard SKU, which must be Static,
    in the node's zone when it has one. Pure."""
    body: dict[str, Any] = {
        "location": location,
        "tags": dict(tags),
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"},
    }
    if zone:
        body["zones"] = [zone]
    return body


def nic_body(
    location: str, subnet_id: str, public_ip_id: str | None, tags: Mapping[str, str]
) -> dict[str, Any]:
    """A node's NIC: one IP configuration `ipconfig1` with a dynamic private address in the
    subnet and the public IP when given (deleted with the NIC); accelerated networking off (not
    every size has it). Pure."""
    config: dict[str, Any] = {
        "subnet": {"id": subnet_id},
        "privateIPAllocationMethod": "Dynamic",
        "primary": True,
    }
    if public_ip_id:
        config["publicIPAddress"] = {"id": public_ip_id, "properties": {"deleteOption": "Delete"}}
    return {
        "location": location,
        "tags": dict(tags),
        "properties": {
            "enableAcceleratedNetworking": False,
            "ipConfigurations": [{"name": "ipconfig1", "properties": config}],
        },
    }


def computer_name(name: str) -> str:
    """The VM's Linux host name: the node name, or when over 64 characters a prefix of it and a
    hash (two nodes never share one). Pure."""
    if len(name) <= COMPUTER_NAME_MAX:
        return name
    digest = uuid.uuid5(uuid.NAMESPACE_DNS, name).hex[:8]
    return f"{name[: COMPUTER_NAME_MAX - 9].rstrip('-.')}-{digest}"


def security_profile(vm_size: str, image: ImageInfo) -> dict[str, Any] | None:
    """Trusted Launch with Secure Boot off and a vTPM where Azure documents it for the size and
    the image (see _TRUSTED_LAUNCH_SIZE), else None (securityType Standard). Pure."""
    ref = reference(image)
    key = tuple(str(ref.get(k, "")).lower() for k in ("publisher", "offer", "sku"))
    if key not in _TRUSTED_LAUNCH_IMAGES or not _TRUSTED_LAUNCH_SIZE.match(vm_size):
        return None
    return {
        "securityType": "TrustedLaunch",
        "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True},
    }


def vm_body(
    request: NodeRequest,
    location: str,
    zone: str | None,
    nic_id: str,
    ssh_public_key: str,
    image: ImageInfo,
    tags: dict[str, str],
) -> dict[str, Any]:
    """The VM create body of one node (see the module docstring). Raises ProviderError when the
    startup script is over Azure's customData limit. Pure."""
    try:
        data = custom_data(request.startup_script)
    except ProviderError as exc:
        raise ProviderError(f"{request.name}: {exc.message}", hint=exc.hint) from None
    props: dict[str, Any] = {
        "hardwareProfile": {"vmSize": request.instance_type},
        "storageProfile": {
            "imageReference": reference(image),
            "osDisk": {
                "createOption": "FromImage",
                "deleteOption": "Delete",
                "diskSizeGB": request.disk_gb,
                "managedDisk": {"storageAccountType": OS_DISK_TYPE},
            },
        },
        "osProfile": {
            "computerName": computer_name(request.name),
            "adminUsername": ADMIN_USER,
            "customData": data,
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "ssh": {
                    "publicKeys": [
                        {
                            "path": f"/home/{ADMIN_USER}/.ssh/authorized_keys",
                            "keyData": ssh_public_key,
                        }
                    ]
                },
            },
        },
        "networkProfile": {
            "networkInterfaces": [
                {"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}
            ]
        },
        # managed boot diagnostics storage (no storageUri): the serial log for console_output()
        "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
    }
    if request.spot:
        props["priority"] = "Spot"
        props["evictionPolicy"] = "Delete"
        props["billingProfile"] = {"maxPrice": -1}  # evicted for capacity only, never for price
    security = security_profile(request.instance_type, image)
    if security:
        props["securityProfile"] = security
    body: dict[str, Any] = {
        "location": location,
        "tags": {**tags, **run_labels(request.run_id, request.role, request.index)},
        "identity": {"type": "SystemAssigned"},
        "properties": props,
    }
    if zone:
        body["zones"] = [zone]
    return body


def driver_extension_body(location: str, tags: Mapping[str, str]) -> dict[str, Any]:
    """The NvidiaGpuDriverLinux VM extension (installs the CUDA driver on N-series sizes; may
    reboot the VM; needs outbound internet and no Secure Boot). Pure."""
    return {
        "location": location,
        "tags": dict(tags),
        "properties": {
            "publisher": DRIVER_PUBLISHER,
            "type": DRIVER_EXTENSION,
            "typeHandlerVersion": DRIVER_VERSION,
            "autoUpgradeMinorVersion": True,
            "settings": {},
        },
    }


def role_definition_id(subscription: str, role_guid: str) -> str:
    """The id of built-in role `role_guid` in the subscription. Pure."""
    return (
        f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/"
        f"{role_guid}"
    )


def role_assignment_body(
    subscription: str, role_guid: str, principal_id: str, condition: str | None = None
) -> dict[str, Any]:
    """A role assignment of `role_guid` to a VM's identity (a service principal; saying so lets
    Azure assign to an identity its directory has not replicated yet), narrowed by the ABAC
    `condition` when given (conditionVersion 2.0, the only one ARM accepts). Pure."""
    role = ROLE_NAMES.get(role_guid, f"role {role_guid}")
    props: dict[str, Any] = {
        "roleDefinitionId": role_definition_id(subscription, role_guid),
        "principalId": principal_id,
        "principalType": "ServicePrincipal",
        "description": f"cloudtrain: {role} for a run's node identity",
    }
    if condition is not None:
        props["condition"] = condition
        props["conditionVersion"] = CONDITION_VERSION
    return {"properties": props}


_ROLE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "cloudtrain:role-assignment")


def role_assignment_name(*parts: str) -> str:
    """A deterministic GUID (role assignment names must be GUIDs) from e.g. the scope, role and
    principal, so creating an assignment twice makes one. Case-insensitive, as Azure's ids
    are. Pure."""
    return str(uuid.uuid5(_ROLE_NAMESPACE, "\n".join(p.lower() for p in parts)))


def container_scope(subscription: str, group: str, account: str, container: str) -> str:
    """The resource id of a blob container: the scope of a role assignment on it. Pure."""
    return (
        f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Storage/"
        f"storageAccounts/{account}/blobServices/default/containers/{container}"
    )


def storage_account_body(location: str, tags: Mapping[str, str]) -> dict[str, Any]:
    """The run's storage account: StorageV2, locally redundant, HTTPS and TLS 1.2 only, no
    anonymous blob access. Pure."""
    return {
        "location": location,
        "tags": dict(tags),
        "sku": {"name": "Standard_LRS"},
        "kind": "StorageV2",
        "properties": {
            "supportsHttpsTrafficOnly": True,
            "allowBlobPublicAccess": False,
            "minimumTlsVersion": "TLS1_2",
            # presigned URLs are SAS signed with the account key, which needs shared keys;
            # user-delegation SAS (signed via Azure AD) would allow False here
            "allowSharedKeyAccess": True,
        },
    }


@functools.cache
def throwaway_ssh_key() -> str:
    """An OpenSSH RSA public key whose private key is discarded at once: Azure needs a key when
    password login is off, and with this one nobody can log in. One per process."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=SSH_KEY_BITS)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return public.decode() + " cloudtrain-throwaway"
