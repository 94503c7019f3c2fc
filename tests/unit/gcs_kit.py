"""The shared kit of GcsStore's unit tests (test_gcp_storage.py, test_gcp_signing.py) on
gcp-storage-emulator: the `emulated` mark, `new_store`, and the two kinds of credentials a store
signs with (a service account's key, token-only credentials with no signer). Not itself a test
module; test_security_gcp.py takes `service_account_credentials` from here too. Standard library,
pytest and the Google SDK only, like the tests that import it: they run on the nodes' Pythons too
(tests/node-side-tests.txt), from 3.10.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

pytest.importorskip("google.cloud.storage")

from google.auth.credentials import Credentials
from google.cloud import storage

from cloudtrain.providers.gcp.storage import GcsStore

emulated = pytest.mark.usefixtures("gcs_emulator")


def new_store(uri: str = "gs://cloudtrain-test/pfx", **kwargs: Any) -> GcsStore:
    store = GcsStore(uri, **kwargs)
    store.ensure_bucket()
    return store


def service_account_credentials(scopes: tuple[str, ...] = storage.Client.SCOPE) -> Any:
    """A service-account credential with a fresh RSA key and a pre-set token (no refresh)."""
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.oauth2 import service_account

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "proj",
        "private_key_id": "1",
        "private_key": pem,
        "client_email": "signer@proj.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "http://127.0.0.1:9/token",  # never called: the token is valid
    }
    creds = service_account.Credentials.from_service_account_info(info, scopes=list(scopes))
    creds.token = "test-token"
    creds.expiry = datetime.datetime.utcnow() + datetime.timedelta(hours=1)
    return creds


class FakeUserCredentials(Credentials):
    """Token-only credentials (like user ADC or a VM's metadata-server account): no signer."""

    def __init__(self, email: str | None = None) -> None:
        super().__init__()
        self.refreshed = 0
        self._email = email

    @property
    def service_account_email(self) -> str | None:
        return self._email if self.refreshed else ("default" if self._email else None)

    def refresh(self, request: Any) -> None:
        self.refreshed += 1
        self.token = "fresh-token"
        self.expiry = datetime.datetime.utcnow() + datetime.timedelta(hours=1)
