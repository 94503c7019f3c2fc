"""Each cloud's firewall, enforced by packets: the rules the adapter really made, read back from the
cloud's fake, compiled to nftables (tests/fakes/firewall_*.py) and loaded into the namespaces of
two member nodes (tests/fakes/netns.py); then TCP probes from a member and from an outsider on
the same bridge.

Per cloud, two runs through the provider (network first, then two nodes, as the orchestrator
does): one without SSH, one with `ssh: true` and `ssh_cidr` = the outsider's address; a node of
the first run, on a host of its own, is then an outsider of the same cloud to the second. A listener
on the member's every probed port answers whatever reaches it, so a probe that times out was
dropped by the firewall (nothing in the box refuses a connection otherwise). No booting, no
TensorFlow: each cloud's test takes a few seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cloudtrain.providers.base import Compute, NodeRequest, Provider, ProviderConfig, RunInfo
from tests.fakes import netns
from tests.fakes.azure_cloud import azure_cloud, azure_config, azurite, azurite_session
from tests.fakes.gce_fake import gce_fake
from tests.fakes.netns import Host, Network

boto3 = pytest.importorskip("boto3")
from tests.unit import aws_kit  # noqa: E402
from tests.unit.aws_kit import aws  # noqa: E402

__all__ = ["aws", "azure_cloud", "azurite", "azurite_session", "gce_fake"]  # fixtures

PORTS = (2222, 2232)  # the job's port range, as the orchestrator passes it
LOW, HIGH = PORTS
PROBED = (22, LOW - 1, LOW, HIGH, HIGH + 1)
PROBE_TIMEOUT_S = 0.5  # a dropped SYN on a local bridge never comes back later
SCRIPT = "#!/bin/bash\necho boot\n"


@pytest.fixture(autouse=True)
def _namespaces_possible() -> None:
    netns.require()  # fails, never skips: tests/run.sh installs what it needs


LISTENER = """
import socket, sys
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    socks.append(s)
print("ready", flush=True)
import selectors
sel = selectors.DefaultSelector()
for s in socks:
    sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        conn, _ = key.fileobj.accept()
        conn.close()
"""

PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
ip, timeout, ports = sys.argv[1], float(sys.argv[2]), [int(p) for p in sys.argv[3:]]
def probe(port):
    try:
        socket.create_connection((ip, port), timeout=timeout).close()
        return "open"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__
with ThreadPoolExecutor(len(ports)) as pool:
    print(json.dumps(dict(zip(map(str, ports), pool.map(probe, ports)))))
"""


