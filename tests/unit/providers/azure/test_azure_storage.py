"""BlobStore (providers/azure/storage.py) against Azurite (the error mapping is in
test_azure_errors.py).

The ObjectStore contract suite runs on Azure in tests/providers (its `azure` case); here are the
Azure specifics: URIs and keys, round trips, NotFound, listings, idempotent, batched
and failing deletes, 20 MB block uploads in 8 MiB blocks, the container's privacy, account-key
SAS URLs used by curl, user delegation SAS through a token credential (Azurite over HTTPS with
OAuth), and credentials errors that never show the account key.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.storage.blob")

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobServiceClient, ContainerClient

from cloudtrain.core.errors import CredentialsError, NotFound, ProviderError, TransientError
from cloudtrain.providers.azure import storage as azstorage
from cloudtrain.providers.azure.storage import BLOB_TYPE_HEADER, BlobStore
from cloudtrain.providers.base import ObjectStore, Resource
from cloudtrain.providers.parallel import parallel_map
from tests.fakes import azurite as fake
from tests.fakes.azurite import azurite, azurite_oauth, azurite_oauth_session, azurite_session
from tests.fakes.in_flight import InFlight
from tests.fakes.shell import require_tool

__all__ = ["azurite", "azurite_oauth", "azurite_oauth_session", "azurite_session"]  # fixtures

ACCOUNT = fake.ACCOUNT
MiB = 1024 * 1024
URI = f"az://{ACCOUNT}/cloudtrain-test/pfx"
emulated = pytest.mark.usefixtures("azurite")


def raw() -> BlobServiceClient:
    """A plain SDK client on the emulator (the test's own view of the blobs)."""
    return BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])


def names(container: str = "cloudtrain-test") -> list[str]:
    return [b.name for b in raw().get_container_client(container).list_blobs()]


def query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))


def curl(*args: str) -> bytes:
    """`curl -fsS ARGS`'s output (fails without curl: `require_tool`)."""
    return subprocess.run(
        [require_tool("curl"), "-fsS", *args], check=True, capture_output=True, timeout=30
    ).stdout


def new_store(uri: str = URI, **kwargs: Any) -> BlobStore:
    store = BlobStore(uri, **kwargs)
    store.ensure_bucket()
    return store


def expiry(url: str) -> float:
    return datetime.datetime.fromisoformat(query(url)["se"].replace("Z", "+00:00")).timestamp()


# --- URIs and keys -----------------------------------------------------------------------------


def test_uri_is_normalized_and_building_a_store_makes_no_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(azstorage, "DefaultAzureCredential", lambda: pytest.fail("no lookup"))
    monkeypatch.setattr(BlobServiceClient, "__init__", lambda *a, **k: pytest.fail("no client"))
    store = BlobStore("az://acct01/cloudtrain-norm/runs/a/")
    assert (store.uri, store.account, store.container, store.prefix) == (
        "az://acct01/cloudtrain-norm/runs/a",
        "acct01",
        "cloudtrain-norm",
        "runs/a",
    )
    assert store.account_url == "https://acct01.blob.core.windows.net"
    assert isinstance(store, ObjectStore)
    assert BlobStore("az://acct01/c-1").uri == "az://acct01/c-1"
    bad = (  # noqa: SIM905 - one string keeps the list short
        "s3://acct01/cont az:// az://acct01 az://acct01/ az://Acct01/cont az://ab/cont "
        "az://acct-01/cont az://acct01/ab az://acct01/-cont az://acct01/cont- az://acct01/co--nt "
        "az://acct01/Cont az://acct01/cont?sig=x acct01/cont"
    ).split()
    for uri in bad:
        with pytest.raises(ProviderError, match="not an Azure Blob URI"):
            BlobStore(uri)


@emulated
def test_keys_are_relative_to_the_prefix_and_validated() -> None:
    store = new_store(f"az://{ACCOUNT}/cloudtrain-test/runs/a")
    store.put("x/1", b"1")
    BlobStore(f"az://{ACCOUNT}/cloudtrain-test/runs/ab").put("x/2", b"2")
    assert names() == ["runs/a/x/1", "runs/ab/x/2"]
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
    assert BlobStore(store.uri).get("bin") == b"new", "a second handle sees the same objects"
    assert {o.key: o.size for o in store.list("")} == {"a b/ü €.json": 8, "bin": 3, "empty": 0}
    props = raw().get_blob_client("cloudtrain-test", "pfx/bin").get_blob_properties()
    assert props.content_settings.content_type == "application/octet-stream"


