"""Conditional writes (ObjectStore.get_tagged / put_if), the ground the run's control lease stands
on (cloudtrain/state/lease.py): one suite over every store, each against its fake (local folder, the
memory fixture, S3 on moto's server, GCS on gcp-storage-emulator with tests/fakes/gcs_emulator.py's
precondition checks, Azure on Azurite), then the two wrappers (RetryingStore, FaultyStore), and
the error mappings the fakes cannot produce (S3's 409 ConditionalRequestConflict).

What every store must do: a create-if-absent succeeds once; an update with the current tag
succeeds and returns a new tag; a stale tag, or a tag of an object deleted since, fails with
PreconditionFailed and changes nothing; N writers that read the same tag and race leave exactly
one winner per round. On S3 that last one is a strict xfail until tests/fakes/moto_server.py
serializes moto's object requests: moto 5.2 checks If-Match / If-None-Match and then writes,
unlocked, so two racers can both win (shown every time by making moto's writes wait 20 ms after
their checks); with the lock in the fake it runs as a plain test. Standard library, pytest
and the cloud SDKs only: this runs on the nodes' Pythons too (tests/node-side-tests.txt).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core import retry
from cloudtrain.core.errors import NotFound, PreconditionFailed, TransientError
from cloudtrain.providers.base import ObjectStore
from cloudtrain.providers.faults import FaultPlan, wrap
from cloudtrain.providers.local import LocalStore
from cloudtrain.providers.retrying import RetryingStore
from tests.fakes.azurite import ACCOUNT as AZURE_ACCOUNT
from tests.fakes.azurite import azurite, azurite_session
from tests.fakes.gcs_emulator import gcs_emulator, gcs_emulator_session
from tests.fakes.memory_provider import MemoryProvider
from tests.fakes.moto_server import moto_server, moto_server_session

__all__ = [  # fixtures used by this module
    "azurite",
    "azurite_session",
    "gcs_emulator",
    "gcs_emulator_session",
    "moto_server",
    "moto_server_session",
]

KEY = "control/lease"
BACKENDS = ("local", "memory", "s3", "gcs", "azure")
# Stores whose tag changes on every write, even of the same bytes. S3's ETag is the MD5 of the
# bytes: rewriting them keeps it, and If-Match on it holds (docs.aws.amazon.com/AmazonS3/latest/
# API/API_Object.html#AmazonS3-Type-Object-ETag), which is safe: the object is what was read.
NEW_TAG_PER_WRITE = frozenset({"local", "memory", "gcs", "azure"})
RACERS = 8
ROUNDS = 8
MiB = 1024 * 1024

StoreFactory = Callable[[], ObjectStore]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.01)


def _factory(
    name: str, request: pytest.FixtureRequest, tmp_path: Path, bucket: str = "cloudtrain-cond"
) -> StoreFactory:
    """A maker of stores at one URI of backend `name` (each racer gets its own store, as each
    controller process has its own), with the backend's fake running."""
    if name == "local":
        uri = f"file://{tmp_path}/{bucket}"
        return lambda: LocalStore(uri)
    if name == "memory":
        provider = MemoryProvider()
        return lambda: provider.store(f"mem://{bucket}")
    if name == "s3":
        pytest.importorskip("boto3")
        request.getfixturevalue("moto_server")
        from cloudtrain.providers.aws.storage import S3Store

        return lambda: S3Store(f"s3://{bucket}/pfx", "us-east-1")
    if name == "gcs":
        pytest.importorskip("google.cloud.storage")
        request.getfixturevalue("gcs_emulator")
        from cloudtrain.providers.gcp.storage import GcsStore

        return lambda: GcsStore(f"gs://{bucket}/pfx")
    pytest.importorskip("azure.storage.blob")
    request.getfixturevalue("azurite")
    from cloudtrain.providers.azure.storage import BlobStore

    return lambda: BlobStore(f"az://{AZURE_ACCOUNT}/{bucket}/pfx")


@pytest.fixture(params=BACKENDS)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    factory = _factory(str(request.param), request, tmp_path)
    factory().ensure_bucket()
    return factory


@pytest.fixture
def store(make_store: StoreFactory) -> ObjectStore:
    return make_store()


def backend(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["make_store"])


# --- every store -------------------------------------------------------------------------------


def test_a_missing_object_has_no_tag(store: ObjectStore) -> None:
    assert store.get_tagged(KEY) is None
    assert store.get_tagged("control/never/written") is None


def test_create_if_absent_succeeds_once(store: ObjectStore) -> None:
    tag = store.put_if(KEY, b"first", None)
    assert isinstance(tag, str) and tag
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, b"second", None)
    assert store.get_tagged(KEY) == (b"first", tag)
    assert store.get(KEY) == b"first"


