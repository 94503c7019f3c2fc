"""Which link of Application Default Credentials GCP's probe names (never the secret), and that
building the probe loads no Google SDK.

Real google-auth reads real files: an impersonation file in GOOGLE_APPLICATION_CREDENTIALS,
gcloud's application-default credentials file under CLOUDSDK_CONFIG, and nothing at all (the
metadata server is skipped with NO_GCE_CHECK, as google-auth documents).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.core.errors import CredentialsError
from cloudtrain.providers.gcp.account import GcpAccountProbe

PROJECT = "ct-creds-project"
EMAIL = f"launcher@{PROJECT}.iam.gserviceaccount.com"
SECRET = "refresh-token-never-shown"


@pytest.fixture(autouse=True)
def no_box(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for env in (
        "CLOUDTRAIN_GCE_ENDPOINT",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "CLOUDSDK_CORE_PROJECT",
        "GCLOUD_PROJECT",
    ):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")


def _impersonation_file(path: Path) -> None:
    """What `gcloud auth application-default login --impersonate-service-account EMAIL` writes:
    a user's refresh token that acts as the service account."""
    info = {
        "type": "impersonated_service_account",
        "service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/"
        f"projects/-/serviceAccounts/{EMAIL}:generateAccessToken",
        "delegates": [],
        "source_credentials": {
            "type": "authorized_user",
            "client_id": "id.apps.googleusercontent.com",
            "client_secret": "not-shown",
            "refresh_token": SECRET,
        },
    }
    path.write_text(json.dumps(info))


def test_a_file_in_google_application_credentials_names_the_file_and_the_account(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "impersonating.json"
    _impersonation_file(path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    source = GcpAccountProbe().credentials()
    assert source.source == f"GOOGLE_APPLICATION_CREDENTIALS file {path}"
    assert (source.principal, source.account) == (EMAIL, PROJECT)
    assert SECRET not in repr(source) and "not-shown" not in repr(source)


def test_gclouds_adc_file_is_named_and_the_spec_project_wins(tmp_path: Path) -> None:
    adc = tmp_path / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir()
    user = {
        "type": "authorized_user",
        "client_id": "id.apps.googleusercontent.com",
        "client_secret": "not-shown",
        "refresh_token": SECRET,
        "quota_project_id": "other-project",
    }
    adc.write_text(json.dumps(user))
    source = GcpAccountProbe("spec-project").credentials()
    assert source.source == f"gcloud application default credentials file {adc}"
    assert (source.principal, source.account) == ("", "spec-project")
    assert SECRET not in repr(source) and "not-shown" not in repr(source)


def test_no_credentials_anywhere_is_a_credentials_error() -> None:
    with pytest.raises(CredentialsError, match="no usable Google Cloud credentials") as err:
        GcpAccountProbe(PROJECT).credentials()
    assert "gcloud auth application-default login" in str(err.value.hint)


def test_building_the_probe_loads_no_google_sdk() -> None:
    code = (
        "import sys\n"
        "from cloudtrain.providers.base import ProviderConfig\n"
        "from cloudtrain.providers.gcp.provider import GcpProvider\n"
        "GcpProvider(ProviderConfig(name='gcp', region='us-east1')).account_probe()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'google'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
