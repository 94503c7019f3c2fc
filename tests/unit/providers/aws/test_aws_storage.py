"""S3Store (providers/aws/storage.py) against moto's server: what the contract suite does not cover.

Bucket creation per region, the default bucket's privacy settings, a user's bucket left as it is,
multipart transfers, presigned URL lifetimes and regions, batched prefix deletes, and SDK errors
becoming cloudtrain errors (NotFound, CredentialsError, ProviderError with a hint).
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import CredentialsError, NotFound, ProviderError
from cloudtrain.providers.base import ObjectStore, Resource
from tests.fakes.moto_server import clear_aws_caches, moto_server, moto_server_session

pytest.importorskip("boto3")

from cloudtrain.providers.aws.storage import ABORT_RULE_ID, S3Store

__all__ = ["moto_server", "moto_server_session"]  # fixtures used by this module

pytestmark = pytest.mark.usefixtures("moto_server")

ALL_BLOCKED = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}


def raw(region: str = "us-east-1") -> Any:
    """A plain boto3 S3 client on the moto server (the test's own view of the bucket)."""
    import boto3

    return boto3.client("s3", region_name=region)


def query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))


def test_uri_is_normalized_and_keys_are_relative_to_the_prefix() -> None:
    store = S3Store("s3://cloudtrain-norm/runs/a/", "us-east-1")
    assert (store.uri, store.bucket, store.prefix) == (
        "s3://cloudtrain-norm/runs/a",
        "cloudtrain-norm",
        "runs/a",
    )
    assert isinstance(store, ObjectStore)
    assert S3Store("s3://cloudtrain-norm", "us-east-1").uri == "s3://cloudtrain-norm"
    store.ensure_bucket()
    store.put("x/1", b"1")
    S3Store("s3://cloudtrain-norm/runs/ab", "us-east-1").put("x/2", b"2")
    assert raw().get_object(Bucket="cloudtrain-norm", Key="runs/a/x/1")["Body"].read() == b"1"
    assert [o.key for o in store.list("")] == ["x/1"], "a sibling prefix is not listed"
    for bad in ("gs://bucket", "s3://", "s3://Upper_Case", "bucket/key"):
        with pytest.raises(ProviderError):
            S3Store(bad, "us-east-1")
    for key in ("", "/abs", "a/../b"):
        with pytest.raises(ProviderError):
            store.put(key, b"x")


@pytest.mark.parametrize(("region", "expected"), [("eu-west-1", "eu-west-1"), ("us-east-1", None)])
def test_location_constraint_only_outside_us_east_1(region: str, expected: str | None) -> None:
    store = S3Store(f"s3://cloudtrain-loc-{region}/p", region)
    res = store.ensure_bucket()
    assert res == Resource("aws", "bucket", f"s3://cloudtrain-loc-{region}/p", region, "")
    location = raw(region).get_bucket_location(Bucket=f"cloudtrain-loc-{region}")
    assert location["LocationConstraint"] == expected


