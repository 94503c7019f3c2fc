"""The GCE fake's HTTP transport: a stdlib `ThreadingHTTPServer` and its request handler.

`FakeHandler` reads each request's body, passes method, path and body to the owning fake's
`GceFake.handle()` and writes back its status and JSON answer. It speaks keep-alive HTTP/1.1
with Nagle's algorithm off, as google-cloud-compute's REST transport expects, frees idle
connections after 30 s and logs nothing; `FakeServer` runs each connection in a daemon thread.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.gce_fake import GceFake


class FakeServer(ThreadingHTTPServer):
    """The fake's server; `fake` is the GceFake that answers its requests."""

    daemon_threads = True
    fake: GceFake


class FakeHandler(BaseHTTPRequestHandler):
    """Hands every request to the server's fake and writes its answer."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the client's requests session expects
    timeout = 30  # an idle keep-alive connection frees its thread after this
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for a delayed ACK
    server: FakeServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        status, payload = self.server.fake.handle(self.command, self.path, raw)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Silence the per-request log lines."""
