"""What tests/e2e/test_managed_runs.py needs of each box: one `Cloud` per provider (its live
nodes of a run by name, how the cloud takes a node back, a node's console, the leak check with the
controller's identity), a resumable tick job, and an `Inventory` that polls the cloud's nodes the
whole run long to catch a duplicate the moment it exists.

A "node" here is what the cloud lists: an EC2 instance (pending or running), a GCE instance
(PROVISIONING, STAGING or RUNNING), an Azure VM (listed), a local node (a live process session
under the local provider's folder). Identified by the cloud's own id, so a node re-created under
the same name counts as a new create.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cloudtrain.providers.base import node_name
from cloudtrain.providers.local import WORK_ENV, session_pids
from tests.e2e.conftest import EXAMPLES, TICK_HOLD, Env
from tests.fakes.boot_harness import BootHarness

PREFIX = "cloudtrain/runs/"  # a run's keys: under PREFIX<run id>/
LEASE_TTL_S = "6"  # the controller's lease expires fast, so attach takes over within seconds
# A tick job that checkpoints: each epoch writes `epoch-<n>` into CLOUDTRAIN_CHECKPOINT_DIR (the
# chief's folder the agent mirrors to the bucket and restores at each attempt) and a restarted
# attempt resumes after the last one there, as Keras' BackupAndRestore does; no TensorFlow.
RESUMABLE_TICK = (
    "import os, sys, time\nfrom pathlib import Path\n"
    + TICK_HOLD
    + """\
epochs, seconds = int(sys.argv[1]), float(sys.argv[2])
ckpt = Path(os.environ.get("CLOUDTRAIN_CHECKPOINT_DIR") or "checkpoints")
ckpt.mkdir(parents=True, exist_ok=True)
done = max((int(p.name.split("-")[1]) for p in ckpt.glob("epoch-*")), default=0)
if done:
    print(f"cloudtrain: resumed at epoch {done + 1}", flush=True)
for i in range(done + 1, epochs + 1):
    hold(i)
    time.sleep(seconds)
    (ckpt / f"epoch-{i}").write_text(str(i))
    print(f"cloudtrain: epoch {i}/{epochs} done", flush=True)
