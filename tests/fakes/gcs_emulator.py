"""gcp-storage-emulator in-process for tests: one server per session, wiped before each test.

    from tests.fakes.gcs_emulator import gcs_emulator, gcs_emulator_session  # noqa: F401

makes the `gcs_emulator` fixture available in a test module or conftest. For the duration of a
test it points google-cloud-storage in this process (and in subprocesses that inherit its
environment, e.g. nodes run by a boot harness) at the emulator: STORAGE_EMULATOR_HOST (with no
credentials in the environment the store is then anonymous), GOOGLE_CLOUD_PROJECT, NO_GCE_CHECK
(google-auth does not probe for a metadata server), and loopback excluded from any proxy (for
the SDK and for curl). Without the emulator installed the fixtures skip.

What the emulator (2026.7.19) serves, as far as cloudtrain cares:
- the JSON API (`/storage/v1/...`), media and resumable uploads (`/upload/storage/v1/...`, POST
  to start, PUT chunks), media downloads (`/download/storage/v1/...?alt=media`), batch;
- `GET` and `PUT` on `/{bucket}/{object}`: the path of a V4 signed URL. Query parameters
  (signatures) are ignored, so signed and unsigned URLs both work, and never expire;
- bucket `iamConfiguration` is stored and reported, but only through PATCH: an insert ignores it;
- bucket IAM policies (`GET`/`PUT /storage/v1/b/{bucket}/iam`): stored, never enforced. The
  emulator's own handlers keep the client's etag and accept any write; `install_iam_policy()`
  (called by `start_gcs_emulator`) replaces them, in process, with GCS's behaviour: every write
  gets a new etag, a write with a stale etag is refused 412, conditions need policy version 3
  and uniform bucket-level access (else 400), and IAM Conditions' limits hold (400 `invalid`:
  tests/fakes/iam_limits.py, as on the GCE fake's project policies). `race_iam_policy(bucket,
  n)` makes the next `n` writes lose a race with another writer (412), and `iam_policy(bucket)`
  reads the policy.
- object preconditions: the emulator ignores them (an upload with `ifGenerationMatch` always
  wrote). `install_preconditions()` (called by `start_gcs_emulator`) wraps the object handlers,
  in process, with GCS's checks (cloud.google.com/storage/docs/request-preconditions):
  `ifGenerationMatch` / `x-goog-if-generation-match` (0: no live object) and
  `ifMetagenerationMatch` / `x-goog-if-metageneration-match` fail with 412 conditionNotMet,
  `ifGenerationNotMatch` / `ifMetagenerationNotMatch` with 304; on uploads of every kind (media,
  multipart, resumable: at each chunk, so at the finalizing one too), XML PUTs, gets, downloads,
  deletes and patches. A read pinned to a `generation` that is no longer live is 404 (no object
  versioning). The server handles one request at a time, so check and write are atomic.
Not served: `PUT` on the upload endpoint without an `upload_id` (the handler crashes, curl gets
an empty reply), the XML multipart API. The server handles one request at a time.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import itertools
import json
import logging
import os
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import pytest

from tests.fakes import iam_limits

HOST = "127.0.0.1"
TEST_PROJECT = "cloudtrain-test"
START_TIMEOUT_S = 10.0
# Anything that could take precedence over the emulator or send loopback through a proxy.
CLEARED_ENV = ("API_ENDPOINT_OVERRIDE", "GOOGLE_CLOUD_UNIVERSE_DOMAIN")
_IAM_LOCK = threading.Lock()
_IAM_RACES: dict[str, int] = {}  # bucket -> writes still to lose to "another writer"
_ETAGS = itertools.count(1)
NO_BUCKET = "The specified bucket does not exist."


def _etag() -> str:
    return base64.b64encode(f"etag-{next(_ETAGS)}".encode()).decode()


def _gcs_error(response: Any, status: HTTPStatus, reason: str, message: str) -> None:
    response.status = status
    detail = {"domain": "global", "reason": reason, "message": message}
    response.json({"error": {"code": status.value, "message": message, "errors": [detail]}})


def _stored_policy(storage: Any, name: str) -> dict[str, Any]:
    policy = storage.get_bucket_iam_policy(name)
    if policy is None or not policy.get("etag") or policy.get("etag") == "CAE=":
        policy = {"version": 1, "bindings": [], **(policy or {}), "etag": _etag()}
        storage.set_bucket_iam_policy(name, policy)
    return dict(policy)


def _answer(response: Any, name: str, policy: dict[str, Any]) -> None:
    response.json(
        {
            "kind": "storage#policy",
            "resourceId": f"projects/_/buckets/{name}",
            "version": policy.get("version", 1),
            "etag": policy["etag"],
            "bindings": policy.get("bindings") or [],
        }
    )


def _get_iam_policy(request: Any, response: Any, storage: Any, *args: Any, **kw: Any) -> None:
    """GET /b/{bucket}/iam: the stored policy with its etag (404 without the bucket)."""
    name = request.params.get("bucket_name")
    if not name or name not in storage.buckets:
        _gcs_error(response, HTTPStatus.NOT_FOUND, "notFound", NO_BUCKET)
        return
    _answer(response, name, _stored_policy(storage, name))


def _set_iam_policy(request: Any, response: Any, storage: Any, *args: Any, **kw: Any) -> None:
    """PUT /b/{bucket}/iam: GCS's checks (etag, version 3 for conditions, uniform access, IAM
    Conditions' limits)."""
    name = request.params.get("bucket_name")
    if not name or name not in storage.buckets:
        _gcs_error(response, HTTPStatus.NOT_FOUND, "notFound", NO_BUCKET)
        return
    body = request.data if isinstance(request.data, dict) else {}
    current = _stored_policy(storage, name)
    with _IAM_LOCK:
        racing = _IAM_RACES.get(name, 0) > 0
        if racing:
            _IAM_RACES[name] -= 1
    if racing:  # another writer got in first
        storage.set_bucket_iam_policy(name, {**current, "etag": _etag()})
        current = _stored_policy(storage, name)
    if body.get("etag") and body["etag"] != current["etag"]:
        _gcs_error(
            response, HTTPStatus.PRECONDITION_FAILED, "conditionNotMet", "Precondition Failed"
        )
        return
    bindings = list(body.get("bindings") or [])
    version = int(body.get("version") or 1)
    if any(b.get("condition") for b in bindings):
        uniform = (storage.buckets[name].get("iamConfiguration") or {}).get(
            "uniformBucketLevelAccess"
        ) or {}
        if version < 3 or not uniform.get("enabled"):
            _gcs_error(
                response,
                HTTPStatus.BAD_REQUEST,
                "invalid",
                "IAM conditions need policy version 3 and uniform bucket-level access.",
            )
            return
    problem = iam_limits.policy_problem(bindings)
    if problem:  # IAM Conditions' limits hold on a bucket's policy too
        _gcs_error(response, HTTPStatus.BAD_REQUEST, "invalid", problem)
        return
    policy = {"version": version, "bindings": json.loads(json.dumps(bindings)), "etag": _etag()}
    storage.set_bucket_iam_policy(name, policy)
    _answer(response, name, policy)


