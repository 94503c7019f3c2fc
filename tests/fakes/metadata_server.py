"""A fake instance metadata service for EC2, GCE and Azure (127.0.0.1 unless `host` is given).

    with MetadataServer(vm_name="ct-run-worker-1") as server:
        watcher = PreemptionWatcher("aws", "ct-run-worker-1", base_url=server.url)
        server.preempt("ct-run-worker-1")

One server answers all three clouds' paths, as the real services do:

- EC2 (IMDSv2 required): `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
  (1..21600, else 400; a request with `X-Forwarded-For` gets 403) returns a token; every
  `GET /latest/meta-data/...` without a valid, unexpired `X-aws-ec2-metadata-token` gets 401.
  `spot/instance-action` is 404 until a notice, then `{"action": ..., "time": ISO-8601 UTC}`.
- GCE: `GET /computeMetadata/v1/instance/preempted` needs `Metadata-Flavor: Google` (else 403)
  and answers `FALSE`, or `TRUE` after a notice; `instance/name` answers the VM name.
- Azure: `GET /metadata/scheduledevents?api-version=...` needs `Metadata: true` (else 400) and
  an api-version (else 400); answers `{"DocumentIncarnation": n, "Events": [...]}`. A POST
  (event approval) is accepted and ignored.

Test controls: `preempt(vm_name, after_s)` gives the notice, visible `after_s` seconds from now,
on all three clouds (the Azure event names `vm_name`, default the server's own `vm_name`);
`add_azure_event()` adds any other event; `expire_tokens()` revokes every EC2 token; `delay_s`
delays every answer; `requests` counts requests per path (query excluded);
`tokens_issued` lists the EC2 tokens handed out. From another
process: `POST /_fake/preempt?vm=NAME[&after_s=S]`. All state is behind one lock.

A VM's own address: EC2's `meta-data/local-ipv4`, GCE's
`instance/network-interfaces/0/ip` and Azure's
`metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress` (format=text) answer
the address the request came from, as the real services answer the VM's primary private
address: with `host` a bridge address of tests/fakes/netns.py, each namespace's VM asks from its
own address (the cloud-in-a-box harness sends 169.254.169.254:80 there).

Many VMs can share one server: a path prefixed `/vm/ID` is that VM's own view, in which the
EC2 and GCE notices are seen only by the VM they were given to (`preempt(ID)`; the
cloud-in-a-box harness hands each VM `<url>/vm/<its id>`, so a replacement VM with the same name
but a new id gets no notice). Azure's events list is the same for all, as on Azure.

A cloud's identity endpoints (EC2's `iam/security-credentials/`, GCE's
`instance/service-accounts/`, Azure's `metadata/identity/oauth2/token`) are not built in: the
box of each cloud registers them with `add_route(prefix, handler)`, its handler asking its
emulator which identity the VM has (so the credentials follow the VM as the cloud's do). A
handler gets (method, path, query, headers, asker, client) with `path` the VM's own view (the
`/vm/ID` part gone, `asker` = ID) and answers (status, headers, body), or None to fall through.

As a script: `python -m tests.fakes.metadata_server --port N [--vm-name NAME]` prints its URL
and serves until interrupted.
"""

from __future__ import annotations

import argparse
import collections
import email.utils
import json
import secrets
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

EC2_TOKEN_PATH = "/latest/api/token"
EC2_ACTION_PATH = "/latest/meta-data/spot/instance-action"
GCE_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCE_NAME_PATH = "/computeMetadata/v1/instance/name"
# the VM's primary private address: EC2 docs.aws.amazon.com/AWSEC2/latest/UserGuide/
# instancedata-data-categories.html; GCE cloud.google.com/compute/docs/metadata/
# predefined-metadata-keys; Azure learn.microsoft.com/azure/virtual-machines/
# instance-metadata-service ("Get the private IP address")
EC2_IP_PATH = "/latest/meta-data/local-ipv4"
GCE_IP_PATH = "/computeMetadata/v1/instance/network-interfaces/0/ip"
AZURE_IP_PATH = "/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress"
AZURE_EVENTS_PATH = "/metadata/scheduledevents"
FAKE_PREEMPT_PATH = "/_fake/preempt"
EC2_NOTICE_S = 120.0
AZURE_NOTICE_S = 30.0

