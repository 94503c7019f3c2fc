"""GcsStore (providers/gcp/storage.py) against gcp-storage-emulator (the error mapping is in
test_gcp_errors.py; presigned URLs and credentials errors are in test_gcp_signing.py; the shared
helpers are gcs_kit.py's).

The ObjectStore contract suite (tests/providers/test_contract.py) runs here against GcsStore
directly until a GcpProvider exists; then come the GCS specifics: URIs and keys, round trips,
NotFound, listings, idempotent and many-object deletes, 20 MB resumable uploads in 8 MiB chunks,
and the bucket's privacy settings (default bucket, a user's bucket).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("google.cloud.storage")

from google.api_core import exceptions as api
from google.cloud import storage

from cloudtrain.core.errors import (
    CredentialsError,
    NotFound,
    ProviderError,
)
from cloudtrain.providers.base import ObjectStore, Resource
from cloudtrain.providers.gcp import storage as gcs
from cloudtrain.providers.gcp.errors import (
    already_exists,
)
from cloudtrain.providers.gcp.storage import GcsStore
from tests.fakes.gcs_emulator import GcsEmulator, gcs_emulator, gcs_emulator_session
from tests.fakes.in_flight import InFlight
from tests.providers import test_contract as contract
from tests.unit.gcs_kit import FakeUserCredentials, emulated, new_store

__all__ = ["gcs_emulator", "gcs_emulator_session"]  # fixtures used by this module

MiB = 1024 * 1024


def raw() -> storage.Client:
    """A plain SDK client on the emulator (the test's own view of the buckets)."""
    return storage.Client()


# --- the contract suite, on GcsStore -----------------------------------------------------------

CONTRACT_STORE_TESTS = (
    "test_ensure_bucket_is_idempotent",
    "test_put_get_round_trip",
    "test_get_of_a_missing_key_is_not_found",
    "test_put_file_get_file_with_3mb",
    "test_list_is_sorted_and_prefix_exact",
    "test_delete_and_delete_prefix_are_idempotent",
    "test_presign_get_is_readable_by_curl",
    "test_presign_put_is_writable_by_curl",
)


@emulated
@pytest.mark.parametrize("name", CONTRACT_STORE_TESTS)
def test_object_store_contract(name: str, tmp_path: Path) -> None:
    """Each store test of the provider contract, with GcsStore as the provider's store."""
    provider = SimpleNamespace(store=lambda uri: GcsStore(uri))
    harness = SimpleNamespace(
        name="gcp",
        provider=provider,
        store_uri="gs://cloudtrain-contract/pfx",
        case=SimpleNamespace(fetchable_urls=True),
    )
    test = getattr(contract, name)
    if "tmp_path" in test.__code__.co_varnames[: test.__code__.co_argcount]:
        test(harness, tmp_path)
    else:
        test(harness)


# --- URIs and keys -----------------------------------------------------------------------------


def test_uri_is_normalized_and_building_a_store_makes_no_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gcs.google.auth, "default", lambda: pytest.fail("no ADC lookup"))
    store = GcsStore("gs://cloudtrain-norm/runs/a/", "proj")
    assert (store.uri, store.bucket, store.prefix, store.project) == (
        "gs://cloudtrain-norm/runs/a",
        "cloudtrain-norm",
        "runs/a",
        "proj",
    )
    assert isinstance(store, ObjectStore)
    assert GcsStore("gs://cloudtrain-norm").uri == "gs://cloudtrain-norm"
    for bad in ("s3://bucket", "gs://", "gs://Upper_Case", "bucket/key", "gs://ab", "gs://goog-x"):
        with pytest.raises(ProviderError):
            GcsStore(bad)


@emulated
def test_keys_are_relative_to_the_prefix_and_validated() -> None:
    store = new_store("gs://cloudtrain-norm/runs/a")
    store.put("x/1", b"1")
    GcsStore("gs://cloudtrain-norm/runs/ab").put("x/2", b"2")
    assert raw().bucket("cloudtrain-norm").blob("runs/a/x/1").download_as_bytes() == b"1"
    assert [o.key for o in store.list("")] == ["x/1"], "a sibling prefix is not listed"
    for key in ("", "/abs", "a/../b"):
        with pytest.raises(ProviderError):
            store.put(key, b"x")
    with pytest.raises(ProviderError):
        store.list("/abs")


# --- objects -----------------------------------------------------------------------------------


@emulated
def test_round_trips_with_odd_keys_and_a_second_handle() -> None:
    store = new_store()
    payloads = {"a b/ü €.json": b'{"x": 1}', "empty": b"", "bin": bytes(range(256)) * 10}
    for key, data in payloads.items():
        store.put(key, data)
    for key, data in payloads.items():
        assert store.get(key) == data
    store.put("bin", b"new")
    assert GcsStore(store.uri).get("bin") == b"new", "a second handle sees the same objects"
    assert {o.key: o.size for o in store.list("")} == {
        "a b/ü €.json": 8,
        "bin": 3,
        "empty": 0,
    }


