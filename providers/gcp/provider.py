"""GcpProvider: the GCP adapter's entry point (see the package docstring for its modules).

Building a GcpProvider reads no credentials: a node's agent builds one only to open its store,
where google-cloud-storage finds the VM's service account (its node's own, or
the `service_account` option); on an emulator (STORAGE_EMULATOR_HOST) the environment's
credentials, if any (storage.environment_credentials).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import Provider, ProviderConfig

if TYPE_CHECKING:
    from cloudtrain.providers.account import AccountProbe
    from cloudtrain.providers.gcp.clients import GcpAuth
    from cloudtrain.providers.gcp.compute import GcpCompute
    from cloudtrain.providers.gcp.storage import GcsStore

DEFAULT_BUCKET = "cloudtrain-{project}-{region}"
# a service account that signs the nodes' URLs (user ADC); deprecated: the option
# providers.gcp.signer, read only when the option is unset


class GcpProvider(Provider):
    """GCP in one project and region (the plan's). Thread-safe."""

    name = "gcp"

    def __init__(self, config: ProviderConfig | None = None) -> None:
        super().__init__(config or ProviderConfig(name="gcp"))
        self.region = self.config.region
        self._auth: GcpAuth | None = None
        self._compute: GcpCompute | None = None
        self._lock = threading.Lock()

    def auth(self) -> GcpAuth:
        """Credentials and project, resolved on first use (CredentialsError / ProviderError)."""
        with self._lock:
            if self._auth is None:
                from cloudtrain.providers.gcp.clients import resolve_auth

                self._auth = resolve_auth(self.config.account)
            return self._auth

    @property
    def project(self) -> str:
        """The project every resource is made in."""
        return self.auth().project

    def _region(self) -> str:
        if not self.region:
            raise ProviderError("no GCP region", hint="set region: in job.yaml, or pass --region")
        return self.region

    @property
    def compute(self) -> GcpCompute:
        """Compute Engine for this project and region (built on first use)."""
        auth, region = self.auth(), self._region()
        with self._lock:
            if self._compute is None:
                from cloudtrain.providers.gcp.compute import GcpCompute

                self._compute = GcpCompute(auth, region, self.config.zone, self.config)
            return self._compute

    def store(self, uri: str) -> GcsStore:
        """A GcsStore for a gs:// URI, in the region (if known). Creates nothing and reads no
        credentials."""
        from cloudtrain.providers.gcp.storage import GcsStore

        project = self.config.account or (self._auth.project if self._auth else None)
        return GcsStore(
            uri,
            project,
            location=self.region,
            signer_email=self.config.option("signer") or None,
            node_identity_fallback=True,  # nodes fetch with their own service account
        )

    def default_store_uri(self, run_id: str) -> str:
        """One bucket per project and region, owned by cloudtrain."""
        return "gs://" + DEFAULT_BUCKET.format(project=self.project, region=self._region())

    def owns_bucket(self, uri: str) -> bool:
        """Only the default bucket is cloudtrain's; a user-given gs:// URI is never deleted."""
        return uri.rstrip("/") == self.default_store_uri("").rstrip("/")

    def account(self) -> str | None:
        """The project (recorded in the ledger so `down` reaches the same one)."""
        return self.project

    def account_probe(self, tpu: bool = False) -> AccountProbe:
        """The read-only probe of the project (providers/gcp/account.py): ADC's link, the
        enabled APIs, the run's missing permissions (a TPU run's too: `tpu`), the
        region's GPU and vCPU quotas. Builds no client and reads no credentials until asked."""
        from cloudtrain.providers.gcp.account import GcpAccountProbe

        return GcpAccountProbe(self.config.account, tpu=tpu)
