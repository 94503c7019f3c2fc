"""AzureProvider: the Azure adapter's entry point (see the package docstring for its modules).

Building an AzureProvider reads no credentials: a node's agent builds one only to open its
store, where azure-storage-blob uses the VM's managed identity (or a connection string).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from cloudtrain.providers.base import Provider, ProviderConfig

if TYPE_CHECKING:
    from cloudtrain.providers.account import AccountProbe
    from cloudtrain.providers.azure.clients import ArmClients, AzureAuth
    from cloudtrain.providers.azure.compute import AzureCompute
    from cloudtrain.providers.azure.storage import BlobStore


class AzureProvider(Provider):
    """Azure in one subscription and region (the plan's). Thread-safe."""

    name = "azure"

    def __init__(self, config: ProviderConfig | None = None) -> None:
        super().__init__(config or ProviderConfig(name="azure"))
        self.region = self.config.region
        self._auth: AzureAuth | None = None
        self._clients: ArmClients | None = None
        self._compute: AzureCompute | None = None
        self._lock = threading.Lock()

    def auth(self) -> AzureAuth:
        """Credential and subscription, resolved on first use (ProviderError without one)."""
        with self._lock:
            if self._auth is None:
                from cloudtrain.providers.azure.clients import resolve_auth

                self._auth = resolve_auth(self.config.account)
            return self._auth

    def clients(self) -> ArmClients:
        """The subscription's management clients (built on first use)."""
        auth = self.auth()
        with self._lock:
            if self._clients is None:
                from cloudtrain.providers.azure.clients import ArmClients

                self._clients = ArmClients(auth)
            return self._clients

    def _region(self) -> str:
        from cloudtrain.providers.azure.clients import check_region

        return check_region(self.region)

    @property
    def compute(self) -> AzureCompute:
        """VMs, network and identities of this subscription and region (built on first use)."""
        clients, region = self.clients(), self._region()
        with self._lock:
            if self._compute is None:
                from cloudtrain.providers.azure.compute import AzureCompute

                self._compute = AzureCompute(clients, region, self.config.zone, self.config)
            return self._compute

    def store(self, uri: str) -> BlobStore:
        """A BlobStore for an az:// URI; on the controller, the default account is made by
        `ensure_bucket`. Creates nothing and reads no credentials."""
        from cloudtrain.providers.azure.account import ManagedBlobStore

        default = bool(self.region) and self._is_default(uri)
        return ManagedBlobStore(uri, self.clients, self.region or "", default)

    def _is_default(self, uri: str) -> bool:
        from cloudtrain.providers.azure.account import default_account

        account = uri.split("://", 1)[-1].split("/", 1)[0]
        return account == default_account(
            self.auth().subscription, self._region(), self.config.option("storage_account")
        )

    def default_store_uri(self, run_id: str) -> str:
        """The run's own container in the default account of the subscription and region."""
        from cloudtrain.providers.azure.account import default_account, run_container

        account = default_account(
            self.auth().subscription, self._region(), self.config.option("storage_account")
        )
        return f"az://{account}/{run_container(run_id)}"

    def owns_bucket(self, uri: str) -> bool:
        """Only containers of the default account are cloudtrain's."""
        return bool(self.region) and self._is_default(uri)

    def account(self) -> str | None:
        """The subscription (recorded in the ledger so `down` reaches the same one)."""
        return self.auth().subscription

    def account_probe(self, tpu: bool = False) -> AccountProbe:
        """The subscription's read-only probe (account_probe.py), through this provider's
        credential and clients; the region (if any) names the group whose permissions it asks.
        Azure sells no TPU, so `tpu` changes nothing. Builds no client and reads no
        credential until a method is called."""
        from cloudtrain.providers.azure.account_probe import AzureAccountProbe

        return AzureAccountProbe(self.auth, self.clients, self.region)
