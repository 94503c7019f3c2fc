"""Issue 30's acceptance on the AWS box: a new account's GPU quota of 0 in the cheapest region
and every zone of the next sold out; `cloudtrain check job.yaml` says so before anything exists,
and `cloudtrain run` lands in the third region and trains to success, leaving nothing in the
first two, the ledger and the summary showing the path. A caller missing one right is told by
`check` which, and `run` refuses before creating anything with the same line.

The box's account: tests/fakes/aws_account.py through tests/fakes/aws_front.py (Service Quotas,
VcpuLimitExceeded, InsufficientInstanceCapacity, IAM's policy simulator). The job's plan, in
price order: us-east-1, us-east-2, us-west-2 (the same g4dn.xlarge price; the catalog's order).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.test_aws_in_a_box import AwsBox, _discover
from tests.fakes.boot_harness import BootHarness
from tests.fakes.imds_credentials_aws import Ec2RoleCredentials
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.moto_server import MotoServer, seed_public_images

pytestmark = pytest.mark.e2e
JOB = EXAMPLES / "digits-multiworker" / "job.yaml"
NO_QUOTA, SOLD_OUT, LANDS = "us-east-1", "us-east-2", "us-west-2"
REGIONS = (NO_QUOTA, SOLD_OUT, LANDS)


@pytest.fixture
def aws3(ct: Env, moto_server: MotoServer, tmp_path: Path) -> Iterator[AwsBox]:
    """The AWS box, its boot harness booting the instances of all three regions."""
    import os

    import boto3

    images = seed_public_images(REGIONS)
    ct.env.update({k: v for k, v in os.environ.items() if k.startswith(("AWS_", "NO_PROXY"))})
    ec2 = {r: boto3.client("ec2", region_name=r, endpoint_url=moto_server.url) for r in REGIONS}
    imds = MetadataServer()
    Ec2RoleCredentials(moto_server.url, LANDS).install(imds)

    def power_off(vm: str) -> None:
        for client in ec2.values():
            if client.describe_instances(Filters=[{"Name": "instance-id", "Values": [vm]}])[
                "Reservations"
            ]:
                client.terminate_instances(InstanceIds=[vm])

    harness = BootHarness(
        tmp_path / "box",
        lambda: [vm for r in REGIONS for vm in _discover(ec2[r], images, imds.url)],
        dict(ct.env),
        on_power_off=power_off,
    )
    harness.metadata_url = imds.url
    harness.start()
    clients = {
        n: boto3.client(n, region_name=LANDS, endpoint_url=moto_server.url) for n in ("s3", "iam")
    }
    try:
        yield AwsBox(ct, harness, ec2[LANDS], clients["s3"], clients["iam"], imds, moto_server)
    finally:
        harness.stop()
        imds.close()


def _instances(box: AwsBox, region: str) -> list[dict[str, Any]]:
    import boto3

    assert box.moto is not None
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=box.moto.url)
    pages = ec2.get_paginator("describe_instances").paginate()
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def test_no_quota_then_sold_out_then_lands_in_the_third_region(aws3: AwsBox) -> None:
    account = aws3.moto.account  # type: ignore[union-attr]
    account.new_account([NO_QUOTA])  # G and VT: 0 vCPUs
    for zone in ("us-east-2a", "us-east-2b", "us-east-2c"):
        account.sell_out(zone)
    check = aws3.run("check", "--provider", "aws", str(JOB))
    out = check.stdout
    assert "L-DB2E81BA" in out and NO_QUOTA in out, out
    assert aws3.ct.run_ids() == [] and all(_instances(aws3, r) == [] for r in REGIONS)

    proc = aws3.run("run", "--provider", "aws", str(JOB), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (run_id,) = aws3.ct.run_ids()
    assert "place:" in proc.stdout and LANDS in proc.stdout, proc.stdout[-3000:]
    for region in (NO_QUOTA, SOLD_OUT):
        assert _instances(aws3, region) == [], region  # nothing made in the first two stays
    landed = _instances(aws3, LANDS)
    assert landed and {i["State"]["Name"] for i in landed} == {"terminated"}
    refused = [r for r in account.refused if r[0] == "InsufficientInstanceCapacity"]
    assert refused and {r[1] for r in refused} <= {"us-east-2a", "us-east-2b", "us-east-2c"}
    events = [e.message for e in aws3.ct.ledger().events(run_id) if e.kind == "failover"]
    assert any(SOLD_OUT in e for e in events), events
    resources = aws3.ct.ledger().resources(run_id)
    assert resources and all(r.state == "deleted" for r in resources)


def test_a_caller_missing_a_right_is_told_and_run_creates_nothing(aws3: AwsBox) -> None:
    aws3.moto.account.deny("iam:CreateRole")  # type: ignore[union-attr]
    check = aws3.run("check", "--provider", "aws", str(JOB))
    assert check.returncode != 0
    lines = [line for line in check.stdout.splitlines() if "iam:CreateRole" in line]
    assert lines, check.stdout
    proc = aws3.run("run", "--provider", "aws", str(JOB))
    assert proc.returncode != 0
    assert lines[0].strip() in proc.stdout + proc.stderr, (lines, proc.stdout[-2000:])
    assert all(_instances(aws3, r) == [] for r in REGIONS)
    roles = [r["RoleName"] for r in aws3.iam.list_roles()["Roles"]]
    assert not [n for n in roles if n.startswith("cloudtrain-")]
    assert aws3.s3.list_buckets()["Buckets"] == []
