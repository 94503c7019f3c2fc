"""The `providers.azure` section of job.yaml and config.yaml (controller side: imports pydantic).

Name rules (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules):
- resource group (Microsoft.Resources/resourcegroups): 1-90 characters, letters, digits,
  '_', '-', '.', '(' and ')', not ending with '.';
- storage account (Microsoft.Storage/storageAccounts): 3-24 lowercase letters and digits;
- subscription id: a GUID.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from cloudtrain.core import env
from cloudtrain.providers.options_base import SSH_CIDR_ENV, ProviderOptions, SshCidr

SUBSCRIPTION_RE = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
GROUP_RE = re.compile(r"^[-\w.()]{0,89}[-\w()]$")
STORAGE_ACCOUNT_RE = re.compile(r"^[a-z0-9]{3,24}$")


class AzureOptions(ProviderOptions):
    """Options of the azure provider. Credentials come from DefaultAzureCredential, never from
    here."""

    ENV_FALLBACKS: ClassVar[dict[str, str]] = {
        "resource_group": env.AZURE_RESOURCE_GROUP.name,
        "storage_account": env.AZURE_STORAGE_ACCOUNT.name,
        "ssh_cidr": SSH_CIDR_ENV,
    }

    subscription: str | None = Field(
        None,
        description="Azure subscription id (default: $AZURE_SUBSCRIPTION_ID); the spec's"
        " top-level `subscription:` is an alias",
    )
    resource_group: str | None = Field(
        None,
        description="an existing resource group every run uses (never deleted); default: a"
        " group per run, cloudtrain-<run id>, deleted at teardown",
    )
    storage_account: str | None = Field(
        None,
        description="the storage account of the default bucket (default: ct<hash of"
        " subscription and region>, made on first use)",
    )
    ssh_cidr: SshCidr = None

    @field_validator("subscription")
    @classmethod
    def _check_subscription(cls, value: str | None) -> str | None:
        if value is not None and not SUBSCRIPTION_RE.match(value):
            raise ValueError(f"must be an Azure subscription id, a GUID (got {value!r})")
        return value

    @field_validator("resource_group")
    @classmethod
    def _check_group(cls, value: str | None) -> str | None:
        if value is not None and not GROUP_RE.match(value):
            raise ValueError(
                "must be a resource group name: 1-90 letters, digits, '_', '-', '.', '(' or"
                f" ')', not ending with '.' (got {value!r})"
            )
        return value

    @field_validator("storage_account")
    @classmethod
    def _check_account(cls, value: str | None) -> str | None:
        if value is not None and not STORAGE_ACCOUNT_RE.match(value):
            raise ValueError(
                f"must be a storage account name: 3-24 lowercase letters and digits (got {value!r})"
            )
        return value
