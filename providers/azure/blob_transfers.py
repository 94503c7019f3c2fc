"""BlobStore's large-file transfers: resumable staged-block uploads and resumable ranged
downloads (the shared machinery is providers/transfer.py).

Upload (learn.microsoft.com/rest/api/storageservices/put-block, put-block-list,
get-block-list): the file's blocks are staged in parallel (Put Block) under ids derived from the
file's size, mtime and the block size (every id of a blob the same length, at most 64 bytes, as
Put Block requires), then committed at once (Put Block List). A call after a failure asks Azure
which blocks it holds uncommitted (Get Block List, blocklisttype=uncommitted) and stages only the
others: no local state is needed, and a changed file has new ids, so nothing of the old one is
reused. Put Block List discards every uncommitted block it does not name, and Azure discards
uncommitted blocks after 7 days. At most 50,000 blocks per blob: larger files get larger blocks.

Download: the blob's size and ETag, then ranged reads with If-Match that ETag (412
ConditionNotMet if it was replaced) into the sidecar (transfer.download_ranges).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

from azure.core import MatchConditions
from azure.storage.blob import BlobBlock, ContentSettings

from cloudtrain.core.errors import NotFound, PreconditionFailed, ProviderError, TransientError
from cloudtrain.providers import transfer
from cloudtrain.providers.azure.errors import azure_errors, error_codes
from cloudtrain.providers.transfer import Part, Progress


class BlobStore(Protocol):
    """What a transfer uses of `providers/azure/storage.BlobStore` (its blobs and limits)."""

    uri: str
    max_concurrency: int

    def _blob(self, key: str) -> Any: ...
    def _where(self, key: str) -> str: ...

MAX_BLOCKS = 50_000  # blocks in one blob (Put Block List)
OCTET = "application/octet-stream"


def block_ids(source: dict[str, int], part: int, count: int) -> list[str]:
    """The ids of a file version's blocks: `ct-<16 hex of size, mtime, part>-<index>`, all of
    one length (the SDK base64-encodes them). Pure."""
    stamp = f"{source['size']}:{source['mtime_ns']}:{part}:{count}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return [f"ct-{digest}-{i:06d}" for i in range(count)]


def upload(store: BlobStore, key: str, path: str, part: int, progress: Progress) -> None:
    """Upload `path` to `key` as staged blocks committed at once, staging only the blocks Azure
    does not hold yet for this file version. Idempotent; blocks."""
    where = store._where(key)
    what = f"upload {path} to {where}"
    blob = store._blob(key)
    source = transfer.fingerprint(path)
    parts = transfer.plan(source["size"], part, MAX_BLOCKS)
    ids = block_ids(source, parts[0][1], len(parts))
    try:
        with azure_errors(f"list the staged blocks of {where}"):
            _committed, uncommitted = blob.get_block_list("uncommitted")
    except NotFound:
        uncommitted = []
    held = {str(b.id): int(b.size) for b in uncommitted}

    def stage(index: int) -> None:
        offset, length = parts[index]
        data = transfer.read_part(path, (offset, length))
        if len(data) != length:
            raise TransientError(f"{what}: the file shrank while uploading")
        with azure_errors(f"{what}: block {index}"):
            blob.stage_block(ids[index], data, length=length)
        transfer.report(progress, length)

    todo = [i for i, (_off, length) in enumerate(parts) if held.get(ids[i]) != length]
    transfer.run_parts(stage, todo, store.max_concurrency)
    if transfer.fingerprint(path) != source:
        raise TransientError(f"{what}: the file changed while uploading")
    with azure_errors(f"{what}: commit {len(ids)} blocks"):
        blob.commit_block_list(
            [BlobBlock(block_id=i) for i in ids],
            content_settings=ContentSettings(content_type=OCTET),
        )


def download(store: BlobStore, key: str, path: str, part: int, progress: Progress) -> None:
    """Download `key` to `path` (see BlobStore.get_file). Raises NotFound. Blocks."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    where = store._where(key)
    blob = store._blob(key)
    with azure_errors(f"download {where}"):
        props = blob.get_blob_properties()
    size, etag = int(props.size or 0), str(props.etag)

    def fetch(span: Part) -> bytes:
        offset, length = span
        if length == 0:
            return b""
        condition: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        try:
            with azure_errors(f"download {where} bytes {offset}+{length}"):
                stream = blob.download_blob(offset, length, max_concurrency=1, **condition)
                return bytes(stream.readall())
        except ProviderError as err:  # ConditionNotMet is otherwise transient (errors.py)
            if "ConditionNotMet" in error_codes(err) or "412" in error_codes(err):
                raise PreconditionFailed(err.message, codes=error_codes(err)) from err
            raise

    state = transfer.State("azure-download", store.uri, key, path)
    transfer.download_ranges(
        state=state, dest=path, size=size, tag=etag, part=part, fetch=fetch, progress=progress
    )