"""
)


def resumable_job(ct: Env, name: str, epochs: int, seconds: float, **fields: Any) -> Path:
    """Two workers (digits-multiworker's spec, `spot: true` unless `cluster` says otherwise)
    running RESUMABLE_TICK; `fields` override job.yaml's. With `env=conftest.tick_held(...)`
    (its path on this machine: the boxes' VMs share its files), training holds after that epoch
    until the test creates the path: an event, not a race against the clock."""
    dest = ct.home / "jobs" / name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tick.py").write_text(RESUMABLE_TICK)
    spec = yaml.safe_load((EXAMPLES / "digits-multiworker" / "job.yaml").read_text())
    spec.pop("setup", None)
    spec["cluster"]["spot"] = True
    spec.update(name=name, workdir=".", entrypoint=f"python tick.py {epochs} {seconds}", **fields)
    (dest / "job.yaml").write_text(yaml.safe_dump(spec))
    return dest / "job.yaml"


@dataclass
class Cloud:
    """One box as the managed-run tests drive it."""

    provider: str
    region: str | None
    ct: Env
    live: Callable[[str], list[tuple[str, str]]]  # run id -> (node name, cloud id) of live nodes
    take_back: Callable[[str], None]  # node name: the cloud preempts / evicts it
    consoles: Callable[[str], list[str]]  # node name -> the console of each incarnation
    leaks: Callable[[str], list[str]]  # run id -> what is left of it in the cloud (empty: none)
    power_cut: Callable[[str], None]  # node name: the VM dies (no shutdown), still listed
    keys: Callable[[str], list[str]]  # run id -> the keys of its bucket prefix
    harness: BootHarness | None = None
    # what `leaks` shows of the controller's identity while it exists (so its absence at the
    # end means it is gone, not that `leaks` cannot see it)
    identity: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # set in the CLI's and the VMs' env

    def args(self) -> list[str]:
        """`--provider P [--region R]`."""
        return ["--provider", self.provider, *(["--region", self.region] if self.region else [])]

    def setenv(self, **values: str) -> None:
        """Set knobs for the CLI and for every VM booted from now on."""
        self.ct.env.update(values)
        if self.harness is not None:
            self.harness.env.update(values)

    def fresh_cli(self, tmp: Path, *args: str, timeout: float = 120) -> Any:
        """`cloudtrain ARGS` from a new, empty CLOUDTRAIN_HOME (another machine). On local the
        "cloud" is this machine's folders under the home (its bucket, `buckets/`, and its nodes,
        `local/`): the other machine sees the same ones, as it would a cloud's."""
        home = tmp / f"fresh-home-{time.monotonic_ns()}"
        home.mkdir(parents=True)
        if self.provider == "local":
            for shared in ("buckets", "local"):
                (home / shared).symlink_to(self.ct.home / shared)
        env = dict(self.ct.env, CLOUDTRAIN_HOME=str(home))
        return subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli.main", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


class Inventory(threading.Thread):
    """Polls `cloud.live(run_id)` every 0.2 s until `stop()`: every cloud id seen per node name
    (`ids`), and each moment two live nodes shared a name (`duplicates`)."""

    def __init__(self, cloud: Cloud, run_id: str) -> None:
        super().__init__(daemon=True, name="inventory")
        self.cloud, self.run_id = cloud, run_id
        self.ids: dict[str, list[str]] = collections.defaultdict(list)
        self.duplicates: list[dict[str, list[str]]] = []
        self.errors: list[str] = []
        self.last: list[tuple[str, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                live = self.cloud.live(self.run_id)
            except Exception as exc:  # an emulator answering mid-change: noted, polled again
                self.errors.append(repr(exc))
            else:
                self.last = live
                by_name: dict[str, list[str]] = collections.defaultdict(list)
                for name, cloud_id in live:
                    by_name[name].append(cloud_id)
                    if cloud_id not in self.ids[name]:
                        self.ids[name].append(cloud_id)
                dup = {name: ids for name, ids in by_name.items() if len(ids) > 1}
                if dup:
                    self.duplicates.append(dup)
            self._stop_event.wait(0.2)

    def creates(self) -> dict[str, int]:
        """Node name (its role-index tail) -> how many incarnations were seen."""
        return {name.split(f"{self.run_id}-", 1)[-1]: len(ids) for name, ids in self.ids.items()}

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def wait_until(
    what: str, check: Callable[[], object], timeout: float, detail: Callable[[], str]
) -> Any:
    """Poll `check` every 0.3 s until truthy (returned); AssertionError naming `what` after
    `timeout` s, with `detail()`."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout:.0f} s: {what}\n{detail()}")
        time.sleep(0.3)


# -- the clouds --------------------------------------------------------------------------------


def _box_consoles(harness: BootHarness) -> Callable[[str], list[str]]:
    return lambda name: [harness.console(vm_id) for vm_id in harness.vm_ids(name)]


def _box_power_cut(harness: BootHarness) -> Callable[[str], None]:
    def cut(name: str) -> None:
        (vm_id,) = harness.vm_ids(name)[-1:]
        harness.kill(vm_id)

    return cut


def node_sessions(nodes: Path) -> list[tuple[str, str]]:
    """The live local nodes under the folder `nodes`, as the machine runs them: every process
    session one of whose live processes has CT_WORK (the node's folder, which the local
    provider gives each node's session and its processes inherit) in `nodes`, by node name and
    session id. Unlike the nodes' node.json (one per name), this sees two sessions of one name.
    A child between its setsid() and its exec() (a copy of its parent, same environment and
    command line, in a new session: the controller starting a node) is not a session of its own
    yet (tests/e2e/test_managed_kit.py)."""
    marker = f"{WORK_ENV}={nodes}{os.sep}".encode()
    found: set[tuple[str, str]] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            names = [i[len(marker) :] for i in environ.split(b"\0") if i.startswith(marker)]
            if not names:  # not a node's process: no more to read of it
                continue
            state, ppid = proc_stat(entry)
            sid = os.getsid(int(entry))
        except OSError:  # gone meanwhile (ProcessLookupError is an OSError)
            continue
        if state == "Z" or _forked_not_yet_execd(entry, ppid, environ, sid):
            continue
        name = names[0].decode(errors="replace").split(os.sep)[0]
        found.add((name, str(sid)))
    return sorted(found)


def proc_stat(pid: str | int) -> tuple[str, int]:
    """Process `pid`'s state letter and parent pid, from /proc/<pid>/stat (the command name in
    parentheses may hold spaces and parentheses: the fields after its last ')' are read).
    OSError when the process is gone."""
    state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[:2]
    return state, int(ppid)


def _forked_not_yet_execd(pid: str, ppid: int, environ: bytes, sid: int) -> bool:
    """Whether process `pid` is its parent's copy in another session: same environment and
    command line as `ppid`, so it has not exec'd since its fork and setsid."""
    try:
        return (
            sid != os.getsid(ppid)
            and Path(f"/proc/{ppid}/environ").read_bytes() == environ
            and Path(f"/proc/{ppid}/cmdline").read_bytes()
            == Path(f"/proc/{pid}/cmdline").read_bytes()
        )
    except OSError:  # the parent (or the child) gone meanwhile
        return False


def local_cloud(ct: Env) -> Cloud:
    """The local provider: nodes are process sessions under $CLOUDTRAIN_HOME/local, priced at
    $3.60/h each (free by default: a run's cost would show nothing)."""
    ct.env["CLOUDTRAIN_LOCAL_PRICE_USD"] = "3.6"

    def live(run_id: str) -> list[tuple[str, str]]:
        return node_sessions(ct.home / "local" / "runs" / run_id / "nodes")

    def node_dir(name: str) -> Path:
        (found,) = ct.home.glob(f"local/runs/*/nodes/{name}")
        return found

    def take_back(name: str) -> None:  # the whole node goes at once, as a VM taken back does
        meta = json.loads((node_dir(name) / "node.json").read_text())
        for pid in session_pids(int(meta["pid"])):
            os.kill(pid, signal.SIGKILL)

    def consoles(name: str) -> list[str]:
        path = node_dir(name) / "console.log"
        return [path.read_text(errors="replace")] if path.exists() else []

    def leaks(run_id: str) -> list[str]:
        return [f"local node {name} (session {sid})" for name, sid in live(run_id)]

    def keys(run_id: str) -> list[str]:
        root = ct.bucket / run_id
        return [f"{PREFIX}{run_id}/{p.relative_to(root)}" for p in root.rglob("*") if p.is_file()]

    return Cloud("local", None, ct, live, take_back, consoles, leaks, take_back, keys)


def aws_cloud(box: Any) -> Cloud:
    """The AWS box (tests/e2e/test_aws_in_a_box.AwsBox)."""
    from tests.e2e.test_aws_in_a_box import REGION
    from tests.e2e.test_evict_replace import reclaim_spot_instance

    def named(inst: dict[str, Any]) -> str:
        return next((t["Value"] for t in inst.get("Tags", []) if t["Key"] == "Name"), "")

    def of_run(run_id: str) -> list[dict[str, Any]]:
        return [i for i in box.instances() if run_id in named(i)]

    def live(run_id: str) -> list[tuple[str, str]]:
        return [
            (named(i), i["InstanceId"])
            for i in of_run(run_id)
            if i["State"]["Name"] in ("pending", "running")
        ]

    def take_back(name: str) -> None:
        (inst,) = [
            i for i in box.instances() if named(i) == name and i["State"]["Name"] == "running"
        ]
        assert inst.get("InstanceLifecycle") == "spot", inst
        reclaim_spot_instance(box, REGION, inst["InstanceId"])

    def leaks(run_id: str) -> list[str]:
        left = [f"instance {named(i)} {i['State']['Name']}" for i in of_run(run_id)]
        left = [x for x in left if not x.endswith(" terminated")]
        groups = box.ec2.describe_security_groups()["SecurityGroups"]
        left += [f"security group {g['GroupName']}" for g in groups if run_id in g["GroupName"]]
        left += [
            f"role {r['RoleName']}"
            for r in box.iam.list_roles()["Roles"]
            if run_id in r["RoleName"]
        ]
        left += [
            f"instance profile {p['InstanceProfileName']}"
            for p in box.iam.list_instance_profiles()["InstanceProfiles"]
            if run_id in p["InstanceProfileName"]
        ]
        left += [
            f"policy {p['PolicyName']}"
            for p in box.iam.list_policies(Scope="Local")["Policies"]
            if run_id in p["PolicyName"]
        ]
        return left

    def keys(run_id: str) -> list[str]:
        return list(box.keys(f"{PREFIX}{run_id}/"))

    h = box.harness
    return Cloud(
        "aws",
        REGION,
        box.ct,
        live,
        take_back,
        _box_consoles(h),
        leaks,
        _box_power_cut(h),
        keys,
        h,
        ("-controller",),  # its role and instance profile: cloudtrain-<run>-controller
    )


def gcp_cloud_of(box: Any) -> Cloud:
    """The GCP box (tests/e2e/test_gcp_in_a_box.GcpBox)."""
    from tests.e2e.test_gcp_in_a_box import REGION

    gce = box.cloud.gce

    def live(run_id: str) -> list[tuple[str, str]]:
        return [
            (i["name"], str(i["id"]))
            for i in gce.instances()
            if run_id in i["name"] and i["status"] in ("PROVISIONING", "STAGING", "RUNNING")
        ]

    def leaks(run_id: str) -> list[str]:
        left = [
            f"instance {i['name']} {i['status']}" for i in gce.instances() if run_id in i["name"]
        ]
        left += [f"firewall {f['name']}" for f in box.run_firewalls(run_id)]
        left += [
            f"service account {a['email']}"
            for a in gce.service_accounts()
            if run_id in json.dumps(a)
        ]
        left += [f"bucket binding {b}" for b in box.run_bindings(run_id)]
        # the controller's grants on the project (instanceAdmin under a condition naming the
        # run's instance prefix; a deleted account's member keeps its email)
        project = gce.iam_policy("project", box.cloud.project)
        left += [
            f"project binding {b}" for b in project.get("bindings") or [] if run_id in json.dumps(b)
        ]
        return left

    def keys(run_id: str) -> list[str]:
        return list(box.keys(f"{PREFIX}{run_id}/"))

    h = box.harness
    return Cloud(
        "gcp",
        REGION,
        box.ct,
        live,
        gce.preempt,
        _box_consoles(h),
        leaks,
        _box_power_cut(h),
        keys,
        h,
        ("service account ", "project binding "),
    )


def azure_cloud_of(box: Any) -> Cloud:
    """The Azure box (tests/e2e/test_azure_in_a_box.AzureBox)."""
    from tests.e2e.test_azure_in_a_box import REGION

    arm = box.arm

    def vms(run_id: str) -> list[dict[str, Any]]:
        return [v for v in arm.resources(kind="virtualMachines") if run_id in v["name"]]

    def live(run_id: str) -> list[tuple[str, str]]:
        return [(v["name"], v["properties"]["vmId"]) for v in vms(run_id)]

    def take_back(name: str) -> None:
        (vm,) = [v for v in arm.resources(kind="virtualMachines") if v["name"] == name]
        props = vm["properties"]
        assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete"), props
        arm.evict(name, vm["id"].split("/")[4])

    def leaks(run_id: str) -> list[str]:
        left = [f"vm {v['name']}" for v in vms(run_id)]
        group = box.run_group(run_id).lower()
        left += [f"group {g['name']}" for g in arm.groups() if g["name"].lower() == group]
        left += [
            r["id"]
            for r in arm.resources()
            if run_id in r["id"] and "/containers/" not in r["id"]  # the container keeps the model
        ]
        holders = {vm.principal: vm.name for vm in box.seen.values() if vm.principal}
        for a in box.run_assignments(run_id):
            principal = a["properties"]["principalId"]
            holder = holders.get(principal, "an identity of no VM seen")
            left.append(f"role assignment at {a['properties']['scope']} for {principal} ({holder})")
        return left

    def keys(run_id: str) -> list[str]:
        return list(box.keys(run_id, f"{PREFIX}{run_id}/"))

    h = box.harness
    return Cloud(
        "azure",
        REGION,
        box.ct,
        live,
        take_back,
        _box_consoles(h),
        leaks,
        _box_power_cut(h),
        keys,
        h,
        ("-controller-0)",),  # its system identity's role assignments
    )


def controller_of(run_id: str) -> str:
    return node_name(run_id, "controller", 0)


def worker(run_id: str, index: int) -> str:
    return node_name(run_id, "worker", index)
