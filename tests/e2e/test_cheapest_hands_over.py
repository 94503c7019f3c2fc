"""Issue 30's acceptance across clouds: with `provider: cheapest`, a cloud with no capacity
anywhere hands the run to the next cloud, and it trains to success there.

The AWS box (tests/e2e/test_aws_gets_gpus.py's `aws3`) and the GCP box
(tests/e2e/test_gcp_in_a_box.py's `gcp`) are up together; the real `cloudtrain run --provider
cheapest` sees both clouds' credentials. The places are narrowed with the user's own catalog
override (`$CLOUDTRAIN_HOME/catalog/<provider>.csv` replaces the bundled file,
cloudtrain/catalog/README.md "Overriding"), each file the bundled rows of one region:
- aws: us-east-1 only, g4dn.xlarge at $0.526/h a worker: the job's cheapest place;
- gcp: us-central1 only, n1-standard-8 + T4 at $0.73/h a worker;
- azure: its CPU machines only, no T4 offer: no place of the job's, so no Azure box is needed.

Both accounts are as stingy as new ones, granted exactly the plan's GPU quota (AWS "Running
On-Demand G and VT instances" 8 vCPUs in us-east-1; GCP NVIDIA_T4_GPUS 2 in us-central1 and
GPUS_ALL_REGIONS 2), so `plan_for_account` keeps aws us-east-1 and the handover is for capacity
only: every zone of us-east-1 is sold out (InsufficientInstanceCapacity).

The path expected (cloudtrain/run/failover.py): the run is planned on aws us-east-1; every zone
refuses (each tried once, `provisioning.create_in_some_zone`); failover records `aws us-east-1:
capacity: ...`, deletes what the run made there (security group, node roles and profiles), and
replans avoiding it. A capacity-failed place is tried again only when no other place is left in
the round, and gcp us-central1 is left: so AWS is tried ONCE, not twice, before GCP. The run
leaves its S3 store (its control objects deleted from the bucket), makes its store anew in the
GCP project's bucket, moves its record to gcp us-central1, and trains there (real TensorFlow).
The ledger's failover events and the summary's `place:` line read `tried aws us-east-1:
capacity: ...; landed in gcp us-central1`; `cloudtrain status RUN` reads it on GCP.
"""

from __future__ import annotations

import csv
import io
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import EXAMPLES
from tests.e2e.test_aws_gets_gpus import aws3
from tests.e2e.test_aws_in_a_box import ACCOUNT, AwsBox
from tests.e2e.test_gcp_in_a_box import GcpBox, gcp
from tests.fakes.gcp_cloud import gcp_cloud, gcs_emulator, gcs_emulator_session

__all__ = ["aws3", "gcp", "gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures
pytestmark = pytest.mark.e2e
JOB = EXAMPLES / "digits-multiworker" / "job.yaml"  # T4:1 on each of two workers
AWS_REGION, GCP_REGION = "us-east-1", "us-central1"
G_QUOTA = "L-DB2E81BA"  # Running On-Demand G and VT instances (vCPUs)
T4_QUOTA = "NVIDIA_T4_GPUS"


def narrow_catalog(home: Path) -> None:
    """The user's catalog override: aws and gcp each the bundled rows of one region, azure its
    CPU machines only (no offer of the job's GPU)."""
    keep = {
        "aws": lambda row: row["region"] == AWS_REGION,
        "gcp": lambda row: row["region"] == GCP_REGION,
        "azure": lambda row: not row["accelerator"],
    }
    folder = home / "catalog"
    folder.mkdir(parents=True, exist_ok=True)
    for provider, wanted in keep.items():
        text = (resources.files("cloudtrain") / "catalog" / f"{provider}.csv").read_text()
        reader = csv.DictReader(io.StringIO(text))
        rows = [row for row in reader if wanted(row)]
        assert rows, provider
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(reader.fieldnames or []))
        writer.writeheader()
        writer.writerows(rows)
        (folder / f"{provider}.csv").write_text(out.getvalue())


def aws_client(box: AwsBox, service: str) -> Any:
    import boto3

    assert box.moto is not None
    return boto3.client(service, region_name=AWS_REGION, endpoint_url=box.moto.url)


def aws_zones(box: AwsBox) -> list[str]:
    zones = aws_client(box, "ec2").describe_availability_zones()["AvailabilityZones"]
    return [z["ZoneName"] for z in zones]


