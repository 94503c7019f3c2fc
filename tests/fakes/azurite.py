"""Azurite (the Azure Blob Storage emulator, from npm) for tests: one server per session (shared
by every module that imports the fixtures), wiped before each test.

    from tests.fakes.azurite import azurite, azurite_session  # noqa: F401

makes the `azurite` fixture available in a test module or conftest. For the duration of a test
it points the Azure SDK of this process (and of subprocesses that inherit its environment) at
the emulator the way an Azure program honours one: AZURE_STORAGE_CONNECTION_STRING is the
well-known `devstoreaccount1` connection string with `BlobEndpoint=http://127.0.0.1:P/
devstoreaccount1;`, and loopback is excluded from any proxy (for the SDK and for curl). Stores
use `az://devstoreaccount1/CONTAINER/...`. Without node or Azurite (tests/run.sh installs it:
`npm install --prefix tests/.azurite azurite@3.35.0`) the fixtures skip.

`azurite_oauth` is a second server over HTTPS (a throwaway CA from `trustme`) with
`--oauth basic`: it takes bearer tokens (`FakeEntraCredential` makes ones it accepts; azure-core
sends bearer tokens over TLS only) and serves `get_user_delegation_key`.

What Azurite 3.35 serves, as far as cloudtrain cares: containers, Put Blob / Put Block / Put
Block List, ranged downloads, prefix listings, blob batch deletes, leases, account-key SAS.
Traps: without `--skipApiVersionCheck` it refuses the SDK's newer API version; without
`--disableTelemetry` it tries to reach the internet; a Put Blob without `x-ms-blob-type` is a
bare 400 (as on Azure); user delegation SAS URLs signed by azure-storage-blob 12.31 (sv
2026-10-06) are refused (403): Azurite's string-to-sign for them predates that version. A
deleted container's name is free at once (Azure keeps it about 30 s).
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"
ACCOUNT = "devstoreaccount1"  # Azurite's well-known development account and key (public)
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_VERSION = "3.35.0"
BINARY = Path(__file__).resolve().parents[1] / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
START_TIMEOUT_S = 30.0
TENANT = "ab1f708d-50f6-404c-a006-d71b2ac7a606"
OBJECT_ID = "0b7c1e2a-3f4d-4e5f-8a9b-0c1d2e3f4a5b"
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
# az CLI / SDK settings that could point elsewhere than the emulator.
CLEARED_ENV = (
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_AUTH_MODE",
)


@dataclass
class Azurite:
    """A running azurite-blob process on a loopback port."""

    process: subprocess.Popen[bytes] | None
    port: int
    workdir: str  # its working folder and log
    ca_pem: str | None = None  # with TLS: the CA that signed the server's certificate

    @property
    def scheme(self) -> str:
        return "https" if self.ca_pem else "http"

    @property
    def endpoint(self) -> str:
        """The account's blob endpoint (path style): http://127.0.0.1:P/devstoreaccount1."""
        return f"{self.scheme}://{HOST}:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol={self.scheme};AccountName={ACCOUNT};"
            f"AccountKey={ACCOUNT_KEY};BlobEndpoint={self.endpoint};"
        )

    def client(self, **options: Any) -> Any:
        """A plain SDK client with the account key (the test's own view of the blobs)."""
        from azure.storage.blob import BlobServiceClient

        if self.ca_pem:
            options.setdefault("connection_verify", self.ca_pem)
        return BlobServiceClient.from_connection_string(self.connection_string, **options)

    def healthy(self) -> bool:
        """Whether the server answers HTTP (any status: an anonymous list is refused)."""
        context = ssl.create_default_context(cafile=self.ca_pem) if self.ca_pem else None
        handlers: list[Any] = [urllib.request.ProxyHandler({})]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(f"{self.endpoint}?comp=list", timeout=5) as resp:
                resp.read()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def wipe(self) -> None:
        """Delete every container (and so every blob). Blocks."""
        client = self.client(retry_total=0)
        for container in client.list_containers():
            client.delete_container(container.name)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (Path(self.workdir) / "azurite.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL after 5 s) and remove its folder. Idempotent."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def azurite_missing() -> str | None:
    """Why Azurite cannot run here (a skip reason), or None."""
    if importlib.util.find_spec("azure.storage.blob") is None:
        return "azure-storage-blob is not installed: pip install 'cloudtrain[azure]'"
    if shutil.which("node") is None:
        return "node is not on PATH (Azurite is a Node.js program)"
    if not BINARY.exists():
        return (
            f"Azurite is not installed: npm install --prefix tests/.azurite "
            f"azurite@{AZURITE_VERSION} (tests/run.sh does this)"
        )
    return None


def azurite_available() -> bool:
    """Whether node, Azurite (tests/.azurite) and azure-storage-blob are all there."""
    return azurite_missing() is None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _tls_files(workdir: str) -> tuple[str, str, str]:
    """(CA, certificate, key) PEM files for 127.0.0.1, from a throwaway trustme CA."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert(HOST, "localhost")
    paths = tuple(os.path.join(workdir, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(paths[0])
    cert.cert_chain_pems[0].write_to_path(paths[1])
    cert.private_key_pem.write_to_path(paths[2])
    return paths  # type: ignore[return-value]


def start_azurite(*, oauth: bool = False, attempts: int = 3) -> Azurite:
    """Start azurite-blob in memory on a free port of 127.0.0.1; ready when this returns.

    With `oauth`, it serves HTTPS (see `Azurite.ca_pem`) and accepts bearer tokens. A start
    that fails (say, the port was taken in between) is retried on another port."""
    failure = ""
    for _ in range(attempts):
        workdir = tempfile.mkdtemp(prefix="cloudtrain-azurite-")
        port = _free_port()
        args = [
            str(BINARY),
            *("--blobHost", HOST, "--blobPort", str(port)),
            *("--inMemoryPersistence", "--silent", "--disableTelemetry", "--skipApiVersionCheck"),
        ]
        ca_pem = None
        if oauth:
            ca_pem, cert, key = _tls_files(workdir)
            args += ["--oauth", "basic", "--cert", cert, "--key", key]
        with open(os.path.join(workdir, "azurite.log"), "wb") as log:
            process = subprocess.Popen(
                args,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends all of it
            )
        server = Azurite(process=process, port=port, workdir=workdir, ca_pem=ca_pem)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            if server.healthy():
                return server
            time.sleep(0.1)
        failure = server.log()
        server.stop()
    raise RuntimeError(f"Azurite did not start in {attempts} attempts; last log:\n{failure}")


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


class FakeEntraCredential:
    """An azure-core TokenCredential issuing unsigned JWTs that Azurite's `--oauth basic`
    accepts (it checks issuer, audience and times, not the signature). Counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.calls += 1
        now = int(time.time())
        claims = {
            "aud": "https://storage.azure.com",
            "iss": f"https://sts.windows.net/{TENANT}/",
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now + 3600,
            "oid": OBJECT_ID,
            "tid": TENANT,
        }
        token = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.c2ln"
        return AccessToken(token, now + 3600)


def use_azurite(monkeypatch: pytest.MonkeyPatch, server: Azurite) -> None:
    """Point this process's (and its children's) Azure Storage SDK at `server`; undone by
    monkeypatch."""
    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(CONNECTION_STRING_ENV, server.connection_string)
    for name in ("NO_PROXY", "no_proxy"):  # loopback never through a proxy (SDK and curl)
        current = os.environ.get(name, "")
        monkeypatch.setenv(name, f"{current},{HOST}" if current else HOST)


# The session's servers, by `oauth`, with their number of users. Every test module that imports
# `azurite_session` gets a session fixture of its own (pytest keys a fixture by where it is
# defined), so the servers are shared here: one process per kind, not one per importing module
# left running until the session ends.
_SHARED: dict[bool, tuple[Azurite, int]] = {}


@contextlib.contextmanager
def shared_azurite(*, oauth: bool = False) -> Iterator[Azurite]:
    """The session's one Azurite of this kind: started by its first user (a dead one is
    replaced), stopped when its last user leaves. Blocks while starting."""
    server, users = _SHARED.get(oauth, (None, 0))
    if server is None or server.process is None or server.process.poll() is not None:
        if server is not None:
            server.stop()
        server = start_azurite(oauth=oauth)
    _SHARED[oauth] = (server, users + 1)
    try:
        yield server
    finally:
        current, users = _SHARED[oauth]
        if users <= 1:
            del _SHARED[oauth]
            current.stop()
        else:
            _SHARED[oauth] = (current, users - 1)


@pytest.fixture(scope="session")
def azurite_session() -> Iterator[Azurite]:
    """One Azurite for the whole test session (skips if node or Azurite is missing)."""
    reason = azurite_missing()
    if reason:
        pytest.skip(reason)
    with shared_azurite() as server:
        yield server


@pytest.fixture
def azurite(azurite_session: Azurite, monkeypatch: pytest.MonkeyPatch) -> Azurite:
    """The session's Azurite, empty, with this process's Azure environment pointed at it."""
    azurite_session.wipe()
    use_azurite(monkeypatch, azurite_session)
    return azurite_session


@pytest.fixture(scope="session")
def azurite_oauth_session() -> Iterator[Azurite]:
    """One HTTPS + OAuth Azurite for the session (skips without Azurite or trustme)."""
    reason = azurite_missing()
    if reason is None and importlib.util.find_spec("trustme") is None:
        reason = "trustme is not installed: pip install trustme"
    if reason:
        pytest.skip(reason)
    with shared_azurite(oauth=True) as server:
        yield server


@pytest.fixture
def azurite_oauth(azurite_oauth_session: Azurite, monkeypatch: pytest.MonkeyPatch) -> Azurite:
    """The HTTPS + OAuth Azurite, empty, with no connection string set (so stores take the
    token-credential path) and loopback excluded from proxies."""
    azurite_oauth_session.wipe()
    for name in (*CLEARED_ENV, CONNECTION_STRING_ENV):
        monkeypatch.delenv(name, raising=False)
    for name in ("NO_PROXY", "no_proxy"):
        current = os.environ.get(name, "")
        monkeypatch.setenv(name, f"{current},{HOST}" if current else HOST)
    return azurite_oauth_session
