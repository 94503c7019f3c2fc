"""Cloud in a box for GCP: the real `cloudtrain run --provider gcp` against the GCE fake and the
GCS emulator.

The adapter talks to the fake through the real google-cloud-compute client (CLOUDTRAIN_GCE_ENDPOINT
with anonymous credentials). Every instance it inserts is booted by the harness, which runs the
instance's own `startup-script` metadata as a local process session pointed at the emulator (as
google-cloud-storage honours STORAGE_EMULATOR_HOST). The training is real TensorFlow; checkpoints
and the model land in the emulated GCS; afterwards the fake holds no instance, firewall rule or
service account of the run, and the bucket policy no binding of it.

The store enforces each node's rights (issue 29, tests/fakes/gce_node_identity.py): a training
node VM takes its instance's service account from the box's metadata server (google-auth, as on
GCE) and reaches GCS through a front that decides each of its requests by the bucket policy
ensure_network wrote, so the run passing shows the rules are not too tight. The laptop side and
a managed run's controller VM stay anonymous on the emulator (the project's owner; enforcing the
controller's identity is issue 30's).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import phases_report
from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.trace_kit import assert_traced
from tests.fakes.boot_harness import ON_DEMAND_GCE_GRACE_S, BootHarness, Vm
from tests.fakes.gce_node_identity import LAPTOP_ENV, NodeIdentities
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.fakes.netns import Network

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
REGION = "us-central1"
# the guest boots (and runs its startup script) once RUNNING; an insert whose operation fails
# never gets there
ALIVE = ("RUNNING",)
JOB = EXAMPLES / "digits-multiworker" / "job.yaml"


@dataclass
class GcpBox:
    ct: Env
    harness: BootHarness
    cloud: GcpCloud
    identities: NodeIdentities

    @property
    def bucket(self) -> str:
        return f"cloudtrain-{self.cloud.project}-{REGION}"

    def run(self, *args: str, timeout: float = 300) -> Any:
        return self.ct.cli(*args, timeout=timeout)

    def keys(self, prefix: str) -> list[str]:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(credentials=AnonymousCredentials(), project=self.cloud.project)
        return [b.name for b in client.list_blobs(self.bucket, prefix=prefix)]

    def read(self, key: str) -> bytes | None:
        """The object `key` of the run bucket, None if there is none (now)."""
        from google.api_core.exceptions import NotFound
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(credentials=AnonymousCredentials(), project=self.cloud.project)
        try:
            return bytes(client.bucket(self.bucket).blob(key).download_as_bytes())
        except NotFound:
            return None

    def run_firewalls(self, run_id: str) -> list[dict[str, Any]]:
        return [f for f in self.cloud.gce.firewalls() if run_id in f["name"]]

    def run_accounts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's node service accounts in the fake's IAM (display name `cloudtrain run <id>
        node <node id>`)."""
        return [
            a
            for a in self.cloud.gce.service_accounts()
            if a["displayName"].startswith(f"cloudtrain run {run_id} node ")
        ]

    def run_bindings(self, run_id: str) -> list[dict[str, Any]]:
        """The bucket policy's bindings that name the run (its account or its prefix)."""
        policy = self.cloud.gcs.iam_policy(self.bucket)
        return [b for b in policy.get("bindings") or [] if run_id in json.dumps(b)]

    def assert_nothing_left(self, run_id: str) -> None:
        assert self.cloud.gce.instances() == []
        assert self.run_firewalls(run_id) == []
        assert self.run_accounts(run_id) == []
        assert self.run_bindings(run_id) == []
        assert self.harness.live_sessions() == []
        resources = self.ct.ledger().resources(run_id)
        assert resources and all(r.state == "deleted" for r in resources)


def _discover(cloud: GcpCloud, identities: NodeIdentities) -> list[Vm]:
    vms = []
    for inst in cloud.gce.instances():
        items = {i["key"]: i["value"] for i in inst.get("metadata", {}).get("items", [])}
        script = items.get("startup-script", "")
        source = inst["disks"][0]["initializeParams"]["sourceImage"]
        image = "gcp:" + source[source.index("projects/") :]
        alive = inst["status"] in ALIVE
        # by GCE's instance id, not its name: an instance re-created under the same name (a
        # preempted node's replacement) is a new VM to boot
        vm_id, name = str(inst["id"]), inst["name"]
        role = (inst.get("labels") or {}).get("cloudtrain-role")
        # GCE's guest agent runs startup-script on every boot; a training node runs as its
        # instance's service account
        env = identities.vm_env(vm_id, role)
        spot = (inst.get("scheduling") or {}).get("provisioningModel") == "SPOT"
        grace = None if spot else ON_DEMAND_GCE_GRACE_S
        vms.append(
            Vm(
                vm_id,
                name,
                alive,
                lambda s=script: s,
                image,
                every_boot=True,
                env=env,
                shutdown_grace_s=grace,
            )
        )
    return vms