def assert_nothing_on_aws(box: AwsBox, run_id: str) -> None:
    """No instance, security group, role or instance profile of the run on AWS, and the run's
    prefix gone from the S3 bucket it was first given."""
    ec2 = aws_client(box, "ec2")
    pages = ec2.get_paginator("describe_instances").paginate()
    assert [i for page in pages for r in page["Reservations"] for i in r["Instances"]] == []
    groups = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [f"cloudtrain-{run_id}"]}]
    )["SecurityGroups"]
    assert groups == []
    roles = [r["RoleName"] for r in box.iam.list_roles()["Roles"]]
    profiles = [
        p["InstanceProfileName"] for p in box.iam.list_instance_profiles()["InstanceProfiles"]
    ]
    assert [n for n in roles + profiles if run_id in n] == []
    s3 = aws_client(box, "s3")
    bucket = f"cloudtrain-{ACCOUNT}-{AWS_REGION}"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"cloudtrain/runs/{run_id}/")
    assert listed.get("KeyCount", 0) == 0, [o["Key"] for o in listed.get("Contents", [])]


def test_aws_sold_out_everywhere_hands_the_run_to_gcp(gcp: GcpBox, aws3: AwsBox) -> None:
    ct = aws3.ct
    assert ct is gcp.ct  # one home, one CLI environment with both clouds' credentials
    narrow_catalog(ct.home)
    aws = aws3.moto.account  # type: ignore[union-attr]
    aws.new_account([AWS_REGION])
    aws.set_quota(AWS_REGION, G_QUOTA, 8)  # two g4dn.xlarge: 4 vCPUs each
    project = gcp.cloud.account
    project.new_project()
    project.set_quota("global", "GPUS_ALL_REGIONS", 2)
    project.set_quota(GCP_REGION, T4_QUOTA, 2)
    sold_out = aws_zones(aws3)
    for zone in sold_out:
        aws.sell_out(zone)

    planned = json.loads(gcp.run("plan", "--provider", "cheapest", "--json", str(JOB)).stdout)
    assert (planned["provider"], planned["region"]) == ("aws", AWS_REGION), planned

    proc = gcp.run("run", "--provider", "cheapest", str(JOB), timeout=600)
    told = proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_id,) = ct.run_ids()
    record = ct.ledger().get_run(run_id)  # where it landed first: the rest follows from it
    assert record is not None and (record.provider, record.region) == ("gcp", GCP_REGION), told
    assert proc.returncode == 0, told
    # every zone of us-east-1 refused for capacity (the SDK retries each 500 refusal), and
    # nothing for quota, on either cloud
    refused = [(kind, where) for kind, where, _type in aws.refused]
    assert {kind for kind, _ in refused} == {"InsufficientInstanceCapacity"}, refused
    assert {where for _, where in refused} == set(sold_out), refused
    inserts = [op for op in gcp.cloud.gce.operations() if op["operationType"] == "insert"]
    assert inserts and not [op for op in inserts if op.get("error")], inserts

    path = [e.message for e in ct.ledger().events(run_id) if e.kind == "failover"]
    assert path[0].startswith(f"aws {AWS_REGION}: capacity: no capacity for g4dn.xlarge"), path
    assert path[1] == f"deleting what was made in aws {AWS_REGION}", path
    assert path[2].startswith("store: the run's ") and f"{ACCOUNT}-{AWS_REGION}" in path[2]
    assert path[3].startswith(f"moving to gcp {GCP_REGION} at $"), path
    route = path[-1]
    assert route.startswith(f"tried aws {AWS_REGION}: capacity: "), route
    assert route.endswith(f"; landed in gcp {GCP_REGION}"), route
    assert "(again)" not in route and route.count("aws ") == 1, route
    assert f"place: tried aws {AWS_REGION}: capacity" in proc.stdout, proc.stdout[-3000:]

    # trained on GCP: the model in the project's bucket; nothing left on either cloud
    prefix = f"cloudtrain/runs/{run_id}/"
    assert f"{prefix}model/saved_model/saved_model.pb" in gcp.keys(prefix)
    gcp.assert_nothing_left(run_id)
    assert_nothing_on_aws(aws3, run_id)
    made = {(r.provider, r.region) for r in ct.ledger().resources(run_id)}
    assert {r for p, r in made if p == "aws"} == {AWS_REGION}, made  # made there, then deleted
    assert ("gcp", GCP_REGION) in made, made  # (GCP's firewall and accounts are global)

    status = gcp.run("status", run_id, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    shown = json.loads(status.stdout)
    assert shown["nodes"]["worker-0"]["status"]["state"] == "succeeded", shown
    assert GCP_REGION in status.stdout and "gs://" in status.stdout, shown
