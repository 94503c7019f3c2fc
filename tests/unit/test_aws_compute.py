"""AwsCompute (providers/aws/compute.py, network.py, identity.py) against moto, in process.

Each test runs inside `moto.mock_aws()` with throwaway credentials, the session caches cleared,
and the two public AMI SSM parameters seeded through moto's backend (moto refuses `put_parameter`
under `/aws/`). What moto does not do is simulated on the client: errors are raised from a
`before-call` hook, slow terminations are made by rewriting DescribeInstances answers, and a
stale ClientToken hit is a short-circuited RunInstances answer.
"""

from __future__ import annotations

import base64
import gzip
import importlib
import json
import os
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from botocore.awsrequest import AWSResponse  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from cloudtrain import retry  # noqa: E402
from cloudtrain.errors import (  # noqa: E402
    NoCapacityError,
    ProviderError,
    QuotaError,
    TransientError,
)
from cloudtrain.providers.aws import compute as compute_mod  # noqa: E402
from cloudtrain.providers.aws import images, network, zones  # noqa: E402
from cloudtrain.providers.aws.bodies import client_token, user_data  # noqa: E402
from cloudtrain.providers.aws.compute import AwsCompute  # noqa: E402
from cloudtrain.providers.aws.identity import parse_s3_uri, s3_policy  # noqa: E402
from cloudtrain.providers.base import NodeRequest, Resource, RunInfo, node_name  # noqa: E402
from cloudtrain.providers.retrying import RetryingCompute  # noqa: E402
from cloudtrain.startup import StartupParams, render_startup  # noqa: E402
from tests.fakes.shell import require_tool  # noqa: E402

REGION = "us-east-1"
GPU_AMI = "ami-0a1b2c3d4e5f60001"
CPU_AMI = "ami-0a1b2c3d4e5f60002"
STORE = "s3://ct-test-bucket/team/a"
RUN = "r1"
GPU_IMAGE_PARAM = images.DLAMI_2204.ref
CPU_IMAGE_PARAM = images.UBUNTU_2204.ref


def _clear_caches() -> None:
    # the clients module keeps the cached clients:
    session_module = importlib.import_module("cloudtrain.providers.aws.clients")
    session_module.clear_clients()
    zones._zones.cache_clear()
    images.clear_image_cache()


def _seed_ssm(params: dict[str, str]) -> None:
    """Put parameters moto refuses through its API (`/aws/...`) into its backend directly."""
    from tests.fakes.moto_server import seed_ssm_parameter

    for name, value in params.items():
        seed_ssm_parameter(name, value, REGION)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """moto in process, testing credentials, no endpoint overrides, caches cleared."""
    for key in list(os.environ):
        if key.startswith(("AWS_ENDPOINT_URL", "AWS_PROFILE")):
            monkeypatch.delenv(key)
    creds = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
    }
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(network.SSH_CIDR_ENV, raising=False)
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.01)
    monkeypatch.setattr(compute_mod, "TERMINATE_POLL_S", 0.0)
    _clear_caches()
    with moto.mock_aws():
        _seed_ssm({GPU_IMAGE_PARAM: GPU_AMI, CPU_IMAGE_PARAM: CPU_AMI})
        yield
    _clear_caches()


@pytest.fixture
def ct(aws: None) -> AwsCompute:
    return AwsCompute(REGION)


def run_info(ssh: bool = False, zone: str | None = None, run_id: str = RUN) -> RunInfo:
    return RunInfo(run_id, REGION, zone, (2222, 2232), ssh=ssh, store_uri=STORE)


def request(
    role: str = "worker",
    index: int = 0,
    *,
    script: str = "#!/bin/bash\necho hello\n",
    gpus: int = 1,
    run_id: str = RUN,
    **kw: Any,
) -> NodeRequest:
    kw.setdefault("instance_type", "g5.xlarge" if gpus else "m5.large")
    return NodeRequest(
        run_id=run_id,
        role=role,
        index=index,
        startup_script=script,
        accelerator="A10G" if gpus else None,
        accelerator_count=gpus,
        **kw,
    )


def describe(ct: AwsCompute, instance_id: str) -> dict[str, Any]:
    answer = ct.ec2.describe_instances(InstanceIds=[instance_id])
    return answer["Reservations"][0]["Instances"][0]  # type: ignore[no-any-return]


