"""The box's S3 refuses a node what its role does not allow (tests/fakes/s3_authorizer.py), and a
node's boto3 finds its role's credentials on the metadata service
(tests/fakes/imds_credentials_aws.py), on a moto server.

The node roles are the adapter's own (`AwsCompute.ensure_network` of a run with nodes chief-0,
worker-0, worker-1, worker-10); the credentials are taken by botocore's default chain with the
environment a node VM gets (`node_env`), exactly as the node's agent takes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("moto")

import boto3
from botocore.exceptions import ClientError

from cloudtrain.jobs import protocol as p
from cloudtrain.providers.aws.compute import AwsCompute
from cloudtrain.providers.base import RunInfo
from tests.fakes.imds_credentials_aws import CREDENTIALS_PATH, Ec2RoleCredentials, node_s3
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.moto_server import MotoServer, moto_amis, moto_server, moto_server_session
from tests.unit.node_rights_kit import CHIEF, NODE, NODES, PEER

__all__ = ["moto_server", "moto_server_session"]  # fixtures, for pytest
REGION = "us-east-1"
BUCKET = "ct-box-bucket"
ROOT = "team/"
RUN = "box-0a1b2c"


def _key(key: str) -> str:
    return ROOT + key


@pytest.fixture
def box(moto_server: MotoServer) -> Iterator[dict[str, Any]]:
    """The run's node roles, one instance of worker-1 under its profile, and the metadata
    service with the credentials routes."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    info = RunInfo(RUN, REGION, None, (2222, 2232), store_uri=f"s3://{BUCKET}/team", nodes=NODES)
    AwsCompute(REGION).ensure_network(info)
    ec2 = boto3.client("ec2", region_name=REGION)
    (inst,) = ec2.run_instances(
        ImageId=moto_amis(1)[0],
        MinCount=1,
        MaxCount=1,
        IamInstanceProfile={"Name": f"cloudtrain-{RUN}-{NODE}"},
    )["Instances"]
    with MetadataServer() as imds:
        Ec2RoleCredentials(moto_server.url, REGION).install(imds)
        yield {"s3": s3, "imds": imds, "instance": inst["InstanceId"], "moto": moto_server}


