"""Cloud in a box for Azure: the real `cloudtrain run --provider azure` against the ARM fake and
Azurite.

The adapter talks to the fake through the real azure-mgmt clients (CLOUDTRAIN_ARM_ENDPOINT and
CLOUDTRAIN_ARM_CA, with an offline token credential). Every VM it creates is booted by the
harness once its create has succeeded: the harness runs the VM's own `customData` (base64) as a
local process session. A training node has no account key, as on Azure: its azure-identity takes
its VM's managed identity's token from the box's metadata service and its store goes through the
box's Blob front, which enforces the identity's role assignments and ABAC conditions before
Azurite serves the request (tests/fakes/azure_node_identity.py); a managed run's controller VM
keeps the box's connection string (issue 30 enforces the controller's rights). The startup
script's own IMDS calls (CLOUDTRAIN_AZURE_IMDS) go to a closed port, so its self-delete through
its managed identity fails and it falls back to `shutdown -h now`, which the harness reports and
the test mirrors as the VM stopping (what a guest shutdown does on Azure).
The training is real TensorFlow; checkpoints and the model land in the run's Azurite container;
afterwards the fake holds no VM, no resource group and no role assignment of the run.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import phases_report
from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.trace_kit import assert_traced
from tests.fakes.azure_cloud import ENV_NAMES, AzureCloud, azure_cloud, azurite, azurite_session
from tests.fakes.azure_node_identity import NodeIdentities
from tests.fakes.azurite import CLEARED_ENV, CONNECTION_STRING_ENV
from tests.fakes.boot_harness import BootHarness, Vm

__all__ = ["azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
REGION = "eastus"
POWERED = ("running", "starting")
SETTLED = ("Succeeded", "Updating")  # a VM boots once its create succeeded (never when Failed)
JOB = EXAMPLES / "digits-multiworker" / "job.yaml"


@dataclass
class SeenVm:
    """A VM as the harness last saw it."""

    name: str
    group: str
    zones: list[str]
    principal: str | None


@dataclass
class AzureBox:
    ct: Env
    harness: BootHarness
    cloud: AzureCloud
    seen: dict[str, SeenVm] = field(default_factory=dict)  # by vmId
    ids: NodeIdentities | None = None  # the nodes' identities: metadata service, Blob front

    @property
    def arm(self) -> Any:
        return self.cloud.arm

    def run(self, *args: str, timeout: float = 300) -> Any:
        return self.ct.cli(*args, timeout=timeout)

    def container(self, run_id: str) -> str:
        return f"ct-{run_id}"

    def keys(self, run_id: str, prefix: str) -> list[str]:
        client = self.cloud.azurite.client().get_container_client(self.container(run_id))
        return [b.name for b in client.list_blobs(name_starts_with=prefix)]

    def run_group(self, run_id: str) -> str:
        return f"cloudtrain-{run_id}"

    def run_vms(self, run_id: str) -> list[dict[str, Any]]:
        vms = self.arm.resources(kind="virtualMachines")
        return [v for v in vms if (v.get("tags") or {}).get("cloudtrain-run") == run_id]

    def run_assignments(self, run_id: str) -> list[dict[str, Any]]:
        """Role assignments scoped to something of the run, or held by one of its VMs."""
        principals = {vm.principal for vm in self.seen.values() if vm.principal}
        return [
            a
            for a in self.arm.role_assignments()
            if run_id in a["properties"]["scope"] or a["properties"]["principalId"] in principals
        ]

    def booted_vms(self) -> list[SeenVm]:
        return [self.seen[vm_id] for vm_id in self.harness.sessions]

    def assert_nothing_left(self, run_id: str) -> None:
        assert self.arm.resources(kind="virtualMachines") == []
        group = self.run_group(run_id).lower()
        assert [g["name"] for g in self.arm.groups() if g["name"].lower() == group] == []
        left = [
            r["id"]
            for r in self.arm.resources()
            if run_id in r["id"] and "/containers/" not in r["id"]  # the container keeps the model
        ]
        assert left == [], left
        scopes = [a["properties"]["scope"] for a in self.run_assignments(run_id)]
        assert scopes == [], scopes
        assert self.harness.live_sessions() == []
        resources = self.ct.ledger().resources(run_id)
        states = [(r.kind, r.resource_id, r.state) for r in resources]
        assert resources and all(r.state == "deleted" for r in resources), states


def _group_of(resource_id: str) -> str:
    parts = resource_id.split("/")
    return parts[parts.index("resourceGroups") + 1]


def _custom_data(body: dict[str, Any]) -> str:
    encoded = ((body.get("properties") or {}).get("osProfile") or {}).get("customData") or ""
    return base64.b64decode(encoded).decode()


def _discover(
    cloud: AzureCloud, seen: dict[str, SeenVm], lock: threading.Lock, ids: NodeIdentities
) -> list[Vm]:
    """The fake's VMs; one is alive while its create has succeeded and it is powered on. A
    training node's environment sends its SDK to its managed identity (`ids.vm_env`)."""
    vms = []
    for body in cloud.arm.resources(kind="virtualMachines"):
        props = body["properties"]
        name, group, vm_id = body["name"], _group_of(body["id"]), props["vmId"]
        try:
            power = cloud.arm.vm_power_state(name, group)
        except KeyError:  # deleted in between: the harness kills its session as unlisted
            continue
        with lock:
            principal = (body.get("identity") or {}).get("principalId")
            seen[vm_id] = SeenVm(name, group, list(body.get("zones") or []), principal)
        alive = power in POWERED and props.get("provisioningState") in SETTLED
        ref = props["storageProfile"]["imageReference"]
        image = "azure:" + ":".join(ref[k] for k in ("publisher", "offer", "sku", "version"))
        extension = any(
            e["id"].lower().startswith(body["id"].lower() + "/extensions/")
            and e["properties"].get("type") == "NvidiaGpuDriverLinux"
            for e in cloud.arm.resources(kind="extensions", group=group)
        )
        env = ids.vm_env(vm_id, (body.get("tags") or {}).get("cloudtrain-role"))
        script = functools.partial(_custom_data, body)
        vms.append(Vm(vm_id, name, alive, script, image, False, extension, env))
    return vms


