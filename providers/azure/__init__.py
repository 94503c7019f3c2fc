"""The Azure provider, in progress: `storage` (BlobStore, `az://ACCOUNT/CONTAINER[/prefix]` on
Azure Blob Storage) and `errors` (azure-core exceptions -> cloudtrain errors) exist; the
`AzureProvider` class and the compute side (resource group, network, NSG, VMs, the storage
account) do not yet. Until this package defines `AzureProvider`, the provider registry keeps
reporting azure as "not available in this version of cloudtrain".
"""
