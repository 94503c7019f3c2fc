"""The box's Blob storage front: Entra ID (bearer token) requests authorized by the ARM fake's
role assignments and their ABAC conditions, then served by Azurite.

Azurite enforces no RBAC. `BlobFront` serves HTTPS (a throwaway `trustme` CA: azure-core sends
bearer tokens over TLS only) on 127.0.0.1 in front of it, path style like Azurite
(`/ACCOUNT/CONTAINER/BLOB`):

- `Authorization: Bearer <token>`: the token must be one the box's IMDS issued for
  https://storage.azure.com/ (tests/fakes/token_book.py, issued by azure_imds_identity.py), else 401
  InvalidAuthenticationInfo as Azure Storage answers. The request is then authorized as Azure
  does ("Authorize access to blobs using Microsoft Entra ID",
  https://learn.microsoft.com/azure/storage/blobs/authorize-access-azure-active-directory, and
  the per-operation permissions of "Authorize with Microsoft Entra ID",
  https://learn.microsoft.com/rest/api/storageservices/authorize-with-azure-active-directory):
  the principal's role assignments at or above the container's scope (the ARM fake's), each
  granting the request's action through its role's (data) actions and, with an ABAC condition,
  only where `arm_conditions.evaluate` allows it (Azure: "A condition filters permissions
  granted by its own role assignment"). Actions per operation (`data_actions`; the ABAC
  attributes page, https://learn.microsoft.com/azure/storage/blobs/storage-auth-abac-attributes):
  Get Blob / Get Blob Properties / Get Block List: `.../blobs/read` with the blob's `path`;
  List Blobs: `.../blobs/read` with suboperation `Blob.List` and no path; Put Blob / Put Block /
  Put Block List / Set Blob Metadata / Set Blob Properties: `.../blobs/write`, or
  `.../blobs/add/action` (a create: either grants it, "Troubleshoot Azure role assignment
  conditions", Cause 2, https://learn.microsoft.com/azure/role-based-access-control/
  conditions-troubleshoot); Delete Blob: `.../blobs/delete`; Get Container Properties:
  `.../containers/read` (a management action of the roles). Anything else a bearer asks (a blob
  batch, leases, tags, copies, container writes) is refused: cloudtrain's nodes use none of it.
  A refusal is Blob storage's 403 `AuthorizationPermissionMismatch` ("This request is not
  authorized to perform this operation using this permission."; error codes,
  https://learn.microsoft.com/rest/api/storageservices/blob-service-error-codes), recorded in
  `refusals`. An allowed request goes to Azurite with the account's own credentials: an account
  SAS appended to its query (Azurite serves account SAS), the bearer header dropped.
- Any other request (SharedKey, SAS, anonymous) goes to Azurite as it came: the account key is
  the account's owner, as on Azure.

A role's (data) actions come from its definition, so the front enforces exactly that role:
a built-in role's from arm_role_definitions.BUILT_IN (Actions and DataActions from "Azure
built-in roles for Storage",
https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/storage, and
"... General"), a custom role's (cloudtrain's node role, providers/azure/node_role.py) from the
ARM fake's role definitions (`ArmFake.role_of`); NotActions and NotDataActions subtract. A List
Blobs request carries its `prefix` parameter as the @Request attribute `blobs:prefix` (absent
without one: a condition comparing it then fails, as Azure denies what it cannot evaluate).
"""

from __future__ import annotations

import datetime
import fnmatch
import http.client
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakes.arm_conditions import BLOBS, Request, evaluate
from tests.fakes.arm_http import FakeServer
from tests.fakes.arm_role_definitions import BUILT_IN, Role
from tests.fakes.arm_tls import FakeTls
from tests.fakes.azure_imds_identity import STORAGE
from tests.fakes.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from tests.fakes.serving import Served
from tests.fakes.token_book import TokenBook

CONTAINERS = "Microsoft.Storage/storageAccounts/blobServices/containers"
READ, WRITE, ADD, DELETE = (f"{BLOBS}/{a}" for a in ("read", "write", "add/action", "delete"))
LIST = "Blob.List"
MISMATCH = "AuthorizationPermissionMismatch"
MISMATCH_TEXT = "This request is not authorized to perform this operation using this permission."
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host"}


@dataclass(frozen=True)
class Ask:
    """What a blob request asks: the actions any one of which grants it (data actions, or
    `management` ones), the blob's path (None for a container request) and suboperation."""

    actions: tuple[str, ...]
    path: str | None
    suboperation: str | None = None
    management: bool = False
    prefix: str | None = None  # List Blobs' `prefix` (the @Request attribute blobs:prefix)