@pytest.fixture
def azure(ct: Env, azure_cloud: AzureCloud, tmp_path: Path) -> Iterator[AzureBox]:
    names = (*ENV_NAMES, CONNECTION_STRING_ENV, "NO_PROXY", "no_proxy")
    ct.env.update({k: os.environ[k] for k in names if k in os.environ})
    for name in CLEARED_ENV:  # as the azurite fixture does for this process
        ct.env.pop(name, None)
    seen: dict[str, SeenVm] = {}
    lock = threading.Lock()

    def power_off(vm_id: str) -> None:  # a guest `shutdown -h now` on Azure: VM stopped
        with lock:
            vm = seen.get(vm_id)
        if vm is not None:
            azure_cloud.arm.set_vm_power_state(vm.name, "stopped", vm.group)

    ids = NodeIdentities(azure_cloud).start()
    harness = BootHarness(
        tmp_path / "box",
        lambda: _discover(azure_cloud, seen, lock, ids),
        dict(ct.env),
        on_power_off=power_off,
    )
    assert ids.metadata is not None
    harness.metadata_url = ids.metadata.url  # each VM gets <url>/vm/<its id>
    harness.start()
    try:
        yield AzureBox(ct, harness, azure_cloud, seen, ids)
    finally:
        harness.stop()
        ids.close()


