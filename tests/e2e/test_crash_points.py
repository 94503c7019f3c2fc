"""Crash safety: SIGKILL `cloudtrain run` at every named point, then `cloudtrain down RUN` must
leave nothing of the run: no node, security group / firewall / NSG, role / profile / service
account (and its bucket binding), resource group or role assignment, and no node process.

The points are `cloudtrain.core.crashpoints.POINTS` (the run dies by its own SIGKILL when
$CLOUDTRAIN_CRASH_AT names the point it reaches). Three need a situation first:
- `rendezvous`: worker-1 is slow to boot (the harness holds its VM; on local its session is
  stopped), so worker-0 waits for it and the controller sees it waiting;
- `training`: a job long enough for an epoch to be reported;
- `stop`: the same long job, and Ctrl-C once an epoch is reported.
On local there is no network, so the three network points cannot be reached there.

Each provider runs every point concurrently, each as its own run of one shared cloud (a fake),
and a last scenario crashes during training and deletes the ledger file: `down` then works from
the cloud's tags alone. Figures go to the reliability report (benchmarks/reliability.py).

After every scenario, every run the ledger held is checked again (a run no scenario tore down
leaks unseen otherwise), and on a cloud box no VM session may be left; each one left is named
with its run (so its scenario) and what the harness saw happen to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.core.crashpoints import CRASH_ENV, POINTS
from cloudtrain.providers.aws.network import TAG_RUN
from cloudtrain.providers.local import session_pids
from cloudtrain.state.ledger import Ledger
from tests.e2e import reliability_report, signals_kit
from tests.e2e.conftest import EXAMPLES, TICK, Env
from tests.e2e.test_aws_in_a_box import AwsBox, aws
from tests.e2e.test_azure_in_a_box import AzureBox, azure, azure_cloud, azurite, azurite_session
from tests.e2e.test_gcp_in_a_box import GcpBox, gcp, gcp_cloud, gcs_emulator, gcs_emulator_session

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
]
pytestmark = pytest.mark.e2e

NETWORK_POINTS = ("network-ledger", "network", "network-deleted")
# run --detach (issue 17): the CLI dies making the controller node (identity, node, handover)...
CONTROLLER_POINTS = (
    "controller-identity-ledger",
    "controller-identity",
    "controller-ledger",
    "controller-created",
    "handover",
)
# ... or the controller node's own process dies (the CLI detached with exit 0): the VM's
# environment names the point, so these run alone
NODE_SIDE_POINTS = ("controller-adopted", "controller-torn-down")
NODE_SIDE_CLOUDS = ("local", "aws")
# by these points the run's nodes had booted: a check that the leftover checks are not vacuous
BOOTED_POINTS = (
    "rendezvous",
    "training",
    "stop",
    "teardown-half",
    "nodes-deleted",
    *NODE_SIDE_POINTS,
)
LONG_JOB_POINTS = ("training", "stop")
REGIONS = {"local": None, "aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}


def _short(point: str) -> str:
    """The job name of a point's run (its run id starts with it)."""
    return f"c-{point}"