def install_iam_policy() -> None:
    """Serve bucket IAM policies as GCS does (see the module docstring), in this process's
    emulator. Idempotent."""
    from gcp_storage_emulator import server

    for regex, handlers in server.HANDLERS:
        if regex.endswith("/iam$"):
            handlers[server.GET] = _get_iam_policy
            handlers[server.PUT] = _set_iam_policy


def _query_or_header(request: Any, name: str, header: str | None) -> int | None:
    """A precondition's value from the JSON API's query parameter or the XML API's header."""
    values = request.query.get(name)
    raw = values[0] if values else (request.get_header(header) if header else None)
    return None if raw in (None, "") else int(raw)


def _live_object(storage: Any, bucket: str | None, name: str | None) -> dict[str, Any] | None:
    from gcp_storage_emulator.exceptions import NotFound

    if not bucket or not name:
        return None
    try:
        return dict(storage.get_file_obj(bucket, name))
    except NotFound:
        return None


def _precondition_status(request: Any, obj: dict[str, Any] | None) -> HTTPStatus | None:
    """How GCS answers the request's preconditions against `obj` (None: no live object): 412,
    304, or None when they hold (or there are none)."""
    generation = int(obj["generation"]) if obj else None
    meta = int(obj["metageneration"]) if obj else None
    want = _query_or_header(request, "ifGenerationMatch", "x-goog-if-generation-match")
    if want is not None and (obj is not None if want == 0 else generation != want):
        return HTTPStatus.PRECONDITION_FAILED
    want = _query_or_header(request, "ifMetagenerationMatch", "x-goog-if-metageneration-match")
    if want is not None and meta != want:
        return HTTPStatus.PRECONDITION_FAILED
    want = _query_or_header(request, "ifGenerationNotMatch", None)
    if want is not None and (obj is None or (want != 0 and generation == want)):
        return HTTPStatus.NOT_MODIFIED
    want = _query_or_header(request, "ifMetagenerationNotMatch", None)
    if want is not None and (obj is None or meta == want):
        return HTTPStatus.NOT_MODIFIED
    return None


def _upload_target(request: Any, storage: Any) -> tuple[str | None, str | None]:
    """(bucket, object name) of an upload request: a new upload's `name` parameter or metadata,
    or the pending resumable upload its `upload_id` names."""
    from gcp_storage_emulator.exceptions import NotFound

    upload_id = request.query.get("upload_id")
    if upload_id:
        try:
            pending = storage.get_resumable_file_obj(upload_id[0])
        except NotFound:
            return None, None
        return pending.get("bucket"), pending.get("name")
    bucket = (request.params or {}).get("bucket_name")
    if request.query.get("name"):
        return bucket, request.query["name"][0]
    data = request.data if isinstance(request.data, dict) else {}
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else data
    return bucket, meta.get("name")


