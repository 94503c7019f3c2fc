"""gcp-storage-emulator in-process for tests: one server per session, wiped before each test.

    from tests.fakes.gcs_emulator import gcs_emulator, gcs_emulator_session  # noqa: F401

makes the `gcs_emulator` fixture available in a test module or conftest. For the duration of a
test it points google-cloud-storage in this process (and in subprocesses that inherit its
environment, e.g. nodes run by a boot harness) at the emulator: STORAGE_EMULATOR_HOST (the SDK
then uses anonymous credentials by itself), GOOGLE_CLOUD_PROJECT, and loopback excluded from any
proxy (for the SDK and for curl). Without the emulator installed the fixtures skip.

What the emulator (2026.7.19) serves, as far as cloudtrain cares:
- the JSON API (`/storage/v1/...`), media and resumable uploads (`/upload/storage/v1/...`, POST
  to start, PUT chunks), media downloads (`/download/storage/v1/...?alt=media`), batch;
- `GET` and `PUT` on `/{bucket}/{object}`: the path of a V4 signed URL. Query parameters
  (signatures) are ignored, so signed and unsigned URLs both work, and never expire;
- bucket `iamConfiguration` is stored and reported, but only through PATCH: an insert ignores it.
Not served: `PUT` on the upload endpoint without an `upload_id` (the handler crashes, curl gets
an empty reply), the XML multipart API. The server handles one request at a time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

HOST = "127.0.0.1"
TEST_PROJECT = "cloudtrain-test"
START_TIMEOUT_S = 10.0
# Anything that could take precedence over the emulator or send loopback through a proxy.
CLEARED_ENV = ("API_ENDPOINT_OVERRIDE", "GOOGLE_CLOUD_UNIVERSE_DOMAIN")


@dataclass
class GcsEmulator:
    """A running emulator on a loopback port."""

    server: Any  # gcp_storage_emulator.server.Server
    url: str  # http://127.0.0.1:PORT (the value of STORAGE_EMULATOR_HOST)

    def _get(self, path: str) -> bytes:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.url}{path}", timeout=10) as resp:
            return bytes(resp.read())

    def healthy(self) -> bool:
        """Whether the server answers its health check. Blocks (at most 10 s)."""
        try:
            return self._get("/") == b"OK"
        except OSError:
            return False

    def wipe(self) -> None:
        """Forget every bucket, object and pending upload (GET /wipe, so it is serialized with
        requests in flight). Blocks."""
        self._get("/wipe")

    def stop(self) -> None:
        """Shut the server down. Idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None


def gcs_emulator_available() -> bool:
    """Whether gcp-storage-emulator and google-cloud-storage are importable."""
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("gcp_storage_emulator", "google.cloud.storage")
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start_gcs_emulator(attempts: int = 3) -> GcsEmulator:
    """Start the emulator in memory on a free port of 127.0.0.1; ready when this returns.

    The emulator binds in its own thread and `Server.start()` waits without a timeout, so a
    port taken in between would hang it: start runs in a helper thread, and a start that does
    not finish in time is retried on another port (the stuck helper is a daemon)."""
    from gcp_storage_emulator.server import create_server

    # Every 404 is logged as an error; handler crashes (gcp_storage_emulator.server) still show.
    for name in ("gcp_storage_emulator.storage", "api.object", "api.bucket"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for _ in range(attempts):
        port = _free_port()
        server = create_server(HOST, port, in_memory=True)
        starter = threading.Thread(target=server.start, name="gcs-emulator-start", daemon=True)
        starter.start()
        starter.join(START_TIMEOUT_S)
        emulator = GcsEmulator(server=server, url=f"http://{HOST}:{port}")
        if not starter.is_alive() and emulator.healthy():
            return emulator
        with contextlib.suppress(Exception):
            server.stop()
    raise RuntimeError(f"gcp-storage-emulator did not start in {attempts} attempts")


def use_gcs_emulator(
    monkeypatch: pytest.MonkeyPatch, emulator: GcsEmulator, project: str = TEST_PROJECT
) -> None:
    """Point this process's (and its children's) google-cloud-storage at `emulator`; undone by
    monkeypatch."""
    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project)
    for name in ("NO_PROXY", "no_proxy"):  # loopback never through a proxy (SDK and curl)
        current = os.environ.get(name, "")
        monkeypatch.setenv(name, f"{current},{HOST}" if current else HOST)


@pytest.fixture(scope="session")
def gcs_emulator_session() -> Iterator[GcsEmulator]:
    """One emulator for the whole test session (skips if it is not installed)."""
    if not gcs_emulator_available():
        pytest.skip("gcp-storage-emulator is not installed: pip install gcp-storage-emulator")
    emulator = start_gcs_emulator()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def gcs_emulator(gcs_emulator_session: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> GcsEmulator:
    """The session's emulator, empty, with this process's GCS environment pointed at it."""
    gcs_emulator_session.wipe()
    use_gcs_emulator(monkeypatch, gcs_emulator_session)
    return gcs_emulator_session