@dataclass
class World:
    """One provider's cloud for the scenarios: how to run there and what is left of a run."""

    provider: str
    ct: Env
    leftovers: Callable[[str], list[str]]
    hold: Callable[[str], None]  # make worker-1 of this job name slow to boot
    box: Any = None
    runs: set[str] = field(default_factory=set)  # every run a scenario made

    def controller_console(self, run_id: str) -> str:
        """The console of the run's controller node (its VM, or its local folder)."""
        name = f"ct-{run_id}-controller-0"
        if self.box is not None:
            return "".join(self.box.harness.console(v) for v in self.box.harness.vm_ids(name))
        path = self.ct.home / "local" / "runs" / run_id / "nodes" / name / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def crash_nodes_at(self, point: str | None) -> None:
        """Name the crash point in the environment of the nodes booted from now on (None: no
        more). On local the nodes inherit the CLI's environment, which names it already."""
        if self.box is not None:
            if point is None:
                self.box.harness.env.pop(CRASH_ENV, None)
            else:
                self.box.harness.env[CRASH_ENV] = point

    def booted(self, run_id: str) -> bool:
        """Whether a node of the run ever booted (a VM session, or a local node folder)."""
        if self.box is not None:
            return any(run_id in name for name in self.box.harness.booted)
        return any(self.ct.home.glob(f"local/runs/{run_id}/nodes/*/node.json"))

    def job(self, point: str) -> Path:
        """A two-worker job named for `point`, running tick.py instead of TensorFlow."""
        name = _short(point)
        dest = self.ct.home / "jobs" / name
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "tick.py").write_text(TICK)
        spec = yaml.safe_load((EXAMPLES / "digits-multiworker" / "job.yaml").read_text())
        spec.pop("setup", None)  # the example's scikit-learn check: tick.py needs none
        long_job = point in LONG_JOB_POINTS or point == "ledgerless"
        spec.update(
            name=name,
            workdir=".",
            entrypoint="python tick.py 60 0.5" if long_job else "python tick.py 2 0.2",
        )
        (dest / "job.yaml").write_text(yaml.safe_dump(spec))
        return dest / "job.yaml"

    def run_args(self) -> list[str]:
        region = REGIONS[self.provider]
        return ["--provider", self.provider] + (["--region", region] if region else [])