def test_default_bucket_is_private_and_encrypted() -> None:
    S3Store("s3://cloudtrain-123456789012-us-east-1", "us-east-1").ensure_bucket()
    s3 = raw()
    pab = s3.get_public_access_block(Bucket="cloudtrain-123456789012-us-east-1")
    assert pab["PublicAccessBlockConfiguration"] == ALL_BLOCKED
    enc = s3.get_bucket_encryption(Bucket="cloudtrain-123456789012-us-east-1")
    (rule,) = enc["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert rule["BucketKeyEnabled"] is True


def _lifecycle(s3: Any, bucket: str) -> list[dict[str, Any]]:
    return list(s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"])


def test_a_bucket_cloudtrain_made_aborts_incomplete_uploads_and_keeps_other_rules() -> None:
    """A node preempted mid-upload leaves a multipart upload S3 bills until it is aborted: the
    bucket's lifecycle aborts those after a week. Rules already there stay; twice is once."""
    bucket = "cloudtrain-123456789012-us-west-2"
    s3 = raw("us-west-2")
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    theirs = {"ID": "tmp-expiry", "Status": "Enabled", "Filter": {"Prefix": "tmp/"}}
    theirs["Expiration"] = {"Days": 3}
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [theirs]})
    for _ in range(2):
        S3Store(f"s3://{bucket}", "us-west-2").ensure_bucket()
    rules = {r["ID"]: r for r in _lifecycle(s3, bucket)}
    assert set(rules) == {"tmp-expiry", ABORT_RULE_ID}, rules
    assert rules["tmp-expiry"]["Expiration"] == {"Days": 3}
    ours = rules[ABORT_RULE_ID]
    assert ours["Status"] == "Enabled" and ours["Filter"] == {"Prefix": ""}
    assert ours["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    S3Store("s3://my-new-lifecycle/x", "us-east-1").ensure_bucket()  # made by cloudtrain too
    assert [r["ID"] for r in _lifecycle(raw(), "my-new-lifecycle")] == [ABORT_RULE_ID]


def test_an_existing_user_bucket_is_left_as_it_is() -> None:
    s3 = raw()
    s3.create_bucket(Bucket="my-team-data")
    open_pab = dict.fromkeys(ALL_BLOCKED, False)
    s3.put_public_access_block(Bucket="my-team-data", PublicAccessBlockConfiguration=open_pab)
    store = S3Store("s3://my-team-data/experiments", "us-east-1")
    assert store.ensure_bucket().id == "s3://my-team-data/experiments"
    got = s3.get_public_access_block(Bucket="my-team-data")["PublicAccessBlockConfiguration"]
    assert got == open_pab, "a user's bucket settings are never changed"
    with pytest.raises(s3.exceptions.ClientError, match="ServerSideEncryptionConfiguration"):
        s3.get_bucket_encryption(Bucket="my-team-data")
    with pytest.raises(s3.exceptions.ClientError, match="NoSuchLifecycleConfiguration"):
        s3.get_bucket_lifecycle_configuration(Bucket="my-team-data")


def test_a_missing_user_bucket_is_created_private() -> None:
    S3Store("s3://my-new-bucket/x", "eu-west-1").ensure_bucket()
    s3 = raw("eu-west-1")
    assert s3.get_bucket_location(Bucket="my-new-bucket")["LocationConstraint"] == "eu-west-1"
    pab = s3.get_public_access_block(Bucket="my-new-bucket")["PublicAccessBlockConfiguration"]
    assert pab == ALL_BLOCKED


def test_bucket_already_owned_by_you_is_fine() -> None:
    store = S3Store("s3://cloudtrain-owned/p", "eu-west-1")
    store.ensure_bucket()
    s3 = raw("eu-west-1")
    with pytest.raises(s3.exceptions.BucketAlreadyOwnedByYou):  # what ensure_bucket meets again
        s3.create_bucket(
            Bucket="cloudtrain-owned",
            CreateBucketConfiguration={"LocationConstraint": "eu-west-1"},
        )
    store.put("k", b"v")
    assert store.ensure_bucket() == S3Store("s3://cloudtrain-owned/p", "eu-west-1").ensure_bucket()
    assert store.get("k") == b"v"


def test_a_default_bucket_name_taken_by_another_account_says_what_to_do() -> None:
    import boto3

    creds = boto3.client("sts").assume_role(
        RoleArn="arn:aws:iam::111111111111:role/other", RoleSessionName="other"
    )["Credentials"]
    other = boto3.client(
        "s3",
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
    )
    other.create_bucket(Bucket="cloudtrain-taken")
    with pytest.raises(ProviderError, match=r"s3://cloudtrain-taken") as info:
        S3Store("s3://cloudtrain-taken", "us-east-1").ensure_bucket()
    assert info.value.hint and "checkpoint: s3://" in info.value.hint


def test_a_20mb_file_goes_up_and_down_in_parts(tmp_path: Path) -> None:
    store = S3Store("s3://cloudtrain-big/p", "us-east-1")
    store.ensure_bucket()
    data = os.urandom(20 * 1024 * 1024)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    store.put_file("model/model.bin", str(src))
    head = raw().head_object(Bucket="cloudtrain-big", Key="p/model/model.bin")
    assert head["ETag"].strip('"').endswith("-3"), "8 + 8 + 4 MiB: a 3-part multipart upload"
    dest = tmp_path / "a" / "b" / "copy.bin"
    store.get_file("model/model.bin", str(dest))
    assert dest.read_bytes() == data
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    store.put_file("small.bin", str(small))
    assert "-" not in raw().head_object(Bucket="cloudtrain-big", Key="p/small.bin")["ETag"]


def test_presigned_urls_live_at_most_an_hour() -> None:
    store = S3Store("s3://cloudtrain-presign/p", "us-east-1")
    store.ensure_bucket()
    store.put("k", b"v")
    assert query(store.presign_get("k", ttl_s=86_400))["X-Amz-Expires"] == "3600"
    assert query(store.presign_put("k", ttl_s=86_400))["X-Amz-Expires"] == "3600"
    assert query(store.presign_get("k", ttl_s=600))["X-Amz-Expires"] == "600"
    assert query(store.presign_get("k"))["X-Amz-Expires"] == "3600"
    url = store.presign_get("k", ttl_s=600)
    assert urllib.parse.urlparse(url).path == "/cloudtrain-presign/p/k"
    assert query(url)["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"


def test_presigned_urls_are_signed_for_the_buckets_region() -> None:
    raw("eu-west-1").create_bucket(
        Bucket="user-eu-bucket", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    store = S3Store("s3://user-eu-bucket/p", "us-east-1")
    store.ensure_bucket()
    assert "/eu-west-1/s3/" in query(store.presign_get("k"))["X-Amz-Credential"]
    fresh = S3Store("s3://user-eu-bucket/p", "us-east-1")  # no ensure_bucket on this handle
    assert "/eu-west-1/s3/" in query(fresh.presign_put("k"))["X-Amz-Credential"]


def test_missing_keys_and_buckets_are_not_found(tmp_path: Path) -> None:
    store = S3Store("s3://cloudtrain-missing/p", "us-east-1")
    with pytest.raises(NotFound, match="s3://cloudtrain-missing/p/k"):
        store.get("k")  # no bucket yet
    store.delete("k")  # idempotent, even without a bucket
    assert store.delete_prefix("") == 0
    store.ensure_bucket()
    with pytest.raises(NotFound, match="s3://cloudtrain-missing/p/nope"):
        store.get("nope")
    with pytest.raises(NotFound):
        store.get_file("nope", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_delete_prefix_of_2500_objects_in_batches() -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    store = S3Store("s3://cloudtrain-many/p", "us-east-1")
    store.ensure_bucket()
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]  # seeding through the API: 2500 requests
    for i in range(2500):
        backend.put_object("cloudtrain-many", f"p/logs/{i:05d}.log", b"x")
    store.put("keep/me", b"x")
    calls: list[int] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        calls.append(len(params["Delete"]["Objects"]))

    store._s3.meta.events.register("provide-client-params.s3.DeleteObjects", count)
    assert len(store.list("logs/")) == 2500
    assert store.delete_prefix("logs/") == 2500
    assert calls == [1000, 1000, 500]
    assert [o.key for o in store.list("")] == ["keep/me"]
    assert store.delete_prefix("logs/") == 0


def test_no_credentials_is_a_credentials_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, fname in (
        ("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        ("AWS_CONFIG_FILE", "config"),
    ):
        (tmp_path / fname).write_text("")
        monkeypatch.setenv(name, str(tmp_path / fname))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    clear_aws_caches()
    store = S3Store("s3://cloudtrain-nocreds/p", "us-east-1")
    with pytest.raises(CredentialsError, match="s3://cloudtrain-nocreds/p/k") as info:
        store.put("k", b"v")
    assert info.value.hint
    with pytest.raises(CredentialsError):
        store.ensure_bucket()
    with pytest.raises(CredentialsError):
        store.presign_get("k")