@dataclass(frozen=True)
class Refusal:
    """A request the front refused: who, what, and why (the actions it needed)."""

    principal: str
    method: str
    container: str
    blob: str | None
    actions: tuple[str, ...]
    # whether the principal then held an assignment at or above the container (refused by its
    # role or condition), or none at all (its grant was already removed: a node VM shutting
    # down after the run's teardown revoked it)
    granted: bool = True


def data_actions(method: str, blob: str | None, query: dict[str, str]) -> Ask | None:
    """The actions a request needs (the module docstring), or None: not an operation a bearer
    may do here. Pure."""
    comp, restype = query.get("comp"), query.get("restype")
    if blob is None:
        if restype != "container":
            return None
        if method == "GET" and comp == "list":
            return Ask((READ,), None, LIST, prefix=query.get("prefix"))
        if method in ("GET", "HEAD") and comp in (None, "metadata"):
            return Ask((f"{CONTAINERS}/read",), None, management=True)
        return None
    if method in ("GET", "HEAD") and comp in (None, "metadata", "blocklist"):
        return Ask((READ,), blob)
    if method == "PUT" and comp in (None, "block", "blocklist", "metadata", "properties"):
        return Ask((WRITE, ADD), blob)
    if method == "DELETE" and comp is None:
        return Ask((DELETE,), blob)
    return None


def _matches(patterns: Iterable[str], action: str) -> bool:
    return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)


def role_grants(role: Role, action: str, management: bool) -> bool:
    """Whether `role`'s definition grants `action`: a (data) action its Actions (DataActions)
    match and its NotActions (NotDataActions) do not ("Understand Azure role definitions",
    https://learn.microsoft.com/azure/role-based-access-control/role-definitions: the
    effective permissions are the allowed ones minus the Not ones). Pure."""
    if management:
        return _matches(role.actions, action) and not _matches(role.not_actions, action)
    return _matches(role.data_actions, action) and not _matches(role.not_data_actions, action)


def _within(inner: str, outer: str) -> bool:
    inner, outer = inner.lower().rstrip("/"), outer.lower().rstrip("/")
    return inner == outer or inner.startswith(outer + "/")


def _theirs(assignments: Iterable[dict[str, Any]], principal: str, scope: str) -> list[dict]:
    """`principal`'s assignments at or above `scope`. Pure."""
    return [
        body
        for body in assignments
        if str(body["properties"]["principalId"]).lower() == principal.lower()
        and _within(scope, str(body["properties"]["scope"]))
    ]


def built_in_role(role_definition_id: str) -> Role | None:
    """A built-in role by its definition id (arm_role_definitions.BUILT_IN), or None. Pure."""
    return BUILT_IN.get(role_definition_id.rsplit("/", 1)[-1].lower())


def allowed(
    assignments: Iterable[dict[str, Any]],
    principal: str,
    scope: str,
    ask: Ask,
    role_of: Callable[[str], Role | None] = built_in_role,
) -> bool:
    """Whether one of `principal`'s assignments at or above `scope` grants one of `ask`'s
    actions through its role's definition (`role_of`: roleDefinitionId -> Role; the front
    passes the ARM fake's, built-in and custom), its condition (if any) allowing it. Pure
    given `role_of`."""
    for body in _theirs(assignments, principal, scope):
        props = body["properties"]
        role = role_of(str(props["roleDefinitionId"]))
        if role is None:
            continue
        for action in ask.actions:
            if not role_grants(role, action, ask.management):
                continue
            condition = props.get("condition")
            if not condition or ask.management:  # conditions target data actions only
                return True
            resource = {} if ask.path is None else {"path": ask.path}
            request = {} if ask.prefix is None else {"prefix": ask.prefix}
            if evaluate(str(condition), Request(action, request, resource, ask.suboperation)):
                return True
    return False


def account_sas(account: str = ACCOUNT, key: str = ACCOUNT_KEY, hours: int = 24) -> str:
    """An account SAS with every blob permission (what the front adds for Azurite)."""
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    every = AccountSasPermissions(
        read=True, write=True, delete=True, list=True, add=True, create=True, update=True
    )
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=hours)
    kinds = ResourceTypes(service=True, container=True, object=True)
    return str(generate_account_sas(account, key, kinds, every, expiry=expiry))


def _error_body(code: str, message: str, request_id: str) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())
    return (
        '<?xml version="1.0" encoding="utf-8"?><Error>'
        f"<Code>{code}</Code><Message>{message}\nRequestId:{request_id}\nTime:{stamp}"
        "</Message></Error>"
    ).encode()