def listen(host: Host, ports: tuple[int, ...]) -> subprocess.Popen[str]:
    """A TCP listener on `ports` of `host`, ready when this returns (the Network kills it)."""
    proc = host.popen(
        [sys.executable, "-c", LISTENER, *map(str, ports)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def probe(source: Host, target: Host, ports: tuple[int, ...] = PROBED) -> dict[int, str]:
    """Port -> "open", "timeout" (dropped) or the connect error, from `source` to `target`."""
    done = source.run(
        [sys.executable, "-c", PROBE, target.ip, str(PROBE_TIMEOUT_S), *map(str, ports)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return {int(k): v for k, v in json.loads(done.stdout).items()}


@dataclass
class Cloud:
    """One cloud's fake and how to read its firewall back, for the probes."""

    provider: Callable[[str | None], Provider]  # ssh_cidr -> the provider built with it
    run: Callable[[str, bool], RunInfo]  # (run id, ssh) -> the run
    request: Callable[[str, int], NodeRequest]  # (run id, index) -> a node request
    rulesets: Callable[[dict[str, str]], dict[str, str]]  # vm id -> box ip => vm id -> ruleset
    vm_id: Callable[[Any], str]  # a created Node -> the id the box (and the compiler) keys by


def stand_up(cloud: Cloud, run_id: str, ssh_cidr: str | None) -> list[str]:
    """The run's network and two nodes, made by the adapter; their vm ids."""
    compute: Compute = cloud.provider(ssh_cidr).compute
    run = cloud.run(run_id, ssh_cidr is not None)
    compute.ensure_network(run)
    return [cloud.vm_id(compute.create_node(run, cloud.request(run_id, i))) for i in (0, 1)]


def check_enforced(cloud: Cloud) -> None:
    """The probes of the module docstring, for one cloud."""
    with Network() as net:
        one, two, outsider = (net.add_host(n) for n in ("member-1", "member-2", "outsider"))
        for host in (one, two):
            listen(host, PROBED)
        assert probe(outsider, one)[LOW] == "open", "without rules everything is reachable"

        ids = stand_up(cloud, "fwprobe1", None)
        rulesets = cloud.rulesets({ids[0]: one.ip, ids[1]: two.ip})
        assert set(rulesets) == set(ids)
        one.apply_nft(rulesets[ids[0]])
        two.apply_nft(rulesets[ids[1]])
        seen = probe(two, one)
        assert seen == {
            22: "timeout",
            LOW - 1: "timeout",
            LOW: "open",
            HIGH: "open",
            HIGH + 1: "timeout",
        }, seen
        assert probe(one, two, (LOW, HIGH)) == {LOW: "open", HIGH: "open"}
        assert set(probe(outsider, one).values()) == {"timeout"}, "an outsider reaches nothing"

        # the second run, with SSH from the outsider; a node of the first run stays, on a host
        # of its own: it is in the same cloud but not in this run's group, tag or VNet
        first = ids[0]
        other = net.add_host("other-run")
        listen(other, PROBED)
        ids = stand_up(cloud, "fwprobe2", f"{outsider.ip}/32")
        rulesets = cloud.rulesets({ids[0]: one.ip, ids[1]: two.ip, first: other.ip})
        one.apply_nft(rulesets[ids[0]])
        two.apply_nft(rulesets[ids[1]])
        other.apply_nft(rulesets[first])
        assert set(probe(other, one).values()) == {"timeout"}, "another run reaches nothing"
        assert set(probe(one, other).values()) == {"timeout"}, "nor does this run reach it"
        assert set(probe(outsider, other).values()) == {"timeout"}, "its SSH stays closed"
        assert probe(outsider, one) == {
            22: "open",
            LOW - 1: "timeout",
            LOW: "timeout",
            HIGH: "timeout",
            HIGH + 1: "timeout",
        }
        assert probe(two, one, (22, LOW)) == {22: "timeout", LOW: "open"}, "SSH: its CIDR only"


# --- AWS (moto in process, as tests/unit/aws_kit.py sets it up) ---------------------------------


@pytest.fixture
def aws_cloud(aws: None) -> Cloud:
    from cloudtrain.providers.aws.provider import AwsProvider
    from tests.fakes.firewall_aws import aws_rulesets

    def provider(cidr: str | None) -> Provider:
        options = {"ssh_cidr": cidr} if cidr else {}
        return AwsProvider(ProviderConfig("aws", aws_kit.REGION, options=options))

    ec2 = boto3.client("ec2", region_name=aws_kit.REGION)
    return Cloud(
        provider,
        lambda run_id, ssh: aws_kit.run_info(ssh=ssh, run_id=run_id),
        lambda run_id, i: aws_kit.request(index=i, gpus=0, run_id=run_id, script=SCRIPT),
        lambda vm_to_ip: aws_rulesets(ec2, vm_to_ip),
        lambda node: str(node.cloud_id),
    )


def test_aws_security_group_is_enforced(aws_cloud: Cloud) -> None:
    check_enforced(aws_cloud)


# --- GCP (the GCE fake, through google-cloud-compute) --------------------------------------------


@pytest.fixture
def gcp_cloud(gce_fake: Any, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    pytest.importorskip("google.cloud.compute_v1")
    from cloudtrain.providers.gcp.provider import GcpProvider
    from tests.fakes.firewall_gcp import gcp_rulesets

    project, region, zone = "ct-fw-project", "us-central1", "us-central1-a"
    monkeypatch.setenv("CLOUDTRAIN_GCE_ENDPOINT", gce_fake.url)
    monkeypatch.setenv("CLOUDTRAIN_IAM_ENDPOINT", gce_fake.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project)
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_GCP_NETWORK", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_GCP_SERVICE_ACCOUNT", raising=False)
    gce_fake.operation_polls_to_done = 0

    def provider(cidr: str | None) -> Provider:
        options = {"ssh_cidr": cidr} if cidr else {}
        return GcpProvider(ProviderConfig("gcp", region, zone, options=options))

    def request(run_id: str, index: int) -> NodeRequest:
        return NodeRequest(run_id, "worker", index, "n1-standard-4", SCRIPT, zone=zone)

    return Cloud(
        provider,
        lambda run_id, ssh: RunInfo(run_id, region, zone, PORTS, ssh=ssh),
        request,
        lambda vm_to_ip: gcp_rulesets(gce_fake.url, project, vm_to_ip),
        lambda node: str(node.cloud_id),  # GCE's numeric instance id, as the box keys VMs
    )


def test_gcp_firewall_rules_are_enforced(gcp_cloud: Cloud) -> None:
    check_enforced(gcp_cloud)


# --- Azure (the ARM fake, through azure-mgmt; Azurite for the run's container) ----------------


@pytest.fixture
def azure_box(azure_cloud: Any, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    from cloudtrain.providers.azure.provider import AzureProvider
    from tests.fakes.arm_testkit import SUB
    from tests.fakes.firewall_azure import azure_rulesets

    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", raising=False)
    arm = azure_cloud.arm
    arm.lro_polls = 0  # operations done in their first answer: the probes are the subject
    token = arm.credential().get_token("https://management.azure.com/.default").token

    def provider(cidr: str | None) -> Provider:
        options = {"ssh_cidr": cidr} if cidr else {}
        return AzureProvider(azure_config("eastus", **options))

    def run(run_id: str, ssh: bool) -> RunInfo:
        store = f"az://devstoreaccount1/ct-{run_id}"
        provider(None).store(store).ensure_bucket()
        return RunInfo(run_id, "eastus", None, PORTS, ssh=ssh, store_uri=store)

    def request(run_id: str, index: int) -> NodeRequest:
        return NodeRequest(run_id, "worker", index, "Standard_D4s_v5", SCRIPT)

    def vm_id(node: Any) -> str:  # the ARM id -> the vmId the box keys VMs by
        (vm,) = [v for v in arm.resources("virtualMachines") if v["id"] == node.cloud_id]
        return str(vm["properties"]["vmId"])

    return Cloud(
        provider,
        run,
        request,
        lambda vm_to_ip: azure_rulesets(arm.url, arm.ca_path, SUB, token, vm_to_ip),
        vm_id,
    )


def test_azure_nsg_is_enforced(azure_box: Cloud) -> None:
    check_enforced(azure_box)