def client_error(code: str, message: str = "simulated", status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "RunInstances",
    )


def hook(client: Any, event: str, fn: Callable[..., Any]) -> Callable[[], None]:
    """Register `fn` on the client's events; returns the unregister function."""
    client.meta.events.register(event, fn)
    return lambda: client.meta.events.unregister(event, fn)


def counter(client: Any, operation: str) -> list[dict[str, Any]]:
    """Every call's API parameters of `operation` on `client` (captured before serialization)."""
    calls: list[dict[str, Any]] = []
    service = client.meta.service_model.service_id.hyphenize()
    hook(
        client,
        f"before-parameter-build.{service}.{operation}",
        lambda params, **_: calls.append(dict(params)),
    )
    return calls


def ingress(ct: AwsCompute, group_id: str) -> list[dict[str, Any]]:
    groups = ct.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    return groups[0]["IpPermissions"]  # type: ignore[no-any-return]


def policy_doc(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        return json.loads(urllib.parse.unquote(raw))  # type: ignore[no-any-return]
    return raw  # type: ignore[no-any-return]


# -- pure pieces ---------------------------------------------------------------------------


def test_planned_network_names_are_deterministic() -> None:
    planned = AwsCompute(REGION).planned_network(run_info())
    assert [(r.kind, r.id, r.region, r.run_id, r.cloud_id) for r in planned] == [
        ("security-group", "cloudtrain-r1", REGION, RUN, None),
        ("iam-role", "cloudtrain-r1", REGION, RUN, None),
        ("instance-profile", "cloudtrain-r1", REGION, RUN, None),
    ]


def test_s3_policy_is_the_run_prefix_only() -> None:
    assert parse_s3_uri("s3://b") == ("b", "")
    assert parse_s3_uri("s3://b/x/y/") == ("b", "x/y/")
    with pytest.raises(ProviderError, match="s3://"):
        parse_s3_uri("gs://b/x")
    doc = s3_policy("s3://b/x", "r9")
    objects, listing = doc["Statement"]
    assert sorted(objects["Action"]) == ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
    assert objects["Resource"] == "arn:aws:s3:::b/x/cloudtrain/runs/r9/*"
    assert listing["Action"] == "s3:ListBucket"
    assert listing["Resource"] == "arn:aws:s3:::b"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "x/cloudtrain/runs/r9/*"}}


def test_user_data_and_client_token() -> None:
    small = "#!/bin/bash\necho hi\n"
    assert user_data(small) == small
    big = "#!/bin/bash\n" + "".join(f"echo line {i} $RANDOM\n" for i in range(2000))
    packed = user_data(big)
    assert isinstance(packed, bytes) and packed[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed).decode() == big
    assert user_data(big) == packed  # deterministic (no mtime in the gzip header)
    huge = os.urandom(40_000).hex()  # does not compress below 16 KiB
    with pytest.raises(ProviderError, match="16384"):
        user_data(huge)
    token = client_token("ct-r1-worker-0", {"script": "a"})
    assert token.startswith("ct-r1-worker-0-") and len(token) <= 64
    assert token == client_token("ct-r1-worker-0", {"script": "a"})
    assert token != client_token("ct-r1-worker-0", {"script": "b"})
    assert len(client_token("ct-" + "x" * 80 + "-worker-0", {})) == 64


# -- network and identity ------------------------------------------------------------------


def test_security_group_opens_the_port_range_to_itself_only(ct: AwsCompute) -> None:
    first = ct.ensure_network(run_info())
    group = next(r for r in first if r.kind == "security-group")
    assert group.cloud_id and group.cloud_id.startswith("sg-")
    again = ct.ensure_network(run_info())  # idempotent: same resources, no duplicate rule
    assert [r.cloud_id for r in again] == [r.cloud_id for r in first]
    rules = ingress(ct, group.cloud_id)
    assert len(rules) == 1
    (rule,) = rules
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 2222, 2232)
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [group.cloud_id]
    assert rule["IpRanges"] == [] and rule["Ipv6Ranges"] == []
    sg = ct.ec2.describe_security_groups(GroupIds=[group.cloud_id])["SecurityGroups"][0]
    assert sg["GroupName"] == "cloudtrain-r1"
    assert {"Key": "cloudtrain:run", "Value": RUN} in sg["Tags"]
    vpc = ct.ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
    assert sg["VpcId"] == vpc["VpcId"]


