"""S3Store's large-file transfers: resumable multipart uploads and resumable ranged downloads
(the shared machinery is providers/transfer.py).

Upload (CreateMultipartUpload, UploadPart in parallel, CompleteMultipartUpload): the upload id
is kept in the transfer state with the file's size, mtime and the part size. A call after a
failure lists the parts S3 holds for that id (ListParts, 1,000 a page) and sends only the
others; a changed file, or an upload S3 no longer knows (completed, aborted, expired), starts a
new upload (a stale one is aborted first: S3 bills the parts of an unfinished upload until it
is aborted, docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html).

Download: HeadObject gives the size and ETag; ranged GetObjects with IfMatch that ETag (412 if
the object was replaced) fill the sidecar (transfer.download_ranges).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

from cloudtrain.core.errors import CloudtrainError, NotFound, TransientError
from cloudtrain.providers import transfer
from cloudtrain.providers.aws.errors import aws_errors
from cloudtrain.providers.transfer import Part, Progress

MiB = 1024 * 1024
# S3's multipart limits (docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html): parts of
# 5 MiB to 5 GiB (the last one may be smaller), numbered 1 to 10,000.
MIN_PART = 5 * MiB
MAX_PARTS = 10_000


class S3Store(Protocol):
    """What a transfer uses of `providers/aws/storage.S3Store` (its bucket, client and keys)."""

    bucket: str
    uri: str
    _s3: Any

    def _key(self, key: str) -> str: ...
    def _where(self, key: str) -> str: ...


def _held_parts(store: S3Store, full: str, upload_id: str) -> dict[int, tuple[int, str]]:
    """Part number -> (size, ETag) of every part S3 holds for the upload (ListParts,
    paginated). Raises NotFound when the upload is gone."""
    held: dict[int, tuple[int, str]] = {}
    with aws_errors(f"list the parts of an upload to s3://{store.bucket}/{full}"):
        pages = store._s3.get_paginator("list_parts").paginate(
            Bucket=store.bucket, Key=full, UploadId=upload_id
        )
        for page in pages:
            for p in page.get("Parts", []):
                held[int(p["PartNumber"])] = (int(p["Size"]), str(p["ETag"]))
    return held


def _abort(store: S3Store, full: str, upload_id: str) -> None:
    """Abort an upload (best effort: it may be gone already)."""
    what = f"abort an upload to s3://{store.bucket}/{full}"
    with contextlib.suppress(CloudtrainError), aws_errors(what):
        store._s3.abort_multipart_upload(Bucket=store.bucket, Key=full, UploadId=upload_id)


def upload(store: S3Store, key: str, path: str, part: int, progress: Progress) -> None:
    """Upload `path` to `key` as a multipart upload of `part`-byte parts, resuming the upload
    recorded in the transfer state when it is for this very file. Idempotent; blocks."""
    full = store._key(key)
    where = store._where(key)
    state = transfer.State("s3-upload", store.uri, key, path)
    source = transfer.fingerprint(path)
    parts = transfer.plan(source["size"], part, MAX_PARTS, align=MIN_PART)
    record = state.load()
    held: dict[int, tuple[int, str]] = {}
    upload_id = ""
    if record is not None:
        if record.get("file") == source and record.get("parts") == len(parts):
            try:
                held = _held_parts(store, full, str(record["upload_id"]))
                upload_id = str(record["upload_id"])
            except NotFound:
                pass  # completed, aborted or expired: a new upload
        else:
            _abort(store, full, str(record.get("upload_id", "")))
        if not upload_id:
            state.forget()
    if not upload_id:
        with aws_errors(f"start an upload of {path} to {where}"):
            upload_id = str(
                store._s3.create_multipart_upload(Bucket=store.bucket, Key=full)["UploadId"]
            )
        state.save({"upload_id": upload_id, "file": source, "parts": len(parts)})

    def send(index: int) -> tuple[int, str]:
        offset, length = parts[index]
        data = transfer.read_part(path, (offset, length))
        if len(data) != length:
            raise TransientError(f"upload {path} to {where}: the file shrank while uploading")
        with aws_errors(f"upload part {index + 1} of {path} to {where}"):
            answer = store._s3.upload_part(
                Bucket=store.bucket, Key=full, UploadId=upload_id, PartNumber=index + 1, Body=data
            )
        transfer.report(progress, length)
        return index + 1, str(answer["ETag"])

    todo = [i for i, (_off, length) in enumerate(parts) if held.get(i + 1, (-1,))[0] != length]
    etags = {n: etag for n, (_size, etag) in held.items()}
    etags.update(transfer.run_parts(send, todo))
    if transfer.fingerprint(path) != source:
        raise TransientError(f"upload {path} to {where}: the file changed while uploading")
    done = [{"PartNumber": n, "ETag": etags[n]} for n in range(1, len(parts) + 1)]
    with aws_errors(f"complete the upload of {path} to {where}"):
        store._s3.complete_multipart_upload(
            Bucket=store.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": done}
        )
    state.forget()


def download(store: S3Store, key: str, path: str, progress: Progress) -> None:
    """Download `key` to `path` (see S3Store.get_file). Raises NotFound. Blocks."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    full = store._key(key)
    where = store._where(key)
    with aws_errors(f"download {where}"):
        head = store._s3.head_object(Bucket=store.bucket, Key=full)
    size, etag = int(head["ContentLength"]), str(head["ETag"])
    part = transfer.part_bytes(minimum=MIN_PART)

    def fetch(span: Part) -> bytes:
        offset, length = span
        if length == 0:
            return b""
        with aws_errors(f"download {where} bytes {offset}+{length}"):
            body = store._s3.get_object(
                Bucket=store.bucket,
                Key=full,
                Range=f"bytes={offset}-{offset + length - 1}",
                IfMatch=etag,
            )["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

    state = transfer.State("s3-download", store.uri, key, path)
    transfer.download_ranges(
        state=state, dest=path, size=size, tag=etag, part=part, fetch=fetch, progress=progress
    )
