"""The GCP provider: Compute Engine GPU nodes, a per-run firewall rule and service account, and a
GCS bucket.

Credentials come from Application Default Credentials only (`google.auth.default()`); none is
ever in the spec, the ledger or the logs. The project comes from the spec (`project:`), else the
environment (GOOGLE_CLOUD_PROJECT), else ADC; the region from the plan.

This file holds only `INFO`, what the registry reads; it imports no SDK, so `cloudtrain --help`
and the node agent may read it. The modules, named as in every cloud package
(providers/README.md): `provider` (GcpProvider), `clients` (credentials, endpoint, operation
waits), `errors` (SDK exceptions -> cloudtrain errors), `bodies` (insert bodies), `network` (the
run's firewall rules), `identity` (one service account per node, reading the run's prefix),
`node_bindings` (what each node's account may write: its own keys only), `compute`
(GcpCompute), `storage` (GcsStore), `images`, `preemption` (the node-side probe), `pricing`
(the price list), `catalog_rules` (which machine types carry GPUs).
"""

from __future__ import annotations

from cloudtrain.core import env
from cloudtrain.providers.info import ProviderInfo

INFO = ProviderInfo(
    name="gcp",
    display="GCP",
    scheme="gs",
    adapter="cloudtrain.providers.gcp.provider:GcpProvider",
    extra="gcp",
    sdk_module="google.cloud.compute_v1",
    account_field="project",
    options="cloudtrain.providers.gcp.options:GcpOptions",
    # Cloud Storage Standard, regional (https://cloud.google.com/storage/pricing)
    storage_usd_per_gb_month=0.020,
    preemption="cloudtrain.providers.gcp.preemption:GceProbe",
    pricing="cloudtrain.providers.gcp.pricing:fetch",
    node_image="cloudtrain.providers.gcp.images:node_image",
    inventory_scope="account",  # firewall rules and service accounts are global to the project
    searched_by_cheapest=True,
    catalog_rules="cloudtrain.providers.gcp.catalog_rules",
    tpu_types="cloudtrain.providers.gcp.tpu_types",  # Cloud TPU VMs (strategy tpu)
    # google.auth.default() before the metadata server: $GOOGLE_APPLICATION_CREDENTIALS, then
    # gcloud's ADC file (https://cloud.google.com/docs/authentication/application-default-
    # credentials); CLOUDTRAIN_GCE_ENDPOINT is the test box's account
    credential_env=("GOOGLE_APPLICATION_CREDENTIALS", env.GCE_ENDPOINT.name),
    credential_files=(".config/gcloud/application_default_credentials.json",),
)
