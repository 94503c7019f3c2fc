"""The ARM fake's virtual machines, driven only through the real azure-mgmt clients: VMs as a
cloudtrain adapter creates them, the checks Azure makes, scripted VM failures (synchronous 409
and failed LROs), power actions, Spot eviction and what a VM deletion takes with it.
"""

from __future__ import annotations

import base64
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("azure.mgmt.compute")
pytest.importorskip("trustme")
from azure.core.exceptions import ResourceNotFoundError

from tests.fakes.arm_fake import ArmFake, arm_fake
from tests.fakes.arm_testkit import (
    CLOUD_INIT,
    GPU_SIZE,
    LOCATION,
    RG,
    ArmClients,
    az,
    az0,
    build_network,
    create_vm,
    error_of,
    loopback_only,
    nics,
    vm_body,
)

__all__ = ["arm_fake", "az", "az0", "loopback_only", "nics"]  # fixtures used by this module
pytestmark = pytest.mark.usefixtures("loopback_only")


# -- create, read, list ------------------------------------------------------------------------


def test_vm_create_answers_what_azure_does(
    arm_fake: ArmFake, az: ArmClients, nics: list[str]
) -> None:
    vm = create_vm(az, "worker-0", nics[0])
    assert vm.provisioning_state == "Succeeded"
    assert vm.location == LOCATION and vm.zones == ["1"]
    assert vm.tags == {"cloudtrain-run": "run-1", "role": "worker", "index": "0"}
    assert vm.hardware_profile.vm_size == GPU_SIZE
    assert vm.priority == "Spot" and vm.eviction_policy == "Delete"
    assert vm.billing_profile.max_price == -1
    assert vm.identity.type == "SystemAssigned"
    assert str(uuid.UUID(vm.identity.principal_id)) == vm.identity.principal_id
    assert vm.identity.tenant_id == arm_fake.tenant_id
    image = vm.storage_profile.image_reference
    assert (image.publisher, image.sku, image.version) == ("Canonical", "22_04-lts-gen2", "latest")
    assert image.exact_version
    assert vm.os_profile.custom_data is None  # write-only, as on Azure
    stored = arm_fake.resources("virtualMachines")[0]
    assert base64.b64decode(stored["properties"]["osProfile"]["customData"]).decode() == CLOUD_INIT
    assert vm.network_profile.network_interfaces[0].id == nics[0]
    disk_id = vm.storage_profile.os_disk.managed_disk.id
    assert f"/resourceGroups/{RG.upper()}/" in disk_id  # Compute upper-cases the group here
    disk = az.compute.disks.get(RG, vm.storage_profile.os_disk.name)
    assert disk.disk_state == "Attached" and disk.managed_by == vm.id
    nic = az.network.network_interfaces.get(RG, "nic-0")
    assert nic.virtual_machine.id == vm.id


def test_instance_view_lists_and_list_all(
    arm_fake: ArmFake, az: ArmClients, nics: list[str]
) -> None:
    create_vm(az, "worker-0", nics[0])
    create_vm(az, "worker-1", nics[1], index=1)
    vms = az.compute.virtual_machines
    assert vms.get(RG, "worker-0").instance_view is None
    view = vms.get(RG, "worker-0", expand="instanceView").instance_view
    assert [s.code for s in view.statuses] == ["ProvisioningState/succeeded", "PowerState/running"]
    assert view.computer_name == "worker-0"
    assert vms.instance_view(RG, "worker-1").statuses[1].display_status == "VM running"
    assert [v.name for v in vms.list(RG)] == ["worker-0", "worker-1"]
    assert [v.name for v in vms.list_all()] == ["worker-0", "worker-1"]
    with_status = list(vms.list_all(status_only="true"))
    assert with_status[0].instance_view.statuses[1].code == "PowerState/running"
    assert any(
        r.startswith("GET /subscriptions/") and "/providers/Microsoft.Compute/virtualMachines?" in r
        for r in arm_fake.requests
    )


