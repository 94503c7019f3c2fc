"""Managed runs in every box (issue 17): `run --detach` hands the run to a controller node that
lives in the cloud, and the laptop can go.

The box (the first tests) is ready for a controller VM:
- a VM the cloud deletes gets SIGTERM, then its power is cut after the shutdown grace (a
  process that ignores SIGTERM, as the controller's last step does, finishes in that window);
  a VM that dies (`BootHarness.kill`) gets nothing;
- from inside a VM, cloudtrain's own clients reach each cloud's compute API with the wheel and
  its SDK extra installed offline into a plain venv, as the controller node's startup does: AWS
  (EC2, S3: the VM terminates itself and writes in its grace), in the plain box and with the VM
  its own host in a network namespace; GCE; ARM.

The acceptance (per provider: local, aws, gcp, azure), against the real CLI:
- `run --detach` returns and the CLI exits; the cloud then takes a worker back; the controller
  node replaces only that node (one new create of its name, never two live nodes of one name,
  polled throughout); the run finishes every epoch (resuming from its checkpoint); afterwards
  nothing of the run is left, the controller VM and its identity included; `cloudtrain status`
  from a fresh CLOUDTRAIN_HOME shows the outcome and the cost (from the run's journal);
- budget stop while detached (local and aws): outcome budget_exceeded, the checkpoint flushed,
  everything deleted;
- the controller VM dies mid-run (aws, and local's controller node process): training goes on;
  `cloudtrain attach` takes the lease once it expired, follows to the end and tears down; no
  duplicate node at any time.

The job ticks (tests/e2e/managed_kit.RESUMABLE_TICK): no TensorFlow, checkpoints as files.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.providers.local import session_pids
from cloudtrain.run.bundle import build_wheel
from tests.e2e.conftest import tick_held
from tests.e2e.managed_kit import (
    LEASE_TTL_S,
    Cloud,
    Inventory,
    aws_cloud,
    azure_cloud_of,
    controller_of,
    gcp_cloud_of,
    local_cloud,
    resumable_job,
    wait_until,
    worker,
)
from tests.e2e.test_aws_in_a_box import AwsBox, aws
from tests.e2e.test_azure_in_a_box import azure, azure_cloud, azurite, azurite_session
from tests.e2e.test_gcp_in_a_box import gcp, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.e2e.test_netns_runs import box as netns_box
from tests.fakes import netns
from tests.fakes.boot_harness import BootHarness, Vm
from tests.fakes.box_images import FACTS

__all__ = [  # fixtures, for pytest
    "aws",
    "azure",
    "azure_cloud",
    "azurite",
    "azurite_session",
    "gcp",
    "gcp_cloud",
    "gcs_emulator",
    "gcs_emulator_session",
    "netns_box",
]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
UBUNTU_2204_PARAM = (
    "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
)
UBUNTU_2204 = "aws:" + UBUNTU_2204_PARAM
assert UBUNTU_2204 in FACTS  # a CPU VM's image (the controller's)
EPOCHS, SECONDS = 12, 0.5
# the runs' training holds after epoch HOLD_AT until the test's event (a replacement resumed, an
# attach took the run) creates the gate: however slowly a VM boots under load, the event comes
# mid-run, and no test sleeps through epochs it does not need
HOLD_AT = 3


# -- the box, ready for a controller VM ---------------------------------------------------------

_GRACEFUL = """trap 'echo term >>"$BOX_VM/log"; sleep 1; echo final >>"$BOX_VM/log"; exit 0' TERM
echo up >>"$BOX_VM/log"
while :; do sleep 0.1; done
"""
_STUBBORN = """trap '' TERM
echo up >>"$BOX_VM/log"
while :; do sleep 0.1; done
"""


def _log(harness: BootHarness, vm_id: str) -> str:
    path = harness.vm_dir(vm_id) / "log"
    return path.read_text() if path.exists() else ""


def _ended(harness: BootHarness, vm_id: str, since: float, timeout: float = 10) -> float:
    """Seconds from `since` until the VM's session has no process left."""
    sid = harness.sessions[vm_id]
    deadline = time.monotonic() + timeout
    while session_pids(sid):
        assert time.monotonic() < deadline, f"{vm_id} still runs"
        time.sleep(0.02)
    return time.monotonic() - since