def _node_s3(box: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    return node_s3(box["imds"].url, box["instance"], monkeypatch, REGION)


def _code(call: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as info:
        call()
    err = info.value.response
    return err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Code"]


def test_the_metadata_service_hands_the_instance_its_roles_credentials(
    box: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import urllib.request

    base = f"{box['imds'].url}/vm/{box['instance']}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as no_token:  # IMDSv2 only
        opener.open(base + CREDENTIALS_PATH, timeout=5)
    assert no_token.value.code == 401
    _, creds = _node_s3(box, monkeypatch)
    assert creds.method == "iam-role"  # botocore's instance-metadata provider
    frozen = creds.get_frozen_credentials()
    assert frozen.access_key.startswith("ASIA") and frozen.token
    who = boto3.client(
        "sts",
        region_name=REGION,
        aws_access_key_id=frozen.access_key,
        aws_secret_access_key=frozen.secret_key,
        aws_session_token=frozen.token,
    ).get_caller_identity()
    assert f":assumed-role/cloudtrain-{RUN}-{NODE}/{box['instance']}" in who["Arn"]


def test_the_store_refuses_what_the_node_role_does_not_allow(
    box: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    s3, _ = _node_s3(box, monkeypatch)
    owner = box["s3"]
    owner.put_object(Bucket=BUCKET, Key=_key(p.stop_key(RUN)), Body=b"{}")
    own = _key(p.status_key(RUN, NODE))
    s3.put_object(Bucket=BUCKET, Key=own, Body=b"{}")  # its own status: accepted
    assert owner.get_object(Bucket=BUCKET, Key=own)["Body"].read() == b"{}"
    s3.delete_object(Bucket=BUCKET, Key=own)
    assert s3.get_object(Bucket=BUCKET, Key=_key(p.stop_key(RUN)))["Body"].read() == b"{}"
    refused = [
        p.stop_key(RUN),
        p.lease_key(RUN),
        p.journal_prefix(RUN) + "0001-entry.json",
        p.status_key(RUN, PEER),
        p.status_key(RUN, p.node_id("worker", 10)),
        p.checkpoints_prefix(RUN) + "ckpt-1.index",  # the chief's
    ]
    for key in refused:
        assert _code(lambda k=key: s3.put_object(Bucket=BUCKET, Key=_key(k), Body=b"x")) == (
            403,
            "AccessDenied",
        ), key
    assert _code(lambda: s3.delete_object(Bucket=BUCKET, Key=_key(p.stop_key(RUN)))) == (
        403,
        "AccessDenied",
    )
    # the run's key: not even read; another run: nothing
    assert (
        _code(lambda: s3.head_object(Bucket=BUCKET, Key=_key(p.run_prefix(RUN) + "control/key")))[0]
        == 403
    )
    assert (
        _code(lambda: s3.get_object(Bucket=BUCKET, Key=_key(p.stop_key("other-0a1b2c"))))[0] == 403
    )
    # copies: the destination is a write; multipart parts are writes
    copy = {"Bucket": BUCKET, "Key": _key(p.stop_key(RUN))}
    s3.copy_object(Bucket=BUCKET, Key=_key(p.notice_key(RUN, NODE)), CopySource=copy)
    assert _code(
        lambda: s3.copy_object(Bucket=BUCKET, Key=_key(p.lease_key(RUN)), CopySource=copy)
    ) == (403, "AccessDenied")
    logs = _key(p.logs_prefix(RUN, NODE) + "big")
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key=logs)["UploadId"]
    s3.upload_part(Bucket=BUCKET, Key=logs, UploadId=upload, PartNumber=1, Body=b"a")
    s3.list_parts(Bucket=BUCKET, Key=logs, UploadId=upload)
    s3.abort_multipart_upload(Bucket=BUCKET, Key=logs, UploadId=upload)
    assert _code(
        lambda: s3.create_multipart_upload(Bucket=BUCKET, Key=_key(p.cluster_key(RUN)))
    ) == (403, "AccessDenied")
    # listing: the run's prefix only
    s3.list_objects_v2(Bucket=BUCKET, Prefix=_key(p.run_prefix(RUN)))
    assert _code(lambda: s3.list_objects_v2(Bucket=BUCKET))[0] == 403
    assert (
        _code(
            lambda: s3.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": _key(p.stop_key(RUN))}]}
            )
        )[0]
        == 403
    )
    # the box's own key is not enforced
    owner.put_object(Bucket=BUCKET, Key=_key(p.lease_key(RUN)), Body=b"{}")
    role = f"cloudtrain-{RUN}-{NODE}"
    stop = f"arn:aws:s3:::{BUCKET}/{_key(p.stop_key(RUN))}"
    assert ("s3:PutObject", stop, role) in box["moto"].authorizer.refused


def test_the_chief_writes_its_checkpoints(box: dict[str, Any]) -> None:
    sts = boto3.client("sts", region_name=REGION)
    arn = boto3.client("iam").get_role(RoleName=f"cloudtrain-{RUN}-{CHIEF}")["Role"]["Arn"]
    c = sts.assume_role(RoleArn=arn, RoleSessionName="i-chief")["Credentials"]
    s3 = boto3.client(
        "s3",
        region_name=REGION,
        aws_access_key_id=c["AccessKeyId"],
        aws_secret_access_key=c["SecretAccessKey"],
        aws_session_token=c["SessionToken"],
    )
    s3.put_object(Bucket=BUCKET, Key=_key(p.checkpoints_prefix(RUN) + "ckpt-1.index"), Body=b"")
    assert _code(
        lambda: s3.put_object(Bucket=BUCKET, Key=_key(p.status_key(RUN, NODE)), Body=b"")
    ) == (403, "AccessDenied")


def test_a_forged_signature_or_token_is_refused(box: dict[str, Any]) -> None:
    sts = boto3.client("sts", region_name=REGION)
    arn = boto3.client("iam").get_role(RoleName=f"cloudtrain-{RUN}-{NODE}")["Role"]["Arn"]
    c = sts.assume_role(RoleArn=arn, RoleSessionName="i-x")["Credentials"]
    own = _key(p.status_key(RUN, NODE))

    def client(secret: str, token: str) -> Any:
        return boto3.client(
            "s3",
            region_name=REGION,
            aws_access_key_id=c["AccessKeyId"],
            aws_secret_access_key=secret,
            aws_session_token=token,
        )

    forged = client("not-the-secret", c["SessionToken"])
    assert _code(lambda: forged.put_object(Bucket=BUCKET, Key=own, Body=b"")) == (
        403,
        "SignatureDoesNotMatch",
    )
    wrong = client(c["SecretAccessKey"], "not-the-token")
    assert _code(lambda: wrong.put_object(Bucket=BUCKET, Key=own, Body=b"")) == (
        400,
        "InvalidToken",
    )
    client(c["SecretAccessKey"], c["SessionToken"]).put_object(Bucket=BUCKET, Key=own, Body=b"")


def test_a_refusal_once_teardown_took_the_roles_policy_is_marked_revoked(
    box: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teardown deletes a node role's policy before the role: a node's last log flush in
    between is refused, as on AWS, and marked " (revoked)" (as after the role is gone), so a
    box run's "nothing refused" check tells it from a rule that is too tight."""
    s3, _ = _node_s3(box, monkeypatch)
    status = _key(p.status_key(RUN, NODE))
    s3.put_object(Bucket=BUCKET, Key=status, Body=b"{}")  # granted while the policy holds
    iam = boto3.client("iam")
    role = f"cloudtrain-{RUN}-{NODE}"
    for name in iam.list_role_policies(RoleName=role)["PolicyNames"]:
        iam.delete_role_policy(RoleName=role, PolicyName=name)
    assert _code(lambda: s3.put_object(Bucket=BUCKET, Key=status, Body=b"{}")) == (
        403,
        "AccessDenied",
    )
    assert box["moto"].authorizer.refused == [
        ("s3:PutObject", f"arn:aws:s3:::{BUCKET}/{status}", f"{role} (revoked)")
    ]