def test_vm_create_is_checked(az: ArmClients, az0: ArmClients, nics: list[str]) -> None:
    vms = az0.compute.virtual_machines
    cases: list[tuple[dict[str, Any], str, str | None]] = [
        ({**vm_body(nics[0]), "location": None}, "LocationRequired", None),
        (vm_body(nics[0], hardwareProfile={}), "InvalidParameter", "vmSize"),
        (vm_body(nics[0], networkProfile={}), "InvalidParameter", "networkProfile"),
        (
            vm_body(
                nics[0],
                osProfile={
                    **vm_body(nics[0])["properties"]["osProfile"],
                    "customData": "not base64!",
                },
            ),
            "InvalidParameter",
            "customData",
        ),
        (vm_body(nics[0], priority="Regular"), "InvalidParameter", "evictionPolicy"),
        (vm_body(nics[0], zone="7"), "InvalidParameter", "zones"),
        (vm_body(nics[0] + "-missing"), "InvalidResourceReference", None),
    ]
    for body, code, target in cases:
        error = error_of(lambda body=body: vms.begin_create_or_update(RG, "bad", body))
        assert (error.status_code, error.error.code) == (400, code)
        assert error.error.target == target
    create_vm(az, "worker-0", nics[0])
    again = az.compute.virtual_machines.begin_create_or_update(
        RG, "worker-0", vm_body(nics[0])
    ).result()
    assert again.provisioning_state == "Succeeded"  # an identical PUT is fine
    error = error_of(lambda: vms.begin_create_or_update(RG, "worker-0", vm_body(nics[0], zone="2")))
    assert (error.status_code, error.error.code, error.error.target) == (
        409,
        "PropertyChangeNotAllowed",
        "zones",
    )
    error = error_of(lambda: vms.begin_create_or_update(RG, "other", vm_body(nics[0])))
    assert (error.status_code, error.error.code) == (409, "NicInUse")
    error = error_of(lambda: az0.network.network_interfaces.begin_delete(RG, "nic-0"))
    assert (error.status_code, error.error.code) == (400, "NicInUse")


def test_parallel_creates_from_threads(arm_fake: ArmFake, az: ArmClients) -> None:
    nic_ids = build_network(az, RG, nics=tuple(f"nic-{i}" for i in range(4)))
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda i: create_vm(az, f"w{i}", nic_ids[i], index=i), range(4)))
    assert [vm.provisioning_state for vm in made] == ["Succeeded"] * 4
    ips = {
        az.network.network_interfaces.get(RG, f"nic-{i}").ip_configurations[0].private_ip_address
        for i in range(4)
    }
    assert ips == {"10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7"}
    assert len({vm.identity.principal_id for vm in made}) == 4


# -- scripted failures -------------------------------------------------------------------------


def test_synchronous_create_failures(arm_fake: ArmFake, az0: ArmClients, nics: list[str]) -> None:
    vms = az0.compute.virtual_machines
    arm_fake.fail_next_vm_create("eastus", "SkuNotAvailable")
    error = error_of(lambda: vms.begin_create_or_update(RG, "w", vm_body(nics[0])))
    assert (error.status_code, error.error.code) == (409, "SkuNotAvailable")
    assert GPU_SIZE in error.error.message and "eastus" in error.error.message
    arm_fake.fail_next_vm_create("*", "OperationNotAllowed")
    error = error_of(lambda: vms.begin_create_or_update(RG, "w", vm_body(nics[0])))
    assert (error.status_code, error.error.code) == (409, "OperationNotAllowed")
    assert "exceeding approved standardNCASv3_T4Family Cores quota" in error.error.message
    assert arm_fake.resources("virtualMachines") == []  # nothing was created
    assert (
        vms.begin_create_or_update(RG, "w", vm_body(nics[0])).result().provisioning_state
        == "Succeeded"
    )


def test_allocation_failures_fail_the_lro_and_leave_a_failed_vm(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients, nics: list[str]
) -> None:
    arm_fake.fail_next_vm_create("eastus-2", "ZonalAllocationFailed")
    assert create_vm(az, "in-zone-1", nics[0]).provisioning_state == "Succeeded"  # zone 1: spared
    poller = az.compute.virtual_machines.begin_create_or_update(
        RG, "in-zone-2", vm_body(nics[1], zone="2")
    )
    error = error_of(poller.result)
    assert error.error.code == "ZonalAllocationFailed"
    assert "sufficient capacity" in error.error.message
    failed = az.compute.virtual_machines.get(RG, "in-zone-2", expand="instanceView")
    assert failed.provisioning_state == "Failed"
    assert failed.instance_view.statuses[0].code == "ProvisioningState/failed/ZonalAllocationFailed"
    arm_fake.fail_next_vm_create("eastus", "AllocationFailed")
    error = error_of(lambda: create_vm(az0, "w2", nics[2], zone=None))
    assert error.error.code == "AllocationFailed"
    az.compute.virtual_machines.begin_delete(RG, "w2").result()
    assert "nic-2" not in [n["name"] for n in arm_fake.resources("networkInterfaces")]
    (nic,) = build_network(az, RG, nics=("nic-3",))
    arm_fake.fail_next_vm_create("1", "SkuNotAvailable", "scripted text", lro=True)
    error = error_of(lambda: create_vm(az0, "w3", nic))
    assert (error.error.code, error.error.message) == ("SkuNotAvailable", "scripted text")


