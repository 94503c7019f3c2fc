"""Machines in the box (issue 16): the AWS cloud box with every node its own host behind the
security group the adapter made, enforced as nftables in each node's namespace.

The box is test_aws_in_a_box's, with the harness in namespace mode (tests/fakes/netns.py): moto
listens on the network's host address, so the controller and the nodes use one endpoint and the
presigned URLs work from every namespace; each instance boots in its own namespace, asks the
metadata service for its address and listens on the job's port. Before each instance's script
starts, the run's security groups are read back from moto and compiled (tests/fakes/
firewall_aws.py) into every booted instance's namespace, so a group's membership follows the
instances as they come, as on AWS. Default deny inbound: only what the group allows gets in.

- a multi-worker run and a parameter-server run train to success through the rules;
- a wrong rule (the compiled port range shifted by one, the job's port outside it) fails the run
  with the agent's rendezvous error naming the unreachable peer;
- SSH (not asked for) is closed, and an outsider (a host in no group) cannot reach the run's
  ports, while a member can.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Env
from tests.e2e.test_aws_in_a_box import BUCKET, REGION, AwsBox, _discover
from tests.fakes import netns
from tests.fakes.boot_harness import BootHarness, Vm
from tests.fakes.firewall_aws import AwsSnapshot, compile_aws, read_aws
from tests.fakes.imds_credentials_aws import Ec2RoleCredentials
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.moto_server import clear_aws_caches, seed_public_images, start_moto, use_moto
from tests.fakes.netns import Host, Network
from tests.fakes.netns_probe import connect, listen

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
]


@pytest.fixture(autouse=True)
def _namespaces_possible() -> None:
    netns.require()  # fails, never skips: tests/run.sh installs what it needs


Mutate = Callable[[AwsSnapshot], AwsSnapshot]


class Firewall:
    """Compiles the groups moto holds into every booted instance's namespace (before_boot)."""

    def __init__(self, ec2: Any, harness: BootHarness) -> None:
        self.ec2, self.harness = ec2, harness
        self.mutate: Mutate = lambda snapshot: snapshot
        self.applied: dict[str, str] = {}  # instance id -> its ruleset now
        self._lock = threading.Lock()

    def __call__(self, _vm: Vm, _host: Host) -> None:
        with self._lock:
            hosts = dict(self.harness.hosts)
            rulesets = compile_aws(
                self.mutate(read_aws(self.ec2)), {i: h.ip for i, h in hosts.items()}
            )
            for iid, host in hosts.items():
                if iid in rulesets:  # not a terminating instance (the harness drops its host)
                    host.apply_nft(rulesets[iid])
                    self.applied[iid] = rulesets[iid]


def shift_run_ports(snapshot: AwsSnapshot) -> AwsSnapshot:
    """The wrong rule: each cloudtrain group's port range moved up by one (job's port outside)."""
    groups = copy.deepcopy(snapshot.groups)
    for group in groups:
        if str(group.get("GroupName", "")).startswith("cloudtrain-"):
            for perm in group.get("IpPermissions") or []:
                if "FromPort" in perm and perm.get("FromPort") != 22:
                    perm["FromPort"] += 1
                    perm["ToPort"] += 1
    return AwsSnapshot(groups, snapshot.instances)


class NetBox(AwsBox):
    network: Network
    firewall: Firewall


@pytest.fixture
def box(ct: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NetBox]:
    import os

    import boto3

    network = Network()
    server = start_moto(network.host_ip)
    # the instances' role credentials (tests/fakes/imds_credentials_aws.py), on the bridge
    imds = MetadataServer(host=network.host_ip)
    Ec2RoleCredentials(server.url, REGION).install(imds)
    harness: BootHarness | None = None
    try:
        server.reset()  # moto's backends are per process: forget the other tests' resources
        use_moto(monkeypatch, server)
        clear_aws_caches()
        images = seed_public_images((REGION,))
        ct.env.update({k: v for k, v in os.environ.items() if k.startswith(("AWS_", "NO_PROXY"))})
        clients = {
            name: boto3.client(name, region_name=REGION, endpoint_url=server.url)
            for name in ("ec2", "s3", "iam")
        }
        ec2 = clients["ec2"]
        harness = BootHarness(
            tmp_path / "box",
            lambda: _discover(ec2, images, imds.url),
            dict(ct.env),
            on_power_off=lambda vm: ec2.terminate_instances(InstanceIds=[vm]),
            network=network,
        )
        firewall = Firewall(ec2, harness)
        harness.before_boot = firewall
        harness.start()
        box = NetBox(ct, harness, ec2, clients["s3"], clients["iam"], imds, server)
        box.network, box.firewall = network, firewall
        yield box
    finally:
        if harness is not None:
            harness.stop()
        imds.close()
        server.stop()
        clear_aws_caches()
        network.close()