def test_run_on_azure_trains_for_real_and_leaves_nothing(azure: AzureBox) -> None:
    # the region has no capacity for a VM without a zone (the plan's first try; the allocation
    # fails in the create's operation, leaving Failed VMs): the run lands in zone 1
    # (the user's own command: the planner picks the region, eastus)
    azure.arm.fail_next_vm_create(REGION, "AllocationFailed", count=2)
    spawned = time.time()
    proc = azure.run("run", "--provider", "azure", str(JOB))
    exited = time.time()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "trying the next zone" in proc.stdout, proc.stdout[-4000:]
    (run_id,) = azure.ct.run_ids()
    run = azure.ct.ledger().get_run(run_id)
    assert run is not None and run.store_uri == f"az://devstoreaccount1/ct-{run_id}"
    prefix = f"cloudtrain/runs/{run_id}/"
    keys = azure.keys(run_id, prefix)
    assert any(k.startswith(prefix + "checkpoints/") and k.endswith(".index") for k in keys)
    assert prefix + "model/saved_model/saved_model.pb" in keys
    assert len(azure.harness.booted) == 2, azure.harness.booted
    assert [vm.zones for vm in azure.booted_vms()] == [["1"], ["1"]]
    azure.assert_nothing_left(run_id)
    # the nodes wrote through the Blob front with their own identities, and it refused nothing
    # while their grants held (a guest's last log flush after the teardown revoked its grant
    # is refused, as on Azure)
    assert azure.ids is not None and azure.ids.front.allowed_count > 0
    refused = [(r.principal, r.method, r.blob) for r in azure.ids.front.refusals if r.granted]
    assert refused == [], refused
    # traced as on local (the VMs are processes here: one clock); its phases for the README
    trace = assert_traced(azure.ct, run_id, spawned, exited, ("worker-0", "worker-1"))
    phases_report.record(
        "azure box", trace, phases_report.azure_fakes(azure.cloud, azure.harness), spawned, exited
    )


def test_detach_then_status_logs_and_down(azure: AzureBox) -> None:
    # detach, logs, status and down are asserted: the job ticks (the run above trains for real)
    job = azure.ct.tick_job("detached", epochs=4, seconds=0.5)
    proc = azure.run(
        "run", "--detach", "--no-controller", "--provider", "azure", "--region", REGION, str(job)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_id,) = azure.ct.run_ids()
    group = azure.run_group(run_id)
    (rg,) = [g for g in azure.arm.groups() if g["name"].lower() == group.lower()]
    assert (rg.get("tags") or {}).get("cloudtrain-run") == run_id
    assert len(azure.arm.resources(kind="networkSecurityGroups", group=group)) == 1
    assert len(azure.arm.resources(kind="virtualNetworks", group=group)) == 1
    vms = azure.run_vms(run_id)
    assert sorted(v["name"] for v in vms) == [f"ct-{run_id}-worker-{i}" for i in (0, 1)]
    nics = {n["name"] for n in azure.arm.resources(kind="networkInterfaces", group=group)}
    assert nics == {f"{v['name']}-nic" for v in vms}
    for vm in vms:
        tags = vm["tags"]
        assert vm["name"] == f"ct-{run_id}-{tags['cloudtrain-role']}-{tags['cloudtrain-index']}"
        mine = {
            a["properties"]["scope"].lower()
            for a in azure.arm.role_assignments()
            if a["properties"]["principalId"] == vm["identity"]["principalId"]
        }
        assert vm["id"].lower() in mine, (vm["name"], mine)
        assert any(s.endswith(f"/containers/ct-{run_id}") for s in mine), (vm["name"], mine)
    follow = azure.run("logs", run_id, "--follow")
    assert "cloudtrain: epoch 4/4 done" in follow.stdout, follow.stdout[-3000:]
    status = json.loads(azure.run("status", run_id, "--json").stdout)
    assert status["nodes"]["worker-0"]["status"]["state"] == "succeeded"
    down = azure.run("down", run_id)
    assert down.returncode == 0, down.stdout + down.stderr
    azure.assert_nothing_left(run_id)


def test_no_capacity_anywhere_fails_clearly_and_leaves_nothing(azure: AzureBox) -> None:
    # the region and every zone are full: 2 nodes x (no zone, zones 1, 2, 3); the region is
    # pinned, so failover may not leave it (an unpinned run moves on: test_azure_gets_gpus.py)
    azure.arm.fail_next_vm_create("*", "ZonalAllocationFailed", count=8)
    proc = azure.run("run", "--provider", "azure", "--region", "eastus", str(JOB))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    tried = "no capacity for Standard_NC4as_T4_v3 in eastus: tried no zone, zone 1, zone 2, zone 3"
    assert tried in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    (run_id,) = azure.ct.run_ids()
    assert azure.harness.booted == []
    azure.assert_nothing_left(run_id)
