"""The fake clouds take Spot VMs back as the real ones do, seen through the real SDKs.

- GCE (`GceFake.preempt`): a SPOT instance with instanceTerminationAction DELETE is gone, STOP
  leaves it TERMINATED; either way the zone's operation list shows a DONE
  `compute.instances.preempted` operation targeting it; a standard instance is never preempted.
- ARM (`ArmFake.evict`): evictionPolicy Delete removes the VM with its NIC, public IP and disk
  (deleteOption Delete) but leaves the role assignments of its identity; Deallocate deallocates
  it; a regular VM is refused.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.fakes.arm_fake import ArmFake, arm_fake
from tests.fakes.gce_fake import GceFake, gce_fake

__all__ = ["arm_fake", "gce_fake"]  # fixtures, for pytest


# -- GCE ---------------------------------------------------------------------------------------


def test_gce_preempts_spot_instances_as_their_termination_action_says(gce_fake: GceFake) -> None:
    compute_v1 = pytest.importorskip("google.cloud.compute_v1")
    from google.api_core import exceptions

    from tests.fakes.test_gce_fake import PROJECT, ZONE, Clients, gpu_instance, make_instance

    gce = Clients(gce_fake)
    gce_fake.operation_polls_to_done = 0
    deleted, stopped = gpu_instance("ct-a-worker-0"), gpu_instance("ct-a-worker-1")
    stopped.scheduling.instance_termination_action = "STOP"
    for inst in (deleted, stopped, make_instance("ct-a-worker-2")):
        gce.insert(inst)

    op = gce_fake.preempt("ct-a-worker-0")
    assert (op["operationType"], op["status"], op["user"]) == (
        "compute.instances.preempted",
        "DONE",
        "system",
    )
    with pytest.raises(exceptions.NotFound):
        gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-worker-0")
    gce_fake.preempt("ct-a-worker-1", zone=ZONE)
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-worker-1").status == (
        "TERMINATED"
    )
    with pytest.raises(ValueError, match="not SPOT"):
        gce_fake.preempt("ct-a-worker-2")
    with pytest.raises(KeyError):
        gce_fake.preempt("ct-a-worker-0")  # already gone

    # what the "List preemption history" sample asks the zone's operations
    wanted = 'operationType="compute.instances.preempted"'
    request = compute_v1.ListZoneOperationsRequest(project=PROJECT, zone=ZONE, filter=wanted)
    preempted = list(gce.zone_ops.list(request=request))
    assert [o.target_link.rsplit("/", 1)[-1] for o in preempted] == [
        "ct-a-worker-0",
        "ct-a-worker-1",
    ]
    assert all(o.status == compute_v1.Operation.Status.DONE for o in preempted)
    every = list(gce.zone_ops.list(project=PROJECT, zone=ZONE))
    assert [o.operation_type for o in every] == ["insert"] * 3 + ["compute.instances.preempted"] * 2
    assert list(gce.zone_ops.list(project=PROJECT, zone="us-central1-b")) == []


# -- ARM ---------------------------------------------------------------------------------------


def test_azure_evicts_spot_vms_as_their_eviction_policy_says(arm_fake: ArmFake) -> None:
    pytest.importorskip("azure.mgmt.compute")
    from azure.core.exceptions import ResourceNotFoundError

    from tests.fakes.arm_testkit import RG, ArmClients, build_network, create_vm

    az = ArmClients(arm_fake)
    nics = build_network(az, RG, nics=("nic-0", "nic-1", "nic-2"))
    gone = create_vm(az, "w0", nics[0])
    create_vm(az, "w1", nics[1], index=1, evictionPolicy="Deallocate")
    create_vm(az, "w2", nics[2], index=2, priority="Regular", evictionPolicy=None)
    principal = gone.identity.principal_id
    scope = gone.id
    name = str(uuid.uuid4())
    body: dict[str, Any] = {
        "properties": {
            "roleDefinitionId": az.role_definition(),
            "principalId": principal,
            "principalType": "ServicePrincipal",
        }
    }
    az.auth.role_assignments.create(scope, name, body)

    arm_fake.evict("w0")
    with pytest.raises(ResourceNotFoundError):
        az.compute.virtual_machines.get(RG, "w0")
    assert [n["name"] for n in arm_fake.resources("networkInterfaces")] == ["nic-1", "nic-2"]
    assert [p["name"] for p in arm_fake.resources("publicIPAddresses")] == ["nic-1-ip", "nic-2-ip"]
    assert len(arm_fake.resources("disks")) == 2
    held = [a["properties"]["principalId"] for a in arm_fake.role_assignments()]
    assert held == [principal], "Azure keeps the assignments of a deleted identity"
    arm_fake.evict("w1")
    assert arm_fake.vm_power_state("w1") == "deallocated"
    with pytest.raises(ValueError, match="not a Spot VM"):
        arm_fake.evict("w2")
    with pytest.raises(KeyError):
        arm_fake.evict("w0")
