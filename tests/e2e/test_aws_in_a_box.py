"""Cloud in a box for AWS: the real `cloudtrain run --provider aws` against a moto server.

Every EC2 instance the adapter creates is booted by the harness, which runs the instance's own
UserData as a local process session pointed at moto (as any boto3 program honours
AWS_ENDPOINT_URL). The training is real TensorFlow; checkpoints and the model land in moto's S3;
afterwards every instance is terminated and the security group, roles and profiles are gone.

Each node VM takes its own node role's credentials from the box's metadata service, as on EC2
(tests/fakes/imds_credentials_aws.py: the box's full-rights key is removed from its environment),
and moto's S3 enforces that role's policy (tests/fakes/s3_authorizer.py, installed by
tests/fakes/moto_server.start_moto): a run here passing shows the node rules are not too tight.
A managed run's controller VM keeps the box's key: enforcing the controller's identity is
issue 30's.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs import protocol
from tests.e2e import phases_report
from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.trace_kit import assert_traced
from tests.fakes.boot_harness import BootHarness, Vm
from tests.fakes.imds_credentials_aws import Ec2RoleCredentials, node_env
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.moto_server import MotoServer

pytestmark = pytest.mark.e2e
REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = f"cloudtrain-{ACCOUNT}-{REGION}"


@dataclass
class AwsBox:
    ct: Env
    harness: BootHarness
    ec2: Any
    s3: Any
    iam: Any
    imds: MetadataServer | None = None  # the VMs' metadata service (their role credentials)
    moto: MotoServer | None = None

    def run(self, *args: str, timeout: float = 300) -> Any:
        return self.ct.cli(*args, timeout=timeout)

    def instances(self) -> list[dict[str, Any]]:
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate():
            for reservation in page["Reservations"]:
                out += reservation["Instances"]
        return out

    def keys(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def wait_for_node_line(self, node: str, pattern: str, timeout: float = 300) -> re.Match[str]:
        """Wait until a line of `node`'s output in the run's bucket matches `pattern` (one run in
        this home). Its log chunks land within the agent's ~1 s flush; the CLI prints a line
        only after a heartbeat announces its chunk and a poll reads it, seconds later on a loaded
        machine, too late to time a termination mid-epoch (as Env.wait_for_node_line on local)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            ids = self.ct.run_ids()
            try:
                keys = self.keys(protocol.logs_prefix(ids[0], node)) if len(ids) == 1 else []
            except self.s3.exceptions.NoSuchBucket:  # the run's row comes before its bucket
                keys = []
            for key in keys:
                try:
                    body = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
                except self.s3.exceptions.NoSuchKey:  # rolled into a segment meanwhile
                    continue
                m = re.search(pattern, body.decode(errors="replace"), re.M)
                if m:
                    return m
            time.sleep(0.2)
        raise AssertionError(
            f"{pattern!r} not in {node}'s logs in time:\n{self.ct.output()[-4000:]}"
        )

    def assert_nodes_ran_under_their_roles(self, run_id: str) -> None:
        """Every instance of the run took its own node role's credentials from the metadata
        service (moto's STS assumed the role for it), and S3 refused the nodes nothing while
        their roles held their policies (a node's last log flush may come after teardown
        deleted its role's policy or its role: refused, as on AWS)."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.sts.models import sts_backends

        assumed = {
            r.session_name: r.role_arn.rsplit("/", 1)[1]
            for r in sts_backends[DEFAULT_ACCOUNT_ID]["aws"].assumed_roles
        }
        instances = [i for i in self.instances() if _tag(i, "cloudtrain:run") == run_id]
        assert instances
        for inst in instances:
            node = f"{_tag(inst, 'cloudtrain:role')}-{_tag(inst, 'cloudtrain:index')}"
            assert assumed.get(inst["InstanceId"]) == f"cloudtrain-{run_id}-{node}", assumed
        assert self.moto is not None
        refused = [r for r in self.moto.authorizer.refused if not r[2].endswith(" (revoked)")]
        assert refused == [], refused

    def assert_nothing_left(self, run_id: str) -> None:
        states = {i["InstanceId"]: i["State"]["Name"] for i in self.instances()}
        assert states and set(states.values()) == {"terminated"}, states
        groups = self.ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [f"cloudtrain-{run_id}"]}]
        )["SecurityGroups"]
        assert groups == []
        roles = [r["RoleName"] for r in self.iam.list_roles()["Roles"]]
        profiles = [
            p["InstanceProfileName"] for p in self.iam.list_instance_profiles()["InstanceProfiles"]
        ]
        left = [n for n in roles + profiles if n.startswith(f"cloudtrain-{run_id}")]
        assert left == [], left  # every node's role and profile, and the controller's
        assert self.harness.live_sessions() == []
        ledger = self.ct.ledger()
        assert all(r.state == "deleted" for r in ledger.resources(run_id))


def _tag(instance: dict[str, Any], key: str) -> str | None:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == key), None)


def _discover(ec2: Any, images: dict[str, str], imds_url: str | None = None) -> list[Vm]:
    """The instances moto holds; `images`: public parameter -> AMI (tells the box the image).
    With `imds_url` (a metadata service with tests/fakes/imds_credentials_aws.py's routes),
    each training node's VM loses the box's key and takes its role's credentials from there
    (`node_env`), as on EC2; a controller VM keeps the box's key (issue 30's to enforce), as
    does a test's own untagged VM."""
    params = {ami: param for param, ami in images.items()}
    vms = []
    for page in ec2.get_paginator("describe_instances").paginate():
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                iid = inst["InstanceId"]
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}

                def script(iid: str = iid) -> str:
                    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
                    raw = base64.b64decode(attr["UserData"]["Value"])
                    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()

                alive = inst["State"]["Name"] in ("pending", "running")
                image = "aws:" + params.get(inst["ImageId"], inst["ImageId"])
                role = tags.get("cloudtrain:role")  # none: a test's own VM, not a node
                training = role is not None and role != "controller"
                env = node_env(imds_url, iid) if imds_url and training else {}
                vms.append(Vm(iid, tags.get("Name", iid), alive, script, image, env=env))
    return vms


