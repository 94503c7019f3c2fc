"""The ARM fake's HTTPS transport: a stdlib `ThreadingHTTPServer` over TLS and its handler.

`FakeServer` accepts plain TCP connections and does each TLS handshake in the connection's own
daemon thread (so a stuck client never stalls the accept loop), with the fake's server context.
`FakeHandler` reads each request's body and passes method, path, lower-cased headers and body to
the owning fake's `ArmFake.handle()`, which answers a `Reply`: a status, a body (a dict or list
sent as JSON, str or bytes sent as they are, None for no body) and extra headers. It speaks
keep-alive HTTP/1.1 with Nagle's algorithm off, frees idle connections after 30 s, sends no body
to HEAD and logs nothing.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.arm_fake import ArmFake


@dataclass
class Reply:
    """One answer of the fake: status, body and extra headers."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class FakeServer(ThreadingHTTPServer):
    """The fake's server; `fake` answers its requests, `context` is the server SSL context."""

    daemon_threads = True
    fake: ArmFake
    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Handshake TLS in this connection's thread, then serve it."""
        request.settimeout(FakeHandler.timeout)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return  # a client that gave up or did not trust the CA
        try:
            with contextlib.suppress(OSError, ssl.SSLError):
                self.RequestHandlerClass(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.shutdown(socket.SHUT_RDWR)
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet about connections that broke off."""


class FakeHandler(BaseHTTPRequestHandler):
    """Hands every request to the server's fake and writes its answer."""

    protocol_version = "HTTP/1.1"
    timeout = 30
    disable_nagle_algorithm = True
    server: FakeServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.fake.handle(self.command, self.path, headers, raw)
        if reply.body is None:
            data, kind = b"", ""
        elif isinstance(reply.body, bytes):
            data, kind = reply.body, "application/octet-stream"
        elif isinstance(reply.body, str):
            data, kind = reply.body.encode(), "text/plain; charset=utf-8"
        else:
            data, kind = json.dumps(reply.body).encode(), "application/json; charset=utf-8"
        self.send_response(reply.status)
        sent = {k.lower() for k in reply.headers}
        if kind and "content-type" not in sent:
            self.send_header("Content-Type", kind)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Silence the per-request log lines."""
