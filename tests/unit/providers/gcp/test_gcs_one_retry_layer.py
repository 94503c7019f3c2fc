"""One retry layer (providers/retrying.py): a GCS read that fails is retried by RetryingStore,
not also by google-cloud-storage underneath it. The SDK's own default retries a 503 or a
connection error for up to 120 s before the store even sees it; stacked under ours, one
unreachable read cost minutes (a keyless render's wheelhouse lookup took 197 s)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("google.cloud.storage")

from cloudtrain.core.errors import TransientError
from cloudtrain.providers.gcp.storage import EMULATOR_ENV, GcsStore


class _Unavailable(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        _Unavailable.seen.append(self.path)
        body = b'{"error": {"code": 503, "message": "backend unavailable"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unavailable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Unavailable.seen = []
    monkeypatch.setenv(EMULATOR_ENV, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield _Unavailable.seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_failed_read_reaches_the_store_after_one_request(unavailable: list[str]) -> None:
    store = GcsStore("gs://ct-one-layer", "p")
    with pytest.raises(TransientError):
        store.get("cloudtrain/wheelhouse/py3.10-x86_64-000000000000/manifest.json")
    downloads = [path for path in unavailable if path.startswith("/download/")]
    assert len(downloads) == 1, unavailable  # asked once: the SDK retried nothing
    assert len(unavailable) == len(set(unavailable)), unavailable  # nor anything else
