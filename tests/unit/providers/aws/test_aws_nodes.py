"""AwsCompute's nodes (providers/aws/compute.py) against moto, in process: the RunInstances
request (image, spot, placement, instance profile, metadata options, user data, volume), the
create guard and ClientToken, listing by tags, terminating and waiting, and the errors of
RunInstances (capacity, vCPU quota, an instance profile not yet visible, no network). The
fixtures and helpers are aws_kit.py's; the network, identity and startup tests are in
test_aws_compute.py.

What moto does not do is simulated on the client: errors are raised from a `before-call` hook,
slow terminations are made by rewriting DescribeInstances answers, and a stale ClientToken hit is
a short-circuited RunInstances answer.
"""

from __future__ import annotations

import base64
import gzip
import time
from typing import Any

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from cloudtrain.core.errors import (
    NoCapacityError,
    ProviderError,
    QuotaError,
    TransientError,
)
from cloudtrain.providers.aws import compute as compute_mod
from cloudtrain.providers.aws.compute import AwsCompute
from cloudtrain.providers.base import node_name
from cloudtrain.providers.retrying import RetryingCompute
from tests.unit.aws_kit import (
    CPU_AMI,
    CPU_IMAGE_PARAM,
    GPU_AMI,
    GPU_IMAGE_PARAM,
    REGION,
    RUN,
    aws,
    client_error,
    counter,
    ct,
    describe,
    hook,
    request,
    run_info,
)

__all__ = ["aws", "ct"]  # fixtures, for pytest


# -- nodes ---------------------------------------------------------------------------------


def test_run_instances_request_shape(ct: AwsCompute) -> None:
    made = ct.ensure_network(run_info())
    network_resources = {
        r.kind: r for r in made if r.id in ("cloudtrain-r1-worker-0", "cloudtrain-r1")
    }
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
    assert sent["IamInstanceProfile"] == {"Name": "cloudtrain-r1-worker-0"}  # its node's
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