@pytest.fixture
def aws(
    ct: Env,
    moto_server: MotoServer,
    moto_public_images: dict[str, str],
    tmp_path: Path,
) -> Iterator[AwsBox]:
    import os

    import boto3

    aws_env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "NO_PROXY"))}
    ct.env.update(aws_env)
    clients = {
        name: boto3.client(name, region_name=REGION, endpoint_url=moto_server.url)
        for name in ("ec2", "s3", "iam")
    }
    ec2 = clients["ec2"]
    imds = MetadataServer()  # the instances' metadata service, with their role credentials
    Ec2RoleCredentials(moto_server.url, REGION).install(imds)
    harness = BootHarness(
        tmp_path / "box",
        lambda: _discover(ec2, moto_public_images, imds.url),
        dict(ct.env),
        on_power_off=lambda vm: ec2.terminate_instances(InstanceIds=[vm]),
    )
    harness.metadata_url = imds.url  # a test may give the agents another (test_preemption)
    harness.start()
    try:
        yield AwsBox(ct, harness, ec2, clients["s3"], clients["iam"], imds, moto_server)
    finally:
        harness.stop()
        imds.close()


def test_run_on_aws_trains_for_real_and_leaves_nothing(aws: AwsBox) -> None:
    # the planned zone (the catalog's use1-az1) has no capacity: the run lands in the next one
    aws.ct.env["CLOUDTRAIN_FAULTS"] = json.dumps({"capacity_errors": {"use1-az1": 99}})
    job = EXAMPLES / "digits-multiworker" / "job.yaml"
    spawned = time.time()
    proc = aws.run("run", "--provider", "aws", "--region", REGION, str(job))
    exited = time.time()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "zone use1-az1: " in proc.stdout and "trying the next zone" in proc.stdout
    (run_id,) = aws.ct.run_ids()
    zones = {i["Placement"]["AvailabilityZone"] for i in aws.instances()}
    assert len(zones) == 1 and zones != {"us-east-1b"}, zones  # us-east-1b is use1-az1 in moto
    prefix = f"cloudtrain/runs/{run_id}/"
    keys = aws.keys(prefix)
    assert any(k.startswith(prefix + "checkpoints/") and k.endswith(".index") for k in keys)
    assert prefix + "model/saved_model/saved_model.pb" in keys
    # what the run measured went to S3: each node's metrics stream, the chief's event files
    for node in ("worker-0", "worker-1"):
        assert any(k.startswith(f"{prefix}metrics/{node}/") for k in keys), keys
    assert any(k.startswith(prefix + "tensorboard/train/events.out.tfevents.") for k in keys)
    status = json.loads(aws.run("status", run_id, "--json").stdout)
    assert status["throughput"]["cluster_examples_per_s"] > 0, status["throughput"]
    assert "throughput: cluster" in proc.stdout
    assert len(aws.harness.booted) == 2
    aws.assert_nodes_ran_under_their_roles(run_id)
    aws.assert_nothing_left(run_id)
    # traced as on local (the VMs are processes here: one clock); its phases for the README
    trace = assert_traced(aws.ct, run_id, spawned, exited, ("worker-0", "worker-1"))
    phases_report.record("aws box", trace, phases_report.aws_fakes(aws.harness), spawned, exited)