def test_a_deleted_vm_gets_sigterm_then_the_power_cut_after_its_grace(tmp_path: Path) -> None:
    listed: dict[str, Vm] = {}
    for vm_id, script in (("graceful", _GRACEFUL), ("stubborn", _STUBBORN), ("dies", _GRACEFUL)):
        listed[vm_id] = Vm(vm_id, vm_id, True, lambda s=script: s, UBUNTU_2204)
    # a VM whose cloud gives it a longer window of its own (GCE's on-demand VMs)
    listed["patient"] = Vm(
        "patient", "patient", True, lambda: _STUBBORN, UBUNTU_2204, shutdown_grace_s=4.5
    )
    harness = BootHarness(
        tmp_path / "box", lambda: list(listed.values()), dict(os.environ), 0.1, shutdown_grace_s=2
    ).start()
    try:
        wait_until(
            "four VMs up",
            lambda: all("up" in _log(harness, v) for v in listed),
            60,
            lambda: repr(harness.errors),
        )
        harness.kill("dies")  # the VM dies while its cloud lists it running: no shutdown at all
        assert _ended(harness, "dies", time.monotonic()) < 1
        deleted = time.monotonic()
        del listed["graceful"], listed["stubborn"], listed["patient"]  # the cloud deletes three
        graceful = _ended(harness, "graceful", deleted)
        stubborn = _ended(harness, "stubborn", deleted)
        patient = _ended(harness, "patient", deleted)
        time.sleep(0.5)
    finally:
        harness.stop()
    assert _log(harness, "graceful").split() == ["up", "term", "final"], "its last step ran"
    assert graceful < 1.9, graceful  # it ended by itself, ~1 s in
    assert 2.0 <= stubborn < 4.0, stubborn  # SIGTERM ignored: cut at the grace's end
    assert 4.5 <= patient < 6.5, patient  # ... at the end of its own, longer grace
    assert _log(harness, "dies").split() == ["up"], "a VM that dies gets no SIGTERM"
    assert harness.boots == {"graceful": 1, "stubborn": 1, "dies": 1, "patient": 1}, "no reboot"
    assert harness.forced == ["stubborn", "patient"], "still running when their grace ended"


def _controller_venv(wheel: Path, extra: str, program: str) -> str:
    """A VM's script that does what the controller node's startup does (a plain venv over the
    image's python3, the wheel with the cloud's SDK extra), then runs `program` in it."""
    return f"""set -euo pipefail
apt-get install -y python3-venv
python3 -m venv "$BOX_VM/venv"
"$BOX_VM/venv/bin/pip" install -q --disable-pip-version-check "{wheel}[{extra}]"
exec "$BOX_VM/venv/bin/python" - <<'EOF'
{program}
EOF
"""


