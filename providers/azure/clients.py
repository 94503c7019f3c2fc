"""Azure Resource Manager clients for cloudtrain: credential, subscription and endpoint.

Credentials come from `DefaultAzureCredential` (az login, AZURE_CLIENT_* variables, a managed
identity) only; none is ever in the spec, the ledger or the logs. The subscription is the
provider config's account (`providers.azure.subscription` or the top-level `subscription:` of
job.yaml, or config.yaml), else $AZURE_SUBSCRIPTION_ID (the Azure tools' own variable).

Test-only: `CLOUDTRAIN_ARM_ENDPOINT=https://host:port` (with `CLOUDTRAIN_ARM_CA=ca.pem` to trust
it) points every management client at another ARM endpoint with an offline static token: that is
how the offline tests reach the ARM fake. azure-core refuses bearer tokens over plain http, so the
endpoint must be https.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from cloudtrain.core import env
from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.azure.errors import azure_errors

ENDPOINT_ENV = env.ARM_ENDPOINT.name  # test-only: the ARM fake's endpoint
CA_ENV = env.ARM_CA.name  # test-only: the CA that signs the ARM fake's certificate
SUBSCRIPTION_ENV = "AZURE_SUBSCRIPTION_ID"
POOL_SIZE = 64  # connections kept open: the base class fans out up to 64 calls at once
SUBSCRIPTION_HINT = (
    "set providers.azure.subscription (or subscription:) in job.yaml, or AZURE_SUBSCRIPTION_ID"
    " (`az account show --query id`)"
)


class StaticToken:
    """An offline azure-core TokenCredential for an emulated endpoint (never a real token)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        """A token that never expires within a test."""
        from azure.core.credentials import AccessToken

        return AccessToken("cloudtrain-offline-token", int(time.time()) + 3600)


@dataclass(frozen=True)
class AzureAuth:
    """Resolved credential, subscription and endpoint for the management clients."""

    credential: Any
    subscription: str
    endpoint: str | None  # CLOUDTRAIN_ARM_ENDPOINT when set
    verify: str | None  # CLOUDTRAIN_ARM_CA when set


def resolve_auth(subscription: str | None) -> AzureAuth:
    """The credential (DefaultAzureCredential, or a static token with CLOUDTRAIN_ARM_ENDPOINT)
    and the subscription. Raises ProviderError without a subscription. Makes no call: the
    credential is asked for a token on the first request."""
    endpoint = env.ARM_ENDPOINT.text() or None
    subscription = subscription or os.environ.get(SUBSCRIPTION_ENV, "").strip() or None
    if not subscription:
        raise ProviderError("no Azure subscription for the azure provider", hint=SUBSCRIPTION_HINT)
    if endpoint is not None:
        credential: Any = StaticToken()
    else:
        from cloudtrain.providers.azure.storage import default_credential

        credential = default_credential()
    return AzureAuth(credential, subscription, endpoint, env.ARM_CA.raw() or None)


class ArmClients:
    """The management clients of one subscription, built on first use (thread-safe; the
    clients themselves are safe to share between threads)."""

    def __init__(self, auth: AzureAuth) -> None:
        self.auth = auth
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        self._shared: Any = None

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"transport": self._transport()}
        if self.auth.endpoint:
            kwargs["base_url"] = self.auth.endpoint
            kwargs["polling_interval"] = 0  # an emulator answers Retry-After: 0
            kwargs["retry_backoff_factor"] = 0.05
        if self.auth.verify:
            kwargs["connection_verify"] = self.auth.verify
        return kwargs

    def _transport(self) -> Any:
        """One HTTP transport for all clients, keeping POOL_SIZE connections open: azure-core's
        own session keeps 10, so a 64-node fan-out would redo a TLS handshake for most calls.
        Called under the lock."""
        if self._shared is None:
            import requests
            from azure.core.pipeline.transport import RequestsTransport
            from requests.adapters import HTTPAdapter
            from urllib3.util.retry import Retry

            session = requests.Session()
            no_retries = Retry(total=False, redirect=False, raise_on_status=False)  # azure-core's
            adapter = HTTPAdapter(
                pool_connections=4, pool_maxsize=POOL_SIZE, max_retries=no_retries
            )
            for prefix in ("https://", "http://"):
                session.mount(prefix, adapter)
            options = {"connection_verify": self.auth.verify} if self.auth.verify else {}
            self._shared = RequestsTransport(session=session, session_owner=False, **options)
        return self._shared

    def _get(self, name: str) -> Any:
        with self._lock:
            if name not in self._clients:
                self._clients[name] = self._build(name)
            return self._clients[name]

    def _build(self, name: str) -> Any:
        if name == "resource":
            from azure.mgmt.resource.resources import ResourceManagementClient as cls
        elif name == "network":
            from azure.mgmt.network import NetworkManagementClient as cls  # type: ignore[no-redef]
        elif name == "compute":
            from azure.mgmt.compute import ComputeManagementClient as cls  # type: ignore[no-redef]
        elif name == "authorization":
            from azure.mgmt.authorization import (  # type: ignore[no-redef]
                AuthorizationManagementClient as cls,
            )
        else:
            from azure.mgmt.storage import StorageManagementClient as cls  # type: ignore[no-redef]
        with azure_errors(f"open the Azure {name} management client"):
            return cls(self.auth.credential, self.auth.subscription, **self._kwargs())

    @property
    def resource(self) -> Any:
        """ResourceManagementClient (resource groups)."""
        return self._get("resource")

    @property
    def network(self) -> Any:
        """NetworkManagementClient."""
        return self._get("network")

    @property
    def compute(self) -> Any:
        """ComputeManagementClient."""
        return self._get("compute")

    @property
    def authorization(self) -> Any:
        """AuthorizationManagementClient."""
        return self._get("authorization")

    @property
    def storage(self) -> Any:
        """StorageManagementClient."""
        return self._get("storage")


def check_region(region: str | None) -> str:
    """The region, or ProviderError naming how to set one. Pure."""
    if not region:
        raise ProviderError("no Azure region", hint="set region: in job.yaml, or pass --region")
    return region