@emulated
def test_missing_objects_and_buckets(tmp_path: Path) -> None:
    store = new_store()
    with pytest.raises(NotFound) as err:
        store.get("nope")
    assert isinstance(err.value.__cause__, api.NotFound)
    assert "gs://cloudtrain-test/pfx/nope" in str(err.value)
    out = tmp_path / "dl" / "out.bin"
    with pytest.raises(NotFound):
        store.get_file("nope", str(out))
    assert list(out.parent.iterdir()) == [], "no file, no temporary file left behind"

    nobucket = GcsStore("gs://cloudtrain-missing/p")
    with pytest.raises(NotFound):
        nobucket.get("k")
    with pytest.raises(NotFound):
        nobucket.list("")
    nobucket.delete("k")
    assert nobucket.delete_prefix("") == 0


@emulated
def test_get_file_replaces_an_existing_file_whole(tmp_path: Path) -> None:
    store = new_store()
    store.put("ckpt/model.bin", b"v2" * 1000)
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"v1")
    store.get_file("ckpt/model.bin", str(dest))
    assert dest.read_bytes() == b"v2" * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


@emulated
def test_list_is_sorted_prefix_exact_and_skips_folder_placeholders() -> None:
    store = new_store()
    for key in ["b", "a/b/x", "ab", "a/bc", "a/b/y/z"]:
        store.put(key, b"x")
    raw().bucket("cloudtrain-test").blob("pfx/a/").upload_from_string(b"")  # console folder
    assert [o.key for o in store.list("a/b")] == ["a/b/x", "a/b/y/z", "a/bc"]
    assert [o.key for o in store.list("")] == ["a/b/x", "a/b/y/z", "a/bc", "ab", "b"]
    infos = store.list("b")
    assert infos[0].size == 1 and abs(infos[0].updated - time.time()) < 300
    assert store.delete_prefix("a/") == 4, "delete_prefix removes the placeholder too"
    assert [b.name for b in raw().list_blobs("cloudtrain-test")] == ["pfx/ab", "pfx/b"]


@emulated
def test_deletes_are_idempotent() -> None:
    store = new_store()
    store.put("status/w-0.json", b"{}")
    store.delete("status/w-0.json")
    store.delete("status/w-0.json")
    store.delete("never/was")
    with pytest.raises(NotFound):
        store.get("status/w-0.json")
    assert store.delete_prefix("status/") == 0


@emulated
def test_delete_prefix_of_many_objects(
    gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 single deletes, DELETE_PARALLEL of them in flight at once, counted at the SDK's
    `Blob.delete` (the time it takes is benchmarks/unit_timings.py's gcs_delete_300_s)."""
    store = new_store()
    bucket = raw().bucket("cloudtrain-test")
    for i in range(300):
        bucket.blob(f"pfx/logs/w-0/{i:04d}.log").upload_from_string(b"line\n")
    store.put("logs/w-01/0.log", b"other")
    deletes = InFlight.spy(monkeypatch, storage.Blob, "delete", hold=gcs.DELETE_PARALLEL)
    assert store.delete_prefix("logs/w-0/") == 300
    assert deletes.calls == 300 and deletes.peak == gcs.DELETE_PARALLEL > 1
    assert store.list("logs/w-0/") == []
    assert [o.key for o in store.list("")] == ["logs/w-01/0.log"]
    assert store.delete_prefix("logs/w-0/") == 0


@emulated
def test_20mb_file_round_trips_as_a_resumable_upload_in_8mib_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = count_resumable_chunks(monkeypatch)
    store = new_store()
    data = os.urandom(20 * 1000 * 1000)
    src = tmp_path / "big.bin"
    src.write_bytes(data)

    store.put_file("ckpt/big.bin", str(src))
    total = len(data)
    assert chunks == [
        f"bytes 0-{8 * MiB - 1}/{total}",
        f"bytes {8 * MiB}-{16 * MiB - 1}/{total}",
        f"bytes {16 * MiB}-{total - 1}/{total}",
    ], "20 MB = 8 MiB + 8 MiB + the rest"
    dest = tmp_path / "out" / "big.bin"
    store.get_file("ckpt/big.bin", str(dest))
    assert dest.read_bytes() == data
    assert [(o.key, o.size) for o in store.list("ckpt/")] == [("ckpt/big.bin", len(data))]

    chunks.clear()
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(MiB))
    store.put_file("ckpt/small.bin", str(small))
    assert chunks == [], "8 MiB or less goes up in one request"
    store.put("ckpt/big2.bin", data)
    assert len(chunks) == 3, "put() of large bytes is chunked too"
    assert store.get("ckpt/big2.bin") == data


def count_resumable_chunks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the Content-Range of every resumable-upload PUT the emulator receives."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    seen: list[str] = []

    def counting(request: Any, response: Any, storage_: Any, *a: Any, **kw: Any) -> Any:
        seen.append(request.get_header("Content-Range", ""))
        return objects.upload_partial(request, response, storage_, *a, **kw)

    for _regex, handlers in server.HANDLERS:
        if handlers.get("PUT") is objects.upload_partial:
            monkeypatch.setitem(handlers, "PUT", counting)
    return seen


@emulated
def test_a_store_is_safe_to_share_between_threads() -> None:
    store = new_store()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(5):
                store.put(f"t/{i}/{j}", f"{i}-{j}".encode())
                assert store.get(f"t/{i}/{j}") == f"{i}-{j}".encode()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.list("t/")) == 30