def test_update_with_the_current_tag_succeeds_and_returns_a_new_tag(
    store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    first = store.put_if(KEY, b"term 1", None)
    second = store.put_if(KEY, b"term 2", first)
    assert second != first
    assert store.get_tagged(KEY) == (b"term 2", second)
    third = store.put_if(KEY, b"term 2", second)  # the same bytes again
    assert store.get_tagged(KEY) == (b"term 2", third)
    if backend(request) in NEW_TAG_PER_WRITE:
        assert third != second
        with pytest.raises(PreconditionFailed):
            store.put_if(KEY, b"term 3", second)
    else:
        assert third == second  # S3: the ETag is the bytes' MD5


def test_a_stale_tag_fails_and_changes_nothing(store: ObjectStore) -> None:
    old = store.put_if(KEY, b"a", None)
    current = store.put_if(KEY, b"b", old)
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, b"c", old)
    assert store.get_tagged(KEY) == (b"b", current)
    store.put(KEY, b"plain put")  # an unconditional write moves the tag too
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, b"d", current)
    assert store.get(KEY) == b"plain put"


def test_an_old_tag_never_matches_again(store: ObjectStore, request: pytest.FixtureRequest) -> None:
    """A-B-A: the object goes back to bytes it had; the first tag must not match (on ext4 the
    local store's third file even gets the first one's inode back)."""
    first = store.put_if(KEY, b"same", None)
    second = store.put_if(KEY, b"other", first)
    third = store.put_if(KEY, b"same", second)
    if backend(request) not in NEW_TAG_PER_WRITE:
        assert third == first  # S3: the same bytes, the same ETag; If-Match on it is correct
        return
    assert third != first
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, b"late", first)
    assert store.get_tagged(KEY) == (b"same", third)


def test_a_tag_of_a_deleted_object_fails_and_absent_then_holds(store: ObjectStore) -> None:
    tag = store.put_if(KEY, b"x", None)
    store.delete(KEY)
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, b"y", tag)
    assert store.get_tagged(KEY) is None
    again = store.put_if(KEY, b"z", None)
    assert store.get_tagged(KEY) == (b"z", again)


def test_large_objects_are_conditional_too(store: ObjectStore) -> None:
    """Past 8 MiB the adapters switch upload paths (GCS resumable, Azure blocks); the
    condition must hold on those too."""
    big = bytes(range(256)) * (9 * MiB // 256)
    tag = store.put_if(KEY, big, None)
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, big, None)
    newer = store.put_if(KEY, big[::-1], tag)
    with pytest.raises(PreconditionFailed):
        store.put_if(KEY, big, tag)
    assert store.get_tagged(KEY) == (big[::-1], newer)


@contextlib.contextmanager
def busy_switching() -> Iterator[None]:
    """Threads switch every 100 µs instead of 5 ms: a check-then-write that is not atomic (in
    a store, or in a fake server running in this process) gets interleaved."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _moto_objects_are_atomic() -> bool:
    """Whether tests/fakes/moto_server.py serializes moto's object requests (S3 decides a
    conditional write atomically; moto 5.2 checks If-Match, then writes, unlocked)."""
    from moto.s3.responses import S3Response

    return bool(getattr(S3Response._key_response, "ct_locked", False))


def _slow_s3_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write of moto's S3 backend waits 20 ms after its request's checks: racers that
    all passed a check that is not atomic with the write then all win, every time."""
    from moto.s3.models import S3Backend

    write = S3Backend.put_object

    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", slow)


