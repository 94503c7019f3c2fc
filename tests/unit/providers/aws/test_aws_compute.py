"""AwsCompute (providers/aws/compute.py, network.py, identity.py) against moto, in process: the
pure pieces (planned names, the S3 policy, user data and client tokens), the network and identity
(security group, SSH rule, IAM role and instance profile, their listing and deletion), console
output and zones, the startup blocks and image names. The node create/list/delete tests and
RunInstances' errors are in test_aws_nodes.py; the fixtures and helpers are aws_kit.py's.

Each test runs inside `moto.mock_aws()` with throwaway credentials, the session caches cleared,
and the two public AMI SSM parameters seeded through moto's backend (moto refuses `put_parameter`
under `/aws/`). What moto does not do is simulated on the client: errors are raised from a
`before-call` hook and a missing default VPC is a short-circuited DescribeVpcs answer.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from cloudtrain.core.errors import NotTheRuns, ProviderError, TransientError
from cloudtrain.providers.aws import images, network
from cloudtrain.providers.aws.bodies import client_token, user_data
from cloudtrain.providers.aws.compute import AwsCompute
from cloudtrain.providers.aws.identity import node_name, node_path
from cloudtrain.providers.aws.node_policy import parse_s3_uri, s3_policy
from cloudtrain.providers.base import Resource, RunInfo
from cloudtrain.run.startup import StartupParams, render_startup
from tests.fakes.shell import require_tool
from tests.unit.aws_kit import (
    REGION,
    RUN,
    STORE,
    TWO_WORKERS,
    aws,
    client_error,
    ct,
    hook,
    ingress,
    policy_doc,
    request,
    run_info,
)

__all__ = ["aws", "ct"]  # fixtures, for pytest


# -- pure pieces ---------------------------------------------------------------------------


def test_planned_network_names_are_deterministic() -> None:
    planned = AwsCompute(REGION).planned_network(run_info(nodes=TWO_WORKERS))
    assert [(r.kind, r.id, r.region, r.run_id, r.cloud_id) for r in planned] == [
        ("security-group", "cloudtrain-r1", REGION, RUN, None),
        ("iam-role", "cloudtrain-r1-worker-0", REGION, RUN, None),
        ("instance-profile", "cloudtrain-r1-worker-0", REGION, RUN, None),
        ("iam-role", "cloudtrain-r1-worker-1", REGION, RUN, None),
        ("instance-profile", "cloudtrain-r1-worker-1", REGION, RUN, None),
    ]


def test_node_names_fit_iams_limits() -> None:
    longest_run = "a" * 30 + "-abcdef"  # run_ids.RUN_ID_RE's longest
    assert node_name(longest_run, "evaluator-99999") == f"cloudtrain-{longest_run}-evaluator-99999"
    long = node_name(longest_run, "worker-1234567890")
    assert len(long) == 64 and long.startswith(f"cloudtrain-{longest_run}-worke")
    assert long != node_name(longest_run, "worker-1234567891")
    assert node_path("r1") == "/cloudtrain/r1/"


def test_s3_policy_is_the_run_prefix_only() -> None:
    assert parse_s3_uri("s3://b") == ("b", "")
    assert parse_s3_uri("s3://b/x/y/") == ("b", "x/y/")
    with pytest.raises(ProviderError, match="s3://"):
        parse_s3_uri("gs://b/x")
    doc = s3_policy("s3://b/x", "r9", "worker-1", chief=False)
    # then the writes and the Denies: test_aws_node_bucket_rights.py
    objects, listing, writes = doc["Statement"][:3]
    assert {s["Effect"] for s in doc["Statement"][3:]} == {"Deny"}
    assert objects["Action"] == "s3:GetObject"
    assert sorted(writes["Action"]) == [
        "s3:AbortMultipartUpload",
        "s3:DeleteObject",
        "s3:ListMultipartUploadParts",
        "s3:PutObject",
    ]
    assert all(r.startswith("arn:aws:s3:::b/x/cloudtrain/runs/r9/") for r in writes["Resource"])
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
    # the option (provider_config turns the deprecated variable into it)
    open_to_all = dataclasses.replace(ct.config, options={"ssh_cidr": "0.0.0.0/0"})
    monkeypatch.setattr(ct, "config", open_to_all)
    with pytest.raises(ProviderError, match="whole internet"):
        ct.ensure_network(run_info(ssh=True))
    assert ct.list_resources(RUN) == []  # nothing is made before the check
    options = {"ssh_cidr": "203.0.113.7/32"}
    monkeypatch.setattr(ct, "config", dataclasses.replace(ct.config, options=options))
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
    made = ct.ensure_network(run_info(nodes=TWO_WORKERS))
    resources = {r.kind: r for r in made if r.id.endswith("-1")}
    name = "cloudtrain-r1-worker-1"
    assert resources["iam-role"].cloud_id == ct.iam.get_role(RoleName=name)["Role"]["Arn"]
    profile = ct.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert resources["instance-profile"].cloud_id == profile["Arn"]
    assert [r["RoleName"] for r in profile["Roles"]] == [name]
    role = ct.iam.get_role(RoleName=name)["Role"]
    trust = policy_doc(role["AssumeRolePolicyDocument"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert role["Path"] == profile["Path"] == "/cloudtrain/r1/"
    tags = ct.iam.list_role_tags(RoleName=name)["Tags"]
    assert {"Key": "cloudtrain:run", "Value": RUN} in tags
    assert {"Key": "cloudtrain:node", "Value": "worker-1"} in tags
    assert ct.iam.list_role_policies(RoleName=name)["PolicyNames"] == ["cloudtrain-r1-s3"]
    doc = policy_doc(
        ct.iam.get_role_policy(RoleName=name, PolicyName="cloudtrain-r1-s3")["PolicyDocument"]
    )
    assert doc == s3_policy(STORE, RUN, "worker-1", chief=False)  # worker-0 is the chief
    chief = ct.iam.get_role_policy(RoleName="cloudtrain-r1-worker-0", PolicyName="cloudtrain-r1-s3")
    assert policy_doc(chief["PolicyDocument"]) == s3_policy(STORE, RUN, "worker-0", chief=True)
    resources_of_statements = [s["Resource"] for s in doc["Statement"] if s["Effect"] == "Allow"]
    assert resources_of_statements[:2] == [
        "arn:aws:s3:::ct-test-bucket/team/a/cloudtrain/runs/r1/*",
        "arn:aws:s3:::ct-test-bucket",
    ]
    ct.ensure_network(run_info())  # idempotent: existing role/profile/membership are fine
    assert (
        len(ct.iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]) == 1
    )


def test_a_non_s3_store_is_refused_before_anything_is_made(ct: AwsCompute) -> None:
    bad = RunInfo(RUN, REGION, None, (2222, 2232), store_uri="gs://bucket", nodes=("worker-0",))
    with pytest.raises(ProviderError, match="s3://"):
        ct.ensure_network(bad)
    assert ct.list_resources(RUN) == []


def test_list_and_delete_resources_idempotently(ct: AwsCompute) -> None:
    made = ct.ensure_network(run_info())
    ct.ensure_network(run_info(run_id="other", nodes=TWO_WORKERS))
    listed = ct.list_resources(RUN)
    assert sorted((r.kind, r.id, r.cloud_id) for r in listed) == sorted(
        (r.kind, r.id, r.cloud_id) for r in made
    )
    ct.delete_resources(listed)
    assert ct.list_resources(RUN) == []
    name = "cloudtrain-r1-worker-0"
    for call in (
        lambda: ct.iam.get_role(RoleName=name),
        lambda: ct.iam.get_instance_profile(InstanceProfileName=name),
    ):
        with pytest.raises(ClientError, match="NoSuchEntity"):
            call()
    ct.delete_resources(listed)  # twice is fine
    # what the ledger recorded before the creates (no cloud ids) deletes by name as well
    planned = ct.planned_network(run_info(run_id="other", nodes=TWO_WORKERS))
    assert len(ct.list_resources("other")) == 5
    ct.delete_resources(planned)
    ct.delete_resources(planned)
    assert ct.list_resources("other") == []


def test_each_nodes_role_is_found_by_its_path_and_kept_unless_its_tags_name_it(
    ct: AwsCompute,
) -> None:
    ct.ensure_network(run_info(nodes=TWO_WORKERS))
    found = {(t.run_id, t.kind, t.id) for t in ct.inventory()}
    for node in TWO_WORKERS:
        assert (RUN, "iam-role", f"cloudtrain-r1-{node}") in found
        assert (RUN, "instance-profile", f"cloudtrain-r1-{node}") in found
    # someone's role at the run's path, tagged with the run but named for another node
    tags = [{"Key": "cloudtrain:run", "Value": RUN}, {"Key": "cloudtrain:node", "Value": "ps-0"}]
    ct.iam.create_role(
        Path=node_path(RUN),
        RoleName="cloudtrain-r1-worker-9",
        AssumeRolePolicyDocument="{}",
        Tags=tags,
    )
    assert (RUN, "iam-role", "cloudtrain-r1-worker-9") not in {
        (t.run_id, t.kind, t.id) for t in ct.inventory()
    }
    listed = ct.list_resources(RUN)
    assert ("iam-role", "cloudtrain-r1-worker-9") in {(r.kind, r.id) for r in listed}
    with pytest.raises(NotTheRuns, match="cloudtrain-r1-worker-9"):
        ct.delete_resources(listed)
    roles = {r["RoleName"] for r in ct.iam.list_roles()["Roles"]}
    assert roles == {"cloudtrain-r1-worker-9"}  # the run's own went, the stranger stays


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
    assert dict(blocks.env) == {
        "AWS_DEFAULT_REGION": REGION,
        "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "5",
        "AWS_METADATA_SERVICE_TIMEOUT": "3",
    }
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
    from cloudtrain.core.errors import ProviderError

    aliases = images.IMAGE_ALIASES
    assert set(aliases) >= {"dlami", "ubuntu-22.04", "ubuntu-24.04"}
    assert aliases["ubuntu-24.04"].ref.startswith("/aws/service/canonical/ubuntu/server/24.04/")
    assert "base-oss-nvidia-driver-gpu-ubuntu-24.04" in aliases["dlami-ubuntu-24.04"].ref
    compute = AwsCompute("us-east-1")
    ami = request(image="ami-0123456789abcdef0")
    assert compute.resolve_image(ami) == "ami-0123456789abcdef0"
    with pytest.raises(ProviderError, match="unknown image 'centos'"):
        compute.resolve_image(request(gpus=0, image="centos"))
