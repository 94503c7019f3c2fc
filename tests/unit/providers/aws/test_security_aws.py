"""Security guarantees of the AWS provider, on moto: one detached `cloudtrain run` (the real CLI,
orchestrator and adapter) with secret env values and canary credentials, then every guarantee
checked against what moto stored and what the controller sent, printed and kept.

See tests/unit/test_security.py for the list of guarantees and the other providers.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("boto3")

from tests.fakes.moto_server import (
    MotoServer,
    clear_aws_caches,
    moto_available,
    moto_server_session,
    seed_public_images,
    use_moto,
)
from tests.unit import security_kit as kit

__all__ = ["moto_server_session"]  # fixtures, for pytest
REGION = "us-east-1"
SSH_CIDR = "203.0.113.7/32"
if not moto_available():
    pytest.skip("moto server mode is not installed", allow_module_level=True)


@dataclass
class AwsSeen:
    """What one detached run left in moto, and what the controller sent and kept."""

    run: kit.CliRun
    bucket: str
    prefix: str
    instances: list[dict[str, Any]]
    user_data: list[str]
    groups: list[dict[str, Any]]
    ssh_groups: list[dict[str, Any]]
    role_policies: dict[str, Any]
    iam: dict[str, Any]
    public_access_block: dict[str, Any]
    encryption: dict[str, Any]
    cluster_json: dict[str, Any]

    def cloud_dump(self) -> str:
        """Everything moto keeps about the run's instances, volumes, groups and identity."""
        parts = [self.instances, self.groups, self.ssh_groups, self.role_policies, self.iam]
        return json.dumps(parts, default=str) + "\n".join(self.user_data)


def _user_data(ec2: Any, instance_id: str) -> str:
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    raw = base64.b64decode(attr["UserData"]["Value"])
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def _run_group(ec2: Any, run_id: str) -> list[dict[str, Any]]:
    found = ec2.describe_security_groups(
        Filters=[{"Name": "tag:cloudtrain:run", "Values": [run_id]}]
    )
    return list(found["SecurityGroups"])


@pytest.fixture(scope="module")
def aws(moto_server_session: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> AwsSeen:
    """One detached run of a two-worker job on moto; then its traces, read back."""
    import boto3

    from cloudtrain.providers.aws.compute import AwsCompute
    from cloudtrain.providers.base import ProviderConfig, RunInfo

    home = tmp_path_factory.mktemp("aws-home")
    with pytest.MonkeyPatch.context() as mp:
        moto_server_session.reset()
        use_moto(mp, moto_server_session)
        clear_aws_caches()
        seed_public_images((REGION,))
        kit.set_canaries(mp, home)
        mp.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
        run = kit.run_detached(home, kit.write_job(home / "job", kit.spec_text("aws", REGION)))
        ec2, iam, s3 = (boto3.client(s, region_name=REGION) for s in ("ec2", "iam", "s3"))
        pages = ec2.describe_instances(
            Filters=[{"Name": "tag:cloudtrain:run", "Values": [run.run_id]}]
        )["Reservations"]
        instances = [i for r in pages for i in r["Instances"]]
        name = f"cloudtrain-{run.run_id}-worker-1"  # one node's role (each has its own)
        store = kit.first_json(run.outputs["status"])["store"]
        bucket, _, prefix = store.removeprefix("s3://").partition("/")
        key = f"{prefix}/cloudtrain/runs/{run.run_id}/cluster.json".lstrip("/")
        # the same run's network with `ssh: true`, for the SSH rule
        ssh_config = ProviderConfig(name="aws", options={"ssh_cidr": SSH_CIDR})
        ssh_run = RunInfo(
            f"{run.run_id}-ssh", REGION, None, (2222, 2232), True, store, nodes=("worker-0",)
        )
        AwsCompute(REGION, ssh_config).ensure_network(ssh_run)
        seen = AwsSeen(
            run=run,
            bucket=bucket,
            prefix=prefix,
            instances=instances,
            user_data=[_user_data(ec2, i["InstanceId"]) for i in instances],
            groups=_run_group(ec2, run.run_id),
            ssh_groups=_run_group(ec2, ssh_run.run_id),
            role_policies={
                p: iam.get_role_policy(RoleName=name, PolicyName=p)["PolicyDocument"]
                for p in iam.list_role_policies(RoleName=name)["PolicyNames"]
            },
            iam={
                "role": iam.get_role(RoleName=name)["Role"],
                "attached": iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"],
                "profile": iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"],
            },
            public_access_block=s3.get_public_access_block(Bucket=bucket)[
                "PublicAccessBlockConfiguration"
            ],
            encryption=s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"],
            cluster_json=json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read()),
        )
        clear_aws_caches()
    return seen


