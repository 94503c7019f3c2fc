"""The AWS probe's pure parts (providers/aws/account.py) and the error mapping of quota and
access-denied answers (providers/aws/errors.py): no cloud, no moto."""

from __future__ import annotations

import subprocess
import sys

import pytest
from botocore.exceptions import ClientError

from cloudtrain.core.errors import CredentialsError, QuotaError
from cloudtrain.providers.aws.account import DESCRIBES, SETUP_RIGHTS, role_arn_of, run_rights
from cloudtrain.providers.aws.controller_identity import controller_policy
from cloudtrain.providers.aws.errors import translate
from cloudtrain.providers.aws.vcpu_quotas import quota_class, vcpu_quota


def _error(code: str, message: str, status: int, operation: str) -> ClientError:
    response = {"Error": {"Code": code, "Message": message}}
    response["ResponseMetadata"] = {"HTTPStatusCode": status}  # type: ignore[assignment]
    return ClientError(response, operation)  # type: ignore[arg-type]


def test_run_rights_are_the_controllers_and_the_setup_ones() -> None:
    policy = controller_policy("r", "s3://b/", "us-east-1", "arn:aws:iam::1:role/x")
    controller = set()
    for st in policy["Statement"]:
        controller |= {st["Action"]} if isinstance(st["Action"], str) else set(st["Action"])
    rights = run_rights()
    assert rights == sorted(set(rights))
    assert set(rights) == (controller - {"ec2:Describe*"}) | set(DESCRIBES) | set(SETUP_RIGHTS)
    assert not [r for r in rights if "*" in r]  # the simulator takes action names only
    assert {"iam:CreateRole", "iam:PassRole", "ec2:RunInstances", "s3:PutObject"} <= set(rights)


@pytest.mark.parametrize(
    ("instance_type", "klass"),
    [
        ("g5.xlarge", "g"),
        ("g4dn.12xlarge", "g"),
        ("vt1.3xlarge", "g"),
        ("p4d.24xlarge", "p"),
        ("p3.2xlarge", "p"),
        ("t3.small", "standard"),
        ("im4gn.large", "standard"),
        ("c7i.large", "standard"),
        ("dl1.24xlarge", None),
        ("inf2.xlarge", None),
        ("trn1.2xlarge", None),
        ("x2idn.16xlarge", None),
        ("hpc7g.4xlarge", None),
    ],
)
def test_each_family_counts_against_its_quota(instance_type: str, klass: str | None) -> None:
    assert quota_class(instance_type) == klass


def test_spot_and_on_demand_quotas_differ() -> None:
    assert vcpu_quota("g5.xlarge", False) == ("L-DB2E81BA", "Running On-Demand G and VT instances")
    assert vcpu_quota("g5.xlarge", True) == ("L-3819A6DF", "All G and VT Spot Instance Requests")
    assert vcpu_quota("p5.48xlarge", True)[0] == "L-7212CCBC"  # type: ignore[index]
    assert vcpu_quota("m5.large", False)[0] == "L-1216C47A"  # type: ignore[index]


def test_an_assumed_role_is_simulated_as_its_role() -> None:
    session = "arn:aws:sts::123456789012:assumed-role/Admin/alice@example.com"
    assert role_arn_of(session) == "arn:aws:iam::123456789012:role/Admin"
    user = "arn:aws:iam::123456789012:user/alice"
    assert role_arn_of(user) == user


def test_vcpu_limit_exceeded_names_the_quota_and_the_region() -> None:
    exc = _error("VcpuLimitExceeded", "You have requested more vCPU capacity", 400, "RunInstances")
    err = translate(exc, "create instance ct-r-worker-0 (g5.xlarge) in us-west-2b", "us-west-2b")
    assert isinstance(err, QuotaError)
    assert "L-DB2E81BA 'Running On-Demand G and VT instances'" in err.message
    assert "in us-west-2" in err.message


def test_max_spot_count_names_the_spot_quota() -> None:
    exc = _error("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded", 400, "R")
    err = translate(exc, "create instance n (p4d.24xlarge) in us-east-1a", "us-east-1a")
    assert isinstance(err, QuotaError) and "L-7212CCBC" in err.message
    by_id = translate(exc, "create instance n (p4d.24xlarge) in us-east-1b (use1-az1)", "use1-az1")
    assert "L-7212CCBC 'All P Spot Instance Requests' (vCPUs) in us-east-1)" in by_id.message


def test_access_denied_names_the_right() -> None:
    iam = _error(
        "AccessDenied",
        "User: arn:aws:iam::1:user/a is not authorized to perform: iam:CreateRole on resource:"
        " arn:aws:iam::1:role/x because no identity-based policy allows the iam:CreateRole action",
        403,
        "CreateRole",
    )
    err = translate(iam, "create role x")
    assert isinstance(err, CredentialsError) and "lacks iam:CreateRole" in err.message
    old_ec2 = _error(
        "UnauthorizedOperation",
        "You are not authorized to perform this operation. Encoded authorization failure"
        " message: abc",
        403,
        "RunInstances",
    )
    assert "lacks ec2:RunInstances" in translate(old_ec2, "create instance n").message


def test_the_probe_module_loads_no_sdk() -> None:
    code = (
        "import sys, cloudtrain.providers.aws.account as a; "
        "print(any(m.split('.')[0] in ('boto3', 'botocore') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
