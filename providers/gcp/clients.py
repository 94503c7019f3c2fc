"""Compute Engine clients for cloudtrain: credentials, project, endpoint, and operation waits.

Credentials come from `google.auth.default()` (Application Default Credentials) only; none is
ever in the spec, the ledger or the logs. The project is the spec's `project:`, else
$GOOGLE_CLOUD_PROJECT (or $CLOUDSDK_CORE_PROJECT), else the ADC project.

`CLOUDTRAIN_GCE_ENDPOINT=http://host:port` points every Compute Engine client at another
endpoint with anonymous credentials, as STORAGE_EMULATOR_HOST does for google-cloud-storage:
that is how the offline tests reach the GCE fake.

Never call `.result()` or `.done()` on the ExtendedOperation an insert or delete returns: it
polls through an internal client built without our endpoint. `wait_zone_operation` and
`wait_global_operation` loop over the public `wait` methods instead.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from cloudtrain.core import env
from cloudtrain.core.errors import ProviderError, TransientError
from cloudtrain.providers.gcp.errors import gcp_errors, operation_error

ENDPOINT_ENV = env.GCE_ENDPOINT.name
PROJECT_ENVS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT")
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
OPERATION_TIMEOUT_S = 900.0  # GPU VM inserts can take minutes; deletes too
POOL_SIZE = 64  # connections per client: the base class fans out up to 64 calls at once
QUICK_POLL_S = 0.1  # a wait that answered at once without DONE is polled again this soon
PROJECT_HINT = (
    "set project: in job.yaml, GOOGLE_CLOUD_PROJECT, or `gcloud config set project PROJECT`"
)


@dataclass(frozen=True)
class GcpAuth:
    """Resolved credentials, project and endpoint for Compute Engine clients."""

    credentials: Any
    project: str
    endpoint: str | None  # CLOUDTRAIN_GCE_ENDPOINT when set


def env_project() -> str | None:
    """The project the environment names, if any. Pure apart from the environment."""
    for name in PROJECT_ENVS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def resolve_auth(project: str | None) -> GcpAuth:
    """Credentials (ADC, or anonymous with CLOUDTRAIN_GCE_ENDPOINT) and the project: `project`,
    else the environment's, else the ADC one. Raises CredentialsError without usable ADC and
    ProviderError without any project. Blocks only while ADC is looked up."""
    endpoint = env.GCE_ENDPOINT.text() or None
    project = project or env_project()
    if endpoint is not None:
        from google.auth.credentials import AnonymousCredentials

        credentials: Any = AnonymousCredentials()
    else:
        import google.auth

        with gcp_errors("find Google Cloud credentials"):
            credentials, adc_project = google.auth.default(scopes=list(SCOPES))
        project = project or adc_project
    if not project:
        raise ProviderError("no Google Cloud project for the gcp provider", hint=PROJECT_HINT)
    return GcpAuth(credentials, project, endpoint)


class ComputeClients:
    """The Compute Engine REST clients one adapter uses, built on first use (thread-safe:
    building clients is locked, using them is safe from many threads)."""

    def __init__(self, auth: GcpAuth) -> None:
        self.auth = auth
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"credentials": self.auth.credentials, "transport": "rest"}
        if self.auth.endpoint:
            from google.api_core.client_options import ClientOptions

            kwargs["client_options"] = ClientOptions(api_endpoint=self.auth.endpoint)
        return kwargs

    def _get(self, name: str) -> Any:
        with self._lock:
            if name not in self._clients:
                from google.cloud import compute_v1

                with gcp_errors("open a Compute Engine client"):
                    client = getattr(compute_v1, name)(**self._kwargs())
                _widen_pool(client)
                self._clients[name] = client
            return self._clients[name]

    @property
    def instances(self) -> Any:
        """compute_v1.InstancesClient."""
        return self._get("InstancesClient")

    @property
    def firewalls(self) -> Any:
        """compute_v1.FirewallsClient."""
        return self._get("FirewallsClient")

    @property
    def regions(self) -> Any:
        """compute_v1.RegionsClient."""
        return self._get("RegionsClient")

    @property
    def zone_operations(self) -> Any:
        """compute_v1.ZoneOperationsClient."""
        return self._get("ZoneOperationsClient")

    @property
    def global_operations(self) -> Any:
        """compute_v1.GlobalOperationsClient."""
        return self._get("GlobalOperationsClient")


def _widen_pool(client: Any) -> None:
    """Let one client keep POOL_SIZE connections open: its REST session's default of 10 would
    make a 64-node fan-out reconnect for most calls. Best effort: the session is the
    transport's private attribute, so a client without one is left as it is."""
    session = getattr(getattr(client, "_transport", None), "_session", None)
    if session is None or not hasattr(session, "mount"):
        return
    from requests.adapters import HTTPAdapter

    for prefix in ("https://", "http://"):
        session.mount(prefix, HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE))


def _done(op: Any) -> bool:
    from google.cloud import compute_v1

    return bool(op.status == compute_v1.Operation.Status.DONE)


def _wait(poll: Any, what: str, zone: str | None, timeout_s: float) -> Any:
    """Call `poll()` (an operation `wait`) until the operation is DONE; raise what it reports."""
    deadline = time.monotonic() + timeout_s
    while True:
        started = time.monotonic()
        with gcp_errors(f"wait for: {what}", zone=zone):
            op = poll()
        if _done(op):
            break
        if time.monotonic() >= deadline:
            raise TransientError(f"{what}: not done after {timeout_s:.0f}s (operation {op.name})")
        if time.monotonic() - started < QUICK_POLL_S:
            time.sleep(QUICK_POLL_S)
    error = operation_error(what, op, zone)
    if error is not None:
        raise error
    return op


def wait_zone_operation(
    clients: ComputeClients,
    zone: str,
    operation: str,
    what: str,
    timeout_s: float = OPERATION_TIMEOUT_S,
) -> Any:
    """Block until the zonal operation is DONE; raise the cloudtrain error it finished with
    (NoCapacityError for ZONE_RESOURCE_POOL_EXHAUSTED, QuotaError, ...). Returns it."""
    project = clients.auth.project
    return _wait(
        lambda: clients.zone_operations.wait(project=project, zone=zone, operation=operation),
        what,
        zone,
        timeout_s,
    )


def wait_global_operation(
    clients: ComputeClients, operation: str, what: str, timeout_s: float = OPERATION_TIMEOUT_S
) -> Any:
    """Block until the global operation is DONE; raise the error it finished with."""
    project = clients.auth.project
    return _wait(
        lambda: clients.global_operations.wait(project=project, operation=operation),
        what,
        None,
        timeout_s,
    )


def operation_name(extended: Any) -> str:
    """The operation name behind what insert()/delete() returned (an ExtendedOperation)."""
    return str(extended.name)