def _policy(doc: Any) -> dict[str, Any]:
    return json.loads(doc) if isinstance(doc, str) else dict(doc)


# 1. no secret or credential in user data, tags, requests, the ledger or the CLI output ----------


def test_secrets_reach_the_nodes_only_through_cluster_json(aws: AwsSeen) -> None:
    assert len(aws.instances) == 2 and len(aws.user_data) == 2
    env = aws.cluster_json["env"]
    assert env["WANDB_API_KEY"] == kit.SECRET_FROM_ENV and env["HF_TOKEN"] == kit.SECRET_INLINE
    assert sorted(aws.cluster_json["secrets"]) == ["HF_TOKEN", "WANDB_API_KEY"]


def test_no_secret_or_credential_in_user_data_tags_or_identity(aws: AwsSeen) -> None:
    canaries = kit.canaries()
    canaries.remove(kit.CREDENTIAL_CANARIES["AWS_SESSION_TOKEN"])  # see the next test
    assert kit.leaks(aws.cloud_dump(), canaries) == []
    for script in aws.user_data:
        assert "WANDB_API_KEY" not in script and "HF_TOKEN" not in script


def test_session_token_appears_only_as_the_presigned_urls_security_token(aws: AwsSeen) -> None:
    """A presigned S3 URL made with temporary credentials must carry X-Amz-Security-Token (by
    AWS's design; without the secret key it signs nothing). Nowhere else."""
    token = kit.CREDENTIAL_CANARIES["AWS_SESSION_TOKEN"]
    for script in aws.user_data:
        urls = kit.startup_urls(script)
        without = script
        for url in urls.values():
            without = without.replace(url, "")
        assert kit.leaks(without, [token]) == []
    assert kit.leaks(json.dumps([aws.instances, aws.groups, aws.iam], default=str), [token]) == []


def test_no_secret_in_requests_except_cluster_json(aws: AwsSeen) -> None:
    sent = [
        (api, what, body)
        for api, what, body in aws.run.sent.items
        if not (what == "PutObject" and "cluster.json" in body)
    ]
    text = "\n".join(f"{a} {w} {b}" for a, w, b in sent)
    assert kit.leaks(text, list(kit.SECRETS)) == []
    run_instances = aws.run.sent.calls("ec2", "RunInstances")
    assert len(run_instances) == 2 and kit.leaks("".join(run_instances), kit.SECRETS) == []


def test_no_secret_or_credential_in_the_ledger_or_cli_output(aws: AwsSeen) -> None:
    assert kit.leaks(aws.run.text(), kit.canaries()) == []
    assert aws.run.run_id in aws.run.ledger  # the dump did read the ledger


# 2. the bucket denies public access and is encrypted -----------------------------------------


def test_bucket_blocks_all_public_access_and_is_encrypted(aws: AwsSeen) -> None:
    assert aws.public_access_block == {
        "BlockPublicAcls": True,
        "IgnorePublicAcls": True,
        "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True,
    }
    rule = aws.encryption["Rules"][0]["ApplyServerSideEncryptionByDefault"]
    assert rule["SSEAlgorithm"] in ("AES256", "aws:kms")


# 3 and 4. TF ports only from the run's own group; SSH closed unless asked, then one CIDR ------


def _ingress(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert len(groups) == 1
    return list(groups[0]["IpPermissions"])


def test_tf_ports_open_only_to_the_group_itself(aws: AwsSeen) -> None:
    group_id = aws.groups[0]["GroupId"]
    rules = _ingress(aws.groups)
    assert len(rules) == 1
    (rule,) = rules
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 2222, 2232)
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [group_id]
    assert rule.get("IpRanges", []) == [] and rule.get("Ipv6Ranges", []) == []
    assert rule.get("PrefixListIds", []) == []
    assert {i["SecurityGroups"][0]["GroupId"] for i in aws.instances} == {group_id}