# -- actions, eviction, deletion ----------------------------------------------------------------


def test_power_actions_are_lros(arm_fake: ArmFake, az: ArmClients, nics: list[str]) -> None:
    create_vm(az, "worker-0", nics[0])
    vms = az.compute.virtual_machines

    def power() -> str:
        return vms.get(RG, "worker-0", expand="instanceView").instance_view.statuses[1].code

    vms.begin_power_off(RG, "worker-0", polling=False).result()
    assert power() == "PowerState/stopping"
    vms.begin_power_off(RG, "worker-0", skip_shutdown=True).result()
    assert power() == "PowerState/stopped"
    vms.begin_start(RG, "worker-0").result()
    assert power() == "PowerState/running"
    vms.begin_deallocate(RG, "worker-0").result()
    assert (
        power() == "PowerState/deallocated" and arm_fake.vm_power_state("worker-0") == "deallocated"
    )
    arm_fake.set_vm_power_state("worker-0", "running")
    assert power() == "PowerState/running"
    vms.begin_restart(RG, "worker-0").result()
    assert any("/worker-0/deallocate?" in r for r in arm_fake.requests)


def test_eviction_and_deletion_take_what_the_vm_owns(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients, nics: list[str]
) -> None:
    create_vm(az, "w0", nics[0])
    create_vm(az, "w1", nics[1], index=1, evictionPolicy="Deallocate")
    create_vm(az, "w2", nics[2], index=2)
    az.compute.virtual_machines.simulate_eviction(RG, "w1")
    assert arm_fake.vm_power_state("w1") == "deallocated"
    az.compute.virtual_machines.simulate_eviction(RG, "w0")
    with pytest.raises(ResourceNotFoundError):
        az0.compute.virtual_machines.get(RG, "w0")
    assert [n["name"] for n in arm_fake.resources("networkInterfaces")] == ["nic-1", "nic-2"]
    assert [p["name"] for p in arm_fake.resources("publicIPAddresses")] == ["nic-1-ip", "nic-2-ip"]
    arm_fake.remove_vm("w2")
    assert [v.name for v in az.compute.virtual_machines.list(RG)] == ["w1"]
    assert len(arm_fake.resources("disks")) == 1
    arm_fake.lro_polls = 2
    az.compute.virtual_machines.begin_delete(RG, "w1", polling=False).result()
    error = error_of(lambda: az0.compute.virtual_machines.begin_deallocate(RG, "w1"))
    assert (error.status_code, error.error.code) == (409, "Conflict")
    az.compute.virtual_machines.begin_delete(RG, "w1").result()
    assert arm_fake.resources("virtualMachines") == [] and arm_fake.resources("disks") == []
    with pytest.raises(KeyError):
        arm_fake.set_vm_power_state("w1", "running")


def test_os_disk_kept_when_delete_option_is_detach(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients, nics: list[str]
) -> None:
    body = vm_body(nics[0])
    body["properties"]["storageProfile"]["osDisk"]["deleteOption"] = "Detach"
    body["properties"]["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] = (
        "Detach"
    )
    vm = az.compute.virtual_machines.begin_create_or_update(RG, "w0", body).result()
    disk_name = vm.storage_profile.os_disk.name
    error = error_of(lambda: az0.compute.disks.begin_delete(RG, disk_name))
    assert (error.status_code, error.error.code) == (409, "OperationNotAllowed")
    az.compute.virtual_machines.begin_delete(RG, "w0").result()
    assert az.compute.disks.get(RG, disk_name).disk_state == "Unattached"
    assert az.network.network_interfaces.get(RG, "nic-0").virtual_machine is None
    az.compute.disks.begin_delete(RG, disk_name).result()
    assert [d.name for d in az.compute.disks.list_by_resource_group(RG)] == []