@emulated
def test_missing_objects_and_containers(tmp_path: Path) -> None:
    store = new_store()
    with pytest.raises(NotFound) as err:
        store.get("nope")
    assert isinstance(err.value.__cause__, ResourceNotFoundError)
    assert f"az://{ACCOUNT}/cloudtrain-test/pfx/nope" in str(err.value)
    assert "BlobNotFound" in str(err.value)
    out = tmp_path / "dl" / "out.bin"
    with pytest.raises(NotFound):
        store.get_file("nope", str(out))
    assert list(out.parent.iterdir()) == [], "no file, no temporary file left behind"

    nocontainer = BlobStore(f"az://{ACCOUNT}/cloudtrain-missing/p")
    with pytest.raises(NotFound, match="ContainerNotFound"):
        nocontainer.get("k")
    with pytest.raises(NotFound):
        nocontainer.list("")
    nocontainer.delete("k")
    assert nocontainer.delete_prefix("") == 0


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
    raw().get_blob_client("cloudtrain-test", "pfx/a/").upload_blob(b"")  # a "folder"
    assert [o.key for o in store.list("a/b")] == ["a/b/x", "a/b/y/z", "a/bc"]
    assert [o.key for o in store.list("")] == ["a/b/x", "a/b/y/z", "a/bc", "ab", "b"]
    infos = store.list("b")
    assert infos[0].size == 1 and abs(infos[0].updated - time.time()) < 300
    assert store.delete_prefix("a/") == 4, "delete_prefix removes the placeholder too"
    assert names() == ["pfx/ab", "pfx/b"]


@emulated
def test_deletes_are_idempotent_and_take_snapshots_along() -> None:
    store = new_store()
    store.put("status/w-0.json", b"{}")
    raw().get_blob_client("cloudtrain-test", "pfx/status/w-0.json").create_snapshot()
    store.delete("status/w-0.json")  # Azure refuses a plain delete of a blob with snapshots
    store.delete("status/w-0.json")
    store.delete("never/was")
    with pytest.raises(NotFound):
        store.get("status/w-0.json")
    assert store.delete_prefix("status/") == 0


@emulated
def test_delete_prefix_of_many_objects_uses_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """300 blobs go in 2 blob batches (256 + 44) sent at once, counted at the SDK's
    `delete_blobs` (the time it takes is benchmarks/unit_timings.py's azure_delete_300_s)."""
    store = new_store()
    container = raw().get_container_client("cloudtrain-test")
    for i in range(300):
        container.upload_blob(f"pfx/logs/w-0/{i:04d}.log", b"line\n")
    container.get_blob_client("pfx/logs/w-0/0001.log").create_snapshot()
    store.put("logs/w-01/0.log", b"other")
    batches = InFlight.spy(monkeypatch, ContainerClient, "delete_blobs", hold=2)
    assert store.delete_prefix("logs/w-0/") == 300
    assert sorted(batches.arg_counts) == [300 - azstorage.DELETE_BATCH, azstorage.DELETE_BATCH]
    assert batches.peak == 2  # both batches in flight at once (DELETE_PARALLEL allows 4)
    assert store.list("logs/w-0/") == []
    assert [o.key for o in store.list("")] == ["logs/w-01/0.log"]
    assert store.delete_prefix("logs/w-0/") == 0


@emulated
def test_a_failing_delete_names_the_blob_and_the_others_still_go() -> None:
    store = new_store()
    for key in ("d/1", "d/2", "d/3"):
        store.put(key, b"x")
    lease = raw().get_blob_client("cloudtrain-test", "pfx/d/2").acquire_lease(lease_duration=-1)
    with pytest.raises(ProviderError) as err:
        store.delete_prefix("d/")
    assert "pfx/d/2" in str(err.value) and "LeaseIdMissing" in str(err.value)
    assert not isinstance(err.value, (NotFound, TransientError))
    assert names() == ["pfx/d/2"]
    with pytest.raises(ProviderError, match="LeaseIdMissing"):
        store.delete("d/2")
    lease.release()
    assert store.delete_prefix("d/") == 1


@emulated
def test_20mb_file_round_trips_in_8mib_blocks(tmp_path: Path) -> None:
    store = new_store()
    data = os.urandom(20 * 1000 * 1000)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store.put_file("ckpt/big.bin", str(src))
    blob = raw().get_blob_client("cloudtrain-test", "pfx/ckpt/big.bin")
    committed, _ = blob.get_block_list("committed")
    assert [b.size for b in committed] == [8 * MiB, 8 * MiB, len(data) - 16 * MiB]
    dest = tmp_path / "out" / "big.bin"
    store.get_file("ckpt/big.bin", str(dest))
    assert dest.read_bytes() == data
    assert store.get("ckpt/big.bin") == data
    store.put_file("ckpt/big.bin", str(src))  # idempotent
    assert [(o.key, o.size) for o in store.list("ckpt/")] == [("ckpt/big.bin", len(data))]

    small = tmp_path / "small.bin"
    small.write_bytes(b"s" * (8 * MiB))
    store.put_file("ckpt/small.bin", str(small))
    single = raw().get_blob_client("cloudtrain-test", "pfx/ckpt/small.bin")
    assert single.get_block_list("committed")[0] == [], "8 MiB goes up in one Put Blob"


