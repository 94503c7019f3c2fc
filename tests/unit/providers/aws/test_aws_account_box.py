"""The AWS box is as stingy as a new account (tests/fakes/aws_front.py, aws_account.py), and the
probe (providers/aws/account.py) reads it with the real boto3: quotas and usage from Service
Quotas and EC2, a create over quota refused with VcpuLimitExceeded (QuotaError naming the
quota), a sold-out zone refused with InsufficientInstanceCapacity every time until restored
(NoCapacityError naming the zone), and a caller's missing right named by IAM's policy simulator
and refused by the create itself, both from the same policies.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

pytest.importorskip("moto")

import boto3
from botocore.exceptions import ClientError

from cloudtrain.core.errors import CredentialsError, NoCapacityError, QuotaError
from cloudtrain.providers.account import QuotaNeed
from cloudtrain.providers.aws.account import AwsAccountProbe, run_rights
from cloudtrain.providers.aws.compute import AwsCompute
from tests.fakes.moto_server import (
    MotoServer,
    moto_amis,
    moto_public_images,
    moto_server,
    moto_server_session,
)
from tests.unit.aws_kit import request, run_info

__all__ = ["moto_public_images", "moto_server", "moto_server_session"]  # fixtures, for pytest
REGION = "us-east-1"
G_NEED = QuotaNeed("g5.xlarge", "A10G", 1, 4, 2, spot=False)  # 2 nodes x 4 vCPUs
STD_NEED = QuotaNeed("t3.small", None, 0, 2, 1, spot=False)


@pytest.fixture
def box(moto_server: MotoServer, moto_public_images: dict[str, str]) -> Iterator[MotoServer]:
    """The box's moto server (empty account, images seeded), the zones cache cleared."""
    zones = importlib.import_module("cloudtrain.providers.aws.zones")
    zones._zones.cache_clear()
    yield moto_server
    zones._zones.cache_clear()


def _launch(instance_type: str, spot: bool = False) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    ec2.run_instances(
        ImageId=moto_amis(1)[0], InstanceType=instance_type, MinCount=1, MaxCount=1, **extra
    )


def test_probe_reads_a_quota_of_zero_and_the_usage(box: MotoServer) -> None:
    box.account.new_account([REGION])
    _launch("t3.large")  # 2 vCPUs of the standard on-demand quota
    _launch("t3.xlarge", spot=True)  # spot: not on-demand usage
    lines = {
        q.quota.split()[0]: q for q in AwsAccountProbe(REGION).quotas(REGION, [G_NEED, STD_NEED])
    }
    g, std = lines["L-DB2E81BA"], lines["L-1216C47A"]
    assert g.quota == "L-DB2E81BA Running On-Demand G and VT instances"
    assert (g.limit, g.usage, g.need, g.fits) == (0.0, 0.0, 8.0, False)
    assert (std.usage, std.need, std.fits) == (2.0, 2.0, True)
    assert std.limit > 0
    box.account.set_quota(REGION, "L-DB2E81BA", 16)
    box.account.occupy(REGION, "g5.xlarge", count=3)  # another program's: 12 vCPUs
    (g,) = AwsAccountProbe(REGION).quotas(REGION, [G_NEED])
    assert (g.limit, g.usage, g.fits) == (16.0, 12.0, False)


def test_spot_needs_count_against_the_spot_quota(box: MotoServer) -> None:
    _launch("g5.xlarge", spot=True)
    box.account.set_quota(REGION, "L-3819A6DF", 8)
    spot = QuotaNeed("g5.xlarge", "A10G", 1, 4, 1, spot=True)
    (line,) = AwsAccountProbe(REGION).quotas(REGION, [spot])
    assert line.quota == "L-3819A6DF All G and VT Spot Instance Requests"
    assert (line.limit, line.usage, line.need, line.fits) == (8.0, 4.0, 4.0, True)


def test_a_create_over_quota_is_vcpu_limit_exceeded_naming_the_quota(box: MotoServer) -> None:
    box.account.new_account([REGION])
    with pytest.raises(ClientError) as raw:
        _launch("g5.xlarge")
    assert raw.value.response["Error"]["Code"] == "VcpuLimitExceeded"
    assert raw.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "current vCPU limit of 0 allows" in raw.value.response["Error"]["Message"]
    ct = AwsCompute(REGION)
    info = run_info(zone="us-east-1a")
    ct.ensure_network(info)
    with pytest.raises(QuotaError) as err:
        ct.create_node(info, request())
    assert "L-DB2E81BA" in str(err.value) and "us-east-1" in str(err.value)
    box.account.set_quota(REGION, "L-DB2E81BA", 4)  # one g5.xlarge fits, a second does not
    ct.create_node(info, request())
    with pytest.raises(QuotaError):
        ct.create_node(info, request(index=1))


