"""The `providers.aws` section of job.yaml and config.yaml (controller side: imports pydantic)."""

from __future__ import annotations

from typing import ClassVar

from cloudtrain.providers.options_base import SSH_CIDR_ENV, ProviderOptions, SshCidr


class AwsOptions(ProviderOptions):
    """Options of the aws provider. The region is the spec's (or the plan's); credentials come
    from boto3's own chain, never from here."""

    ENV_FALLBACKS: ClassVar[dict[str, str]] = {"ssh_cidr": SSH_CIDR_ENV}

    ssh_cidr: SshCidr = None