@emulated
def test_one_store_is_safe_to_share_between_threads() -> None:
    store = new_store()

    def work(i: int) -> bytes:
        store.put(f"t/{i}", str(i).encode() * 1000)
        return store.get(f"t/{i}")

    assert parallel_map(work, list(range(16)), 16) == [str(i).encode() * 1000 for i in range(16)]
    assert len(store.list("t/")) == 16


# --- the container -----------------------------------------------------------------------------


@emulated
def test_ensure_bucket_creates_a_private_container_and_is_idempotent() -> None:
    store = BlobStore(URI)
    results = parallel_map(lambda s: s.ensure_bucket(), [store, BlobStore(URI)], 2)
    expected = Resource(provider="azure", kind="bucket", id=URI, region=None, run_id="")
    assert results == [expected, expected], "concurrent creates both succeed"
    props = raw().get_container_client("cloudtrain-test").get_container_properties()
    assert props.public_access is None, "no anonymous access"
    store.put("k", b"v")
    assert store.ensure_bucket() == expected
    assert store.get("k") == b"v"


# --- presigned URLs ----------------------------------------------------------------------------


@emulated
def test_presigned_urls_work_with_curl(azurite: fake.Azurite, tmp_path: Path) -> None:
    store = new_store()
    data = os.urandom(50_000)
    store.put("runs/r/bundle/a b.tar.gz", data)
    url = store.presign_get("runs/r/bundle/a b.tar.gz", ttl_s=600)
    assert url.startswith(f"{azurite.endpoint}/cloudtrain-test/pfx/runs/r/bundle/a%20b.tar.gz?")
    params = query(url)
    assert (params["sp"], params["sr"]) == ("r", "b")
    assert "spr" not in params, "http allowed: the emulator's endpoint is http"
    assert curl(url) == data
    assert curl("-H", BLOB_TYPE_HEADER, url) == data, "the PUT header does not hurt a GET"

    log = tmp_path / "boot.log"
    log.write_text("phase 1\n")
    put_url = store.presign_put("runs/r/bootstrap/w-0.log", ttl_s=600)
    assert query(put_url)["sp"] == "cw"
    with pytest.raises(subprocess.CalledProcessError) as refused:
        curl("-T", str(log), put_url)  # plain `curl -T`: no x-ms-blob-type
    assert b"400" in refused.value.stderr
    curl("-H", BLOB_TYPE_HEADER, "-T", str(log), put_url)
    assert store.get("runs/r/bootstrap/w-0.log") == b"phase 1\n"
    log.write_text("replaced\n")
    curl("-H", BLOB_TYPE_HEADER, "-T", str(log), put_url)
    assert store.get("runs/r/bootstrap/w-0.log") == b"replaced\n"

    with pytest.raises(subprocess.CalledProcessError):
        curl(store.presign_get("runs/r/missing"))
    with pytest.raises(subprocess.CalledProcessError):  # a GET URL cannot write
        curl("-H", BLOB_TYPE_HEADER, "-T", str(log), url)
    other = url.replace("a%20b.tar.gz", "other.tar.gz")
    with pytest.raises(subprocess.CalledProcessError):  # signed for one blob only
        curl(other)


@emulated
def test_sas_lifetime_is_capped_at_an_hour_and_expires() -> None:
    store = new_store()
    store.put("k", b"v")
    now = time.time()
    assert now + 3590 <= expiry(store.presign_get("k", ttl_s=99_999)) <= now + 3602
    assert now + 3590 <= expiry(store.presign_put("k", ttl_s=7200)) <= now + 3602
    assert expiry(store.presign_get("k", ttl_s=600)) <= now + 602
    short = store.presign_get("k", ttl_s=0)  # at least one second
    assert expiry(short) <= now + 2
    time.sleep(max(0.0, expiry(short) - time.time()) + 1.1)
    with pytest.raises(subprocess.CalledProcessError):
        curl(short)


# --- credentials -------------------------------------------------------------------------------


