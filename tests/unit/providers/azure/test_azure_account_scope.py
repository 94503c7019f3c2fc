"""The container scope a node is granted names the storage account where it is
(providers/azure/account.py `container_scope`): a configured `storage_account` is one account,
made in the shared group of the first region that needed it, and a run in another region (a
failover's) must be granted there, or the store refuses its nodes."""

from __future__ import annotations

from cloudtrain.providers.azure.account import container_scope
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.azure.storage import BlobStore
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azure_config, azurite, azurite_session

__all__ = ["azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
URI = "az://devstoreaccount1/ct-scope-run"  # the box's configured account (azure_cloud)


def test_a_configured_account_is_granted_where_it_was_made(azure_cloud: AzureCloud) -> None:
    made_in = AzureProvider(azure_config("eastus"))
    made_in.store(URI).ensure_bucket()
    (account,) = azure_cloud.arm.resources(kind="storageAccounts")
    elsewhere = AzureProvider(azure_config("westus2"))
    configured = elsewhere.config.option("storage_account")
    scope = container_scope(elsewhere.clients(), BlobStore(URI), "westus2", configured)
    assert scope == f"{account['id']}/blobServices/default/containers/ct-scope-run"
    assert "/resourceGroups/cloudtrain-eastus/" in scope


def test_a_default_account_not_made_yet_is_where_it_will_be(azure_cloud: AzureCloud) -> None:
    provider = AzureProvider(azure_config("westus2"))
    configured = provider.config.option("storage_account")
    scope = container_scope(provider.clients(), BlobStore(URI), "westus2", configured)
    assert "/resourceGroups/cloudtrain-westus2/providers/Microsoft.Storage/" in scope
