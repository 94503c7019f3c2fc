"""An authorizing front for the GCS emulator: what GCS decides about a request, done in the box.

The emulator stores bucket IAM policies but enforces nothing. The box's node VMs reach it
through this front (their STORAGE_EMULATOR_HOST), which forwards every request unchanged
(the Host header too, so a resumable upload's session URI names the front) and, for a request
that carries `Authorization: Bearer <token>`, first decides it as GCS does:

- authentication: the token must be one the box's metadata server issued
  (tests/fakes/token_book.py, issued by gce_metadata_identity.py), else 401 `authError` "Invalid
  Credentials";
- authorization: the request's permissions on its resource, checked against the bucket's IAM
  policy as the emulator stores it, by tests/fakes/gcs_iam_conditions.py (roles, conditions);
  one missing permission refuses it with GCS's 403 `forbidden`, "<email> does not have
  <permission> access to the Google Cloud Storage object. ..." ("HTTP status and error codes"
  of the JSON API, https://cloud.google.com/storage/docs/json_api/v1/status-codes#403-forbidden).

Requests with no token (the box's controller and laptop, anonymous on the emulator) pass as
the project's owner would: enforcing the controller's identity is issue 30's.

The permissions of each JSON API method ("IAM permissions for JSON methods",
https://cloud.google.com/storage/docs/access-control/iam-json; the resource names, "Resource
name attribute" of https://cloud.google.com/iam/docs/conditions-attribute-reference):
- objects.get (metadata, `alt=media`, `/download/...`), XML GET/HEAD: storage.objects.get on
  `projects/_/buckets/B/objects/NAME`;
- objects.list: storage.objects.list on `projects/_/buckets/B`, its `prefix` parameter the API
  attribute `storage.googleapis.com/objectListPrefix` (absent: "");
- objects.insert (`uploadType=media|multipart|resumable`; the name from `name=`, the multipart
  metadata part or the resumable start's JSON body), XML PUT: storage.objects.create, and
  storage.objects.delete too when an object of that name exists (it replaces it). The chunks
  of a resumable upload (`upload_id=`) are not checked again: the session URI authorizes them
  ("Resumable uploads", https://cloud.google.com/storage/docs/resumable-uploads: the session
  URI "acts as an authentication token");
- objects.delete: storage.objects.delete; objects.patch / update: storage.objects.update;
- objects.rewrite / copy / compose: storage.objects.get on each source, storage.objects.create
  (+ delete when it replaces) on the destination;
- buckets' own methods (get, iam, ...) and anything else: a bucket permission
  (storage.buckets.*), which no object role holds: refused.
"""

from __future__ import annotations

import email.parser
import email.policy
import http.client
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.fakes import gcs_iam_conditions as iam
from tests.fakes.serving import Served
from tests.fakes.token_book import TokenBook

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    }
)
JSON_PREFIX = "/storage/v1/b/"
UPLOAD_PREFIX = "/upload/storage/v1/b/"
DOWNLOAD_PREFIX = "/download/storage/v1/b/"


@dataclass(frozen=True)
class Ask:
    """One permission the request needs: `permission` on `resource`, with API attributes."""

    permission: str
    resource: str
    attributes: tuple[tuple[str, str], ...] = ()

    def request(self) -> iam.Request:
        return iam.Request(self.permission, self.resource, dict(self.attributes))


@dataclass(frozen=True)
class Refusal:
    """A refused request, for tests: who, what, and the permission it lacked. `bound`: whether
    the bucket's policy still named the account then; a node's last log flush after teardown
    revoked its bindings is refused as on GCP, and is no sign of rules that are too tight."""

    email: str
    method: str
    path: str
    permission: str
    resource: str
    bound: bool = True


