"""The storage account behind cloudtrain's default Azure bucket, and the scope of a container.

The default bucket of a subscription and region is account `ct<hash>` (or the `storage_account`
option, which its deprecated variable still sets through provider_config) in resource group
`cloudtrain-<region>`, which outlives every run (checkpoints and models are kept after
teardown); each run gets its own container `ct-<run_id>`, so a node's identity can be given that
container and nothing else. The account is HTTPS only, TLS 1.2, with no public blob access. A
storage account the user names (`checkpoint: az://...`) is only looked up, never created or
changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import NotFound
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors
from cloudtrain.providers.azure.storage import BlobStore

SHARED_TAG = "cloudtrain-shared"


def default_account(subscription: str, region: str, configured: str | None = None) -> str:
    """The default storage account name of a subscription and region (3-24 of a-z0-9):
    `configured` (the `storage_account` option, which the deprecated variable still sets
    through provider_config), else `ct<hash>`. Pure."""
    override = (configured or "").strip()
    if override:
        return override
    digest = hashlib.sha256(f"{subscription}/{region}".encode()).hexdigest()
    return f"ct{digest[:20]}"


def shared_group(region: str) -> str:
    """The resource group that holds the default storage account of a region."""
    return f"cloudtrain-{region}"


def run_container(run_id: str) -> str:
    """The run's own container in the default account (3-63 of a-z0-9 and single '-')."""
    return f"ct-{run_id}"[:63].rstrip("-")


def ensure_account(clients: ArmClients, account: str, region: str) -> str:
    """Create the shared group and the account if missing (HTTPS only, TLS 1.2, no public blob
    access); return the account's resource id. Idempotent; blocks until the account exists."""
    from cloudtrain.providers.azure.bodies import storage_account_body

    group = shared_group(region)
    tags = {SHARED_TAG: "true"}
    with azure_errors(f"create resource group {group} in {region}"):
        clients.resource.resource_groups.create_or_update(group, {"location": region, "tags": tags})
    found = find_account(clients, account)
    if found is not None:
        return found
    with azure_errors(f"create storage account {account} in {group}"):
        poller = clients.storage.storage_accounts.begin_create(
            group, account, storage_account_body(region, tags)
        )
        return str(poller.result().id)


def find_account(clients: ArmClients, account: str) -> str | None:
    """The resource id of storage account `account` in the subscription, or None. Blocks."""
    with azure_errors(f"look up storage account {account}"):
        for item in clients.storage.storage_accounts.list():
            if str(item.name).lower() == account.lower():
                return str(item.id)
    return None


def default_container_scope(
    subscription: str, region: str, container: str, configured: str | None = None
) -> str:
    """The ARM scope of a container in the default account of a region (`configured`: the
    `storage_account` option). Pure."""
    from cloudtrain.providers.azure.bodies import container_scope as scope

    return scope(
        subscription,
        shared_group(region),
        default_account(subscription, region, configured),
        container,
    )


def container_scope(
    clients: ArmClients, store: BlobStore, region: str, configured: str | None = None
) -> str:
    """The ARM scope of the store's container (for a role assignment): where the account is.
    The default account is looked up too: a configured name (`storage_account`) is one account
    for every region, made in the shared group of the first region that needed it, so a run in
    (or failed over to) another region must not assume its own region's group; a default
    account not made yet is where it will be. Raises NotFound when the subscription has no such
    user's storage account. Blocks. `configured`: the `storage_account` option."""
    subscription = clients.auth.subscription
    found = find_account(clients, store.account)
    if found is None and store.account == default_account(subscription, region, configured):
        return default_container_scope(subscription, region, store.container, configured)
    if found is None:
        raise NotFound(
            f"storage account {store.account} is not in subscription {subscription}",
            hint="nodes get access to the run's container only in their own subscription",
        )
    return f"{found}/blobServices/default/containers/{store.container}"


class ManagedBlobStore(BlobStore):
    """A BlobStore whose `ensure_bucket` first makes the default storage account (a user's
    account must exist). `clients` is called for the ArmClients only then."""

    def __init__(
        self, uri: str, clients: Callable[[], ArmClients], region: str, default: bool, **kw: Any
    ) -> None:
        super().__init__(uri, **kw)
        self._arm, self._region, self._default = clients, region, default

    def ensure_bucket(self) -> Any:
        """The account (default bucket only), then the private container. Idempotent."""
        if self._default:
            ensure_account(self._arm(), self.account, self._region)
            crash_point("bucket")  # the account exists, the run's container not yet
        return super().ensure_bucket()
