"""AwsProvider: the AWS adapter's entry point (see the package docstring for its modules)."""

from __future__ import annotations

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.aws.clients import account_id, session
from cloudtrain.providers.base import Provider, ProviderConfig

DEFAULT_BUCKET = "cloudtrain-{account}-{region}"


class AwsProvider(Provider):
    """AWS in one region (the spec's, else the SDK's default)."""

    name = "aws"

    def __init__(self, config: ProviderConfig | None = None) -> None:
        super().__init__(config or ProviderConfig(name="aws"))
        self.region = self.config.region or session(None).region_name
        if not self.region:
            raise ProviderError("no AWS region", hint="set region: in job.yaml or AWS_REGION")
        self._compute = None

    @property
    def compute(self):  # type: ignore[no-untyped-def]
        """EC2 + IAM for this region (built on first use)."""
        if self._compute is None:
            from cloudtrain.providers.aws.compute import AwsCompute

            self._compute = AwsCompute(self.region, self.config)  # type: ignore[assignment]
        return self._compute

    def store(self, uri: str):  # type: ignore[no-untyped-def]
        """An S3Store for an s3:// URI. Creates nothing."""
        from cloudtrain.providers.aws.storage import S3Store

        return S3Store(uri, self.region)

    def default_store_uri(self, run_id: str) -> str:
        """One bucket per account and region, owned by cloudtrain."""
        return "s3://" + DEFAULT_BUCKET.format(account=account_id(self.region), region=self.region)

    def account_probe(self, tpu: bool = False):  # type: ignore[no-untyped-def]
        """The read-only probe of the caller's account in this region
        (providers/aws/account.py); AWS sells no TPU, so `tpu` changes nothing. Creates
        nothing; clients are made on first use."""
        from cloudtrain.providers.aws.account import AwsAccountProbe

        return AwsAccountProbe(self.region)

    def owns_bucket(self, uri: str) -> bool:
        """Only the default bucket is cloudtrain's; a user-given s3:// URI is never deleted."""
        return uri.rstrip("/") == self.default_store_uri("").rstrip("/")
