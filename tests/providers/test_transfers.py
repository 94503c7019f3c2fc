"""Large-file transfers (providers/transfer.py and each cloud's): parallel parts that round-trip
byte-exact, and calls that resume after an interruption, on moto S3, the GCS emulator and
Azurite, through the real SDKs.

What the server got is counted at the HTTP boundary: a small reverse proxy sits between the
store and the emulator, counts the part requests it forwards (S3 UploadPart, GCS resumable
chunks, Azure Put Block; ranged GETs) and, when told, refuses every part request after the
first k (403, which no SDK retries), so an interrupted transfer leaves exactly k parts there.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import CloudtrainError, UsageError
from cloudtrain.providers import transfer
from cloudtrain.providers.faults import FaultPlan, wrap
from tests.fakes.azurite import azurite, azurite_session
from tests.fakes.gcs_emulator import gcs_emulator, gcs_emulator_session
from tests.fakes.memory_provider import MemoryProvider
from tests.fakes.moto_server import clear_aws_caches, moto_server, moto_server_session

__all__ = [  # fixtures, for pytest
    "azurite",
    "azurite_session",
    "gcs_emulator",
    "gcs_emulator_session",
    "moto_server",
    "moto_server_session",
]

MiB = 1024 * 1024
Classify = Callable[[str, str, Any], "str | None"]


def _s3_kind(method: str, path: str, headers: Any) -> str | None:
    if method == "PUT" and "partNumber=" in path:
        return "up"
    return "down" if method == "GET" and headers.get("Range") else None


def _gcs_kind(method: str, path: str, headers: Any) -> str | None:
    if method == "PUT" and "upload_id=" in path and int(headers.get("Content-Length") or 0):
        return "up"  # a chunk (a status query has no body)
    return "down" if method == "GET" and headers.get("Range") else None


def _azure_kind(method: str, path: str, headers: Any) -> str | None:
    if method == "PUT" and "comp=block" in path and "comp=blocklist" not in path:
        return "up"
    ranged = headers.get("x-ms-range") or headers.get("Range")
    return "down" if method == "GET" and ranged else None


class CountingProxy:
    """A reverse proxy to `upstream` that counts the part requests it forwards, per kind ("up",
    "down"), and refuses those beyond `refuse_after[kind]` with `status` (403: no SDK retries
    it), at most `refusals` times when that is set. Thread-safe."""

    def __init__(self, upstream: str, classify: Classify) -> None:
        parsed = urllib.parse.urlparse(upstream)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.classify = classify
        self.forwarded: Counter[str] = Counter()
        self.refuse_after: dict[str, int] = {}
        self.status = 403
        self.refusals: int | None = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def handle_one(self) -> None:
                body = self._body()
                if not proxy.admit(self.command, self.path, self.headers):
                    self.send_response(proxy.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                skip = ("transfer-encoding", "connection", "content-length")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status, resp.reason)
                for name, value in resp.getheaders():
                    if name.lower() not in skip:
                        self.send_header(name, value)
                length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def admit(self, method: str, path: str, headers: Any) -> bool:
        """Count a part request and say whether to forward it."""
        kind = self.classify(method, path, headers)
        if kind is None:
            return True
        with self._lock:
            limit = self.refuse_after.get(kind)
            if limit is not None and self.forwarded[kind] >= limit and self.refusals != 0:
                if self.refusals is not None:
                    self.refusals -= 1
                return False
            self.forwarded[kind] += 1
            return True

    def reset(self) -> None:
        """Forget the counts and refuse nothing."""
        with self._lock:
            self.forwarded.clear()
            self.refuse_after.clear()
            self.status, self.refusals = 403, None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Cloud:
    name: str
    store: Any
    proxy: CountingProxy
    part: int  # the part size the store uses here


def _aws(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    from cloudtrain.providers.aws.storage import MIN_PART, S3Store

    server = request.getfixturevalue("moto_server")
    proxy = CountingProxy(server.url, _s3_kind)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    clear_aws_caches()
    store = S3Store(f"s3://ct-transfer-{uuid.uuid4().hex[:10]}/pfx", "us-east-1")
    return Cloud("aws", store, proxy, MIN_PART)


def _gcp(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    from cloudtrain.providers.gcp.storage import GcsStore

    emulator = request.getfixturevalue("gcs_emulator")
    proxy = CountingProxy(emulator.url, _gcs_kind)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    store = GcsStore(f"gs://ct-transfer-{uuid.uuid4().hex[:10]}/pfx", "cloudtrain-test")
    return Cloud("gcp", store, proxy, MiB)


def _azure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    from cloudtrain.providers.azure.storage import BlobStore
    from tests.fakes.azurite import ACCOUNT, ACCOUNT_KEY

    server = request.getfixturevalue("azurite")
    proxy = CountingProxy(f"http://127.0.0.1:{server.port}", _azure_kind)
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={proxy.url}/{ACCOUNT};"
    )
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    uri = f"az://{ACCOUNT}/ct-transfer-{uuid.uuid4().hex[:10]}/pfx"
    return Cloud("azure", BlobStore(uri, client_options={"retry_total": 0}), proxy, MiB)


@pytest.fixture(params=["aws", "gcp", "azure"])
def cloud(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Cloud]:
    """A store of each cloud behind a CountingProxy, with 1 MiB parts (S3: its 5 MiB minimum)
    and the transfer state in `tmp_path`."""
    monkeypatch.setenv(transfer.PART_BYTES_ENV, str(MiB))
    monkeypatch.setenv(transfer.STATE_DIR_ENV, str(tmp_path / "state"))
    made = {"aws": _aws, "gcp": _gcp, "azure": _azure}[request.param](request, monkeypatch)
    try:
        made.store.ensure_bucket()
        yield made
    finally:
        made.proxy.stop()


PARTS = 4  # every test file is 3.5 parts
K = 2  # parts that reach the server before an interruption


def _file(path: Path, cloud: Cloud, seed: int = 0) -> bytes:
    data = os.urandom(PARTS * cloud.part - cloud.part // 2)
    path.write_bytes(data)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + seed))  # a new version: a new mtime
    return data


def _progress() -> tuple[list[int], Callable[[int], None]]:
    seen: list[int] = []
    lock = threading.Lock()

    def note(n: int) -> None:
        with lock:
            seen.append(n)

    return seen, note


def _state_files(tmp_path: Path) -> list[str]:
    folder = tmp_path / "state"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_round_trip_in_parts_with_progress(cloud: Cloud, tmp_path: Path) -> None:
    src, dest = tmp_path / "src.bin", tmp_path / "out" / "dest.bin"
    data = _file(src, cloud)
    up, note_up = _progress()
    cloud.store.put_file("ckpt/big.bin", str(src), note_up)
    down, note_down = _progress()
    cloud.store.get_file("ckpt/big.bin", str(dest), note_down)
    assert dest.read_bytes() == data
    assert sum(up) == sum(down) == len(data)
    assert cloud.proxy.forwarded == {"up": PARTS, "down": PARTS}
    assert os.listdir(dest.parent) == ["dest.bin"]  # the sidecar was renamed into place
    assert _state_files(tmp_path) == []


def test_interrupted_upload_resumes_with_the_missing_parts(cloud: Cloud, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = _file(src, cloud)
    cloud.proxy.refuse_after["up"] = K
    seen, note = _progress()
    with pytest.raises(CloudtrainError):
        cloud.store.put_file("ckpt/big.bin", str(src), note)
    assert cloud.proxy.forwarded["up"] == K and len(seen) == K
    cloud.proxy.reset()
    cloud.store.put_file("ckpt/big.bin", str(src), note)
    assert cloud.proxy.forwarded["up"] == PARTS - K
    assert sum(seen) == len(data)  # each part counted once, over both calls
    assert cloud.store.get("ckpt/big.bin") == data
    assert _state_files(tmp_path) == []


def test_a_changed_source_file_starts_the_upload_over(cloud: Cloud, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    _file(src, cloud)
    cloud.proxy.refuse_after["up"] = K
    with pytest.raises(CloudtrainError):
        cloud.store.put_file("ckpt/big.bin", str(src))
    cloud.proxy.reset()
    data = _file(src, cloud, seed=7)  # same size, new bytes and mtime
    cloud.store.put_file("ckpt/big.bin", str(src))
    assert cloud.proxy.forwarded["up"] == PARTS
    assert cloud.store.get("ckpt/big.bin") == data


def test_interrupted_download_resumes_with_the_missing_ranges(cloud: Cloud, tmp_path: Path) -> None:
    src, dest = tmp_path / "src.bin", tmp_path / "out" / "dest.bin"
    data = _file(src, cloud)
    cloud.store.put_file("ckpt/big.bin", str(src))
    cloud.proxy.reset()
    cloud.proxy.refuse_after["down"] = K
    seen, note = _progress()
    with pytest.raises(CloudtrainError):
        cloud.store.get_file("ckpt/big.bin", str(dest), note)
    assert not dest.exists() and transfer.sidecar_path(dest).is_file()
    assert len(seen) == K
    cloud.proxy.reset()
    cloud.store.get_file("ckpt/big.bin", str(dest), note)
    assert cloud.proxy.forwarded["down"] == PARTS - K
    assert sum(seen) == len(data)  # each range counted once, over both calls
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["dest.bin"]


def test_a_replaced_object_starts_the_download_over(cloud: Cloud, tmp_path: Path) -> None:
    src, dest = tmp_path / "src.bin", tmp_path / "out" / "dest.bin"
    _file(src, cloud)
    cloud.store.put_file("ckpt/big.bin", str(src))
    cloud.proxy.refuse_after["down"] = K
    with pytest.raises(CloudtrainError):
        cloud.store.get_file("ckpt/big.bin", str(dest))
    data = _file(src, cloud, seed=7)
    cloud.store.put_file("ckpt/big.bin", str(src))  # a new ETag / generation
    cloud.proxy.reset()
    cloud.store.get_file("ckpt/big.bin", str(dest))
    assert cloud.proxy.forwarded["down"] == PARTS
    assert dest.read_bytes() == data


def test_store_bytes_per_s_paces_put_file_and_get_file(tmp_path: Path) -> None:
    """A bandwidth limit, not a timing check of our speed: N bytes at B bytes/s take at least
    about N / B (the lower bound only)."""
    size, rate = MiB, 8 * MiB
    store = wrap(MemoryProvider(), FaultPlan(store_bytes_per_s=rate)).store("mem://paced")
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    seen, note = _progress()
    start = time.monotonic()
    store.put_file("big.bin", str(src), note)
    store.get_file("big.bin", str(tmp_path / "dest.bin"), note)
    assert time.monotonic() - start >= 0.8 * 2 * size / rate
    assert sum(seen) == 2 * size


def test_store_bytes_per_s_comes_from_the_environment_and_is_checked() -> None:
    plan = FaultPlan.from_env(environ={"CLOUDTRAIN_FAULTS": '{"store_bytes_per_s": 1e6}'})
    assert plan is not None and plan.store_bytes_per_s == 1e6 and plan.store_faults
    with pytest.raises(UsageError, match="store_bytes_per_s"):
        FaultPlan(store_bytes_per_s=-1).validate()


@pytest.mark.parametrize("cloud", ["gcp"], indirect=True)
def test_the_retry_layer_resumes_a_transfer_that_made_progress(
    cloud: Cloud, tmp_path: Path
) -> None:
    """A transfer that fails (503) after moving bytes is called again even with no retry
    deadline left, and that call resumes: each part reaches the server once."""
    from cloudtrain.providers.retrying import RetryingStore

    src = tmp_path / "src.bin"
    data = _file(src, cloud)
    cloud.proxy.refuse_after["up"] = K
    cloud.proxy.status, cloud.proxy.refusals = 503, 1
    seen, note = _progress()
    RetryingStore(cloud.store, deadline_s=0).put_file("ckpt/big.bin", str(src), note)
    assert cloud.proxy.forwarded["up"] == PARTS
    assert sum(seen) == len(data)
    assert cloud.store.get("ckpt/big.bin") == data
