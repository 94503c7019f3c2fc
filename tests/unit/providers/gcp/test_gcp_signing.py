"""GcsStore's presigned URLs (providers/gcp/storage.py) in each signing mode, and its credentials
errors: unsigned object paths on gcp-storage-emulator, V4 signed with a service account's key
(fetched by curl on the emulator, pointing at Google without it), V4 through IAM signBlob for
token-only credentials (the call faked), and credentials that cannot sign, that IAM refuses, or
that are missing altogether. The rest of GcsStore is in test_gcp_storage.py; the shared helpers
are gcs_kit.py's.
"""

from __future__ import annotations

import base64
import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.storage")

from google.auth import exceptions as auth
from google.auth.credentials import AnonymousCredentials

from cloudtrain.core.errors import CredentialsError
from cloudtrain.providers.gcp.storage import GcsStore
from tests.fakes.gcs_emulator import GcsEmulator, gcs_emulator, gcs_emulator_session
from tests.fakes.shell import require_tool
from tests.unit.gcs_kit import (
    FakeUserCredentials,
    emulated,
    new_store,
    service_account_credentials,
)

__all__ = ["gcs_emulator", "gcs_emulator_session"]  # fixtures used by this module


def query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))


def curl(*args: str) -> bytes:
    """`curl -fsS ARGS`'s output (fails without curl: `require_tool`)."""
    return subprocess.run(
        [require_tool("curl"), "-fsS", *args], check=True, capture_output=True, timeout=30
    ).stdout


# --- presigned URLs ----------------------------------------------------------------------------


@emulated
def test_presigned_urls_on_the_emulator_are_its_object_paths(
    gcs_emulator: GcsEmulator, tmp_path: Path
) -> None:
    store = new_store()
    data = os.urandom(50_000)
    store.put("runs/r/bundle/a b.tar.gz", data)
    url = store.presign_get("runs/r/bundle/a b.tar.gz", ttl_s=600)
    assert url == f"{gcs_emulator.url}/cloudtrain-test/pfx/runs/r/bundle/a%20b.tar.gz"
    assert curl(url) == data

    log = tmp_path / "boot.log"
    log.write_text("phase 1\n")
    put_url = store.presign_put("runs/r/bootstrap/w-0.log", ttl_s=99_999)
    curl("-T", str(log), put_url)
    assert store.get("runs/r/bootstrap/w-0.log") == b"phase 1\n"
    log.write_text("replaced\n")
    curl("-T", str(log), put_url)
    assert store.get("runs/r/bootstrap/w-0.log") == b"replaced\n"
    with pytest.raises(subprocess.CalledProcessError):
        curl(store.presign_get("runs/r/missing"))


@emulated
def test_v4_urls_signed_with_a_key_work_on_the_emulator(tmp_path: Path) -> None:
    store = new_store(credentials=service_account_credentials())
    store.put("k/x.bin", b"payload")
    url = store.presign_get("k/x.bin", ttl_s=7200)
    params = query(url)
    assert params["X-Goog-Algorithm"] == "GOOG4-RSA-SHA256"
    assert params["X-Goog-Expires"] == "3600", "capped at one hour"
    assert params["X-Goog-SignedHeaders"] == "host"
    assert params["X-Goog-Credential"].startswith("signer@proj.iam.gserviceaccount.com/")
    assert urllib.parse.urlparse(url).path == "/cloudtrain-test/pfx/k/x.bin"
    assert curl(url) == b"payload"
    src = tmp_path / "up.txt"
    src.write_text("up\n")
    curl("-T", str(src), store.presign_put("k/up.txt", ttl_s=60))
    assert store.get("k/up.txt") == b"up\n"
    assert query(store.presign_put("k/up.txt", ttl_s=0))["X-Goog-Expires"] == "1"


def test_v4_urls_signed_with_a_key_point_at_google(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    store = GcsStore("gs://cloudtrain-x/p", credentials=service_account_credentials())
    url = store.presign_put("a b", ttl_s=900)
    assert url.startswith("https://storage.googleapis.com/cloudtrain-x/p/a%20b?")
    assert query(url)["X-Goog-Expires"] == "900"


@pytest.fixture
def fake_sign_blob(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Replace the IAM signBlob call; records (access token, service account) per call."""
    from google.cloud.storage import _signing

    calls: list[tuple[str, str]] = []

    def sign(message: Any, access_token: str, email: str, universe_domain: str = "") -> str:
        calls.append((access_token, email))
        return base64.b64encode(b"\x01" * 256).decode()

    monkeypatch.setattr(_signing, "_sign_message", sign)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    return calls


def test_credentials_without_a_key_sign_through_iam(fake_sign_blob: list[tuple[str, str]]) -> None:
    creds = FakeUserCredentials(email="vm-sa@proj.iam.gserviceaccount.com")
    store = GcsStore("gs://cloudtrain-x/p", credentials=creds)
    url = store.presign_get("k", ttl_s=5000)
    assert creds.refreshed == 1, "refreshed first: a VM account learns its email that way"
    assert fake_sign_blob == [("fresh-token", "vm-sa@proj.iam.gserviceaccount.com")]
    params = query(url)
    assert params["X-Goog-Credential"].startswith("vm-sa@proj.iam.gserviceaccount.com/")
    assert params["X-Goog-Expires"] == "3600"
    assert params["X-Goog-Signature"] == "01" * 256


def test_user_credentials_sign_as_the_configured_service_account(
    fake_sign_blob: list[tuple[str, str]],
) -> None:
    store = GcsStore(
        "gs://cloudtrain-x",
        credentials=FakeUserCredentials(),
        signer_email="signer@proj.iam.gserviceaccount.com",
    )
    store.presign_put("k")
    assert fake_sign_blob == [("fresh-token", "signer@proj.iam.gserviceaccount.com")]


def test_credentials_that_cannot_sign_raise_credentials_error(
    fake_sign_blob: list[tuple[str, str]],
) -> None:
    with pytest.raises(CredentialsError, match="no private key") as err:
        GcsStore("gs://cloudtrain-x", credentials=FakeUserCredentials()).presign_get("k")
    assert "impersonate-service-account" in (err.value.hint or "")
    with pytest.raises(CredentialsError, match="anonymous"):
        GcsStore("gs://cloudtrain-x", credentials=AnonymousCredentials()).presign_get("k")
    assert fake_sign_blob == []


def test_iam_refusing_to_sign_is_a_credentials_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud.storage import _signing

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise auth.TransportError(
            'Error calling the IAM signBytes API: b\'{"error": {"code": 403, '
            '"status": "PERMISSION_DENIED"}}\''
        )

    monkeypatch.setattr(_signing, "_sign_message", refuse)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    store = GcsStore("gs://cloudtrain-x", credentials=FakeUserCredentials(email="a@b.c"))
    with pytest.raises(CredentialsError, match="IAM refused to sign") as err:
        store.presign_get("k")
    assert "roles/iam.serviceAccountTokenCreator" in (err.value.hint or "")


def test_no_credentials_at_all_is_a_credentials_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    store = GcsStore("gs://cloudtrain-x")
    with pytest.raises(CredentialsError) as err:
        store.get("k")
    assert "gcloud auth application-default login" in str(err.value)
