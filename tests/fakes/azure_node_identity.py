"""A node VM's managed identity in the Azure box: its IMDS token route, the authorizing Blob
front, and the environment that sends the VM's azure-identity to them.

    with NodeIdentities(cloud) as ids:
        harness.metadata_url = ids.metadata.url
        Vm(..., env=ids.vm_env(vm_id, role))

On Azure a training node has no account key: its BlobStore (providers/azure/storage.py, no
connection string) takes DefaultAzureCredential, whose ManagedIdentityCredential asks the VM's
IMDS for a token of its system-assigned identity, and sends it to Blob storage, which enforces
the identity's role assignments and their ABAC conditions (providers/azure/identity.py). In the
box, `vm_env` gives a training node VM:

- no AZURE_STORAGE_CONNECTION_STRING (the box's full-rights account key);
- AZURE_POD_IDENTITY_AUTHORITY_HOST=<metadata url>/vm/<vm id>: azure-identity's (msal's) IMDS
  address when set, here the VM's own view of the box's metadata service, where
  `imds_token_route` answers tokens for the VM's identity (tests/fakes/azure_imds_identity.py);
- CLOUDTRAIN_AZURE_BLOB_ENDPOINT=<front url>: the store's account URL is the front's
  (`https://127.0.0.1:P/ACCOUNT`) instead of `https://ACCOUNT.blob.core.windows.net`;
- REQUESTS_CA_BUNDLE=<the front's CA>: azure-core's requests transport trusts it (the ARM
  clients pass their own CA file explicitly, so they are unaffected).

A managed run's controller VM keeps the box's credentials (`vm_env` gives it nothing): enforcing
the controller identity's rights is issue 30's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.fakes.azure_imds_identity import TOKEN_PATH, imds_token_route, token_book
from tests.fakes.blob_authorizer import BlobFront
from tests.fakes.metadata_server import MetadataServer

CONTROLLER_ROLE = "controller"  # providers/azure/compute.py: the run's controller VM
IMDS_HOST_ENV = "AZURE_POD_IDENTITY_AUTHORITY_HOST"
BLOB_ENDPOINT_ENV = "CLOUDTRAIN_AZURE_BLOB_ENDPOINT"
CA_BUNDLE_ENV = "REQUESTS_CA_BUNDLE"
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"


class NodeIdentities:
    """The box's metadata service (with the token route) and Blob front for one test. `cloud`
    is a tests.fakes.azure_cloud.AzureCloud. Start with `start()` (or `with`), always
    `close()`."""

    def __init__(self, cloud: Any) -> None:
        self.cloud = cloud
        self.book = token_book()
        self.metadata: MetadataServer | None = None
        self.front = BlobFront(cloud.azurite, cloud.arm, self.book)

    def start(self) -> NodeIdentities:
        """Serve the metadata service and the front. Ready on return."""
        self.metadata = MetadataServer()
        self.metadata.add_route(TOKEN_PATH, imds_token_route(self.cloud.arm, self.book))
        self.front.start()
        return self

    def close(self) -> None:
        """Stop both. Idempotent."""
        self.front.close()
        if self.metadata is not None:
            self.metadata.close()
            self.metadata = None

    def __enter__(self) -> NodeIdentities:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def imds(self, vm_id: str) -> str:
        """The VM's own view of the metadata service (what the harness hands it)."""
        assert self.metadata is not None, "start() first"
        return f"{self.metadata.url}/vm/{vm_id}"

    def vm_env(self, vm_id: str, role: str | None) -> Mapping[str, str | None]:
        """The environment changes of a VM of `role` (the module docstring)."""
        if role == CONTROLLER_ROLE:
            return {}  # keeps the box's credentials: enforcing them is issue 30's
        return {
            CONNECTION_STRING_ENV: None,
            IMDS_HOST_ENV: self.imds(vm_id),
            BLOB_ENDPOINT_ENV: self.front.url,
            CA_BUNDLE_ENV: self.front.ca_path,
        }