def _multipart_name(content_type: str, body: bytes) -> str | None:
    """The object name in a multipart upload's metadata part (the first part, JSON)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.default).parsebytes(head + body)
    for part in message.iter_parts():  # type: ignore[attr-defined]
        with_json = part.get_content_type() == "application/json"
        if with_json:
            return str(json.loads(part.get_payload(decode=True) or b"{}").get("name") or "")
    return None


class GcsFront:
    """The front (the module docstring). Start with `start()`, always `close()`."""

    def __init__(self, emulator_url: str, book: TokenBook, host: str = "127.0.0.1") -> None:
        parts = urlsplit(emulator_url)
        self.upstream = (parts.hostname or "127.0.0.1", int(parts.port or 80))
        self.book, self.host = book, host
        self.refusals: list[Refusal] = []
        self.allowed: list[tuple[str, str, str]] = []  # (email, method, path) let through
        self._lock = threading.Lock()
        self._served: Served | None = None
        self.url = ""

    def start(self) -> GcsFront:
        """Serve on a free port of `host` in a daemon thread; ready on return."""
        server = _Server((self.host, 0), _Handler)
        server.front = self
        self._served = Served(server, "gcs-front")
        self.url = f"http://{self.host}:{self._served.port}"
        return self

    def close(self) -> None:
        """Stop serving. Idempotent."""
        if self._served is not None:
            self._served.close()
            self._served = None

    def __enter__(self) -> GcsFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the emulator holds ------------------------------------------------------------

    def _upstream(self, method: str, target: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.request(method, target)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def policy(self, bucket: str) -> dict[str, Any]:
        """The bucket's IAM policy as the emulator stores it ({} for none)."""
        status, data = self._upstream(
            "GET", f"{JSON_PREFIX}{quote(bucket, safe='')}/iam?optionsRequestedPolicyVersion=3"
        )
        return json.loads(data) if status == 200 and data else {}

    def exists(self, bucket: str, name: str) -> bool:
        """Whether the object is live in the emulator."""
        status, _ = self._upstream(
            "GET", f"{JSON_PREFIX}{quote(bucket, safe='')}/o/{quote(name, safe='')}"
        )
        return status == 200

    # --- deciding ---------------------------------------------------------------------------

    def _writes(self, bucket: str, name: str) -> Iterator[Ask]:
        resource = iam.object_name(bucket, name)
        yield Ask("storage.objects.create", resource)
        if self.exists(bucket, name):
            yield Ask("storage.objects.delete", resource)

    def asks(self, method: str, target: str, headers: dict[str, str], body: bytes) -> list[Ask]:
        """The permissions the request needs (the module docstring); [] for a resumable
        upload's chunks (its session authorizes them)."""
        parts = urlsplit(target)
        path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
        for prefix in (UPLOAD_PREFIX, DOWNLOAD_PREFIX, JSON_PREFIX):
            if path.startswith(prefix):
                bucket, _, rest = path[len(prefix) :].partition("/")
                return self._json_asks(prefix, method, unquote(bucket), rest, query, headers, body)
        # the XML API: /BUCKET/OBJECT (signed URLs' paths)
        bucket, _, name = path.lstrip("/").partition("/")
        if not bucket or not name:
            return [Ask("storage.buckets.list", "projects/_")]
        name = unquote(name)
        if method in ("GET", "HEAD"):
            return [Ask("storage.objects.get", iam.object_name(bucket, name))]
        if method == "PUT":
            return list(self._writes(bucket, name))
        if method == "DELETE":
            return [Ask("storage.objects.delete", iam.object_name(bucket, name))]
        return [Ask("storage.buckets.update", iam.bucket_name(bucket))]

    def _json_asks(
        self,
        prefix: str,
        method: str,
        bucket: str,
        rest: str,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes,
    ) -> list[Ask]:
        if prefix == UPLOAD_PREFIX:
            if "upload_id" in query:
                return []
            name = query.get("name")
            kind = query.get("uploadType", "")
            if not name and kind == "multipart":
                name = _multipart_name(headers.get("content-type", ""), body)
            if not name and kind == "resumable" and body:
                name = str(json.loads(body).get("name") or "")
            if not name:
                return [Ask("storage.objects.create", iam.bucket_name(bucket))]
            return list(self._writes(bucket, name))
        if rest in ("o", "o/"):
            if method == "GET":
                attributes = ((iam.LIST_PREFIX, query.get("prefix", "")),)
                return [Ask("storage.objects.list", iam.bucket_name(bucket), attributes)]
            return [Ask("storage.objects.create", iam.bucket_name(bucket))]
        if not rest.startswith("o/"):
            what = "get" if method == "GET" else "update"
            return [Ask(f"storage.buckets.{what}", iam.bucket_name(bucket))]
        name, _, action = rest[len("o/") :].partition("/")
        name = unquote(name)
        resource = iam.object_name(bucket, name)
        if action.startswith(("rewriteTo/b/", "copyTo/b/")):
            target = action.split("/b/", 1)[1]
            dest_bucket, _, dest = target.partition("/o/")
            return [
                Ask("storage.objects.get", resource),
                *self._writes(unquote(dest_bucket), unquote(dest)),
            ]
        if action == "compose":
            sources = [str(s.get("name")) for s in json.loads(body or b"{}").get("sourceObjects")]
            return [
                *(Ask("storage.objects.get", iam.object_name(bucket, s)) for s in sources),
                *self._writes(bucket, name),
            ]
        if action:
            return [Ask("storage.objects.update", resource)]
        if method == "GET":
            return [Ask("storage.objects.get", resource)]
        if method == "DELETE":
            return [Ask("storage.objects.delete", resource)]
        return [Ask("storage.objects.update", resource)]

    def decide(
        self, method: str, target: str, headers: dict[str, str], token: str, body: bytes
    ) -> tuple[int, dict[str, Any]]:
        """(0, {}) when the bearer may make the request, else (status, GCS's error body)."""
        who = self.book.who(token)
        if who is None:
            message = "Invalid Credentials"
            error = {"message": message, "domain": "global", "reason": "authError"}
            error |= {"locationType": "header", "location": "Authorization"}
            return 401, {"error": {"code": 401, "message": message, "errors": [error]}}
        member = f"serviceAccount:{who}"
        policies: dict[str, dict[str, Any]] = {}
        for ask in self.asks(method, target, headers, body):
            bucket = ask.resource.removeprefix("projects/_/buckets/").split("/", 1)[0]
            if bucket not in policies:
                policies[bucket] = self.policy(bucket) if bucket != "projects/_" else {}
            if iam.allows(policies[bucket], member, ask.request()):
                continue
            bound = any(
                member in (b.get("members") or ()) for b in policies[bucket].get("bindings") or ()
            )
            with self._lock:
                refusal = Refusal(who, method, target, ask.permission, ask.resource, bound)
                self.refusals.append(refusal)
            what = (
                "Google Cloud Storage object"
                if "/objects/" in ask.resource
                else "Google Cloud Storage bucket"
            )
            message = (
                f"{who} does not have {ask.permission} access to the {what}. Permission "
                f"'{ask.permission}' denied on resource (or it may not exist)."
            )
            error = {"message": message, "domain": "global", "reason": "forbidden"}
            return 403, {"error": {"code": 403, "message": message, "errors": [error]}}
        with self._lock:
            self.allowed.append((who, method, target))
        return 0, {}

    # --- forwarding -------------------------------------------------------------------------

    def forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send the request on to the emulator, its Host header kept, its token dropped."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            sent = {
                k: v
                for k, v in headers
                if k.lower() not in HOP_BY_HOP and k.lower() not in ("authorization",)
            }
            sent["Content-Length"] = str(len(body))
            conn.request(method, target, body=body if body else None, headers=sent)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, list(resp.getheaders()), data
        finally:
            conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    front: GcsFront

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet about connections that broke off."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    disable_nagle_algorithm = True
    server: _Server

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _serve(self) -> None:
        body = self._body()
        front = self.server.front
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer "):
            lower = {k.lower(): v for k, v in self.headers.items()}
            status, error = front.decide(
                self.command, self.path, lower, auth[len("Bearer ") :], body
            )
            if status:
                data = json.dumps(error).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                if status == 401:
                    self.send_header(
                        "WWW-Authenticate", 'Bearer realm="https://accounts.google.com/"'
                    )
                self.send_header(
                    "Content-Length", "0" if self.command == "HEAD" else str(len(data))
                )
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return
        status, headers, data = front.forward(
            self.command, self.path, list(self.headers.items()), body
        )
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Quiet."""