@emulated
def test_no_account_key_in_any_error(
    azurite: fake.Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    new_store().put("k", b"v")
    wrong_key = fake.ACCOUNT_KEY.replace("Eby8", "AAAA")
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        azurite.connection_string.replace(fake.ACCOUNT_KEY, wrong_key),
    )
    with pytest.raises(CredentialsError) as denied:
        BlobStore(URI).get("k")
    dead = azurite.connection_string.replace(f":{azurite.port}/", ":9/")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", dead)
    with pytest.raises(TransientError) as unreachable:
        BlobStore(URI, client_options={"retry_total": 0}).get("k")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountKey={wrong_key};junk")
    with pytest.raises(CredentialsError, match="malformed") as malformed:
        BlobStore(URI).get("k")
    for err in (denied.value, unreachable.value, malformed.value):
        text = f"{err} {err.hint}"
        assert fake.ACCOUNT_KEY not in text and wrong_key not in text and "AccountKey=" not in text
        assert "sig=" not in text
    assert "Storage Blob Data Contributor" in (denied.value.hint or "")
    assert malformed.value.__cause__ is None, "the malformed string is not kept as the cause"


@emulated
def test_connection_strings_for_another_account_or_without_a_key(
    azurite: fake.Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CredentialsError, match="for account 'devstoreaccount1', not 'other01'"):
        BlobStore("az://other01/cloudtrain-test").get("k")
    sas_only = f"BlobEndpoint={azurite.endpoint};SharedAccessSignature=sv=2025-11-05&sig=SECRET"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", sas_only)
    with pytest.raises(CredentialsError, match="no AccountKey") as err:
        BlobStore(URI).presign_get("k")
    assert "SECRET" not in str(err.value)


def test_token_credentials_sign_with_a_user_delegation_key(
    azurite_oauth: fake.Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No connection string: DefaultAzureCredential (here a fake Entra ID token source) against
    the account URL, made on first use and shared by stores; SAS URLs are user delegation SAS,
    one key per store. (Azurite 3.35 cannot check these URLs' signatures: see
    tests/fakes/azurite.py.)"""
    made: list[fake.FakeEntraCredential] = []

    def default_credential() -> fake.FakeEntraCredential:
        made.append(fake.FakeEntraCredential())
        return made[-1]

    monkeypatch.setattr(azstorage, "DefaultAzureCredential", default_credential)
    keys: list[Any] = []
    original = BlobServiceClient.get_user_delegation_key

    def counting(self: BlobServiceClient, *args: Any, **kwargs: Any) -> Any:
        keys.append(original(self, *args, **kwargs))
        return keys[-1]

    monkeypatch.setattr(BlobServiceClient, "get_user_delegation_key", counting)
    uri = f"az://{ACCOUNT}/cloudtrain-oauth/p"
    options = {"connection_verify": azurite_oauth.ca_pem}
    store = BlobStore(uri, account_url=azurite_oauth.endpoint, client_options=options)
    assert made == [], "building a store makes no credential"
    store.ensure_bucket()
    store.put("k", b"token-authenticated")
    assert store.get("k") == b"token-authenticated"
    assert len(made) == 1 and made[0].calls >= 1
    second = BlobStore(uri, account_url=azurite_oauth.endpoint, client_options=options)
    assert second.get("k") == b"token-authenticated"
    assert len(made) == 1, "one DefaultAzureCredential per process (and its token cache)"

    now = time.time()
    get_url = store.presign_get("k", ttl_s=99_999)
    put_url = store.presign_put("k", ttl_s=60)
    assert len(keys) == 1, "the delegation key is reused"
    params = query(get_url)
    assert (params["skoid"], params["sktid"]) == (fake.OBJECT_ID, fake.TENANT)
    assert (params["sp"], params["sr"], params["spr"]) == ("r", "b", "https")
    assert now + 3590 <= expiry(get_url) <= now + 3602
    assert query(put_url)["sp"] == "cw" and expiry(put_url) <= now + 62
    assert get_url.startswith(f"{azurite_oauth.endpoint}/cloudtrain-oauth/p/k?")


def test_the_box_blob_endpoint_is_test_only_and_path_style(monkeypatch: pytest.MonkeyPatch) -> None:
    # on Azure (unset) the account's own endpoint; the box's front: path style, like Azurite
    monkeypatch.delenv(azstorage.BLOB_ENDPOINT_ENV, raising=False)
    assert BlobStore("az://acct1/box").account_url == "https://acct1.blob.core.windows.net"
    monkeypatch.setenv(azstorage.BLOB_ENDPOINT_ENV, "https://127.0.0.1:4443/")
    assert BlobStore("az://acct1/box").account_url == "https://127.0.0.1:4443/acct1"
    given = BlobStore("az://acct1/box", account_url="https://other.example/acct1")
    assert given.account_url == "https://other.example/acct1"  # an explicit one wins