def _with_preconditions(handler: Any, upload: bool) -> Any:
    """`handler` behind GCS's precondition checks (see `install_preconditions`)."""

    def checked(request: Any, response: Any, storage: Any, *args: Any, **kw: Any) -> Any:
        if upload:
            bucket, name = _upload_target(request, storage)
        else:
            params = request.params or {}
            bucket, name = params.get("bucket_name"), params.get("object_id")
        if bucket not in storage.buckets:  # a missing bucket is 404 before any precondition
            return handler(request, response, storage, *args, **kw)
        obj = _live_object(storage, bucket, name)
        pinned = request.query.get("generation")
        live = pinned and obj is not None and obj.get("generation") == pinned[0]
        if pinned and not live and not upload and not request.query.get("softDeleted"):
            _gcs_error(response, HTTPStatus.NOT_FOUND, "notFound", "No such object.")
            return None
        status = _precondition_status(request, obj)
        if status == HTTPStatus.PRECONDITION_FAILED:
            message = "At least one of the pre-conditions you specified did not hold."
            _gcs_error(response, status, "conditionNotMet", message)
            return None
        if status is not None:
            response.status = status
            return None
        return handler(request, response, storage, *args, **kw)

    checked.ct_preconditions = True  # type: ignore[attr-defined]
    return checked


def install_preconditions() -> None:
    """Check object preconditions as GCS does (see the module docstring), in this process's
    emulator. Each handler is wrapped once and the wrapper replaces it everywhere (the module's
    name too: the router's POST fallback and tests that spy on a handler look it up there).
    Idempotent."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    uploads = ("insert", "upload_partial", "xml_upload")
    wrapped: dict[Any, Any] = {}
    for name in (*uploads, "get", "download", "delete", "patch"):
        handler = getattr(objects, name)
        if getattr(handler, "ct_preconditions", False):
            continue
        checked = _with_preconditions(handler, name in uploads)
        wrapped[handler] = checked
        setattr(objects, name, checked)
    for _regex, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in wrapped:
                handlers[method] = wrapped[handler]


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
        requests in flight) and every scripted policy race. Blocks."""
        self._get("/wipe")
        with _IAM_LOCK:
            _IAM_RACES.clear()

    def iam_policy(self, bucket: str) -> dict[str, Any]:
        """The bucket's IAM policy as GCS answers it (version 3 asked). Blocks."""
        data = self._get(f"/storage/v1/b/{bucket}/iam?optionsRequestedPolicyVersion=3")
        return dict(json.loads(data))

    def race_iam_policy(self, bucket: str, count: int = 1) -> None:
        """Make the next `count` policy writes of `bucket` lose a race (412 conditionNotMet)."""
        with _IAM_LOCK:
            _IAM_RACES[bucket] = _IAM_RACES.get(bucket, 0) + count

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


def _free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _deepen_backlog(server: Any) -> None:
    """Let 128 connections wait instead of http.server's 5. The server answers one request at a
    time; with more than 5 clients connecting at once, Linux dropped the others' SYNs and each
    waited a second to retry (8 racing writers took 12 s for 8 rounds). Listening again on the
    bound socket only resizes its queue."""
    httpd = getattr(getattr(server, "_api", None), "_httpd", None)
    if httpd is not None:
        httpd.socket.listen(128)


def start_gcs_emulator(attempts: int = 3, host: str = HOST) -> GcsEmulator:
    """Start the emulator in memory on a free port of `host` (default 127.0.0.1; a box whose
    VMs are hosts of their own gives its network's host address); ready when this returns.

    The emulator binds in its own thread and `Server.start()` waits without a timeout, so a
    port taken in between would hang it: start runs in a helper thread, and a start that does
    not finish in time is retried on another port (the stuck helper is a daemon)."""
    from gcp_storage_emulator.server import create_server

    install_iam_policy()
    install_preconditions()
    # Every 404 is logged as an error; handler crashes (gcp_storage_emulator.server) still show.
    for name in ("gcp_storage_emulator.storage", "api.object", "api.bucket"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for _ in range(attempts):
        port = _free_port(host)
        server = create_server(host, port, in_memory=True)
        starter = threading.Thread(target=server.start, name="gcs-emulator-start", daemon=True)
        starter.start()
        starter.join(START_TIMEOUT_S)
        emulator = GcsEmulator(server=server, url=f"http://{host}:{port}")
        if not starter.is_alive() and emulator.healthy():
            _deepen_backlog(server)
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
    # google-auth never probes for a metadata server here (the store looks for the
    # environment's credentials on an emulator: providers/gcp/storage.py)
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    host = urllib.parse.urlsplit(emulator.url).hostname or HOST
    for name in ("NO_PROXY", "no_proxy"):  # the box never through a proxy (SDK and curl)
        current = os.environ.get(name, "")
        monkeypatch.setenv(name, f"{current},{host}" if current else host)


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
