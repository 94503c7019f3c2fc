"""The Azure provider: GPU VMs in one resource group per run, and a Blob container per run.

Credentials come from DefaultAzureCredential only; none is ever in the spec, the ledger or the
logs. The subscription comes from the spec (`subscription:`), else AZURE_SUBSCRIPTION_ID; the
region from the plan.

This file holds only `INFO`, what the registry reads; it imports no SDK, so `cloudtrain --help`
and the node agent may read it. The modules, named as in every cloud package
(providers/README.md): `provider` (AzureProvider), `clients` (credential, endpoint, management
clients), `errors` (SDK exceptions -> cloudtrain errors), `bodies` (ARM request bodies),
`account` (the default storage account), `network`, `identity` (the role assignments of a node's
managed identity), `compute` (AzureCompute), `storage` (BlobStore), `images`, `startup`,
`preemption` (the node-side probe, stdlib only), `pricing` (the price list).
"""

from __future__ import annotations

from cloudtrain.core import env
from cloudtrain.providers.info import ProviderInfo

INFO = ProviderInfo(
    name="azure",
    display="Azure",
    scheme="az",
    adapter="cloudtrain.providers.azure.provider:AzureProvider",
    extra="azure",
    sdk_module="azure.mgmt.compute",
    account_field="subscription",
    options="cloudtrain.providers.azure.options:AzureOptions",
    # Blob Storage, Hot tier, LRS, first 50 TB (https://azure.microsoft.com/pricing/details/storage/blobs/)
    storage_usd_per_gb_month=0.018,
    preemption="cloudtrain.providers.azure.preemption:ScheduledEventsProbe",
    pricing="cloudtrain.providers.azure.pricing:fetch",
    node_image="cloudtrain.providers.azure.images:node_image",
    inventory_scope="region",
    searched_by_cheapest=True,
    catalog_zones=False,  # the Retail Prices API prices a size per region, not per zone
    catalog_rules="cloudtrain.providers.azure.catalog_rules",
    # DefaultAzureCredential before managed identity: EnvironmentCredential and workload
    # identity ($AZURE_CLIENT_ID, $AZURE_FEDERATED_TOKEN_FILE), then the Azure CLI's login
    # (https://learn.microsoft.com/python/api/azure-identity/azure.identity.defaultazurecredential);
    # CLOUDTRAIN_ARM_ENDPOINT is the test box's account
    credential_env=("AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE", env.ARM_ENDPOINT.name),
    credential_files=(".azure/azureProfile.json",),
)