# --- the bucket --------------------------------------------------------------------------------


def bucket_settings(name: str) -> tuple[bool, str]:
    bucket = raw().get_bucket(name)
    iam = bucket.iam_configuration
    return iam.uniform_bucket_level_access_enabled, iam.public_access_prevention


@emulated
def test_default_bucket_is_created_private() -> None:
    resource = GcsStore("gs://cloudtrain-proj-us-central1/p").ensure_bucket()
    assert resource == Resource("gcp", "bucket", "gs://cloudtrain-proj-us-central1/p", "us", "")
    assert bucket_settings("cloudtrain-proj-us-central1") == (True, "enforced")


@emulated
def test_default_bucket_that_lost_its_settings_gets_them_back() -> None:
    raw().create_bucket("cloudtrain-loose")
    raw().bucket("cloudtrain-loose").blob("keep").upload_from_string(b"k")
    assert bucket_settings("cloudtrain-loose") == (False, "inherited")
    store = GcsStore("gs://cloudtrain-loose")
    store.ensure_bucket()
    assert bucket_settings("cloudtrain-loose") == (True, "enforced")
    assert store.get("keep") == b"k"
    store.ensure_bucket()  # already private: nothing to change


@emulated
def test_a_users_bucket_is_left_as_it_is_and_a_missing_one_is_created_private() -> None:
    raw().create_bucket("team-bucket")
    GcsStore("gs://team-bucket/runs").ensure_bucket()
    assert bucket_settings("team-bucket") == (False, "inherited"), "never changed"
    GcsStore("gs://new-team-bucket/runs").ensure_bucket()
    assert bucket_settings("new-team-bucket") == (True, "enforced")


@emulated
def test_bucket_location_and_project_are_passed_on_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []
    original = storage.Client.create_bucket

    def spy(self: storage.Client, bucket: Any, **kwargs: Any) -> Any:
        calls.append({"project": kwargs.get("project"), "location": kwargs.get("location")})
        return original(self, bucket, **kwargs)

    monkeypatch.setattr(storage.Client, "create_bucket", spy)
    GcsStore("gs://cloudtrain-loc", "my-proj", location="us-central1").ensure_bucket()
    assert calls == [{"project": "my-proj", "location": "us-central1"}]


def test_creating_a_bucket_without_a_project_says_how_to_set_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    store = GcsStore("gs://cloudtrain-noproj", credentials=FakeUserCredentials())
    monkeypatch.setattr(store, "_existing_bucket", lambda: None)
    with pytest.raises(ProviderError, match="no Google Cloud project") as err:
        store.ensure_bucket()
    assert "GOOGLE_CLOUD_PROJECT" in (err.value.hint or "")


@emulated
def test_a_concurrent_create_of_the_same_bucket_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    store = GcsStore("gs://cloudtrain-race")
    raw().create_bucket("cloudtrain-race")  # someone (another thread of ours) was faster
    monkeypatch.setattr(store, "_existing_bucket", lambda: None)
    assert store.ensure_bucket().id == "gs://cloudtrain-race"
    assert bucket_settings("cloudtrain-race") == (True, "enforced")


def forbid_bucket_get(monkeypatch: pytest.MonkeyPatch) -> None:
    """buckets.get answers 403, as for a bucket of another project or object-level access."""

    def forbidden(self: Any, *args: Any, **kwargs: Any) -> None:
        raise api.Forbidden(f"caller does not have storage.buckets.get access to {self.name}")

    monkeypatch.setattr(storage.Bucket, "reload", forbidden)


@emulated
def test_a_users_bucket_shared_at_object_level_is_checked_by_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw().create_bucket("team-objects-only")
    forbid_bucket_get(monkeypatch)
    store = GcsStore("gs://team-objects-only/runs")
    assert store.ensure_bucket() == Resource("gcp", "bucket", store.uri, None, "")
    store.put("k", b"v")
    assert store.get("k") == b"v"


@emulated
def test_a_default_bucket_name_we_cannot_read_is_explained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forbid_bucket_get(monkeypatch)
    with pytest.raises(CredentialsError, match="another project") as err:
        GcsStore("gs://cloudtrain-taken").ensure_bucket()
    assert "checkpoint: gs://" in (err.value.hint or "")


@emulated
def test_a_name_taken_by_another_project_is_a_provider_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw().create_bucket("cloudtrain-theirs")  # 409 on create, then 403 on get: not ours
    store = GcsStore("gs://cloudtrain-theirs")
    monkeypatch.setattr(store, "_existing_bucket", lambda: None)
    forbid_bucket_get(monkeypatch)
    with pytest.raises(ProviderError, match="belongs to another project") as err:
        store.ensure_bucket()
    assert not isinstance(err.value, CredentialsError)
    assert isinstance(err.value.__cause__, ProviderError) and already_exists(err.value.__cause__)
