"""GcsStore's large-file transfers: a resumable upload session kept across calls, and resumable
ranged downloads (the shared machinery is providers/transfer.py).

Upload: the JSON API's resumable upload (cloud.google.com/storage/docs/performing-resumable-
uploads). The session URI (`Blob.create_resumable_upload_session`) is kept in the transfer state
with the file's size and mtime; chunks are PUT with `Content-Range: bytes START-END/TOTAL`, each
a multiple of 256 KiB but the last, and answered 308 with `Range: bytes=0-N` (what GCS holds)
until the last one (200/201). A call after a failure asks where the session stands (a PUT with
no body and `Content-Range: bytes */TOTAL`; a 308 without Range means nothing was received) and
continues from there; a session GCS no longer knows (404/410: a session lives a week) or a file
that changed starts a new one. One session is one stream: GCS has no parallel parts on the
JSON API (the XML multipart API is not on the emulator; compose of temporary objects would bill
each part's early deletion on colder classes), so uploads are sequential; downloads are parallel.

Download: the object's generation and size, then ranged reads pinned with ifGenerationMatch
(412 if it was replaced) into the sidecar (transfer.download_ranges).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

from google.api_core import exceptions as api

from cloudtrain.core.errors import NotFound, TransientError
from cloudtrain.providers import transfer
from cloudtrain.providers.gcp.errors import gcp_errors
from cloudtrain.providers.transfer import Part, Progress


class GcsStore(Protocol):
    """What a transfer uses of `providers/gcp/storage.GcsStore` (its bucket, client, auth, keys)."""

    bucket: str
    uri: str

    def _client(self) -> Any: ...
    def _resolve_auth(self) -> Any: ...
    def _blob(self, key: str, chunk_size: int | None = None) -> Any: ...
    def _key(self, key: str) -> str: ...
    def _where(self, key: str) -> str: ...

KiB = 1024
CHUNK_ALIGN = 256 * KiB  # every chunk but the last is a multiple of this (GCS's rule)
TIMEOUT_S = (30, 300)  # connect, read: one chunk's PUT
_RANGE_RE = re.compile(r"bytes=0-(\d+)")
OCTET = "application/octet-stream"


def _http(store: GcsStore) -> Any:
    """A requests session for the session URI: authorized with the store's credentials (none
    on the emulator)."""
    import requests
    from google.auth.transport.requests import AuthorizedSession

    credentials = store._resolve_auth().credentials
    return requests.Session() if credentials is None else AuthorizedSession(credentials)


def _check(answer: Any, what: str) -> None:
    """Raise the translated error of an answer that is neither 2xx nor 308."""
    if answer.status_code in (200, 201, 308):
        return
    with gcp_errors(what):
        raise api.from_http_status(answer.status_code, answer.text[:300] or answer.reason)


def _held(answer: Any) -> int:
    """The bytes GCS holds, from a 308's Range header (none: 0)."""
    m = _RANGE_RE.fullmatch(answer.headers.get("Range", "").strip())
    return int(m.group(1)) + 1 if m else 0


def _resume_offset(http: Any, url: str, size: int, what: str) -> int | None:
    """Where the session stands: the bytes GCS holds, `size` when the upload is complete, or
    None when the session is gone (404/410)."""
    with gcp_errors(what):
        answer = http.put(
            url, data=b"", headers={"Content-Range": f"bytes */{size}"}, timeout=TIMEOUT_S
        )
    if answer.status_code in (404, 410):
        return None
    _check(answer, what)
    return size if answer.status_code in (200, 201) else _held(answer)


def upload(store: GcsStore, key: str, path: str, chunk: int, progress: Progress) -> None:
    """Upload `path` to `key` through a resumable session in `chunk`-byte chunks, resuming the
    session in the transfer state when it is for this very file. Idempotent; blocks."""
    where = store._where(key)
    what = f"upload {path} to {where}"
    state = transfer.State("gcs-upload", store.uri, key, path)
    source = transfer.fingerprint(path)
    size = source["size"]
    http = _http(store)
    record = state.load()
    url, offset = "", None
    if record is not None and record.get("file") == source:
        url = str(record.get("url", ""))
        offset = _resume_offset(http, url, size, f"resume {what}") if url else None
    if offset is None:
        blob = store._blob(key)
        with gcp_errors(f"start {what}"):
            url = blob.create_resumable_upload_session(
                content_type=OCTET, size=size, checksum=None, timeout=TIMEOUT_S
            )
        state.save({"url": url, "file": source})
        offset = 0
    with open(path, "rb") as fh:
        while offset < size:
            fh.seek(offset)
            data = fh.read(chunk)
            if not data:
                raise TransientError(f"{what}: the file shrank while uploading")
            end = offset + len(data) - 1
            with gcp_errors(what):
                answer = http.put(
                    url,
                    data=data,
                    headers={"Content-Range": f"bytes {offset}-{end}/{size}"},
                    timeout=TIMEOUT_S,
                )
            if answer.status_code in (404, 410):
                state.forget()
                raise TransientError(f"{what}: the upload session expired; starting over")
            _check(answer, what)
            held = size if answer.status_code in (200, 201) else _held(answer)
            transfer.report(progress, held - offset)
            offset = held
    state.forget()


def download(store: GcsStore, key: str, path: str, part: int, progress: Progress) -> None:
    """Download `key` to `path` (see GcsStore.get_file). Raises NotFound. Blocks."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    where = store._where(key)
    full = store._key(key)
    with gcp_errors(f"download {where}"):
        blob = store._client().bucket(store.bucket).get_blob(full, retry=None)
    if blob is None:
        raise NotFound(f"download {where}: no such object")
    size, generation = int(blob.size or 0), int(blob.generation)

    def fetch(span: Part) -> bytes:
        offset, length = span
        if length == 0:
            return b""
        one = store._client().bucket(store.bucket).blob(full)  # this thread's client
        with gcp_errors(f"download {where} bytes {offset}+{length}"):
            if length == size:  # the whole object: checksum-verified by the SDK
                return bytes(one.download_as_bytes(if_generation_match=generation, retry=None))
            return bytes(
                one.download_as_bytes(
                    start=offset,
                    end=offset + length - 1,
                    if_generation_match=generation,
                    checksum=None,
                    retry=None,  # one retry layer (storage.py READ_RETRY)
                )
            )

    state = transfer.State("gcs-download", store.uri, key, path)
    transfer.download_ranges(
        state=state,
        dest=path,
        size=size,
        tag=str(generation),
        part=part,
        fetch=fetch,
        progress=progress,
    )