class BlobFront:
    """The front (the module docstring). Start with `start()`, always `close()`."""

    def __init__(self, azurite: Azurite, arm: Any, book: TokenBook) -> None:
        self.azurite, self.arm, self.book = azurite, arm, book
        self.refusals: list[Refusal] = []
        self.allowed_count = 0
        self._lock = threading.Lock()
        self._sas = account_sas()
        self._tls: FakeTls | None = None
        self._served: Served | None = None
        self.url = ""
        self.ca_path = ""

    @property
    def endpoint(self) -> str:
        """The account's blob endpoint through the front: https://127.0.0.1:P/ACCOUNT."""
        return f"{self.url}/{ACCOUNT}"

    def start(self) -> BlobFront:
        """Serve on a free port of 127.0.0.1 in a daemon thread; ready on return."""
        self._tls = FakeTls()
        self.ca_path = self._tls.ca_path
        server = _Server(("127.0.0.1", 0), _Handler)
        server.front, server.context = self, self._tls.server_context
        self._served = Served(server, "blob-front")
        self.url = f"https://127.0.0.1:{self._served.port}"
        return self

    def close(self) -> None:
        """Stop serving and remove the CA file. Idempotent."""
        if self._served is not None:
            self._served.close()
            self._served = None
        if self._tls is not None:
            self._tls.close()
            self._tls = None

    def __enter__(self) -> BlobFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- deciding ---------------------------------------------------------------------------

    def container_scope(self, account: str, container: str) -> str | None:
        """The container's resource id in the ARM fake (its storage account's), or None."""
        for body in self.arm.resources(kind="storageAccounts"):
            if str(body.get("name", "")).lower() == account.lower():
                return f"{body['id']}/blobServices/default/containers/{container}"
        return None

    def decide(self, method: str, target: str, token: str) -> tuple[int, str, str]:
        """(status, error code, message) for a bearer request: 0 when allowed."""
        principal = self.book.who(token, STORAGE)
        if principal is None:
            return 401, "InvalidAuthenticationInfo", "Server failed to authenticate the request."
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        segments = parts.path.lstrip("/").split("/", 2)
        account = segments[0] if segments else ""
        container = segments[1] if len(segments) > 1 else ""
        blob = unquote(segments[2]) if len(segments) > 2 and segments[2] else None
        ask = data_actions(method, blob, query) if container else None
        scope = self.container_scope(account, container) if container else None
        assignments = self.arm.role_assignments()
        ok = (
            ask is not None
            and scope is not None
            and allowed(assignments, principal, scope, ask, self.arm.role_of)
        )
        if not ok:
            granted = scope is not None and bool(_theirs(assignments, principal, scope))
            actions = ask.actions if ask else ()
            with self._lock:
                self.refusals.append(Refusal(principal, method, container, blob, actions, granted))
            return 403, MISMATCH, MISMATCH_TEXT
        with self._lock:
            self.allowed_count += 1
        return 0, "", ""

    # --- forwarding -------------------------------------------------------------------------

    def forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes, signed: bool
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send the request on to Azurite (with the account SAS when `signed`)."""
        if signed:
            target += ("&" if "?" in target else "?") + self._sas
        conn = http.client.HTTPConnection("127.0.0.1", self.azurite.port, timeout=60)
        try:
            sent = {k: v for k, v in headers if k.lower() not in HOP_BY_HOP}
            if signed:
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
            sent["Host"] = f"127.0.0.1:{self.azurite.port}"
            conn.request(
                method, target, body=body if body or method == "PUT" else None, headers=sent
            )
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, list(resp.getheaders()), data
        finally:
            conn.close()


class _Server(FakeServer):
    """The ARM fake's TLS server (a handshake per connection thread), serving the front."""

    front: BlobFront


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    disable_nagle_algorithm = True
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        front = self.server.front
        auth = self.headers.get("Authorization") or ""
        signed = auth.startswith("Bearer ")
        if signed:
            status, code, message = front.decide(self.command, self.path, auth[len("Bearer ") :])
            if status:
                self._refuse(status, code, message)
                return
        status, headers, data = front.forward(
            self.command, self.path, list(self.headers.items()), body, signed
        )
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        length_header = dict((k.lower(), v) for k, v in headers).get("content-length")
        if self.command == "HEAD" and length_header is not None:
            self.send_header("Content-Length", length_header)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _refuse(self, status: int, code: str, message: str) -> None:
        request_id = str(uuid.uuid4())
        data = _error_body(code, message, request_id)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-ms-error-code", code)
        self.send_header("x-ms-request-id", request_id)
        self.send_header("x-ms-version", self.headers.get("x-ms-version") or "2025-11-05")
        if status == 401:  # Azure Storage names where to get a token
            self.send_header(
                "WWW-Authenticate",
                "Bearer authorization_uri=https://login.microsoftonline.com/common/oauth2/"
                "authorize resource_id=https://storage.azure.com",
            )
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Silence the per-request log lines."""