def _cli(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """`cloudtrain ARGS`, SIGINT at its default (the `stop` point sends it; a test run in the
    background would otherwise hand its ignored SIGINT down)."""
    return signals_kit.start(env, args, log=log, text=True)


def _runs(ledger_path: Path) -> list[str]:
    """Every run id the ledger holds, newest first."""
    return [r.run_id for r in Ledger(ledger_path).list_runs(limit=100_000)]


def _run_id(ledger_path: Path, point: str, timeout: float = 60) -> str | None:
    """The run id of the point's run, from the ledger (the run printed nothing reliable: its
    buffered output died with it). A run id is its job's name, a dash and six hex digits: the
    job's name must match whole, as a prefix would also match the run of a point whose name
    extends this one's (`network` and `network-ledger`, run at the same time)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ledger_path.exists():
            mine = [r for r in _runs(ledger_path) if r.rsplit("-", 1)[0] == _short(point)]
            if mine:
                return mine[0]
        time.sleep(0.1)
    return None


def _wait_for(log: Path, text: str, proc: subprocess.Popen[str], timeout: float = 180) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and text in log.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


def _crash_traces(ledger_path: Path, run_id: str) -> list[str]:
    """The `crash` events (detail and bounded traceback) the ledger holds for `run_id`."""
    try:
        events = Ledger(ledger_path).events(run_id)
    except Exception as exc:  # a diagnostic only: never hides the problem it explains
        return [f"{run_id}: its ledger events unreadable ({exc!r})"]
    return [f"{run_id} crash event:\n{e.message}" for e in events if e.kind == "crash"]


def crash_then_down(world: World, point: str, *, ledgerless: bool = False) -> list[str]:
    """Run the point's job until it SIGKILLs itself at `point`, then `cloudtrain down` it.
    Returns the problems found (empty: nothing leaked)."""
    ct = world.ct
    env = dict(ct.env)
    crash_at = "training" if ledgerless else point
    env[CRASH_ENV] = crash_at
    home = ct.home
    ledger_path = home / "ledger.db"
    name = "ledgerless" if ledgerless else point
    log = home / f"crash-{name}.log"
    if point == "rendezvous":
        world.hold(_short(point))
    detach = ["--detach"] if point in CONTROLLER_POINTS + NODE_SIDE_POINTS else []
    proc = _cli(env, "run", *world.run_args(), *detach, str(world.job(name)), log=log)
    try:
        if point == "stop":
            if not _wait_for(log, "epoch 1/", proc):
                return [f"{name}: no epoch seen before the stop; log:\n{log.read_text()[-3000:]}"]
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    problems: list[str] = []
    output = log.read_text(errors="replace")
    node_side = point in NODE_SIDE_POINTS
    if code != (0 if node_side else -signal.SIGKILL):
        problems.append(f"{name}: exit {code}, not a crash at {crash_at}; log:\n{output[-3000:]}")
    run_id = _run_id(ledger_path, name)
    if run_id is None:
        return [*problems, f"{name}: no run in the ledger"]
    world.runs.add(run_id)
    if problems:  # an unexpected end: the controller's traceback, which the ledger keeps
        problems += _crash_traces(ledger_path, run_id)
    if node_side:  # the controller node's process kills itself at the point, then its VM stops
        end = time.time() + 300
        while "phase agent: exited with 137" not in world.controller_console(run_id):
            if time.time() > end:
                console = world.controller_console(run_id)[-3000:]
                return [*problems, f"{name}: the controller node never crashed:\n{console}"]
            time.sleep(0.5)
    down_args = ["down", run_id]
    if ledgerless:  # the ledger file is lost: down has only the cloud's tags
        for path in home.glob("ledger.db*"):
            path.unlink()
        down_args += world.run_args()
    down = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", *down_args],
        env=ct.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if down.returncode != 0:
        problems.append(f"{name}: down exited {down.returncode}: {down.stdout}{down.stderr}")
    if (ledgerless or point in BOOTED_POINTS) and not world.booted(run_id):
        problems.append(f"{name}: no node of {run_id} ever booted; the checks prove nothing")
    problems += [f"{name}: left {what} of {run_id}" for what in world.leftovers(run_id)]
    if not ledgerless:
        rec = Ledger(ledger_path)
        live = [(r.kind, r.resource_id, r.state) for r in rec.resources(run_id, live_only=True)]
        if live:
            problems.append(f"{name}: the ledger still shows {live}")
    return problems


def _live_sessions(harness: Any) -> list[str]:
    """One problem per VM whose session still runs after the harness's settle: its run (whose
    job name is `c-<scenario>`) and what the harness saw of it (`BootHarness.describe`)."""
    problems = []
    for vm_id in harness.live_sessions():
        vm = harness.describe(vm_id)
        found = re.match(r"ct-(.+-[0-9a-f]{6})-", vm)
        run_id = found[1] if found else "?"
        problems.append(f"VM session still running, of run {run_id}: {vm}")
    return problems


def _local_world(ct: Env) -> World:
    def processes(run_id: str) -> list[str]:
        left = []
        for meta in ct.home.glob(f"local/runs/{run_id}/nodes/*/node.json"):
            pids = session_pids(int(json.loads(meta.read_text())["pid"]))
            left += [f"process {pid} of {meta.parent.name}" for pid in pids]
        return left

    def hold(job_name: str) -> None:
        """Stop worker-1's session as soon as it exists: it never registers."""

        def stopper() -> None:
            deadline = time.time() + 120
            while time.time() < deadline:
                pattern = f"local/runs/{job_name}-*/nodes/*-worker-1/node.json"
                for meta in ct.home.glob(pattern):
                    with contextlib.suppress(ValueError, OSError):
                        for pid in session_pids(int(json.loads(meta.read_text())["pid"])):
                            os.kill(pid, signal.SIGSTOP)
                        return
                time.sleep(0.005)

        threading.Thread(target=stopper, daemon=True).start()

    return World("local", ct, processes, hold)


def _harness_hold(box: Any) -> Callable[[str], None]:
    """For a cloud box: the harness does not boot worker-1 of the named job (a slow VM)."""

    def hold(job_name: str) -> None:
        box.harness.hold = lambda vm: job_name in vm.name and vm.name.endswith("-worker-1")

    return hold


def _aws_world(box: AwsBox) -> World:
    def leftovers(run_id: str) -> list[str]:
        left = [
            f"instance {i['InstanceId']} ({i['State']['Name']})"
            for i in box.instances()
            if {"Key": TAG_RUN, "Value": run_id} in i.get("Tags", [])
            and i["State"]["Name"] != "terminated"
        ]
        groups = box.ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [f"cloudtrain-{run_id}"]}]
        )["SecurityGroups"]
        left += [f"security group {g['GroupId']}" for g in groups]
        roles = [r["RoleName"] for r in box.iam.list_roles()["Roles"]]
        profiles = [
            p["InstanceProfileName"] for p in box.iam.list_instance_profiles()["InstanceProfiles"]
        ]
        left += [f"role {r}" for r in roles if run_id in r]
        left += [f"instance profile {p}" for p in profiles if run_id in p]
        return left

    return World("aws", box.ct, leftovers, _harness_hold(box), box)


