"""S3 as a cloudtrain ObjectStore: `s3://bucket[/prefix]`, keys relative to the prefix.

Every SDK call runs inside `aws_errors(...)`, which names the object and turns botocore exceptions
into `cloudtrain.core.errors` types; nothing here catches a botocore exception. Large files go
through
s3_transfers.py (parallel multipart parts and ranged GETs, both resumable). Presigned URLs are
SigV4, signed for the bucket's own region, and live at most an hour. Only the default bucket
(`cloudtrain-...`) and buckets this class creates are configured (public access blocked,
SSE-S3); a user's existing bucket is only checked for access, never changed.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from typing import Any

from botocore.config import Config
from botocore.exceptions import ClientError

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import (
    CloudtrainError,
    NotFound,
    PreconditionFailed,
    ProviderError,
    TooLarge,
    TransientError,
)
from cloudtrain.providers import transfer
from cloudtrain.providers.aws import s3_transfers as uploads
from cloudtrain.providers.aws.clients import client
from cloudtrain.providers.aws.errors import TRANSIENT_CODES, aws_errors, error_code
from cloudtrain.providers.aws.s3_transfers import MIN_PART
from cloudtrain.providers.base import ObjectInfo, Resource, within
from cloudtrain.providers.transfer import Progress
from cloudtrain.providers.uri_rules import uri_problem

DEFAULT_BUCKET_PREFIX = "cloudtrain-"
MAX_PRESIGN_TTL_S = 3600
DELETE_BATCH = 1000  # the most keys one DeleteObjects call takes
# S3 keeps, and bills, the parts of a multipart upload never completed until it is aborted
# (docs.aws.amazon.com/AmazonS3/latest/userguide/mpu-abort-incomplete-mpu-lifecycle-config.html):
# a node preempted or killed mid-upload of a checkpoint leaves one that no process will resume
# (its transfer state went with its disk). A lifecycle rule of the bucket aborts them.
ABORT_RULE_ID = "cloudtrain-abort-incomplete-uploads"
ABORT_DAYS = 7  # an upload is resumed within minutes, by the same node, or never
# SigV4 everywhere: botocore still presigns with SigV2 by default, which newer regions refuse.
S3_CONFIG = Config(signature_version="s3v4")  # presigned URLs every region accepts
_WAIT = {"Delay": 1, "MaxAttempts": 30}


def _cause_code(err: CloudtrainError) -> str:
    """The AWS error code behind a translated error ('' if it did not come from a ClientError)."""
    cause = err.__cause__
    return error_code(cause) if isinstance(cause, ClientError) else ""


class S3Store:
    """An ObjectStore on S3. Thread-safe: one client per store, shared by all threads."""

    def __init__(self, uri: str, region: str) -> None:
        parsed = urllib.parse.urlparse(uri)
        bucket = parsed.netloc
        problem = uri_problem(uri, "s3")  # the spec's rule too (providers/uri_rules.py)
        if problem:
            raise ProviderError(
                f"not an S3 bucket URI: {uri!r}: {problem}",
                hint="use s3://BUCKET or s3://BUCKET/PREFIX (3-63 chars: a-z, 0-9, '.', '-')",
            )
        self.bucket = bucket
        self.prefix = parsed.path.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.region = region
        self._root = f"{self.prefix}/" if self.prefix else ""
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self._bucket_region: str | None = None

    # --- helpers ---------------------------------------------------------------------------

    def _client_for(self, region: str) -> Any:
        with self._lock:
            if region not in self._clients:
                self._clients[region] = client("s3", region, S3_CONFIG)
            return self._clients[region]

    @property
    def _s3(self) -> Any:
        return self._client_for(self.region)

    def _key(self, key: str) -> str:
        """The full S3 key of a store-relative key (the same key rules as LocalStore)."""
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ProviderError(f"invalid object key {key!r} in {self.uri}")
        return self._root + key

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._root}{key}"

    def _is_default(self) -> bool:
        return self.bucket.startswith(DEFAULT_BUCKET_PREFIX)

    # --- the bucket ------------------------------------------------------------------------

    def ensure_bucket(self) -> Resource:
        """Make the bucket usable and return it as a Resource (id = this store's URI).

        The default bucket (`cloudtrain-...`) is created if missing in this store's region and
        then (re)configured: all public access blocked, SSE-S3 (AES256) with a bucket key. A
        user-given bucket that exists is only checked for access (head_bucket), never changed;
        if missing it is created and configured like the default one. A name owned by another
        account raises ProviderError. Idempotent; blocks until the bucket answers head_bucket.
        """
        if self._is_default():
            self._create()
            crash_point("bucket")
            self._configure()
        else:
            try:
                with aws_errors(f"check access to s3://{self.bucket}"):
                    head = self._s3.head_bucket(Bucket=self.bucket)
                self._bucket_region = head.get("BucketRegion") or self.region
            except NotFound:
                self._create()
                crash_point("bucket")
                self._configure()
        return Resource(provider="aws", kind="bucket", id=self.uri, region=self.region, run_id="")

    def _create(self) -> None:
        """CreateBucket in this region (us-east-1 takes no LocationConstraint), then wait."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        what = f"create bucket s3://{self.bucket} in {self.region}"
        try:
            with aws_errors(what):
                self._s3.create_bucket(**kwargs)
        except ProviderError as err:
            code = _cause_code(err)
            if code == "BucketAlreadyExists":
                raise ProviderError(
                    f"{what}: the name s3://{self.bucket} belongs to another AWS account",
                    hint="set `checkpoint: s3://YOUR-BUCKET/PREFIX` in job.yaml",
                ) from err
            if code != "BucketAlreadyOwnedByYou":
                raise
        with aws_errors(f"wait for bucket s3://{self.bucket}"):
            self._s3.get_waiter("bucket_exists").wait(Bucket=self.bucket, WaiterConfig=_WAIT)
        self._bucket_region = self.region

    def _configure(self) -> None:
        """Block all public access, turn on default encryption and abort incomplete multipart
        uploads after ABORT_DAYS. Idempotent."""
        with aws_errors(f"block public access on s3://{self.bucket}"):
            self._s3.put_public_access_block(
                Bucket=self.bucket,
                PublicAccessBlockConfiguration={
                    "BlockPublicAcls": True,
                    "IgnorePublicAcls": True,
                    "BlockPublicPolicy": True,
                    "RestrictPublicBuckets": True,
                },
            )
        with aws_errors(f"turn on encryption of s3://{self.bucket}"):
            self._s3.put_bucket_encryption(
                Bucket=self.bucket,
                ServerSideEncryptionConfiguration={
                    "Rules": [
                        {
                            "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
                            "BucketKeyEnabled": True,
                        }
                    ]
                },
            )
        self._abort_incomplete_uploads()

    def _abort_incomplete_uploads(self) -> None:
        """Add the lifecycle rule ABORT_RULE_ID to the bucket, keeping its other rules (a put
        replaces the whole configuration). Idempotent; blocks."""
        try:
            with aws_errors(f"read the lifecycle of s3://{self.bucket}"):
                got = self._s3.get_bucket_lifecycle_configuration(Bucket=self.bucket)
            rules = list(got.get("Rules", []))
        except ProviderError as err:
            if _cause_code(err) != "NoSuchLifecycleConfiguration":
                raise
            rules = []
        if any(rule.get("ID") == ABORT_RULE_ID for rule in rules):
            return
        rules.append(
            {
                "ID": ABORT_RULE_ID,
                "Status": "Enabled",
                "Filter": {"Prefix": ""},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABORT_DAYS},
            }
        )
        with aws_errors(f"set the lifecycle of s3://{self.bucket}"):
            self._s3.put_bucket_lifecycle_configuration(
                Bucket=self.bucket, LifecycleConfiguration={"Rules": rules}
            )

    # --- objects ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Write an object whole (PutObject: readers see the old or the new one). Idempotent;
        blocks."""
        full = self._key(key)
        with aws_errors(f"put {self._where(key)}"):
            self._s3.put_object(Bucket=self.bucket, Key=full, Body=data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object. Raises NotFound for a missing key (or bucket); with `max_bytes`,
        TooLarge for one that holds more (at most max_bytes + 1 bytes of its body are read; the
        rest is never taken off the connection). Blocks."""
        full = self._key(key)
        with aws_errors(f"get {self._where(key)}"):
            body = self._s3.get_object(Bucket=self.bucket, Key=full)["Body"]
            return _read_body(body, max_bytes, f"get {self._where(key)}")

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its ETag (GetObject answers both at once, so they belong together), or
        None when there is no object (or no bucket); TooLarge past `max_bytes` (as `get`). The
        ETag is S3's: an MD5 of the content for a PutObject, so rewriting the same bytes keeps
        it. Blocks."""
        full = self._key(key)
        try:
            with aws_errors(f"get {self._where(key)}"):
                resp = self._s3.get_object(Bucket=self.bucket, Key=full)
                data = _read_body(resp["Body"], max_bytes, f"get {self._where(key)}")
        except NotFound:
            return None
        except TooLarge as exc:
            exc.tag = str(resp["ETag"])  # the answer's own: a conditional write can replace it
            raise
        return data, str(resp["ETag"])

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """One PutObject conditioned on the ETag `tag` (If-Match), or on no object at all
        (If-None-Match: *, for `tag` None); returns the new ETag. S3 decides atomically: a
        condition that does not hold is 412 PreconditionFailed, a concurrent conditional write
        409 ConditionalRequestConflict, and If-Match on a key that is gone 404 NoSuchKey
        (docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); each raises
        PreconditionFailed. A missing bucket raises NotFound. One request, so at most 5 GB.
        Not idempotent: a retry after a lost reply fails although the first try wrote. Blocks."""
        full = self._key(key)
        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        what = f"put {self._where(key)} if " + ("absent" if tag is None else f"ETag {tag}")
        try:
            with aws_errors(what):
                resp = self._s3.put_object(Bucket=self.bucket, Key=full, Body=data, **condition)
        except NotFound as err:
            if tag is None or "NoSuchKey" not in err.codes:
                raise
            raise PreconditionFailed(f"{what}: the object is gone", codes=err.codes) from err
        return str(resp["ETag"])

    def put_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Upload a file: up to one part (8 MiB) in one PutObject, larger ones as a multipart
        upload of parallel parts (`transfer.CONCURRENCY` at a time). The object appears whole
        when the upload completes. Resumable: a call after a failure asks S3 which parts it holds
        (ListParts on the upload id kept in the transfer state) and sends only the others; a
        source file that changed since (size or mtime) aborts that upload and starts over.
        `progress(n)` gets each part's bytes once S3 has it. Idempotent; blocks."""
        size = os.path.getsize(path)
        part = transfer.part_bytes(minimum=MIN_PART)
        if size <= part:
            with open(path, "rb") as body, aws_errors(f"upload {path} to {self._where(key)}"):
                self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=body)
            transfer.report(progress, size)
            return
        uploads.upload(self, key, path, part, progress)

    def get_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Download to `path`, creating parent folders; a large object as parallel ranged GETs
        (IfMatch its ETag) into the sidecar `.<name>.cloudtrain-part`, renamed into place when
        complete. Resumable: a call after a failure fetches only the missing ranges if the ETag
        is unchanged, else starts over. Raises NotFound. `progress(n)` gets each range's bytes
        once written. Blocks."""
        uploads.download(self, key, path, progress)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix` (plain key-prefix match, not folders),
        sorted by key, keys relative to the store. Raises NotFound if the bucket is missing.
        Blocks."""
        if prefix.startswith("/"):
            raise ProviderError(f"invalid prefix {prefix!r} in {self.uri}")
        out: list[ObjectInfo] = []
        with aws_errors(f"list {self._where(prefix)}"):
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._root + prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(
                        ObjectInfo(
                            key=obj["Key"][len(self._root) :],
                            size=int(obj["Size"]),
                            updated=obj["LastModified"].timestamp(),
                        )
                    )
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Delete one object. Idempotent: a missing key (or bucket) is fine. Blocks."""
        full = self._key(key)
        try:
            with aws_errors(f"delete {self._where(key)}"):
                self._s3.delete_object(Bucket=self.bucket, Key=full)
        except NotFound:
            pass

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (DeleteObjects, 1000 keys a call); returns how many.
        Idempotent: nothing there (or no bucket) deletes 0. Blocks."""
        try:
            keys = [self._root + o.key for o in self.list(prefix)]
        except NotFound:
            return 0
        deleted = 0
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            with aws_errors(f"delete {len(batch)} objects under {self._where(prefix)}"):
                resp = self._s3.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                text = (
                    f"delete s3://{self.bucket}/{first.get('Key')}: "
                    f"{first.get('Code')}: {first.get('Message')} ({len(errors)} keys failed)"
                )
                kind = TransientError if first.get("Code") in TRANSIENT_CODES else ProviderError
                raise kind(text)
            deleted += len(batch)
        return deleted

    # --- presigned URLs --------------------------------------------------------------------

    def _presigner(self) -> Any:
        """A client signing for the bucket's own region (a user's bucket may live elsewhere)."""
        if self._bucket_region is None:
            try:
                with aws_errors(f"find the region of s3://{self.bucket}"):
                    head = self._s3.head_bucket(Bucket=self.bucket)
                self._bucket_region = head.get("BucketRegion") or self.region
            except NotFound:
                return self._s3
        return self._client_for(self._bucket_region)

    def _presign(self, method: str, key: str, ttl_s: int) -> str:
        full = self._key(key)
        expires = max(1, min(int(ttl_s), MAX_PRESIGN_TTL_S))
        signer = self._presigner()
        with aws_errors(f"presign {method} for {self._where(key)}"):
            url = signer.generate_presigned_url(
                method, Params={"Bucket": self.bucket, "Key": full}, ExpiresIn=expires
            )
        return str(url)

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A SigV4 URL that GETs the object without credentials for min(ttl_s, 3600) seconds.
        Signs locally (one head_bucket per store to learn the bucket's region if unknown)."""
        return self._presign("get_object", key, ttl_s)

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A SigV4 URL that PUTs the object (`curl -T FILE URL`; no Content-Type is signed) for
        min(ttl_s, 3600) seconds. Each PUT replaces the object."""
        return self._presign("put_object", key, ttl_s)


def _read_body(body: Any, max_bytes: int | None, what: str) -> bytes:
    """A GetObject body's bytes (at most max_bytes + 1 of them taken off the connection with
    `max_bytes`, then TooLarge), the body closed either way. Blocks on the read."""
    try:
        data = bytes(body.read() if max_bytes is None else body.read(max_bytes + 1))
    finally:
        body.close()
    return within(data, max_bytes, what)
