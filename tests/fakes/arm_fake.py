"""An in-memory HTTPS fake of the Azure Resource Manager REST API, for offline adapter tests.

    from tests.fakes.arm_fake import ArmFake, arm_fake, start_arm_fake

`start_arm_fake()` serves the fake on a free port of 127.0.0.1 over HTTPS (a fresh `trustme` CA
per fake, its PEM in `fake.ca_path`; azure-core refuses bearer tokens over plain http), with a
stdlib ThreadingHTTPServer and one lock around all state. Point the real azure-mgmt clients at it:

    Client(fake.credential(), SUB, **fake.client_kwargs())
    # == Client(credential, SUB, base_url=fake.url, connection_verify=fake.ca_path)

`fake.credential()` is offline (`get_token()` answers an AccessToken); `fake.ssl_context()`
trusts the CA for plain clients (urllib on a boot diagnostics URL). Use
`begin_...(..., polling_interval=0).result()` for LROs and `retry_total=0` on clients whose calls
are meant to fail (else azure-core retries 5xx/429 with back-off).

Every request needs `Authorization: Bearer ...` (else 401 AuthenticationFailed) and an
`api-version` query parameter (else 400 MissingApiVersionParameter, 400
InvalidApiVersionParameter if malformed); errors have ARM's shape `{"error": {"code",
"message"}}`. Served, under `/subscriptions/{sub}` (see each module's docstring):
resource groups and generic resource lists (arm_groups, arm_resources), Microsoft.Network
virtual networks, subnets, NSGs, NICs, public IPs (arm_network), Microsoft.Compute virtual
machines, disks, VM actions, boot diagnostics and extensions (arm_vms, arm_vm_actions), role
assignments at any scope (arm_authorization), role definitions (arm_role_definitions), storage
accounts and containers (arm_storage), compute usages and the caller's permissions (arm_usages).

The subscription is as stingy as the test makes it through `fake.account` (an AzureAccount,
tests/fakes/azure_account.py): quotas and usage, sold-out zones, and the caller's rights, each
refused in Azure's shape (quota: 409 OperationNotAllowed; capacity: AllocationFailed /
ZonalAllocationFailed; a right: 403 AuthorizationFailed, checked after the route is known).

LROs (arm_operations): `Azure-AsyncOperation` status URLs (resource group deletion and storage
account creation: `Location`) with `Retry-After: 0`, answering InProgress for `fake.lro_polls`
polls (default 1), then Succeeded or Failed; effects land when they succeed.

Inspection and scripting (arm_scripting): `resources(kind, group)`, `groups()`,
`role_assignments()`, `requests`, `vm_power_state()`, `set_serial()`/`append_serial()`,
`set_vm_power_state()`, `remove_vm()`, `evict()` (a Spot eviction), `fail_next_vm_create()`,
`fail_next_extension()`, `fail_next_role_assignment()`, `throttle_next()`; plus `lro_polls`,
`tenant_id`, `reset()` and `bugs` (tracebacks of requests the fake itself failed with 500; the
fixture fails on any).

This module holds `ArmFake` (lifecycle and the request entry point), `start_arm_fake()` and the
`arm_fake` fixture. State lives in arm_state, routing in arm_routes, transport and TLS in
arm_http and arm_tls, shared resource logic in arm_resources, failure texts in arm_faults;
arm_testkit has SDK clients, sample bodies and fixtures for tests.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import traceback
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.fakes.arm_authorization import AuthorizationMixin
from tests.fakes.arm_errors import ArmApiError
from tests.fakes.arm_groups import GroupsMixin
from tests.fakes.arm_http import FakeHandler, FakeServer, Reply
from tests.fakes.arm_network import NetworkMixin
from tests.fakes.arm_resources import bad_body
from tests.fakes.arm_role_definitions import CUSTOM_ROLE_LIMIT, RoleDefinitionsMixin
from tests.fakes.arm_routes import Req, match_route
from tests.fakes.arm_scripting import THROTTLE, ScriptingMixin
from tests.fakes.arm_state import State
from tests.fakes.arm_storage import StorageMixin
from tests.fakes.arm_tls import FakeCredential, FakeTls
from tests.fakes.arm_usages import UsagesMixin
from tests.fakes.arm_vm_actions import VmActionsMixin
from tests.fakes.azure_account import AzureAccount
from tests.fakes.serving import Served

__all__ = ["DEFAULT_LRO_POLLS", "TENANT_ID", "ArmApiError", "ArmFake", "arm_fake", "start_arm_fake"]

HOST = "127.0.0.1"
DEFAULT_LRO_POLLS = 1
TENANT_ID = "0c4f2a7e-5b1d-4e8a-9f3c-7d2e1b6a8c90"
API_VERSION_RE = re.compile(r"\d{4}-\d{2}-\d{2}(-preview|-beta)?")


class ArmFake(
    ScriptingMixin,
    GroupsMixin,
    NetworkMixin,
    VmActionsMixin,
    AuthorizationMixin,
    StorageMixin,
    RoleDefinitionsMixin,
    UsagesMixin,
):
    """The fake's state and its HTTPS server. Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state = State()
        self.lro_polls = DEFAULT_LRO_POLLS
        self.tenant_id = TENANT_ID
        self.url = ""
        self.ca_path = ""
        self.bugs: list[str] = []  # tracebacks of requests the fake itself failed (HTTP 500)
        self.account = AzureAccount(self)  # quotas, capacity, the caller's rights
        self._tls: FakeTls | None = None
        self._served: Served | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> ArmFake:
        """Serve HTTPS on a free port of 127.0.0.1 in a daemon thread; ready on return."""
        self._tls = FakeTls()
        self.ca_path = self._tls.ca_path
        server = FakeServer((HOST, 0), FakeHandler)
        server.fake, server.context = self, self._tls.server_context
        self._served = Served(server, "arm-fake")
        self.url = f"https://{HOST}:{self._served.port}"
        return self

    def stop(self) -> None:
        """Shut the server down, join its thread and remove the CA file. Idempotent."""
        if self._served is not None:
            self._served.close()
            self._served = None
        if self._tls is not None:
            self._tls.close()
            self._tls = None

    def reset(self) -> None:
        """Forget all state, scripting and logged requests; `lro_polls` and `custom_role_limit`
        back to their defaults."""
        with self._lock:
            self._state = State()
            self.lro_polls = DEFAULT_LRO_POLLS
            self.custom_role_limit = CUSTOM_ROLE_LIMIT
            self.bugs.clear()

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that point an azure-mgmt client at this fake."""
        return {"base_url": self.url, "connection_verify": self.ca_path}

    def credential(self) -> FakeCredential:
        """An offline TokenCredential the fake accepts."""
        return FakeCredential()

    def ssl_context(self) -> ssl.SSLContext:
        """An SSL context trusting the fake's CA (e.g. for urllib on a boot diagnostics URL)."""
        return ssl.create_default_context(cafile=self.ca_path)

    # -- HTTP entry point -----------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> Reply:
        """Serve one request."""
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        with self._lock:
            self._state.requests.append(f"{method} {raw_path}")
            blob = self._serve_blob(method, parts.path, headers)
            if blob is not None:
                return blob
        try:
            self._gate(headers, query)
            route, params = match_route(method, re.sub(r"/{2,}", "/", parts.path))
            body: Any = None
            if raw_body.strip():
                try:
                    body = json.loads(raw_body)
                except ValueError as exc:
                    raise bad_body() from exc
            req = Req(method, params, query, body, headers, parts.path)
            with self._lock:
                self._authorize(method, parts.path)
                self._check_registered(method, parts.path)
                result = getattr(self, f"_{route.action}")(req)
            return result if isinstance(result, Reply) else Reply(200, result)
        except ArmApiError as exc:
            return Reply(exc.status, exc.body(), exc.headers)
        except Exception as exc:  # a fake bug: answer it loudly, in ARM's shape
            with self._lock:
                self.bugs.append(traceback.format_exc())
            return Reply(500, ArmApiError(500, "InternalServerError", f"arm fake: {exc!r}").body())

    def _gate(self, headers: dict[str, str], query: dict[str, str]) -> None:
        """Throttling, authentication and api-version checks, in ARM's order."""
        with self._lock:
            status = self._state.throttles.pop(0) if self._state.throttles else 0
        if status:
            code, message = THROTTLE[status]
            raise ArmApiError(status, code, message, headers={"Retry-After": "0"})
        if not headers.get("authorization", "").startswith("Bearer "):
            raise ArmApiError(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )
        version = query.get("api-version")
        if version is None:
            raise ArmApiError(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        if not API_VERSION_RE.fullmatch(version):
            raise ArmApiError(
                400,
                "InvalidApiVersionParameter",
                f"The api-version '{version}' is invalid. The supported versions are dates like "
                "'2024-11-01'.",
            )


def start_arm_fake() -> ArmFake:
    """A running, empty ARM fake on a free port of 127.0.0.1 (call `.stop()` when done)."""
    return ArmFake().start()


@pytest.fixture
def arm_fake() -> Iterator[ArmFake]:
    """A fresh ARM fake for one test, stopped afterwards; fails the test if the fake crashed."""
    fake = start_arm_fake()
    try:
        yield fake
    finally:
        fake.stop()
    assert not fake.bugs, "the ARM fake failed internally:\n" + "\n".join(fake.bugs)