def test_scale_on_aws_measures_each_size_at_the_catalogs_price(aws: AwsBox) -> None:
    job = EXAMPLES / "digits-multiworker" / "job.yaml"
    where = ("--provider", "aws", "--region", REGION)
    proc = aws.run("scale", *where, str(job), "--workers", "1,2", "--steps", "10", "--json", "-q")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    assert all(r["examples_per_s"] and r["examples_per_s"] > 0 for r in rows), rows
    plan = json.loads(aws.run("plan", *where, str(job), "--json").stdout)  # two workers
    each = plan["hourly_usd"] / 2  # the catalog's on-demand price of the planned instance
    assert [r["hourly_usd"] for r in rows] == pytest.approx([each, 2 * each]), (rows, plan)
    for row in rows:
        aws.assert_nothing_left(row["run_id"])


def test_a_full_zone_fails_over_and_all_full_fails_clearly(aws: AwsBox) -> None:
    job = EXAMPLES / "digits-multiworker" / "job.yaml"
    aws.ct.env["CLOUDTRAIN_FAULTS"] = json.dumps(
        {
            "capacity_errors": {
                "use1-az1": 99,
                "use1-az2": 99,
                "use1-az3": 99,
                "use1-az4": 99,
                "use1-az5": 99,
                "use1-az6": 99,
            }
        }
    )
    proc = aws.run("run", "--provider", "aws", "--region", REGION, str(job))
    assert proc.returncode == 3
    assert "tried zone use1-az1, zone " in proc.stdout, proc.stdout[-3000:]
    (run_id,) = aws.ct.run_ids()
    groups = aws.ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [f"cloudtrain-{run_id}"]}]
    )["SecurityGroups"]
    assert groups == [] and aws.harness.booted == [] and aws.instances() == []
    roles = [r["RoleName"] for r in aws.iam.list_roles()["Roles"]]
    profiles = [
        p["InstanceProfileName"] for p in aws.iam.list_instance_profiles()["InstanceProfiles"]
    ]
    assert not [n for n in roles + profiles if n.startswith(f"cloudtrain-{run_id}")]
    resources = aws.ct.ledger().resources(run_id)
    assert resources and all(r.state == "deleted" for r in resources)


def test_detach_then_status_logs_and_down(aws: AwsBox) -> None:
    # detach, logs, status and down are asserted: the job ticks (the run above trains for real)
    job = aws.ct.tick_job("detached", epochs=4, seconds=0.5)
    proc = aws.run(
        "run", "--detach", "--no-controller", "--provider", "aws", "--region", REGION, str(job)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_id,) = aws.ct.run_ids()
    follow = aws.run("logs", run_id, "--follow")
    assert "cloudtrain: epoch 4/4 done" in follow.stdout, follow.stdout[-3000:]
    status = json.loads(aws.run("status", run_id, "--json").stdout)
    assert status["nodes"]["worker-0"]["status"]["state"] == "succeeded"
    down = aws.run("down", run_id)
    assert down.returncode == 0, down.stdout + down.stderr
    aws.assert_nothing_left(run_id)