def test_a_spot_create_over_quota_is_max_spot_instance_count_exceeded(box: MotoServer) -> None:
    box.account.new_account([REGION])
    with pytest.raises(ClientError) as raw:
        _launch("g5.xlarge", spot=True)
    assert raw.value.response["Error"]["Code"] == "MaxSpotInstanceCountExceeded"
    _launch("t3.small", spot=True)  # the standard spot quota is not a new account's 0


def test_a_sold_out_zone_refuses_every_create_until_restored(box: MotoServer) -> None:
    ct = AwsCompute(REGION)
    info = run_info(zone="us-east-1a")
    ct.ensure_network(info)
    box.account.sell_out("us-east-1a")
    for _ in range(2):  # persistently, not only the next call
        with pytest.raises(NoCapacityError) as err:
            ct.create_node(info, request())
        assert err.value.zone == "us-east-1a"
        assert "InsufficientInstanceCapacity" in str(err.value)
        assert "us-east-1a" in str(err.value)
    ct.create_node(info, request(zone="us-east-1b"))  # the region's other zones have it
    box.account.restore("us-east-1a")
    assert ct.create_node(info, request(index=1)).zone == "us-east-1a"


def test_a_missing_right_is_named_by_the_probe_and_refused_by_the_create(
    box: MotoServer,
) -> None:
    probe = AwsAccountProbe(REGION)
    assert probe.missing_rights() == []
    box.account.deny("ec2:RunInstances")
    assert probe.missing_rights() == ["ec2:RunInstances"]
    ct = AwsCompute(REGION)
    info = run_info(zone="us-east-1a")
    ct.ensure_network(info)
    with pytest.raises(CredentialsError) as err:
        ct.create_node(info, request())
    assert err.value.codes >= {"UnauthorizedOperation", "403"}
    assert "lacks ec2:RunInstances" in str(err.value)


def test_a_narrow_iam_user_is_refused_what_its_policy_lacks(box: MotoServer) -> None:
    reads = ["sts:GetCallerIdentity", "iam:SimulatePrincipalPolicy", "iam:GetRole"]
    key, secret = box.account.narrow_caller("alice", [*reads, "ec2:Describe*"])
    alice = boto3.Session(aws_access_key_id=key, aws_secret_access_key=secret)
    iam = alice.client("iam", region_name=REGION)
    with pytest.raises(ClientError) as raw:
        iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")
    error = raw.value.response["Error"]
    assert error["Code"] == "AccessDenied"
    assert raw.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "is not authorized to perform: iam:CreateRole" in error["Message"]
    arn = alice.client("sts", region_name=REGION).get_caller_identity()["Arn"]
    answer = iam.simulate_principal_policy(
        PolicySourceArn=arn, ActionNames=["iam:CreateRole", "ec2:DescribeInstances"]
    )
    decisions = {r["EvalActionName"]: r["EvalDecision"] for r in answer["EvaluationResults"]}
    assert decisions == {"iam:CreateRole": "implicitDeny", "ec2:DescribeInstances": "allowed"}
    forged = boto3.Session(aws_access_key_id=key, aws_secret_access_key="not-the-secret")
    with pytest.raises(ClientError) as bad:
        forged.client("ec2", region_name=REGION).describe_instances()
    assert bad.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    alice.client("ec2", region_name=REGION).describe_instances()  # what it may do, it does


def test_the_probe_of_a_narrow_caller_names_each_right_it_lacks(
    box: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = ["sts:GetCallerIdentity", "iam:SimulatePrincipalPolicy"]
    key, secret = box.account.narrow_caller("bob", [*reads, "ec2:*", "s3:*", "ssm:*"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    importlib.import_module("cloudtrain.providers.aws.clients").clear_clients()
    probe = AwsAccountProbe(REGION)
    source = probe.credentials()
    assert source.principal.endswith(":user/bob") and source.account == "123456789012"
    assert source.source.startswith("environment variables")
    missing = probe.missing_rights()
    assert missing == [r for r in run_rights() if r.startswith("iam:")]
    apis = {a.name: a for a in probe.apis()}
    assert all(a.ok for a in apis.values()), apis  # a refusal still answers
