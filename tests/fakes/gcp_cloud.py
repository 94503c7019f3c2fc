"""GCP offline for tests: the GCE fake and the GCS emulator, with the environment pointed at both.

    from tests.fakes.gcp_cloud import gcp_cloud  # noqa: F401  (and its dependencies)

The `gcp_cloud` fixture gives a fresh GCE fake and the session's (wiped) GCS emulator, and sets
CLOUDTRAIN_GCE_ENDPOINT and CLOUDTRAIN_IAM_ENDPOINT (cloudtrain's Compute Engine and IAM calls
then use the fake, which serves both, with anonymous credentials), STORAGE_EMULATOR_HOST and
GOOGLE_CLOUD_PROJECT for this process and its children (the CLI, and nodes booted by a boot
harness). The fake refuses instances naming a service account its IAM does not hold, as GCE
does. `cloud.account` scripts the account's quotas, sold-out zones, the caller's missing
permissions and disabled APIs (tests/fakes/gcp_account.py); the probe's Resource Manager and
Service Usage calls reach the fake through CLOUDTRAIN_IAM_ENDPOINT. It skips when an SDK or
the emulator is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.fakes.gce_fake import GceFake, start_gce_fake
from tests.fakes.gcp_account import GcpAccount
from tests.fakes.gcs_emulator import (
    TEST_PROJECT,
    GcsEmulator,
    gcs_emulator,
    gcs_emulator_session,
)

__all__ = [
    "ENDPOINT_ENV",
    "IAM_ENDPOINT_ENV",
    "GcpCloud",
    "gcp_available",
    "gcp_cloud",
    "gcp_cloud_on",
    "gcs_emulator",
    "gcs_emulator_session",
]
ENDPOINT_ENV = "CLOUDTRAIN_GCE_ENDPOINT"
IAM_ENDPOINT_ENV = "CLOUDTRAIN_IAM_ENDPOINT"


@dataclass
class GcpCloud:
    """The offline GCP of one test."""

    gce: GceFake
    gcs: GcsEmulator
    project: str = TEST_PROJECT

    @property
    def account(self) -> GcpAccount:
        """The project's quotas, zone capacity, the caller's rights and APIs
        (tests/fakes/gcp_account.py): as stingy as a test makes it."""
        return GcpAccount(self.gce)


def gcp_available() -> bool:
    """Whether google-cloud-compute is importable (the emulator fixture checks the rest)."""
    return importlib.util.find_spec("google.cloud.compute_v1") is not None


@contextlib.contextmanager
def gcp_cloud_on(emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcpCloud]:
    """A fresh GCE fake beside `emulator` (this process's GCS environment already pointed at
    it), with the environment pointed at the fake; stopped on exit. Skips without
    google-cloud-compute."""
    if not gcp_available():
        pytest.skip("google-cloud-compute is not installed: pip install 'cloudtrain[gcp]'")
    fake = start_gce_fake()
    fake.require_known_service_accounts = True
    monkeypatch.setenv(ENDPOINT_ENV, fake.url)
    monkeypatch.setenv(IAM_ENDPOINT_ENV, fake.url)
    monkeypatch.delenv("CLOUDTRAIN_GCP_SERVICE_ACCOUNT", raising=False)
    try:
        yield GcpCloud(fake, emulator)
    finally:
        fake.stop()


@pytest.fixture
def gcp_cloud(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcpCloud]:
    """A fresh GCE fake plus the wiped GCS emulator, with the environment pointed at both."""
    with gcp_cloud_on(gcs_emulator, monkeypatch) as cloud:
        yield cloud