_AWS_SELF_DELETE = """
import json, os, signal, time
from cloudtrain.providers.aws.clients import client
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the controller's last step
me = os.environ["HARNESS_VM_ID"]
ec2, s3 = client("ec2", "us-east-1"), client("s3", "us-east-1")
(inst,) = ec2.describe_instances(InstanceIds=[me])["Reservations"][0]["Instances"]
facts = {
    "state": inst["State"]["Name"],
    "home": os.environ["HOME"],
    "cloudtrain_home": os.environ.get("CLOUDTRAIN_HOME"),
    "no_index": os.environ.get("PIP_NO_INDEX"),
}
ec2.terminate_instances(InstanceIds=[me])
time.sleep(2)  # the guest is shutting down now
s3.put_object(Bucket="managed-box", Key="final", Body=json.dumps(facts).encode())
print("final step done", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("where", ["box", "namespace"])
def test_a_vm_drives_ec2_deletes_itself_and_ends_in_its_grace(
    where: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if where == "namespace":
        netns.require()
    box: AwsBox = request.getfixturevalue("aws" if where == "box" else "netns_box")
    import boto3

    name, wheel = build_wheel()
    (tmp_path / name).write_bytes(wheel)
    ami = boto3.client("ssm", region_name="us-east-1").get_parameter(Name=UBUNTU_2204_PARAM)
    box.s3.create_bucket(Bucket="managed-box")
    script = _controller_venv(tmp_path / name, "aws", _AWS_SELF_DELETE)
    (inst,) = box.ec2.run_instances(
        ImageId=ami["Parameter"]["Value"], MinCount=1, MaxCount=1, UserData=script
    )["Instances"]
    vm_id = inst["InstanceId"]

    def final() -> Any:
        keys = box.s3.list_objects_v2(Bucket="managed-box").get("Contents", [])
        return keys and json.loads(
            box.s3.get_object(Bucket="managed-box", Key="final")["Body"].read()
        )

    facts = wait_until(
        "the VM's final write", final, 120, lambda: box.harness.console(vm_id)[-3000:]
    )
    assert facts == {
        "state": "running",
        "home": str(box.harness.vm_dir(vm_id) / "root"),
        "cloudtrain_home": None,  # the laptop's home is not the VM's
        "no_index": "1",  # its pip installed offline, from the box's wheels
    }, facts
    (gone,) = [i for i in box.instances() if i["InstanceId"] == vm_id]
    assert gone["State"]["Name"] == "terminated"
    assert box.harness.live_sessions() == [], "the power was cut after the grace"
    assert "final step done" in box.harness.console(vm_id)
    if where == "namespace":  # its namespace goes with it, once its guest is down
        wait_until("the VM's namespace removed", lambda: vm_id not in box.harness.hosts, 10, str)


_GCE_LIST = """
import json, os
from cloudtrain.providers.gcp.clients import ComputeClients, resolve_auth
auth = resolve_auth(None)
found = ComputeClients(auth).instances.list(project=auth.project, zone="us-central1-a")
print("ANSWER " + json.dumps(sorted(i.name for i in found)), flush=True)
"""
_ARM_LIST = """
import json
from cloudtrain.providers.azure.clients import ArmClients, resolve_auth
groups = ArmClients(resolve_auth(None)).resource.resource_groups.list()
print("ANSWER " + json.dumps(sorted(g.name for g in groups)), flush=True)
"""


@pytest.mark.parametrize("provider", ["gcp", "azure"])
def test_a_vm_reaches_its_clouds_compute_api_with_the_sdk_extra(
    provider: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    box: Any = request.getfixturevalue(provider)
    name, wheel = build_wheel()
    (tmp_path / name).write_bytes(wheel)
    if provider == "gcp":
        program, expected = _GCE_LIST, []
    else:
        from cloudtrain.providers.azure.clients import ArmClients, resolve_auth

        groups = ArmClients(resolve_auth(None)).resource.resource_groups
        groups.create_or_update("managed-box-probe", {"location": "eastus"})
        program, expected = _ARM_LIST, ["managed-box-probe"]
    vm = Vm(
        "probe",
        "probe",
        True,
        lambda: _controller_venv(tmp_path / name, provider, program),
        UBUNTU_2204,
    )
    harness = BootHarness(tmp_path / "probe-box", lambda: [vm], dict(box.harness.env)).start()
    try:
        answer = wait_until(
            f"the VM's answer from {provider}",
            lambda: re.search(r"^ANSWER (.*)$", harness.console("probe"), re.M),
            120,
            lambda: harness.console("probe")[-3000:],
        )
    finally:
        harness.stop()
    assert json.loads(answer[1]) == expected


# -- the acceptance -----------------------------------------------------------------------------


def _cloud(request: pytest.FixtureRequest, provider: str) -> Cloud:
    if provider == "local":
        return local_cloud(request.getfixturevalue("ct"))
    box = request.getfixturevalue(provider)
    return {"aws": aws_cloud, "gcp": gcp_cloud_of, "azure": azure_cloud_of}[provider](box)


def _detach(cloud: Cloud, job: Path, *extra: str) -> str:
    """`run --detach` (the controller node by default): returns the run id once the CLI has
    exited 0 with the outcome `detached`."""
    cloud.setenv(CLOUDTRAIN_LEASE_TTL_S=LEASE_TTL_S)
    proc = cloud.ct.cli("run", "--detach", "--json", *cloud.args(), *extra, str(job), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["outcome"] == "detached", result
    (run_id,) = cloud.ct.run_ids()
    return run_id


def _epoch_of(console: str) -> int:
    done = re.findall(r"cloudtrain: epoch (\d+)/\d+ done", console)
    return int(done[-1]) if done else 0


def _wait_controlling(cloud: Cloud, run_id: str, inventory: Inventory) -> None:
    """Until the controller node says it controls the run
    (cloudtrain/managed/controller_node.py)."""
    controller = controller_of(run_id)
    wait_until(
        "the controller node controlling the run",
        lambda: "controlling run" in "".join(cloud.consoles(controller)),
        180,
        lambda: f"live: {inventory.last}\n" + "".join(cloud.consoles(controller))[-3000:],
    )


def _wait_gone(cloud: Cloud, inventory: Inventory, timeout: float) -> None:
    """Until no node of the run is live (the controller node included) and no VM session is
    left in the box."""

    def detail() -> str:
        tails = {n: cloud.consoles(n)[-1][-1500:] for n, _ in inventory.last if cloud.consoles(n)}
        dups = f"duplicates: {inventory.duplicates[:3]}\n" if inventory.duplicates else ""
        shown = "\n".join(f"--- {n}\n{t}" for n, t in tails.items())
        return f"{dups}live: {inventory.last}\n{shown}"

    wait_until(
        "every node of the run gone", lambda: not cloud.live(inventory.run_id), timeout, detail
    )
    if cloud.harness is not None:
        assert cloud.harness.live_sessions() == []
        controller = cloud.harness.vm_ids(controller_of(inventory.run_id))
        cut = set(controller) & set(cloud.harness.forced)
        assert not cut, "the controller node's last step outlasted its VM's shutdown grace:\n" + (
            "\n".join(cloud.harness.describe(v) for v in controller)
        )


def _status(cloud: Cloud, tmp_path: Path, run_id: str) -> dict[str, Any]:
    """`cloudtrain status RUN --provider P [--region R] --json` from a fresh CLOUDTRAIN_HOME."""
    proc = cloud.fresh_cli(tmp_path, "status", run_id, *cloud.args(), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _assert_nothing_left(cloud: Cloud, run_id: str) -> None:
    """Nothing of the run in the cloud (the controller VM and its identity included), and the
    laptop's ledger, once it saw the run again (`status` imports the journal), agrees."""
    assert cloud.leaks(run_id) == []
    proc = cloud.ct.cli("status", run_id, "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resources = cloud.ct.ledger().resources(run_id)
    states = [(r.kind, r.resource_id, r.state) for r in resources]
    assert resources and all(r.state == "deleted" for r in resources), states
    kinds = {r.kind for r in resources}
    assert any(k.startswith("controller-") for k in kinds) or cloud.provider == "local", kinds
    assert cloud.ct.live_processes() == []


@pytest.mark.parametrize("provider", ["local", "aws", "gcp", "azure"])
def test_detached_run_survives_a_preemption_and_cleans_up_after_itself(
    provider: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cloud = _cloud(request, provider)
    gate = tmp_path / "gate"
    job = resumable_job(cloud.ct, "managed", EPOCHS, SECONDS, env=tick_held(gate, HOLD_AT))
    started = time.monotonic()
    run_id = _detach(cloud, job)
    detached_s = time.monotonic() - started
    inventory = Inventory(cloud, run_id)
    inventory.start()
    try:
        victim, chief = worker(run_id, 1), worker(run_id, 0)
        _wait_controlling(cloud, run_id, inventory)
        wait_until(
            "worker-1 past epoch 2",
            lambda: cloud.consoles(victim) and _epoch_of(cloud.consoles(victim)[-1]) >= 2,
            180,
            lambda: f"live: {inventory.last}",
        )
        during = cloud.leaks(run_id)
        for mark in cloud.identity:  # the end's leak check sees the controller's identity
            assert any(mark in x for x in during), (mark, during)
        cloud.take_back(victim)
        wait_until(  # attempt 2 began on the replacement: then training may go on
            "the replacement resumed",
            lambda: "resumed at epoch" in "".join(cloud.consoles(victim)[-1:]),
            240,
            lambda: f"live: {inventory.last}",
        )
        gate.touch()
        _wait_gone(cloud, inventory, timeout=240)
    finally:
        inventory.stop()
    took_s = time.monotonic() - started
    assert inventory.duplicates == [], inventory.duplicates
    assert inventory.creates() == {"worker-0": 1, "worker-1": 2, "controller-0": 1}, inventory.ids
    assert _epoch_of(cloud.consoles(chief)[-1]) == EPOCHS, cloud.consoles(chief)[-1][-3000:]
    replacement = cloud.consoles(victim)[-1]
    assert "cloudtrain: resumed at epoch" in replacement, replacement[-3000:]
    status = _status(cloud, tmp_path, run_id)
    assert (status["status"], status["outcome"]) == ("done", "succeeded"), status
    assert status["cost_usd"] > 0, status
    _assert_nothing_left(cloud, run_id)
    print(f"{provider}: detached in {detached_s:.1f} s, run over and clean in {took_s:.1f} s")
    if cloud.harness is not None:  # how much of its shutdown grace the controller's end took
        for vm_id in cloud.harness.vm_ids(controller_of(run_id)):
            print(cloud.harness.describe(vm_id))


def _price(cloud: Cloud, job: Path) -> float:
    """The plan's $/h for `job` (its nodes; the controller node's $/h comes on top at launch)."""
    proc = cloud.ct.cli("plan", "--json", *cloud.args(), str(job))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return float(json.loads(proc.stdout)["hourly_usd"])


# The budget affords AFFORDS seconds of the plan's $/h, and max_hours is about that long (the
# plan refuses an estimate over the budget). The stop comes when the cost so far plus the stop
# grace and teardown margin (local 20 + 10 s, clouds 30 + 300 s: runtypes.RunOptions) at the
# run's $/h (the controller node's included) reaches the budget: ~30-60 s in on local (its
# controller free or priced as a node), ~60-70 s on AWS; the deadline comes later.
AFFORDS = {"local": 90.0, "aws": 400.0}


@pytest.mark.parametrize("provider", ["local", "aws"])
def test_detached_budget_stop_flushes_the_checkpoint_and_deletes_everything(
    provider: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cloud = _cloud(request, provider)
    if provider == "local":  # $2/s a node
        cloud.setenv(CLOUDTRAIN_LOCAL_PRICE_USD="7200")
    hourly = _price(cloud, resumable_job(cloud.ct, "priced", 400, SECONDS, max_cost_usd=None))
    seconds = AFFORDS[provider]
    fields = {"max_cost_usd": hourly * seconds / 3600, "max_hours": 0.99 * seconds / 3600}
    job = resumable_job(cloud.ct, "budget", 400, SECONDS, **fields)
    run_id = _detach(cloud, job)
    inventory = Inventory(cloud, run_id)
    inventory.start()
    try:
        _wait_gone(cloud, inventory, timeout=300)
    finally:
        inventory.stop()
    assert inventory.duplicates == [], inventory.duplicates
    status = _status(cloud, tmp_path, run_id)
    assert (status["status"], status["outcome"]) == ("done", "budget_exceeded"), status
    assert 0 < status["cost_usd"] <= fields["max_cost_usd"], status
    chief = cloud.consoles(worker(run_id, 0))[-1]
    assert "final checkpoint flushed" in chief, chief[-3000:]
    epoch = _epoch_of(chief)
    assert 0 < epoch < 400, chief[-3000:]
    saved = [k for k in cloud.keys(run_id) if "/checkpoints/" in k]
    assert any(k.endswith(f"/epoch-{epoch}") for k in saved), (epoch, saved[-5:])
    _assert_nothing_left(cloud, run_id)


@pytest.mark.parametrize("provider", ["local", "aws"])
def test_controller_vm_dies_and_attach_takes_the_run_to_its_end(
    provider: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    cloud = _cloud(request, provider)
    # training holds until attach took the run: however slowly the controller VM boots, it
    # dies mid-run (a 30 s run left unheld was over by then once, under load), and attach
    # follows a run that still trains
    gate = tmp_path / "gate"
    job = resumable_job(cloud.ct, "orphan", EPOCHS, SECONDS, env=tick_held(gate, HOLD_AT))
    run_id = _detach(cloud, job)
    inventory = Inventory(cloud, run_id)
    inventory.start()
    try:
        chief = worker(run_id, 0)
        _wait_controlling(cloud, run_id, inventory)
        wait_until(
            "worker-0 past epoch 2",
            lambda: cloud.consoles(chief) and _epoch_of(cloud.consoles(chief)[-1]) >= 2,
            180,
            lambda: f"live: {inventory.last}",
        )
        cloud.power_cut(controller_of(run_id))
        at_cut = _epoch_of(cloud.consoles(chief)[-1])
        log = tmp_path / "attach.log"
        attach = cloud.ct.start("attach", run_id, log=log)
        try:
            wait_until(
                "attach took the run",
                lambda: "attached to run" in log.read_text(errors="replace"),
                180,
                lambda: log.read_text(errors="replace")[-3000:],
            )
            gate.touch()  # the workers train on, followed by attach
            assert attach.wait(timeout=300) == 0, log.read_text(errors="replace")[-5000:]
        finally:
            if attach.poll() is None:
                attach.kill()
        _wait_gone(cloud, inventory, timeout=120)
    finally:
        inventory.stop()
    assert inventory.duplicates == [], inventory.duplicates
    assert inventory.creates() == {"worker-0": 1, "worker-1": 1, "controller-0": 1}, inventory.ids
    final = cloud.consoles(chief)[-1]
    assert _epoch_of(final) == EPOCHS and at_cut <= HOLD_AT, (at_cut, final[-3000:])
    assert "resumed at epoch" not in final, "training went on through the controller's death"
    status = _status(cloud, tmp_path, run_id)
    assert (status["status"], status["outcome"]) == ("done", "succeeded"), status
    _assert_nothing_left(cloud, run_id)
