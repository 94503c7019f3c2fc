"""Bodies of the ARM fake's virtual machines: the checks Azure makes and the fields it adds.

`check_vm()` refuses with 400 InvalidParameter (`target` naming the field) a VM without
`properties.hardwareProfile.vmSize`, without `properties.networkProfile.networkInterfaces`,
without `storageProfile.imageReference` (an `id`, or `publisher`/`offer`/`sku`), without
`osProfile.adminUsername` or a password or SSH key, with `customData` that is not base64 or longer
than 87380 characters, with an `evictionPolicy` but no Spot priority, an unknown priority or
eviction policy, or other than one zone in `zones`. `immutable_change()` names a property that
may not change on an existing VM (409 PropertyChangeNotAllowed). `complete_vm()` adds what Azure
answers: `vmId`, `timeCreated`, OS disk defaults (named `{vm}_OsDisk_1_{hex}`, deleteOption
Detach, a managed disk id with the resource group UPPER-CASED as Compute writes it),
`imageReference.exactVersion`, `osProfile` defaults, Spot defaults (evictionPolicy Deallocate,
maxPrice -1). `instance_view()` builds the `instanceView` GET answers with `$expand`.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

from tests.fakes.arm_errors import ArmApiError, invalid_parameter
from tests.fakes.arm_ids import now

MAX_CUSTOM_DATA = 87380
POWER_DISPLAY = {
    "running": "VM running",
    "starting": "VM starting",
    "stopping": "VM stopping",
    "stopped": "VM stopped",
    "deallocating": "VM deallocating",
    "deallocated": "VM deallocated",
    "restarting": "VM restarting",
}


def _required(value: Any, what: str, target: str) -> None:
    if not value:
        raise invalid_parameter(f"Required parameter '{what}' is missing (null).", target)


def check_vm(body: dict[str, Any], props: dict[str, Any]) -> None:
    """400 InvalidParameter for what Azure refuses in a VM PUT (see the module docstring)."""
    _required(
        (props.get("hardwareProfile") or {}).get("vmSize"), "hardwareProfile.vmSize", "vmSize"
    )
    nics = (props.get("networkProfile") or {}).get("networkInterfaces")
    _required(nics, "networkProfile", "networkProfile")
    if not all(isinstance(n, dict) and n.get("id") for n in nics):
        raise invalid_parameter(
            "Every network interface reference needs an id.", "networkInterfaces"
        )
    image = (props.get("storageProfile") or {}).get("imageReference") or {}
    if not image.get("id") and not all(image.get(k) for k in ("publisher", "offer", "sku")):
        raise invalid_parameter(
            "The value of parameter imageReference is invalid: it needs an id, or a publisher, "
            "an offer and a sku.",
            "imageReference",
        )
    os_profile = props.get("osProfile") or {}
    _required(os_profile.get("adminUsername"), "osProfile.adminUsername", "adminUsername")
    keys = (((os_profile.get("linuxConfiguration") or {}).get("ssh") or {}).get("publicKeys")) or []
    if not os_profile.get("adminPassword") and not keys:
        raise invalid_parameter(
            "Authentication using either SSH or by user name and password must be enabled in "
            "Linux profile.",
            "linuxConfiguration",
        )
    custom = os_profile.get("customData")
    if custom is not None:
        try:
            base64.b64decode(str(custom), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise invalid_parameter(
                "Custom data in OSProfile must be in Base64 encoding and with a maximum length "
                f"of {MAX_CUSTOM_DATA} characters.",
                "customData",
            ) from exc
        if len(str(custom)) > MAX_CUSTOM_DATA:
            raise invalid_parameter(
                f"Custom data in OSProfile must be in Base64 encoding and with a maximum length "
                f"of {MAX_CUSTOM_DATA} characters.",
                "customData",
            )
    priority = props.get("priority") or "Regular"
    if priority not in ("Regular", "Low", "Spot"):
        raise invalid_parameter(
            f"The value {priority} of parameter priority is invalid.", "priority"
        )
    eviction = props.get("evictionPolicy")
    if eviction is not None and (priority == "Regular" or eviction not in ("Deallocate", "Delete")):
        raise invalid_parameter(
            f"Eviction policy {eviction} can be set only on Spot/Low priority virtual machines, "
            "to Deallocate or Delete.",
            "evictionPolicy",
        )
    zones = body.get("zones")
    if zones is not None and (len(zones) != 1 or str(zones[0]) not in ("1", "2", "3")):
        raise invalid_parameter(f"The zones {zones} are invalid: give one of 1, 2, 3.", "zones")


def immutable_change(old: dict[str, Any], body: dict[str, Any], props: dict[str, Any]) -> str:
    """The name of a property `body` would change that Azure keeps fixed, or ''."""
    old_props = old["properties"]
    pairs = (
        ("zones", old.get("zones"), body.get("zones")),
        ("priority", old_props.get("priority"), props.get("priority") or "Regular"),
        (
            "customData",
            (old_props.get("osProfile") or {}).get("customData"),
            (props.get("osProfile") or {}).get("customData"),
        ),
        (
            "adminUsername",
            (old_props.get("osProfile") or {}).get("adminUsername"),
            (props.get("osProfile") or {}).get("adminUsername"),
        ),
    )
    for name, before, after in pairs:
        if after is not None and before != after:
            return name
    return ""


def complete_vm(
    sub: str, rg: str, name: str, props: dict[str, Any], old: dict[str, Any] | None
) -> dict[str, Any]:
    """The stored properties of VM `name` (see the module docstring)."""
    old_props = (old or {}).get("properties") or {}
    storage = props.setdefault("storageProfile", {})
    image = storage["imageReference"]
    if str(image.get("version", "latest")).lower() == "latest" and not image.get("id"):
        image["exactVersion"] = "22.04.202601150"
    disk = storage.setdefault("osDisk", {})
    old_disk = (old_props.get("storageProfile") or {}).get("osDisk") or {}
    disk_name = disk.get("name") or old_disk.get("name") or f"{name}_OsDisk_1_{uuid.uuid4().hex}"
    disk.update(name=disk_name, osType="Linux")
    disk.setdefault("createOption", "FromImage")
    disk.setdefault("caching", "ReadWrite")
    disk.setdefault("deleteOption", "Detach")
    disk.setdefault("diskSizeGB", 30)
    managed = disk.setdefault("managedDisk", {})
    managed.setdefault("storageAccountType", "Premium_LRS")
    managed["id"] = (
        f"/subscriptions/{sub}/resourceGroups/{rg.upper()}/providers/Microsoft.Compute/disks/"
        f"{disk_name}"
    )
    storage.setdefault("dataDisks", [])
    os_profile = props.setdefault("osProfile", {})
    os_profile.setdefault("computerName", name)
    os_profile.setdefault("allowExtensionOperations", True)
    os_profile.setdefault("requireGuestProvisionSignal", True)
    os_profile.setdefault("secrets", [])
    if props.get("priority") in ("Spot", "Low"):
        props.setdefault("evictionPolicy", "Deallocate")
        props.setdefault("billingProfile", {"maxPrice": -1})
    props["vmId"] = old_props.get("vmId") or str(uuid.uuid4())
    props["timeCreated"] = old_props.get("timeCreated") or now()
    return props


def identity(
    body: dict[str, Any], old: dict[str, Any] | None, tenant: str
) -> dict[str, Any] | None:
    """The identity Azure answers: a principalId and tenantId for SystemAssigned."""
    wanted = body.get("identity")
    if not wanted:
        return None
    kind = str(wanted.get("type") or "None")
    if kind == "None":
        return {"type": "None"}
    if kind not in ("SystemAssigned", "UserAssigned", "SystemAssigned, UserAssigned"):
        raise invalid_parameter(f"The identity type {kind} is invalid.", "identity.type")
    result: dict[str, Any] = {"type": kind}
    if "SystemAssigned" in kind:
        before = (old or {}).get("identity") or {}
        result["principalId"] = before.get("principalId") or str(uuid.uuid4())
        result["tenantId"] = tenant
    if "UserAssigned" in kind:
        users = wanted.get("userAssignedIdentities") or {}
        if not users:
            raise invalid_parameter("UserAssigned needs userAssignedIdentities.", "identity")
        result["userAssignedIdentities"] = {
            k: {"principalId": str(uuid.uuid4()), "clientId": str(uuid.uuid4())} for k in users
        }
    return result


def status(code: str, display: str, level: str = "Info", message: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"code": code, "level": level, "displayStatus": display}
    if message:
        entry["message"] = message
    return entry


def instance_view(body: dict[str, Any], power: str, error: dict[str, Any] | None) -> dict[str, Any]:
    """The VM's instance view for its provisioning and power state."""
    props = body["properties"]
    state = props.get("provisioningState", "Succeeded")
    statuses = []
    if state == "Failed" and error:
        statuses.append(
            status(
                f"ProvisioningState/failed/{error['code']}",
                "Provisioning failed",
                "Error",
                error["message"],
            )
        )
    else:
        statuses.append(
            status(f"ProvisioningState/{state.lower()}", f"Provisioning {state.lower()}")
        )
    if power and state != "Failed":
        statuses.append(status(f"PowerState/{power}", POWER_DISPLAY.get(power, f"VM {power}")))
    statuses[0]["time"] = now()
    image = props["storageProfile"].get("imageReference") or {}
    return {
        "computerName": props["osProfile"].get("computerName"),
        "osName": "ubuntu",
        "osVersion": "22.04" if "jammy" in str(image.get("offer", "")) else "",
        "hyperVGeneration": "V2",
        "statuses": statuses,
    }


def check_immutable(old: dict[str, Any], body: dict[str, Any], props: dict[str, Any]) -> None:
    changed = immutable_change(old, body, props)
    if changed:
        raise ArmApiError(
            409,
            "PropertyChangeNotAllowed",
            f"Changing property '{changed}' is not allowed.",
            changed,
        )