Answer = tuple[int, dict[str, str], bytes]
# (method, path, query, headers, asker, client) -> an answer, or None: not this route's
Route = Callable[[str, str, dict[str, list[str]], dict[str, str], str, str], "Answer | None"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: MetadataServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Silence clients that hang up early (the poller's timeouts)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 0:
            self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, extra, body = self.server.fake.handle(
            self.command, self.path, headers, self.client_address[0]
        )
        self.send_response(status)
        for key, value in {"Content-Type": "text/plain", **extra}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Silence the per-request log lines."""


class MetadataServer:
    """The fake service; starts serving on construction. Thread-safe."""

    def __init__(
        self, *, port: int = 0, vm_name: str = "cloudtrain-vm", host: str = "127.0.0.1"
    ) -> None:
        """Bind `host`:`port` (0: a free port) and serve in a daemon thread."""
        self.vm_name = vm_name
        self.delay_s = 0.0
        self.requests: collections.Counter[str] = collections.Counter()
        self.tokens_issued: list[str] = []
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}  # token -> expiry (epoch s)
        self._notice_at: float | None = None  # epoch s when the notice becomes visible
        self._notice_vm = ""
        self._ec2_action = "terminate"
        self._events: list[dict[str, Any]] = []
        self._incarnation = 1
        self._routes: list[tuple[str, Route]] = []
        self._httpd = _Server((host, port), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # a quick shutdown()
            name="fake-metadata",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """`http://HOST:PORT`, the base URL to give the poller."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> MetadataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_route(self, prefix: str, handler: Route) -> None:
        """Answer the requests whose path (the VM's own view) starts with `prefix` with
        `handler` first (the module docstring). Thread-safe."""
        with self._lock:
            self._routes.append((prefix, handler))

    # --- test controls --------------------------------------------------------------------
    def preempt(
        self, vm_name: str = "", after_s: float = 0, *, ec2_action: str = "terminate"
    ) -> None:
        """Give the interruption notice, visible from `after_s` seconds from now on: EC2's
        instance-action (`ec2_action`, 2 min later), GCE's preempted=TRUE, and an Azure Preempt
        event for `vm_name` (default: the server's vm_name) with NotBefore 30 s later."""
        with self._lock:
            self._notice_at = time.time() + after_s
            self._ec2_action = ec2_action
            self._notice_vm = vm_name or self.vm_name
            self._incarnation += 1

    def add_azure_event(
        self,
        event_type: str,
        resources: list[str],
        *,
        not_before: str | None = None,
        status: str = "Scheduled",
    ) -> dict[str, Any]:
        """Add an Azure scheduled event (e.g. a Freeze, or a Preempt of another VM) and return
        it. `not_before` defaults to 15 minutes from now; "" is kept as is."""
        if not_before is None:
            not_before = email.utils.formatdate(time.time() + 900, usegmt=True)
        event = _azure_event(event_type, resources, not_before, status)
        with self._lock:
            self._events.append(event)
            self._incarnation += 1
        return event

    def ec2_token_valid(self, token: str) -> bool:
        """Whether `token` is an IMDSv2 session token this server issued and has not expired
        (for a cloud's identity route, which answers only with one, as EC2's other paths)."""
        with self._lock:
            return self._tokens.get(token, 0.0) > time.time()

    def expire_tokens(self) -> None:
        """Revoke every EC2 token issued so far: their next use gets 401."""
        with self._lock:
            self._tokens.clear()

    # --- the service ----------------------------------------------------------------------
    def handle(
        self, method: str, target: str, headers: dict[str, str], client: str = "127.0.0.1"
    ) -> Answer:
        """Answer one request: (status, extra headers, body). `headers` have lowercase keys;
        `client` is the address the request came from (the VM's own address)."""
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        asker = ""  # `/vm/NAME/...`: one VM's own view (a notice for another VM is not seen)
        if path.startswith("/vm/"):
            asker, _, rest = path[len("/vm/") :].partition("/")
            path = "/" + rest
        with self._lock:
            self.requests[path] += 1
            delay = self.delay_s
        if delay > 0:
            time.sleep(delay)
        with self._lock:
            routes = list(self._routes)
        for prefix, handler in routes:
            if path.startswith(prefix):
                answer = handler(method, path, query, headers, asker, client)
                if answer is not None:
                    return answer
        if path == FAKE_PREEMPT_PATH and method == "POST":
            vm = query.get("vm", [""])[0]
            self.preempt(vm, float(query.get("after_s", ["0"])[0]))
            return _json(200, {"preempted": vm or self.vm_name})
        if path == EC2_TOKEN_PATH or path.startswith("/latest/"):
            return self._ec2(method, path, headers, asker, client)
        if path.startswith("/computeMetadata/"):
            return self._gce(method, path, headers, asker, client)
        if path == AZURE_EVENTS_PATH:
            return self._azure(method, query, headers)
        if path == AZURE_IP_PATH:
            return self._azure_ip(query, headers, client)
        return 404, {}, b"Not Found"

    def _notice_for(self, asker: str) -> float | None:
        """When the notice is visible to `asker` ("" = any VM); None if it never is."""
        with self._lock:
            if asker and asker != self._notice_vm:
                return None
            return self._notice_at

    def _ec2(
        self, method: str, path: str, headers: dict[str, str], asker: str = "", client: str = ""
    ) -> Answer:
        if path == EC2_TOKEN_PATH:
            if method != "PUT":
                return 405, {}, b"Method Not Allowed"
            if "x-forwarded-for" in headers:
                return 403, {}, b"Forbidden"
            ttl = headers.get("x-aws-ec2-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return 400, {}, b"Bad Request"
            token = secrets.token_urlsafe(40)
            with self._lock:
                self._tokens[token] = time.time() + int(ttl)
                self.tokens_issued.append(token)
            return 200, {"X-aws-ec2-metadata-token-ttl-seconds": ttl}, token.encode()
        if method != "GET":
            return 405, {}, b"Method Not Allowed"
        token = headers.get("x-aws-ec2-metadata-token", "")
        with self._lock:
            valid = self._tokens.get(token, 0.0) > time.time()
            action = self._ec2_action
        notice_at = self._notice_for(asker)
        if not valid:
            return 401, {}, b"Unauthorized"
        if path == EC2_IP_PATH:
            return 200, {}, client.encode()
        if path != EC2_ACTION_PATH or notice_at is None or time.time() < notice_at:
            return 404, {"Content-Type": "text/html"}, b"<title>404 - Not Found</title>"
        when = datetime.fromtimestamp(notice_at + EC2_NOTICE_S, timezone.utc)
        return _json(200, {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")})

    def _gce(
        self, method: str, path: str, headers: dict[str, str], asker: str = "", client: str = ""
    ) -> Answer:
        if "x-forwarded-for" in headers or headers.get("metadata-flavor") != "Google":
            return 403, {"Content-Type": "text/html"}, b"Missing Metadata-Flavor:Google header."
        if method != "GET":
            return 405, {}, b"Method Not Allowed"
        extra = {"Metadata-Flavor": "Google", "Content-Type": "application/text"}
        if path == GCE_NAME_PATH:
            return 200, extra, self.vm_name.encode()
        if path == GCE_IP_PATH:
            return 200, extra, client.encode()
        if path != GCE_PREEMPTED_PATH:
            return 404, {}, b"Not Found"
        notice_at = self._notice_for(asker)
        preempted = notice_at is not None and time.time() >= notice_at
        return 200, extra, b"TRUE" if preempted else b"FALSE"

    def _azure_ip(
        self, query: dict[str, list[str]], headers: dict[str, str], client: str
    ) -> Answer:
        if headers.get("metadata", "").lower() != "true" or "x-forwarded-for" in headers:
            return _json(400, {"error": "Bad request. Required metadata header not specified"})
        if not query.get("api-version"):
            return _json(400, {"error": "Bad request. api-version was not specified"})
        if query.get("format", [""])[0] == "text":
            return 200, {}, client.encode()
        return 200, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(client).encode()

    def _azure(self, method: str, query: dict[str, list[str]], headers: dict[str, str]) -> Answer:
        if headers.get("metadata", "").lower() != "true" or "x-forwarded-for" in headers:
            return _json(400, {"error": "Bad request. Required metadata header not specified"})
        if not query.get("api-version"):
            return _json(400, {"error": "Bad request. api-version was not specified"})
        if method == "POST":
            return 200, {}, b""  # StartRequests (approvals): accepted, no effect here
        now = time.time()
        with self._lock:
            events = [dict(e) for e in self._events]
            incarnation = self._incarnation
            if self._notice_at is not None and now >= self._notice_at:
                not_before = email.utils.formatdate(self._notice_at + AZURE_NOTICE_S, usegmt=True)
                events.append(_azure_event("Preempt", [self._notice_vm], not_before, "Scheduled"))
                events[-1]["EventId"] = f"preempt-{self._notice_vm}"
        for event in events:  # an event whose NotBefore has passed has started
            start = email.utils.parsedate_tz(event["NotBefore"]) if event["NotBefore"] else None
            if start is not None and email.utils.mktime_tz(start) <= now:
                event["EventStatus"] = "Started"
        return _json(200, {"DocumentIncarnation": incarnation, "Events": events})


def _azure_event(
    event_type: str, resources: list[str], not_before: str, status: str
) -> dict[str, Any]:
    return {
        "EventId": str(uuid.uuid4()).upper(),
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "EventStatus": status,
        "NotBefore": not_before,
        "Description": f"Virtual machine is scheduled for {event_type}.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def _json(status: int, payload: dict[str, Any]) -> Answer:
    return status, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(payload).encode()


def main(argv: list[str] | None = None) -> int:
    """Serve on --host:--port until interrupted (blocks); prints the URL first."""
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.metadata_server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--vm-name", default="cloudtrain-vm")
    args = parser.parse_args(argv)
    server = MetadataServer(port=args.port, vm_name=args.vm_name, host=args.host)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