def job(ct: Env, example: str, epochs: int = 1, **fields: Any) -> Path:
    return ct.job(example, entrypoint=f"python train.py --epochs {epochs}", **fields)


def run_port(box: NetBox) -> int:
    """The low end of the run group's cluster range, as the adapter authorized it."""
    groups = box.ec2.describe_security_groups()["SecurityGroups"]
    ports = [
        perm["FromPort"]
        for g in groups
        if g["GroupName"].startswith("cloudtrain-")
        for perm in g["IpPermissions"]
        if perm.get("UserIdGroupPairs")
    ]
    assert ports, groups
    return min(ports)


def wait_hosts(box: NetBox, count: int, timeout: float = 120) -> list[Host]:
    deadline = time.monotonic() + timeout
    while len(box.firewall.applied) < count:
        assert time.monotonic() < deadline, f"{len(box.firewall.applied)} of {count} booted"
        time.sleep(0.2)
    return [box.harness.host_of(iid) for iid in box.firewall.applied]


def test_multiworker_trains_through_the_group_and_ssh_and_outsiders_are_shut_out(
    box: NetBox,
) -> None:
    cli = box.ct.start(
        "run", "--provider", "aws", "--region", REGION, str(job(box.ct, "digits-multiworker"))
    )
    try:
        first, second = wait_hosts(box, 2)
        assert first.ip != second.ip
        port = run_port(box)
        outsider = box.network.add_host("outsider")
        listen(first, 22)  # something answers on 22, so only the firewall can keep it shut
        listen(first, port + 10)  # the top of the run's range
        assert connect(second, first.ip, port + 10) == 0  # a member gets in
        assert connect(second, first.ip, 22) == 2  # SSH was not asked for: dropped
        assert connect(outsider, first.ip, port + 10) == 2  # a host in no group: dropped
        assert connect(outsider, first.ip, port) == 2
        assert cli.wait(timeout=240) == 0, box.ct.output()[-4000:]
    finally:
        if cli.poll() is None:
            cli.kill()
    out = box.ct.output()
    assert "succeeded" in out, out[-3000:]
    (run_id,) = box.ct.run_ids()
    assert len(box.harness.booted) == 2
    keys = box.keys(f"cloudtrain/runs/{run_id}/")
    assert f"cloudtrain/runs/{run_id}/model/saved_model/saved_model.pb" in keys
    # each node registered its own address (from its route, not a loopback) and the job's port
    registered = {
        json.loads(box.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())["address"]
        for key in keys
        if "/attempt-" in key and "/nodes/" in key and key.endswith(".json")
    }
    assert registered == {f"{first.ip}:{port}", f"{second.ip}:{port}"}
    box.assert_nodes_ran_under_their_roles(run_id)  # from the bridge's metadata service
    box.assert_nothing_left(run_id)


def test_parameter_server_trains_through_the_group(box: NetBox) -> None:
    cluster = dict(
        strategy="parameter_server", chief=1, workers=1, ps=1, accelerator="T4:1", spot=False
    )
    path = job(box.ct, "digits-ps", cluster=cluster)
    proc = box.run("run", "--provider", "aws", "--region", REGION, str(path), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_id,) = box.ct.run_ids()
    assert len(box.harness.booted) == 3
    assert len(set(box.firewall.applied)) == 3
    box.assert_nothing_left(run_id)


def test_a_port_range_off_by_one_fails_the_rendezvous_naming_the_peer(box: NetBox) -> None:
    box.firewall.mutate = shift_run_ports
    started = time.monotonic()
    path = job(box.ct, "digits-multiworker")
    proc = box.run("run", "--provider", "aws", "--region", REGION, str(path), timeout=240)
    elapsed = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-4000:]
    assert "rendezvous: worker-" in out and "never answered" in out, out[-4000:]
    assert elapsed < 180, elapsed
    (run_id,) = box.ct.run_ids()
    box.assert_nothing_left(run_id)
