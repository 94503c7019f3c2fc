"""TLS and credentials for the ARM fake: a throwaway CA per fake, and an offline credential.

azure-core refuses bearer tokens over plain http, so the fake speaks HTTPS. `FakeTls` makes a
fresh `trustme` CA, issues a server certificate for 127.0.0.1 and localhost, writes the CA PEM to
a temporary file (`ca_path`, what clients pass as `connection_verify=`) and builds the server's
`ssl.SSLContext`; `close()` removes the file. `FakeCredential` is an azure-core TokenCredential
that never leaves the machine: `get_token(*scopes, **kw)` returns an `AccessToken` for the token
`fake-arm-token`, valid for an hour, and records the scopes it was asked for.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
import time
from typing import Any

TOKEN = "fake-arm-token"


class FakeTls:
    """A CA, its PEM file and a server SSL context for 127.0.0.1 and localhost."""

    def __init__(self) -> None:
        import trustme

        self._ca = trustme.CA(organization_name="cloudtrain ARM fake")
        cert = self._ca.issue_cert("127.0.0.1", "localhost")
        self.server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(self.server_context)
        fd, self.ca_path = tempfile.mkstemp(prefix="arm-fake-ca-", suffix=".pem")
        with os.fdopen(fd, "wb") as handle:
            handle.write(self._ca.cert_pem.bytes())

    def client_context(self) -> ssl.SSLContext:
        """An SSL context trusting this CA (for urllib and other plain clients)."""
        return ssl.create_default_context(cafile=self.ca_path)

    def close(self) -> None:
        """Remove the CA file. Idempotent."""
        if self.ca_path and os.path.exists(self.ca_path):
            os.unlink(self.ca_path)


class FakeCredential:
    """An offline azure-core TokenCredential (see the module docstring)."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.scopes: list[str] = []
        self._lock = threading.Lock()

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        """A token good for an hour, whatever the scopes, claims or tenant asked for."""
        from azure.core.credentials import AccessToken

        with self._lock:
            self.scopes.extend(scopes)
        return AccessToken(self.token, int(time.time()) + 3600)

    def close(self) -> None:
        """Nothing to release (the credential protocol allows a close)."""

    def __enter__(self) -> FakeCredential:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