def _gcp_world(box: GcpBox) -> World:
    def leftovers(run_id: str) -> list[str]:
        left = [
            f"instance {i['name']} ({i['status']})"
            for i in box.cloud.gce.instances()
            if run_id in i["name"]
        ]
        left += [f"firewall {f['name']}" for f in box.run_firewalls(run_id)]
        left += [f"service account {a['email']}" for a in box.run_accounts(run_id)]
        with contextlib.suppress(OSError):  # no bucket (a crash before it): no binding
            left += [f"bucket binding {b['role']}" for b in box.run_bindings(run_id)]
        return left

    return World("gcp", box.ct, leftovers, _harness_hold(box), box)


def _azure_world(box: AzureBox) -> World:
    def leftovers(run_id: str) -> list[str]:
        left = [f"vm {v['name']}" for v in box.run_vms(run_id)]
        group = box.run_group(run_id).lower()
        left += [f"group {g['name']}" for g in box.arm.groups() if g["name"].lower() == group]
        left += [
            r["id"]
            for r in box.arm.resources()
            if run_id in r["id"] and "/containers/" not in r["id"]
        ]
        principals = {v.principal for v in box.seen.values() if run_id in v.name and v.principal}
        left += [
            f"role assignment on {a['properties']['scope']}"
            for a in box.arm.role_assignments()
            if run_id in a["properties"]["scope"] or a["properties"]["principalId"] in principals
        ]
        return left

    return World("azure", box.ct, leftovers, _harness_hold(box), box)


def _world(provider: str, request: pytest.FixtureRequest) -> World:
    if provider == "local":
        return _local_world(request.getfixturevalue("ct"))
    box = request.getfixturevalue(provider)
    return {"aws": _aws_world, "gcp": _gcp_world, "azure": _azure_world}[provider](box)


@pytest.mark.parametrize("provider", ["local", "aws", "gcp", "azure"])
def test_a_crash_at_every_point_then_down_leaves_nothing(
    provider: str, request: pytest.FixtureRequest
) -> None:
    world = _world(provider, request)
    points = [p for p in POINTS if not (provider == "local" and p in NETWORK_POINTS)]
    # the controller node's own points boot a controller VM each (its venv, the wheel), one at
    # a time: on local and AWS (the same code on every cloud; each cloud's controller lifecycle
    # is test_managed_runs')
    points = [p for p in points if p not in NODE_SIDE_POINTS or provider in NODE_SIDE_CLOUDS]
    alone = [p for p in points if p in NODE_SIDE_POINTS]
    started = time.monotonic()
    # first, alone: the run's default bucket is shared, so only the first run creates it
    results = {"bucket": crash_then_down(world, "bucket")}
    rest = [p for p in points if p != "bucket" and p not in alone]
    with ThreadPoolExecutor(max_workers=3) as pool:
        found = pool.map(lambda p: crash_then_down(world, p), rest)
        results.update(zip(rest, found, strict=True))
    for point in alone:  # the nodes' environment names the point: one run at a time
        world.crash_nodes_at(point)
        try:
            results[point] = crash_then_down(world, point)
        finally:
            world.crash_nodes_at(None)
    # last, alone: it deletes the ledger file the other scenarios share
    made = set(_runs(world.ct.home / "ledger.db"))
    ledgerless = crash_then_down(world, "training", ledgerless=True)
    problems = [p for found in results.values() for p in found] + ledgerless
    for run_id in sorted(made | world.runs):  # a run no scenario tore down, or one that grew
        problems += [f"after every down: {run_id} left {what}" for what in world.leftovers(run_id)]
    if world.box is not None:
        problems += _live_sessions(world.box.harness)
    survived = sum(1 for found in results.values() if not found)
    reliability_report.record(
        "crash",
        provider,
        points=len(points),
        survived=survived,
        leaks=sum(1 for found in results.values() for p in found if ": left " in p),
        ledgerless_down=not ledgerless,
        seconds=round(time.monotonic() - started, 1),
    )
    assert not problems, "\n".join(problems)