def test_ssh_needs_a_cidr_and_opens_22_to_it_only(
    ct: AwsCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProviderError, match=network.SSH_CIDR_ENV):
        ct.ensure_network(run_info(ssh=True))
    monkeypatch.setenv(network.SSH_CIDR_ENV, "0.0.0.0/0")
    with pytest.raises(ProviderError, match="whole internet"):
        ct.ensure_network(run_info(ssh=True))
    assert ct.list_resources(RUN) == []  # nothing is made before the check
    monkeypatch.setenv(network.SSH_CIDR_ENV, "203.0.113.7/32")
    group = ct.ensure_network(run_info(ssh=True))[0]
    assert group.cloud_id is not None
    rules = {(r["FromPort"], r["ToPort"]): r for r in ingress(ct, group.cloud_id)}
    assert set(rules) == {(2222, 2232), (22, 22)}
    assert [r["CidrIp"] for r in rules[(22, 22)]["IpRanges"]] == ["203.0.113.7/32"]
    assert rules[(22, 22)]["UserIdGroupPairs"] == []
    assert rules[(2222, 2232)]["IpRanges"] == []


def test_no_default_vpc_is_a_clear_error(ct: AwsCompute) -> None:
    def no_vpcs(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("https://ec2", 200, {}, None), {"Vpcs": []}

    hook(ct.ec2, "before-call.ec2.DescribeVpcs", no_vpcs)
    with pytest.raises(ProviderError, match="no default VPC") as info:
        ct.ensure_network(run_info())
    assert "create-default-vpc" in str(info.value)


def test_iam_role_profile_and_s3_policy(ct: AwsCompute) -> None:
    resources = {r.kind: r for r in ct.ensure_network(run_info())}
    name = "cloudtrain-r1"
    assert resources["iam-role"].cloud_id == ct.iam.get_role(RoleName=name)["Role"]["Arn"]
    profile = ct.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert resources["instance-profile"].cloud_id == profile["Arn"]
    assert [r["RoleName"] for r in profile["Roles"]] == [name]
    role = ct.iam.get_role(RoleName=name)["Role"]
    trust = policy_doc(role["AssumeRolePolicyDocument"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    tags = ct.iam.list_role_tags(RoleName=name)["Tags"]
    assert {"Key": "cloudtrain:run", "Value": RUN} in tags
    assert ct.iam.list_role_policies(RoleName=name)["PolicyNames"] == [f"{name}-s3"]
    doc = policy_doc(
        ct.iam.get_role_policy(RoleName=name, PolicyName=f"{name}-s3")["PolicyDocument"]
    )
    assert doc == s3_policy(STORE, RUN)
    resources_of_statements = [s["Resource"] for s in doc["Statement"]]
    assert resources_of_statements == [
        "arn:aws:s3:::ct-test-bucket/team/a/cloudtrain/runs/r1/*",
        "arn:aws:s3:::ct-test-bucket",
    ]
    ct.ensure_network(run_info())  # idempotent: existing role/profile/membership are fine
    assert (
        len(ct.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]) == 1
    )


def test_a_non_s3_store_is_refused_before_anything_is_made(ct: AwsCompute) -> None:
    bad = RunInfo(RUN, REGION, None, (2222, 2232), store_uri="gs://bucket")
    with pytest.raises(ProviderError, match="s3://"):
        ct.ensure_network(bad)
    assert ct.list_resources(RUN) == []


def test_list_and_delete_resources_idempotently(ct: AwsCompute) -> None:
    made = ct.ensure_network(run_info())
    ct.ensure_network(run_info(run_id="other"))
    listed = ct.list_resources(RUN)
    assert sorted((r.kind, r.id, r.cloud_id) for r in listed) == sorted(
        (r.kind, r.id, r.cloud_id) for r in made
    )
    ct.delete_resources(listed)
    assert ct.list_resources(RUN) == []
    name = "cloudtrain-r1"
    for call in (
        lambda: ct.iam.get_role(RoleName=name),
        lambda: ct.iam.get_instance_profile(InstanceProfileName=name),
    ):
        with pytest.raises(ClientError, match="NoSuchEntity"):
            call()
    ct.delete_resources(listed)  # twice is fine
    # what the ledger recorded before the creates (no cloud ids) deletes by name as well
    planned = ct.planned_network(run_info(run_id="other"))
    assert len(ct.list_resources("other")) == 3
    ct.delete_resources(planned)
    ct.delete_resources(planned)
    assert ct.list_resources("other") == []


def test_a_group_still_in_use_is_retried_then_transient(
    ct: AwsCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = ct.ensure_network(run_info())[0]
    monkeypatch.setattr(network, "SG_DEPENDENCY_POLL_S", 0.0)
    monkeypatch.setattr(network, "SG_DEPENDENCY_WAIT_S", 0.05)
    busy = {"left": 2}

    def in_use(**_: Any) -> None:
        if busy["left"]:
            busy["left"] -= 1
            raise client_error("DependencyViolation", "resource sg has a dependent object")

    unhook = hook(ct.ec2, "before-call.ec2.DeleteSecurityGroup", in_use)
    ct.delete_resources([group])  # waits out two refusals
    assert busy["left"] == 0 and ct.list_resources(RUN)[0].kind == "iam-role"
    unhook()
    group = ct.ensure_network(run_info())[0]
    hook(
        ct.ec2,
        "before-call.ec2.DeleteSecurityGroup",
        lambda **_: (_ for _ in ()).throw(client_error("DependencyViolation")),
    )
    with pytest.raises(TransientError):
        ct.delete_resources([group])


# -- nodes ---------------------------------------------------------------------------------


def test_run_instances_request_shape(ct: AwsCompute) -> None:
    network_resources = {r.kind: r for r in ct.ensure_network(run_info())}
    calls = counter(ct.ec2, "RunInstances")
    script = "#!/bin/bash\necho gpu worker\n"
    node = ct.create_node(
        run_info(), request(script=script, spot=True, disk_gb=77, zone="use1-az1")
    )
    assert len(calls) == 1
    sent = calls[0]
    assert sent["ImageId"] == GPU_AMI
    assert sent["InstanceType"] == "g5.xlarge"
    assert (sent["MinCount"], sent["MaxCount"]) == (1, 1)
    assert sent["ClientToken"].startswith("ct-r1-worker-0-") and len(sent["ClientToken"]) <= 64
    assert sent["Placement"] == {"AvailabilityZone": "us-east-1b"}  # moto: use1-az1 is 1b
    assert sent["InstanceMarketOptions"]["MarketType"] == "spot"
    assert sent["InstanceMarketOptions"]["SpotOptions"] == {
        "SpotInstanceType": "one-time",
        "InstanceInterruptionBehavior": "terminate",
    }
    assert sent["IamInstanceProfile"] == {"Name": "cloudtrain-r1"}
    assert sent["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"
    # the node as returned
    assert node.name == node_name(RUN, "worker", 0) and node.alive and node.spot
    assert (node.role, node.index, node.zone) == ("worker", 0, "us-east-1b")
    # read back from moto
    inst = describe(ct, node.cloud_id or "")
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags == {
        "cloudtrain:run": RUN,
        "cloudtrain:role": "worker",
        "cloudtrain:index": "0",
        "Name": "ct-r1-worker-0",
    }
    assert inst["InstanceLifecycle"] == "spot"
    assert inst["IamInstanceProfile"]["Arn"] == network_resources["instance-profile"].cloud_id
    assert [g["GroupId"] for g in inst["SecurityGroups"]] == [
        network_resources["security-group"].cloud_id
    ]
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert inst["MetadataOptions"]["HttpEndpoint"] == "enabled"
    assert inst["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    attr = ct.ec2.describe_instance_attribute
    shutdown = attr(InstanceId=node.cloud_id, Attribute="instanceInitiatedShutdownBehavior")
    assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    data = attr(InstanceId=node.cloud_id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(data).decode() == script  # encoded once, by boto3
    volume_id = inst["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    volume = ct.ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    assert (volume["Size"], volume["VolumeType"]) == (77, "gp3")
    assert {t["Key"]: t["Value"] for t in volume["Tags"]} == tags


def test_cpu_nodes_get_the_ubuntu_image_and_a_given_image_wins(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    calls = counter(ct.ec2, "RunInstances")
    ssm_calls = counter(ct.ssm, "GetParameter")
    ct.create_node(run_info(), request("ps", 0, gpus=0))
    ct.create_node(run_info(), request("ps", 1, gpus=0))
    ct.create_node(run_info(), request("worker", 0, image="ami-0000000000000abcd"))
    assert [c["ImageId"] for c in calls] == [CPU_AMI, CPU_AMI, "ami-0000000000000abcd"]
    assert "InstanceMarketOptions" not in calls[0] and "Placement" not in calls[0]
    assert [c["Name"] for c in ssm_calls] == [CPU_IMAGE_PARAM]  # cached per process


def test_v100_nodes_boot_plain_ubuntu_the_oss_driver_ami_does_not_drive_volta(
    ct: AwsCompute,
) -> None:
    ct.ensure_network(run_info())
    calls = counter(ct.ec2, "RunInstances")
    ct.create_node(run_info(), request("worker", 0, instance_type="p3.2xlarge"))
    ct.create_node(run_info(), request("worker", 1, instance_type="g4dn.xlarge"))
    assert [c["ImageId"] for c in calls] == [CPU_AMI, GPU_AMI]


def test_a_missing_image_parameter_says_what_to_do(ct: AwsCompute) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import ssm_backends

    del ssm_backends[DEFAULT_ACCOUNT_ID][REGION]._parameters[GPU_IMAGE_PARAM]
    ct.ensure_network(run_info())
    with pytest.raises(ProviderError) as info:
        ct.create_node(run_info(), request())
    assert GPU_IMAGE_PARAM in str(info.value) and "image:" in str(info.value)


def test_a_large_script_is_gzipped_and_decodes_to_the_script(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    script = "#!/bin/bash\n" + "".join(f"echo 'step {i} of the bootstrap'\n" for i in range(900))
    assert len(script) > 14 * 1024
    node = ct.create_node(run_info(), request(script=script))
    data = ct.ec2.describe_instance_attribute(InstanceId=node.cloud_id, Attribute="userData")
    raw = base64.b64decode(data["UserData"]["Value"])
    assert raw[:2] == b"\x1f\x8b" and len(raw) <= 16 * 1024
    assert gzip.decompress(raw).decode() == script


def test_create_is_idempotent_per_name(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    calls = counter(ct.ec2, "RunInstances")
    first = ct.create_node(run_info(), request())
    again = ct.create_node(run_info(), request())
    assert again.cloud_id == first.cloud_id and len(calls) == 1  # the list-first guard
    nodes = ct.create_nodes(run_info(), [request("worker", i) for i in range(3)])
    assert len({n.cloud_id for n in nodes}) == 3 and nodes[0].cloud_id == first.cloud_id
    assert len(calls) == 3
    listed = ct.list_nodes(RUN)
    assert sorted(n.name for n in listed) == [f"ct-r1-worker-{i}" for i in range(3)]
    # a lost node is re-created as a new instance (new presigned URLs: a new ClientToken)
    ct.delete_node(first)
    remade = ct.create_node(run_info(), request(script="#!/bin/bash\necho new urls\n"))
    assert remade.cloud_id != first.cloud_id
    assert calls[-1]["ClientToken"] != calls[0]["ClientToken"]
    assert len(ct.list_nodes(RUN)) == 3


def test_client_token_is_stable_across_retries_and_moto_ignores_it(ct: AwsCompute) -> None:
    """The same request always sends the same token (so AWS would return the first instance).
    moto 5.2 stores the token but does not deduplicate by it: two calls make two instances."""
    ct.ensure_network(run_info())
    calls = counter(ct.ec2, "RunInstances")
    fail_once = {"left": 1}

    def lost_answer(**_: Any) -> None:  # the call "fails" after AWS may have acted on it
        if fail_once["left"]:
            fail_once["left"] -= 1
            raise client_error("InternalError", "try again", status=500)

    hook(ct.ec2, "before-call.ec2.RunInstances", lost_answer)
    node = RetryingCompute(ct).create_nodes(run_info(), [request()])[0]
    assert len(calls) == 2 and calls[0]["ClientToken"] == calls[1]["ClientToken"]
    token = calls[0]["ClientToken"]
    assert describe(ct, node.cloud_id or "")["ClientToken"] == token
    image = calls[0]["ImageId"]
    a = ct.ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, ClientToken="same-token")
    b = ct.ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, ClientToken="same-token")
    moto_dedupes = a["Instances"][0]["InstanceId"] == b["Instances"][0]["InstanceId"]
    assert not moto_dedupes, "moto now honours ClientToken: test it directly here"


def test_a_token_that_matches_a_terminated_instance_launches_afresh(ct: AwsCompute) -> None:
    """On AWS, a re-create with an identical script would get the old, terminated instance
    back for its ClientToken; create_node then launches again with a fresh token."""
    ct.ensure_network(run_info())
    old = ct.create_node(run_info(), request())
    ct.delete_node(old)
    gone = describe(ct, old.cloud_id or "")
    assert gone["State"]["Name"] == "terminated"
    calls = counter(ct.ec2, "RunInstances")
    answered = {"stale": 1}

    def stale(**_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if answered["stale"]:
            answered["stale"] -= 1
            return AWSResponse("https://ec2", 200, {}, None), {"Instances": [gone]}
        return None

    hook(ct.ec2, "before-call.ec2.RunInstances", stale)
    new = ct.create_node(run_info(), request())
    assert len(calls) == 2 and calls[0]["ClientToken"] != calls[1]["ClientToken"]
    assert new.cloud_id != old.cloud_id and new.alive


def test_list_nodes_reads_the_tags(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    ct.ensure_network(run_info(run_id="other"))
    ct.create_node(run_info(), request("chief", 0))
    labels = {"team": "vision", "cloudtrain:run": "spoofed", "Name": "spoofed"}
    ct.create_node(run_info(), request("worker", 1, spot=True, labels=labels))
    ct.create_node(run_info(), request("ps", 0, gpus=0))
    ct.create_node(run_info(run_id="other"), request("chief", 0, run_id="other"))
    nodes = ct.list_nodes(RUN)
    assert [(n.name, n.role, n.index, n.spot) for n in nodes] == [
        ("ct-r1-chief-0", "chief", 0, False),
        ("ct-r1-ps-0", "ps", 0, False),
        ("ct-r1-worker-1", "worker", 1, True),
    ]
    for node in nodes:
        assert node.run_id == RUN and node.state == "running" and node.alive
        assert node.private_ip and node.zone and node.zone.startswith(REGION)
        assert node.cloud_id and node.cloud_id.startswith("i-")
    assert {n.instance_type for n in nodes} == {"g5.xlarge", "m5.large"}
    tags = describe(ct, nodes[2].cloud_id or "")["Tags"]
    assert {"Key": "team", "Value": "vision"} in tags  # labels are tags, ours win
    assert {"Key": "cloudtrain:run", "Value": RUN} in tags
    ct.ec2.stop_instances(InstanceIds=[nodes[0].cloud_id])
    states = {n.name: n.state for n in ct.list_nodes(RUN)}
    assert states["ct-r1-chief-0"] == "stopped"
    assert ct.list_nodes("nobody") == []


def test_delete_listed_terminates_in_one_call_and_waits(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    nodes = ct.create_nodes(run_info(), [request("worker", i) for i in range(3)])
    ct.ec2.stop_instances(InstanceIds=[nodes[2].cloud_id])  # a stopped one terminates too
    terminations = counter(ct.ec2, "TerminateInstances")
    polls = {"n": 0}

    def slow(parsed: dict[str, Any], **_: Any) -> None:  # moto terminates at once; AWS does not
        polls["n"] += 1
        if polls["n"] <= 2:
            for reservation in parsed.get("Reservations", []):
                for inst in reservation["Instances"]:
                    inst["State"] = {"Code": 32, "Name": "shutting-down"}

    listed = ct.list_nodes(RUN)
    unhook = hook(ct.ec2, "after-call.ec2.DescribeInstances", slow)
    ct.delete_listed(listed)
    unhook()
    assert len(terminations) == 1 and len(terminations[0]["InstanceIds"]) == 3
    assert polls["n"] == 3  # two "still shutting down", then "terminated"
    for node in nodes:
        assert describe(ct, node.cloud_id or "")["State"]["Name"] == "terminated"
    assert ct.list_nodes(RUN) == []
    ct.delete_listed(nodes)  # deleting again is fine
    ct.delete_node(nodes[0])
    ct.delete_nodes(RUN)


def test_delete_tolerates_an_instance_aws_forgot(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    node = ct.create_node(run_info(), request())
    import dataclasses

    forgotten = dataclasses.replace(node, name="ct-r1-worker-9", cloud_id="i-0123456789abcdef0")
    ct.delete_listed([node, forgotten])
    assert describe(ct, node.cloud_id or "")["State"]["Name"] == "terminated"


def test_delete_gives_up_after_the_timeout(ct: AwsCompute, monkeypatch: pytest.MonkeyPatch) -> None:
    ct.ensure_network(run_info())
    node = ct.create_node(run_info(), request())
    monkeypatch.setattr(compute_mod, "TERMINATE_TIMEOUT_S", 0.05)

    def stuck(parsed: dict[str, Any], **_: Any) -> None:
        for reservation in parsed.get("Reservations", []):
            for inst in reservation["Instances"]:
                inst["State"] = {"Code": 32, "Name": "shutting-down"}

    hook(ct.ec2, "after-call.ec2.DescribeInstances", stuck)
    started = time.monotonic()
    with pytest.raises(ProviderError, match="still not terminated"):
        ct.delete_node(node)
    # the wait is patched to 0.05 s; unpatched it is TERMINATE_TIMEOUT_S (minutes): a bound no
    # load reaches still tells the two apart
    assert time.monotonic() - started < 60


# -- errors --------------------------------------------------------------------------------


def _raise_on_run_instances(ct: AwsCompute, exc: ClientError, times: int = 10**6) -> None:
    left = {"n": times}

    def fail(**_: Any) -> None:
        if left["n"]:
            left["n"] -= 1
            raise exc

    hook(ct.ec2, "before-call.ec2.RunInstances", fail)


def test_no_capacity_names_the_zone(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    _raise_on_run_instances(ct, client_error("InsufficientInstanceCapacity", "no g5 capacity"))
    with pytest.raises(NoCapacityError) as info:
        ct.create_node(run_info(), request(zone="us-east-1c"))
    assert info.value.zone == "us-east-1c"
    assert "us-east-1c" in str(info.value) and "g5.xlarge" in str(info.value)
    with pytest.raises(NoCapacityError) as info:  # a zone ID: reported as given
        ct.create_nodes(run_info(), [request(zone="use1-az1")])
    assert info.value.zone == "use1-az1" and "us-east-1b (use1-az1)" in str(info.value)


def test_vcpu_limit_is_a_quota_error_naming_the_quota(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    _raise_on_run_instances(ct, client_error("VcpuLimitExceeded", "vCPU limit of 0"))
    with pytest.raises(QuotaError) as info:
        ct.create_node(run_info(), request())
    assert "vCPU" in str(info.value) and "L-DB2E81BA" in str(info.value)
    assert ct.list_nodes(RUN) == []


def test_an_instance_profile_not_yet_visible_is_retried(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    message = (
        "Value (cloudtrain-r1) for parameter iamInstanceProfile.name is invalid. "
        "Invalid IAM Instance Profile name"
    )
    _raise_on_run_instances(ct, client_error("InvalidParameterValue", message), times=2)
    with pytest.raises(TransientError, match="instance profile"):
        ct.create_node(run_info(), request())
    # the retry policy gets through
    (node,) = RetryingCompute(ct).create_nodes(run_info(), [request()])
    assert node.alive and len(ct.list_nodes(RUN)) == 1
    _raise_on_run_instances(ct, client_error("InvalidParameterValue", "bad instance type"))
    with pytest.raises(ProviderError) as info:
        ct.create_node(run_info(), request("worker", 1))
    assert not isinstance(info.value, TransientError)


def test_create_without_network_says_so(ct: AwsCompute) -> None:
    with pytest.raises(ProviderError, match="ensure_network"):
        ct.create_node(run_info(), request())


# -- console, zones, startup blocks ----------------------------------------------------------


def test_console_output_and_zones(ct: AwsCompute) -> None:
    ct.ensure_network(run_info())
    node = ct.create_node(run_info(), request())
    assert isinstance(ct.console_output(node), str) and ct.console_output(node)
    ct.delete_node(node)
    import dataclasses

    assert ct.console_output(dataclasses.replace(node, cloud_id="i-0123456789abcdef0")) == ""
    assert ct.console_output(dataclasses.replace(node, cloud_id=None)) == ""
    zone_ids = ct.zones()
    assert "use1-az1" in zone_ids and zone_ids == sorted(zone_ids)


def _params() -> StartupParams:
    prefix = f"{STORE}/cloudtrain/runs/{RUN}"
    return StartupParams(
        run_id=RUN,
        role="worker",
        index=0,
        node_name="ct-r1-worker-0",
        store_uri=STORE,
        bundle_url=f"https://example.invalid/{prefix}/bundle.tar.gz?sig=x",
        bundle_sha256="ab" * 32,
        log_put_url="https://example.invalid/log?sig=y",
        version="0.0.0",
        deadline_epoch=1767225600,
        gpu_count=1,
    )


def test_startup_blocks_render_into_a_valid_script(tmp_path: Path) -> None:
    ct = AwsCompute(REGION)
    blocks = ct.startup_blocks(run_info(), request())
    assert blocks.python == "/opt/cloudtrain/venv/bin/python" and blocks.install_stack
    assert dict(blocks.env) == {"AWS_DEFAULT_REGION": REGION}
    assert blocks.power_off == "shutdown -h now"
    assert "X-aws-ec2-metadata-token-ttl-seconds: 300" in blocks.metadata
    assert "latest/meta-data/local-ipv4" in blocks.metadata
    script = render_startup(_params(), blocks)
    path = tmp_path / "startup.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    result = subprocess.run(
        [require_tool("shellcheck"), "-S", "warning", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
    assert len(user_data(script)) <= 16 * 1024


def _run_blocks(tmp_path: Path, body: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a provider block with fakes of `shutdown` and `curl` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    for tool, answer in (("shutdown", ""), ("curl", "10.0.0.12")):
        fake = bin_dir / tool
        fake.write_text(f'#!/bin/sh\necho "{tool} $*" >>"{log}"\nprintf %s "{answer}"\n')
        fake.chmod(0o755)
    prologue = (
        'set -Eeuo pipefail\nphase() { echo "phase: $*"; }\nfail() { echo "FAIL: $*"; exit 1; }\n'
    )
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(
        ["bash", "-c", prologue + body], env=full_env, capture_output=True, text=True, check=True
    )


def test_the_blocks_behave_under_bash(tmp_path: Path) -> None:
    blocks = AwsCompute(REGION).startup_blocks(run_info(), request())
    now = int(time.time())
    log = tmp_path / "calls.log"
    _run_blocks(tmp_path, blocks.self_shutdown, {"DEADLINE_EPOCH": str(now + 20)})
    assert log.read_text().splitlines()[0].startswith("shutdown -h +1 ")  # at least +1
    log.unlink()
    _run_blocks(tmp_path, blocks.self_shutdown, {"DEADLINE_EPOCH": str(now + 3600 + 30)})
    assert log.read_text().splitlines()[0].startswith("shutdown -h +60 ")
    log.unlink()
    out = _run_blocks(tmp_path, blocks.metadata + '\necho "host=$CLOUDTRAIN_NODE_HOST"', {})
    assert "host=10.0.0.12" in out.stdout
    calls = log.read_text()
    assert "-X PUT http://169.254.169.254/latest/api/token" in calls
    assert "X-aws-ec2-metadata-token: 10.0.0.12" in calls  # the token our fake answered
    log.unlink()
    out = _run_blocks(
        tmp_path,
        blocks.metadata + '\necho "host=$CLOUDTRAIN_NODE_HOST"',
        {"CLOUDTRAIN_NODE_HOST": "127.0.0.5"},
    )
    assert "host=127.0.0.5" in out.stdout and not log.exists()  # no IMDS call when preset


def test_resource_kinds_of_other_providers_are_ignored(ct: AwsCompute) -> None:
    calls: list[str] = []
    for client in (ct.ec2, ct.iam):
        hook(client, "before-call", lambda model, **_: calls.append(model.name))
    ct.delete_resources([Resource("aws", "bucket", "s3://x", REGION, RUN)])
    assert calls == []  # a bucket is not the compute adapter's to delete


def test_image_names_resolve_through_public_parameters() -> None:
    from cloudtrain.errors import ProviderError

    aliases = images.IMAGE_ALIASES
    assert set(aliases) >= {"dlami", "ubuntu-22.04", "ubuntu-24.04"}
    assert aliases["ubuntu-24.04"].ref.startswith("/aws/service/canonical/ubuntu/server/24.04/")
    assert "base-oss-nvidia-driver-gpu-ubuntu-24.04" in aliases["dlami-ubuntu-24.04"].ref
    compute = AwsCompute("us-east-1")
    ami = request(image="ami-0123456789abcdef0")
    assert compute.resolve_image(ami) == "ami-0123456789abcdef0"
    with pytest.raises(ProviderError, match="unknown image 'centos'"):
        compute.resolve_image(request(gpus=0, image="centos"))