def test_racing_writers_leave_exactly_one_winner_per_round(
    make_store: StoreFactory, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend(request) == "s3":
        _slow_s3_writes(monkeypatch)
        if not _moto_objects_are_atomic():
            request.applymarker(
                pytest.mark.xfail(
                    strict=True,
                    reason="moto checks If-Match/If-None-Match and then writes without a lock: "
                    "two racers both win until tests/fakes/moto_server.py serializes them",
                )
            )
    stores = [make_store() for _ in range(RACERS)]
    stores[0].put_if(KEY, b"start", None)
    for rnd in range(ROUNDS):
        read = threading.Barrier(RACERS)
        winners: list[int] = []
        lost: list[int] = []
        errors: list[BaseException] = []

        def race(
            i: int,
            rnd: int = rnd,
            read: threading.Barrier = read,
            winners: list[int] = winners,
            lost: list[int] = lost,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                found = stores[i].get_tagged(KEY)
                assert found is not None
                read.wait(timeout=30)  # everyone holds the same tag before anyone writes
                stores[i].put_if(KEY, f"{rnd}:{i}".encode(), found[1])
                winners.append(i)
            except PreconditionFailed:
                lost.append(i)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(RACERS)]
        with busy_switching():
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert not errors, errors
        assert len(winners) == 1, f"round {rnd}: winners {winners}"
        assert len(lost) == RACERS - 1
        assert stores[0].get(KEY) == f"{rnd}:{winners[0]}".encode()


def _process_racer(uri: str, barrier: Any, results: Any, i: int) -> None:
    store = LocalStore(uri)
    found = store.get_tagged(KEY)
    barrier.wait(30)
    try:
        store.put_if(KEY, f"p{i}".encode(), None if found is None else found[1])
        results.put(("won", i))
    except PreconditionFailed:
        results.put(("lost", i))


def test_local_racing_processes_leave_exactly_one_winner(tmp_path: Path) -> None:
    """The attached CLI and a local controller node are two processes: the folder's flock
    must keep processes apart, not only threads."""
    uri = f"file://{tmp_path}/bucket"
    LocalStore(uri).ensure_bucket()
    ctx = multiprocessing.get_context("fork")
    for rnd in range(3):
        barrier, results = ctx.Barrier(RACERS), ctx.Queue()
        procs = [
            ctx.Process(target=_process_racer, args=(uri, barrier, results, i))
            for i in range(RACERS)
        ]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(30)
        won = [i for what, i in outcomes if what == "won"]
        assert len(won) == 1, f"round {rnd}: winners {won}"
        assert LocalStore(uri).get(KEY) == f"p{won[0]}".encode()


# --- GCS: the two-request read, and the emulator's preconditions ------------------------------


def test_gcs_get_tagged_reads_again_when_replaced_between_its_requests(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_tagged reads the generation, then that generation's bytes: another writer in
    between must not pair the new bytes with the old generation."""
    store = _factory("gcs", request, tmp_path)()
    store.ensure_bucket()
    store.put_if(KEY, b"old", None)
    from google.cloud import storage as gcs

    download = gcs.Blob.download_as_bytes
    replaced: list[bool] = []

    def another_writer_first(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not replaced:
            replaced.append(True)
            store.put(KEY, b"new")  # lands between the metadata and the bytes
        return download(self, *args, **kwargs)

    monkeypatch.setattr(gcs.Blob, "download_as_bytes", another_writer_first)
    found = store.get_tagged(KEY)
    live = gcs.Client().bucket("cloudtrain-cond").get_blob(f"pfx/{KEY}")
    assert replaced and found == (b"new", str(live.generation))


@pytest.mark.usefixtures("gcs_emulator")
def test_the_gcs_emulator_checks_preconditions_as_gcs_does() -> None:
    """tests/fakes/gcs_emulator.py: without install_preconditions the emulator wrote whatever
    the precondition said."""
    from google.api_core import exceptions as api
    from google.cloud import storage as gcs

    bucket = gcs.Client().create_bucket("cloudtrain-pre")
    blob = bucket.blob("k")
    blob.upload_from_string(b"1", if_generation_match=0)
    first = int(blob.generation)
    with pytest.raises(api.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"2", if_generation_match=0)
    with pytest.raises(api.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"2", if_generation_match=first + 1)
    with pytest.raises(api.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"2", if_metageneration_match=7)
    bucket.blob("k").upload_from_string(b"2", if_generation_match=first)
    with pytest.raises(api.PreconditionFailed):
        bucket.blob("k").download_as_bytes(if_generation_match=first)
    with pytest.raises(api.NotFound):  # a generation that is no longer live
        bucket.blob("k", generation=first).download_as_bytes()
    with pytest.raises(api.PreconditionFailed):
        bucket.blob("k").delete(if_generation_match=first)
    assert bucket.blob("k").download_as_bytes() == b"2"
    with pytest.raises(api.PreconditionFailed):  # no live object: only 0 matches
        bucket.blob("absent").upload_from_string(b"x", if_generation_match=first)


# --- the wrappers ------------------------------------------------------------------------------


def test_retrying_store_never_retries_a_precondition(
    store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    retrying = RetryingStore(store)
    tag = retrying.put_if(KEY, b"a", None)
    assert retrying.get_tagged(KEY) == (b"a", tag)
    caplog.set_level(logging.INFO, logger=retry.log.name)
    with pytest.raises(PreconditionFailed):
        retrying.put_if(KEY, b"b", None)
    with pytest.raises(PreconditionFailed):
        retrying.put_if(KEY, b"b", "stale-" + tag)
    assert not [r for r in caplog.records if "retry" in r.getMessage()]
    assert retrying.get_tagged("missing") is None


def test_retrying_store_counts_one_call_per_precondition_and_retries_throttling() -> None:
    provider = wrap(MemoryProvider(), FaultPlan(store_latency_s=1e-6))
    retrying = RetryingStore(provider.store("mem://ct-r"))
    tag = retrying.put_if(KEY, b"a", None)
    calls = provider.store_faults.calls
    before = calls["put_if"]
    with pytest.raises(PreconditionFailed):
        retrying.put_if(KEY, b"b", None)
    assert calls["put_if"] - before == 1, "PreconditionFailed was retried"

    throttled = wrap(MemoryProvider(), FaultPlan(store_error_rate=0.5, seed=7))
    flaky = RetryingStore(throttled.store("mem://ct-t"))
    for i in range(20):  # every call gets through the throttling: TransientError is retried
        tag = flaky.put_if(KEY, str(i).encode(), None if i == 0 else tag)
        assert flaky.get_tagged(KEY) == (str(i).encode(), tag)
    assert throttled.store_faults.throttled["put_if"] > 0
    assert throttled.store_faults.throttled["get_tagged"] > 0


class LostReply:
    """A store whose first `put_if` writes and then loses its reply (a TransientError), as a
    dropped connection does after the cloud has written: test scaffolding around a real store."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.lost = 0

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.get_tagged(key)

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        new = self.inner.put_if(key, data, tag)
        if not self.lost:
            self.lost += 1
            raise TransientError("the reply was lost (test)")
        return new


def test_a_retried_put_if_after_a_lost_reply_fails_although_it_wrote() -> None:
    """What RetryingStore.put_if documents: PreconditionFailed means "read again", never
    "nothing was written"."""
    lossy = LostReply(MemoryProvider().store("mem://ct-lost"))
    retrying = RetryingStore(lossy)  # type: ignore[arg-type]
    with pytest.raises(PreconditionFailed):
        retrying.put_if(KEY, b"mine", None)
    found = retrying.get_tagged(KEY)
    assert found is not None and found[0] == b"mine"


def test_faulty_store_gates_conditional_calls_like_the_others() -> None:
    provider = wrap(MemoryProvider(), FaultPlan(store_latency_s=0.2))
    store = provider.store("mem://ct-slow")
    start = time.monotonic()
    tag = store.put_if(KEY, b"a", None)
    assert store.get_tagged(KEY) == (b"a", tag)
    assert time.monotonic() - start >= 0.4
    assert provider.store_faults.calls["put_if"] == 1
    assert provider.store_faults.calls["get_tagged"] == 1

    failing = wrap(MemoryProvider(), FaultPlan(store_error_rate=1.0))
    store = failing.store("mem://ct-down")
    with pytest.raises(TransientError):
        store.put_if(KEY, b"a", None)
    with pytest.raises(TransientError):
        store.get_tagged(KEY)
    assert failing.inner.store("mem://ct-down").get_tagged(KEY) is None  # never reached it


def test_a_paused_writer_arrives_with_a_stale_tag() -> None:
    """The lease race test's pattern: one writer reads, is paused (store latency) while
    another writes, and its write then fails."""
    inner = MemoryProvider()
    slow = wrap(inner, FaultPlan(store_latency_s=0.3)).store("mem://ct-pause")
    fast = inner.store("mem://ct-pause")
    tag = fast.put_if(KEY, b"term 1", None)
    outcome: list[object] = []

    def paused() -> None:
        try:
            outcome.append(slow.put_if(KEY, b"term 2 (stale)", tag))
        except PreconditionFailed as exc:
            outcome.append(exc)

    thread = threading.Thread(target=paused)
    thread.start()
    time.sleep(0.05)
    fast.put_if(KEY, b"term 2", tag)
    thread.join(10)
    assert isinstance(outcome[0], PreconditionFailed)
    assert fast.get(KEY) == b"term 2"


# --- what the fakes cannot produce ---------------------------------------------------------------


def test_s3_conflict_and_precondition_codes_are_precondition_failed() -> None:
    pytest.importorskip("botocore")
    from botocore.exceptions import ClientError

    from cloudtrain.providers.aws.errors import translate

    def error(code: str, status: int) -> ClientError:
        meta = {"HTTPStatusCode": status}
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": meta}, "PutObject")

    for code, status in (("ConditionalRequestConflict", 409), ("PreconditionFailed", 412)):
        err = translate(error(code, status), "put s3://b/k")
        assert isinstance(err, PreconditionFailed) and not err.retryable, code
    missing = error("NoSuchBucket", 404)
    assert isinstance(translate(missing, "put"), NotFound)


@pytest.mark.parametrize("name", ["s3", "gcs", "azure"])
def test_a_missing_bucket_is_not_found_not_a_precondition(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The lease reads None, then its create must say the bucket is gone (NotFound), not that
    someone else won (PreconditionFailed)."""
    missing = _factory(name, request, tmp_path, bucket="cloudtrain-cond-missing")()
    assert missing.get_tagged(KEY) is None
    with pytest.raises(NotFound):
        missing.put_if(KEY, b"x", None)
    with pytest.raises(NotFound):
        missing.put_if(KEY, b"x", "1")
