"""Azure offline for tests: the ARM fake and Azurite, with the environment pointed at both.

    from tests.fakes.azure_cloud import azure_cloud  # noqa: F401  (and its dependencies)

The `azure_cloud` fixture gives a fresh ARM fake (tests/fakes/arm_fake.py, HTTPS with its own CA)
and the session's (wiped) Azurite, and sets for this process and its children (the CLI, and nodes
booted by a boot harness):

- CLOUDTRAIN_ARM_ENDPOINT and CLOUDTRAIN_ARM_CA: cloudtrain's azure-mgmt clients use the fake as
  their `base_url`, trusting its CA, with an offline static-token credential;
- AZURE_SUBSCRIPTION_ID: the fake's test subscription (arm_testkit.SUB);
- AZURE_STORAGE_CONNECTION_STRING (set by the `azurite` fixture) and
  CLOUDTRAIN_AZURE_STORAGE_ACCOUNT=devstoreaccount1: the blobs live in Azurite's account, which
  the adapter also creates as a storage account in the fake (the Azure box's training node VMs
  drop the connection string and use their managed identity instead:
  tests/fakes/azure_node_identity.py). The variable reaches only the CLI children, through
  cloudtrain/jobspec/provider_config.py (the adapter reads the `storage_account` option alone); a
  test that builds a provider itself passes the option (`azure_config`);
- CLOUDTRAIN_AZURE_IMDS: a closed loopback port, so a node's Instance Metadata Service calls
  (its own identity, self-delete) fail at once and it falls back to `shutdown -h now`.

It skips when an azure-mgmt SDK, trustme (the fake's CA) or Azurite is missing, stops the fake
afterwards and fails the test if the fake itself crashed on a request.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cloudtrain.providers.base import ProviderConfig
from tests.fakes.arm_fake import ArmFake, start_arm_fake
from tests.fakes.arm_testkit import SUB
from tests.fakes.azurite import ACCOUNT, Azurite, azurite, azurite_session

__all__ = [
    "AzureCloud",
    "azure_cloud",
    "azure_config",
    "azure_missing",
    "azurite",
    "azurite_session",
]
ENDPOINT_ENV = "CLOUDTRAIN_ARM_ENDPOINT"
CA_ENV = "CLOUDTRAIN_ARM_CA"
SUBSCRIPTION_ENV = "AZURE_SUBSCRIPTION_ID"
ACCOUNT_ENV = "CLOUDTRAIN_AZURE_STORAGE_ACCOUNT"
IMDS_ENV = "CLOUDTRAIN_AZURE_IMDS"
CLOSED_IMDS = "http://127.0.0.1:9"  # the discard port: nothing listens, calls fail at once
ENV_NAMES = (ENDPOINT_ENV, CA_ENV, SUBSCRIPTION_ENV, ACCOUNT_ENV, IMDS_ENV)
SDK_MODULES = (
    "azure.mgmt.compute",
    "azure.mgmt.network",
    "azure.mgmt.resource",
    "azure.mgmt.authorization",
    "azure.mgmt.storage",
    "trustme",
)


@dataclass
class AzureCloud:
    """The offline Azure of one test."""

    arm: ArmFake
    azurite: Azurite
    subscription: str = SUB
    account: str = ACCOUNT


def azure_config(region: str, **options: Any) -> ProviderConfig:
    """The ProviderConfig of an Azure provider a test builds itself: its storage account is
    Azurite's (the option the CLI gets from ACCOUNT_ENV), `options` add to or replace it."""
    return ProviderConfig(
        name="azure", region=region, options={"storage_account": ACCOUNT, **options}
    )


def azure_missing() -> str | None:
    """Why the ARM side cannot run here (a skip reason), or None (the Azurite fixture checks
    the rest)."""
    missing = [m for m in SDK_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        return f"{', '.join(missing)} not installed: pip install 'cloudtrain[azure]' trustme"
    return None


@pytest.fixture
def azure_cloud(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureCloud]:
    """A fresh ARM fake plus the wiped Azurite, with the environment pointed at both."""
    reason = azure_missing()
    if reason:
        pytest.skip(reason)
    fake = start_arm_fake()
    monkeypatch.setenv(ENDPOINT_ENV, fake.url)
    monkeypatch.setenv(CA_ENV, fake.ca_path)
    monkeypatch.setenv(SUBSCRIPTION_ENV, SUB)
    monkeypatch.setenv(ACCOUNT_ENV, ACCOUNT)
    monkeypatch.setenv(IMDS_ENV, CLOSED_IMDS)
    try:
        yield AzureCloud(fake, azurite)
    finally:
        fake.stop()
    assert not fake.bugs, "the ARM fake failed internally:\n" + "\n".join(fake.bugs)