@contextlib.contextmanager
def gcp_box(
    ct: Env, cloud: GcpCloud, root: Path, network: Network | None = None
) -> Iterator[GcpBox]:
    """The GCP box over `cloud`: the harness booting its instances under `root`, with the node
    identities; with `network`, every VM its own host there (the identities on the network's
    host address: the cloud's emulators must be there too). Stopped on exit."""
    names = (
        "CLOUDTRAIN_GCE_ENDPOINT",
        "CLOUDTRAIN_IAM_ENDPOINT",
        "STORAGE_EMULATOR_HOST",
        "GOOGLE_CLOUD_PROJECT",
    )
    ct.env.update({k: os.environ[k] for k in (*names, "NO_PROXY") if k in os.environ})
    ct.env.update(LAPTOP_ENV)

    def power_off(vm_id: str) -> None:  # `shutdown -h now` on GCE stops the VM: TERMINATED
        for inst in cloud.gce.instances():
            if str(inst["id"]) == vm_id:
                zone = inst["zone"].rsplit("/", 1)[-1]
                cloud.gce.set_instance_status(inst["name"], "TERMINATED", zone)

    identities = NodeIdentities(cloud)
    harness: BootHarness | None = None
    try:
        identities.start(network.host_ip if network is not None else "127.0.0.1")
        harness = BootHarness(
            root,
            lambda: _discover(cloud, identities),
            dict(ct.env),
            on_power_off=power_off,
            network=network,
        ).start()
        yield GcpBox(ct, harness, cloud, identities)
    finally:
        if harness is not None:
            harness.stop()
        identities.close()


@pytest.fixture
def gcp(ct: Env, gcp_cloud: GcpCloud, tmp_path: Path) -> Iterator[GcpBox]:
    with gcp_box(ct, gcp_cloud, tmp_path / "box") as box:
        yield box


def test_run_on_gcp_trains_for_real_and_leaves_nothing(gcp: GcpBox) -> None:
    # the planned zone has no capacity (GCE's own operation error): the run lands in the next
    # (the user's own command: the planner picks the region, us-central1, and its zone a)
    gcp.cloud.gce.fail_next_insert("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED", count=2)
    spawned = time.time()
    proc = gcp.run("run", "--provider", "gcp", str(JOB))
    exited = time.time()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "zone us-central1-a: " in proc.stdout and "trying the next zone" in proc.stdout
    (run_id,) = gcp.ct.run_ids()
    inserts = [op for op in gcp.cloud.gce.operations() if op["operationType"] == "insert"]
    zones = {op["zone"].rsplit("/", 1)[-1] for op in inserts if "zone" in op}
    assert zones == {"us-central1-a", "us-central1-b"}, zones
    prefix = f"cloudtrain/runs/{run_id}/"
    keys = gcp.keys(prefix)
    assert any(k.startswith(prefix + "checkpoints/") and k.endswith(".index") for k in keys)
    assert prefix + "model/saved_model/saved_model.pb" in keys
    assert len(gcp.harness.booted) == 2
    # every node request carried the node's own token and the store allowed each (the rules
    # are not too tight): the front refused nothing
    front = gcp.identities.front
    assert front is not None
    from cloudtrain.providers.gcp import identity

    emails = {who for who, _method, _path in front.allowed}
    nodes = {identity.node_email(gcp.cloud.project, run_id, n) for n in ("worker-0", "worker-1")}
    assert emails == nodes, emails
    # (a node's last log flush after teardown revoked its bindings is refused, as on GCP)
    assert [r for r in front.refusals if r.bound] == [], front.refusals[:5]
    gcp.assert_nothing_left(run_id)
    # traced as on local (the VMs are processes here: one clock); its phases for the README
    trace = assert_traced(gcp.ct, run_id, spawned, exited, ("worker-0", "worker-1"))
    phases_report.record(
        "gcp box", trace, phases_report.gcp_fakes(gcp.cloud, gcp.harness), spawned, exited
    )


def test_detach_then_status_logs_and_down(gcp: GcpBox) -> None:
    # detach, logs, status and down are asserted: the job ticks (the run above trains for real)
    job = gcp.ct.tick_job("detached", epochs=4, seconds=0.5)
    proc = gcp.run(
        "run", "--detach", "--no-controller", "--provider", "gcp", "--region", REGION, str(job)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_id,) = gcp.ct.run_ids()
    assert len(gcp.run_firewalls(run_id)) == 1
    follow = gcp.run("logs", run_id, "--follow")
    assert "cloudtrain: epoch 4/4 done" in follow.stdout, follow.stdout[-3000:]
    status = json.loads(gcp.run("status", run_id, "--json").stdout)
    assert status["nodes"]["worker-0"]["status"]["state"] == "succeeded"
    down = gcp.run("down", run_id)
    assert down.returncode == 0, down.stdout + down.stderr
    gcp.assert_nothing_left(run_id)
