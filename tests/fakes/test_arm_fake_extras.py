"""The ARM fake's boot diagnostics, VM extensions and storage accounts, driven only through
the real SDK clients (and urllib / azure-storage-blob for the boot diagnostics blob URLs).
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

pytest.importorskip("azure.mgmt.compute")
pytest.importorskip("trustme")

from tests.fakes.arm_fake import ArmFake, arm_fake
from tests.fakes.arm_testkit import (
    LOCATION,
    RG,
    ArmClients,
    az,
    az0,
    create_vm,
    error_of,
    loopback_only,
    nics,
)

__all__ = ["arm_fake", "az", "az0", "loopback_only", "nics"]  # fixtures used by this module
pytestmark = pytest.mark.usefixtures("loopback_only")

DRIVER = {
    "location": LOCATION,
    "properties": {
        "publisher": "Microsoft.HpcCompute",
        "type": "NvidiaGpuDriverLinux",
        "typeHandlerVersion": "1.6",
        "autoUpgradeMinorVersion": True,
        "settings": {},
    },
}


# -- boot diagnostics ---------------------------------------------------------------------------


def test_boot_diagnostics_serial_log_is_served_by_the_fake(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients, nics: list[str]
) -> None:
    create_vm(az, "worker-0", nics[0])
    arm_fake.set_serial("worker-0", "cloud-init: booting\n")
    arm_fake.append_serial("worker-0", "cloudtrain agent ready\n")
    uris = az.compute.virtual_machines.retrieve_boot_diagnostics_data(RG, "worker-0")
    assert uris.serial_console_log_blob_uri.startswith(arm_fake.url + "/")
    with urllib.request.urlopen(
        uris.serial_console_log_blob_uri, context=arm_fake.ssl_context()
    ) as answer:
        assert answer.read().decode() == "cloud-init: booting\ncloudtrain agent ready\n"
    ranged = urllib.request.Request(
        uris.serial_console_log_blob_uri, headers={"Range": "bytes=0-9"}
    )
    with urllib.request.urlopen(ranged, context=arm_fake.ssl_context()) as answer:
        assert answer.status == 206 and answer.read() == b"cloud-init"
    with urllib.request.urlopen(
        uris.console_screenshot_blob_uri, context=arm_fake.ssl_context()
    ) as answer:
        assert answer.headers["Content-Type"] == "image/bmp"
    create_vm(
        az, "worker-1", nics[1], index=1, diagnosticsProfile={"bootDiagnostics": {"enabled": False}}
    )
    error = error_of(
        lambda: az0.compute.virtual_machines.retrieve_boot_diagnostics_data(RG, "worker-1")
    )
    assert (error.status_code, error.error.code) == (409, "OperationNotAllowed")
    arm_fake.remove_vm("worker-0")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(uris.serial_console_log_blob_uri, context=arm_fake.ssl_context())
    assert caught.value.code == 404


def test_serial_log_readable_with_azure_storage_blob(
    arm_fake: ArmFake, az: ArmClients, nics: list[str]
) -> None:
    blob = pytest.importorskip("azure.storage.blob")
    create_vm(az, "worker-0", nics[0])
    arm_fake.set_serial("worker-0", "x" * 1000)
    uris = az.compute.virtual_machines.retrieve_boot_diagnostics_data(RG, "worker-0")
    client = blob.BlobClient.from_blob_url(
        uris.serial_console_log_blob_uri, connection_verify=arm_fake.ca_path
    )
    assert client.download_blob().readall() == b"x" * 1000
    arm_fake.set_serial("worker-0", "")
    assert client.download_blob().readall() == b""


# -- extensions ---------------------------------------------------------------------------------


def test_nvidia_driver_extension(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients, nics: list[str]
) -> None:
    create_vm(az, "worker-0", nics[0])
    exts = az.compute.virtual_machine_extensions
    made = exts.begin_create_or_update(RG, "worker-0", "NvidiaGpuDriverLinux", DRIVER).result()
    assert made.provisioning_state == "Succeeded" and made.type_handler_version == "1.6"
    got = exts.get(RG, "worker-0", "NvidiaGpuDriverLinux", expand="instanceView")
    assert got.instance_view.statuses[0].code == "ProvisioningState/succeeded"
    assert [e.name for e in exts.list(RG, "worker-0").value] == ["NvidiaGpuDriverLinux"]
    assert (
        az.compute.virtual_machines.get(RG, "worker-0").resources[0].name == "NvidiaGpuDriverLinux"
    )
    exts.begin_delete(RG, "worker-0", "NvidiaGpuDriverLinux").result()
    assert exts.list(RG, "worker-0").value == []
    arm_fake.fail_next_extension("worker-0", message="Enable failed with exit code 11")
    error = error_of(
        exts.begin_create_or_update(RG, "worker-0", "NvidiaGpuDriverLinux", DRIVER).result
    )
    assert (
        error.error.code == "VMExtensionProvisioningError" and "exit code 11" in error.error.message
    )
    failed = exts.get(RG, "worker-0", "NvidiaGpuDriverLinux", expand="instanceView")
    assert failed.provisioning_state == "Failed"
    az.compute.virtual_machines.begin_deallocate(RG, "worker-0").result()
    error = error_of(
        lambda: az0.compute.virtual_machine_extensions.begin_create_or_update(
            RG, "worker-0", "NvidiaGpuDriverLinux", DRIVER
        )
    )
    assert (error.status_code, error.error.code) == (409, "OperationNotAllowed")


def test_driver_extension_fails_like_azure_on_secure_boot_or_cpu_sizes(
    az: ArmClients, nics: list[str]
) -> None:
    secure = {"securityType": "TrustedLaunch", "uefiSettings": {"secureBootEnabled": True}}
    create_vm(az, "secure", nics[0], securityProfile=secure)
    create_vm(az, "cpu", nics[1], index=1, hardwareProfile={"vmSize": "Standard_D4s_v5"})
    exts = az.compute.virtual_machine_extensions
    for vm, text in (("secure", "Secure Boot"), ("cpu", "exit code 13")):
        error = error_of(exts.begin_create_or_update(RG, vm, "NvidiaGpuDriverLinux", DRIVER).result)
        assert error.error.code == "VMExtensionProvisioningError" and text in error.error.message


# -- storage (bonus) ----------------------------------------------------------------------------


def test_storage_account_and_container(arm_fake: ArmFake, az: ArmClients, az0: ArmClients) -> None:
    az.group(RG)
    body = {"location": LOCATION, "sku": {"name": "Standard_LRS"}, "kind": "StorageV2"}
    account = az.storage.storage_accounts.begin_create(RG, "ctstore1", body).result()
    assert account.provisioning_state == "Succeeded"
    assert account.primary_endpoints.blob == "https://ctstore1.blob.core.windows.net/"
    assert any(
        "/Microsoft.Storage/locations/eastus/asyncoperations/" in r for r in arm_fake.requests
    )
    container = az.storage.blob_containers.create(RG, "ctstore1", "runs", {})
    assert container.name == "runs"
    assert az.storage.blob_containers.get(RG, "ctstore1", "runs").public_access == "None"
    assert [a.name for a in az.storage.storage_accounts.list_by_resource_group(RG)] == ["ctstore1"]
    az.group("elsewhere")
    error = error_of(
        lambda: az0.storage.storage_accounts.begin_create("elsewhere", "ctstore1", body)
    )
    assert (error.status_code, error.error.code) == (409, "StorageAccountAlreadyTaken")
    error = error_of(lambda: az0.storage.storage_accounts.begin_create(RG, "Bad_Name", body))
    assert error.error.code == "AccountNameInvalid"
    az.storage.blob_containers.delete(RG, "ctstore1", "runs")
    az.storage.storage_accounts.delete(RG, "ctstore1")
    assert arm_fake.resources(group=RG) == []
