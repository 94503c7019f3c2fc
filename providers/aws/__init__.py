"""The AWS provider: EC2 GPU nodes, a per-run security group, an IAM role per node, and S3.

Credentials come from boto3's standard chain only; none is ever in the spec, the ledger or the
logs. The region comes from the spec, else from the profile/environment.

This file holds only `INFO`, what the registry reads; it imports no SDK, so `cloudtrain --help`
and the node agent may read it. The modules, named as in every cloud package
(providers/README.md): `provider` (AwsProvider), `clients` (boto3 sessions and clients),
`errors` (botocore -> cloudtrain errors), `bodies` (EC2 request bodies), `compute`
(AwsCompute), `network` (the run's security group), `identity` (the nodes' IAM roles),
`node_policy` (a node role's S3 policy), `storage` (S3Store), `images` (AMIs), `zones`,
`preemption` (the node-side probe, stdlib only), `pricing` (the price list), `catalog_rules`
(the catalog's supplement rows), `options` (its settings).
"""

from __future__ import annotations

from cloudtrain.providers.info import ProviderInfo

INFO = ProviderInfo(
    name="aws",
    display="AWS",
    scheme="s3",
    adapter="cloudtrain.providers.aws.provider:AwsProvider",
    extra="aws",
    sdk_module="boto3",
    account_field=None,
    options="cloudtrain.providers.aws.options:AwsOptions",
    # S3 Standard, first 50 TB, us-east-1 (https://aws.amazon.com/s3/pricing/)
    storage_usd_per_gb_month=0.023,
    preemption="cloudtrain.providers.aws.preemption:Ec2Probe",
    pricing="cloudtrain.providers.aws.pricing:fetch",
    node_image="cloudtrain.providers.aws.images:node_image",
    inventory_scope="region",
    searched_by_cheapest=True,
    catalog_rules="cloudtrain.providers.aws.catalog_rules",
    # boto3's chain before instance metadata: the environment, web identity, the container
    # endpoint, the shared files (https://boto3.amazonaws.com/v1/documentation/api/latest/guide/
    # credentials.html, "Configuring credentials")
    credential_env=(
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ),
    credential_files=(".aws/credentials", ".aws/config"),
)