def test_ssh_closed_by_default(aws: AwsSeen) -> None:
    for rule in _ingress(aws.groups):
        assert not (rule["FromPort"] <= 22 <= rule["ToPort"]), rule
    assert "0.0.0.0/0" not in json.dumps(_ingress(aws.groups))


def test_ssh_when_asked_only_from_the_configured_cidr(aws: AwsSeen) -> None:
    ssh = [r for r in _ingress(aws.ssh_groups) if r["FromPort"] <= 22 <= r["ToPort"]]
    assert len(ssh) == 1
    assert (ssh[0]["FromPort"], ssh[0]["ToPort"]) == (22, 22)
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == [SSH_CIDR]
    assert ssh[0].get("UserIdGroupPairs", []) == [] and ssh[0].get("Ipv6Ranges", []) == []
    assert "0.0.0.0/0" not in json.dumps(_ingress(aws.ssh_groups))


# 5. IMDSv2 only --------------------------------------------------------------------------------


def test_instances_require_imdsv2(aws: AwsSeen) -> None:
    for body in aws.run.sent.calls("ec2", "RunInstances"):
        assert json.loads(body)["MetadataOptions"]["HttpTokens"] == "required"
    for instance in aws.instances:
        assert instance["MetadataOptions"]["HttpTokens"] == "required"


# 6. presigned URLs live at most an hour -------------------------------------------------------


def test_presigned_urls_in_user_data_expire_within_an_hour(aws: AwsSeen) -> None:
    # the run's first node publishes the wheelhouse (a bare image): its PUTs are checked too
    assert any("CT_WHEELHOUSE_PUT_URL" in kit.startup_urls(s) for s in aws.user_data)
    for script in aws.user_data:
        urls = kit.startup_urls(script)
        assert {"CT_BUNDLE_URL", "CT_LOG_URL"} <= set(urls), urls  # + the wheelhouse's, if any
        for url in urls.values():
            lifetime = kit.url_lifetime_s(url)
            assert lifetime is not None and 0 < lifetime <= kit.MAX_URL_TTL_S, url
            assert "X-Amz-Signature=" in url


# 7. the node identity reaches only the run's prefix ------------------------------------------


def test_node_role_reaches_only_the_runs_prefix(aws: AwsSeen) -> None:
    run_prefix = f"{aws.prefix}/cloudtrain/runs/{aws.run.run_id}/".lstrip("/")
    assert aws.iam["attached"] == []  # no managed policy, only the inline one
    (doc,) = (_policy(d) for d in aws.role_policies.values())
    by_action: dict[str, dict[str, Any]] = {}
    for statement in doc["Statement"]:
        if statement["Effect"] == "Deny":  # narrows the Allows: test_aws_node_bucket_rights.py
            continue
        assert statement["Effect"] == "Allow"
        actions = statement["Action"]
        for action in [actions] if isinstance(actions, str) else actions:
            by_action[action] = statement
    writes = {"s3:PutObject", "s3:DeleteObject"}
    writes |= {"s3:ListMultipartUploadParts", "s3:AbortMultipartUpload"}  # resumed uploads
    assert set(by_action) == writes | {"s3:GetObject", "s3:ListBucket"}
    assert by_action["s3:GetObject"]["Resource"] == f"arn:aws:s3:::{aws.bucket}/{run_prefix}*"
    for action in writes:  # its own keys only: test_aws_node_bucket_rights.py, key by key
        own = by_action[action]["Resource"]
        assert own and all(r.startswith(f"arn:aws:s3:::{aws.bucket}/{run_prefix}") for r in own)
    listing = by_action["s3:ListBucket"]
    assert listing["Resource"] == f"arn:aws:s3:::{aws.bucket}"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": f"{run_prefix}*"}}
    trust = _policy(aws.iam["role"]["AssumeRolePolicyDocument"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    arn = aws.iam["profile"]["Arn"]
    assert arn.endswith(
        f"instance-profile/cloudtrain/{aws.run.run_id}/cloudtrain-{aws.run.run_id}-worker-1"
    )
    for inst in aws.instances:  # each node under its own node's profile
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        node = f"{tags['cloudtrain:role']}-{tags['cloudtrain:index']}"
        profile = inst["IamInstanceProfile"]["Arn"]
        assert profile.endswith(f"/cloudtrain-{aws.run.run_id}-{node}"), (node, profile)
