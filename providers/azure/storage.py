"""Azure Blob Storage as a cloudtrain ObjectStore: `az://ACCOUNT/CONTAINER[/prefix]`, keys
relative to the prefix.

Every SDK call runs inside `azure_errors(...)`, which names the object and turns azure-core /
azure-identity exceptions into `cloudtrain.core.errors` types; nothing above this module sees an SDK
exception. Nothing is logged, and no message carries an account key or a SAS signature.

- Credentials: `AZURE_STORAGE_CONNECTION_STRING` when set (Azurite offline, or a user's own
  key), and it must name this store's account; otherwise the process's one
  `DefaultAzureCredential` (az login, AZURE_CLIENT_* variables, a VM's managed identity)
  against `https://ACCOUNT.blob.core.windows.net`; chosen once per store, on first use. An
  Azure AD identity needs a data role on the account ("Storage Blob Data Contributor"): Owner
  or Contributor alone cannot read blobs.
- Containers: `ensure_bucket` creates a missing container private (no anonymous access); the
  storage account itself is made by the compute side, not here. Azure encrypts every blob at
  rest (Microsoft-managed keys).
- Blobs: whole-object writes (one Put Blob up to 8 MiB, then 8 MiB blocks uploaded in parallel
  and committed at once); put_file/get_file resume after a failure (blob_transfers.py);
  downloads land in a hidden sidecar that is renamed when complete.
- Presigned URLs: SAS, at most one hour; see `presign_get`. A PUT through a SAS URL must carry
  `x-ms-blob-type: BlockBlob` (see `presign_put`).

Test-only: `CLOUDTRAIN_AZURE_BLOB_ENDPOINT=https://host:port` makes a store without a connection
string reach its account at `https://host:port/ACCOUNT` (path style, as the emulators serve),
with its token credential: that is how a node VM of the offline box reaches the box's
authorizing Blob front with its managed identity (tests/fakes/blob_authorizer.py). Unset on
Azure: the account's own `https://ACCOUNT.blob.core.windows.net`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import (
    BlobSasPermissions,
    BlobServiceClient,
    ContentSettings,
    UserDelegationKey,
    generate_blob_sas,
)

from cloudtrain.core import env
from cloudtrain.core.errors import (
    CredentialsError,
    NotFound,
    PreconditionFailed,
    ProviderError,
    TooLarge,
)
from cloudtrain.providers import transfer
from cloudtrain.providers.azure import blob_transfers
from cloudtrain.providers.azure.errors import (
    ACCOUNT_NOT_FOUND,
    already_exists,
    azure_errors,
    error_codes,
    translate,
)
from cloudtrain.providers.base import ObjectInfo, Resource, within
from cloudtrain.providers.parallel import parallel_map
from cloudtrain.providers.transfer import Progress
from cloudtrain.providers.uri_rules import uri_problem

try:
    from azure.identity import DefaultAzureCredential
except ImportError:  # pragma: no cover - azure-identity not installed (connection strings only)
    DefaultAzureCredential = None  # type: ignore[assignment,misc]

MiB = 1024 * 1024
BLOCK_SIZE = 8 * MiB  # larger blobs go up as blocks of this size...
SINGLE_PUT_MAX = 8 * MiB  # ...anything up to this in one Put Blob request
MAX_CONCURRENCY = 8  # parallel block uploads / range downloads per transfer
MAX_PRESIGN_TTL_S = 3600
DELEGATION_KEY_TTL = datetime.timedelta(hours=2)  # reused while it outlives the SAS asked for
CLOCK_SKEW = datetime.timedelta(minutes=5)
DELETE_BATCH = 256  # the most subrequests one blob batch takes
DELETE_PARALLEL = 4  # batches in flight at once
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
BLOB_ENDPOINT_ENV = env.AZURE_BLOB_ENDPOINT.name  # test-only: the box's Blob front
BLOB_TYPE_HEADER = "x-ms-blob-type: BlockBlob"  # what a PUT through a SAS URL must send
OCTET = "application/octet-stream"
# The SDK's storage retry waits 15 s before the first retry; these keep a retry to ~1-10 s.
CLIENT_OPTIONS: Mapping[str, Any] = {
    "max_block_size": BLOCK_SIZE,
    "max_single_put_size": SINGLE_PUT_MAX,
    "retry_total": 3,
    "initial_backoff": 1,
    "increment_base": 3,
}
CONNECTION_HINT = (
    "unset AZURE_STORAGE_CONNECTION_STRING to use your Azure login, or set it to a connection "
    "string of the store's account (Azure portal: Storage account > Access keys)"
)
_OK_DELETE_STATUS = frozenset({200, 202, 204, 404})
# What a conditional Put Blob that lost answers (learn.microsoft.com/rest/api/storageservices/
# specifying-conditional-headers-for-blob-service-operations): 412 ConditionNotMet for If-Match,
# 409 BlobAlreadyExists for If-None-Match: * (the SDK reports overwrite=False's 412 so).
LOST_CONDITION_CODES = frozenset({"ConditionNotMet", "412", "BlobAlreadyExists"})


_CREDENTIAL_LOCK = threading.Lock()
_CREDENTIALS: dict[Any, Any] = {}  # DefaultAzureCredential (the class) -> its one instance


def default_credential() -> Any:
    """The process's one DefaultAzureCredential, made on first use (its token cache is shared:
    each new instance would ask again, and with `az login` that is a subprocess each time).
    Thread-safe; makes no call itself."""
    factory = DefaultAzureCredential
    if factory is None:
        raise CredentialsError(
            "azure-identity is not installed", hint="pip install 'cloudtrain[azure]'"
        )
    with _CREDENTIAL_LOCK:
        if factory not in _CREDENTIALS:
            with azure_errors("find Azure credentials"):
                _CREDENTIALS[factory] = factory()
        return _CREDENTIALS[factory]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


class BlobStore:
    """An ObjectStore on Azure Blob Storage. Thread-safe: one SDK client per store (azure-core
    clients are thread-safe), built on first use; building a store makes no call and reads no
    credentials.

    `credential` (an azure-core TokenCredential) overrides both the connection string and
    DefaultAzureCredential; `account_url` overrides `https://ACCOUNT.blob.core.windows.net`
    (another Azure cloud, or an emulator); `client_options` go to BlobServiceClient (e.g.
    `retry_total=0`, `connection_verify=CA_FILE`).
    """

    def __init__(
        self,
        uri: str,
        *,
        credential: Any | None = None,
        account_url: str | None = None,
        max_concurrency: int = MAX_CONCURRENCY,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        parsed = urllib.parse.urlparse(uri)
        account = parsed.netloc
        container, _, prefix = parsed.path.lstrip("/").partition("/")
        problem = uri_problem(uri, "az")  # the spec's rule too (providers/uri_rules.py)
        if problem:
            raise ProviderError(
                f"not an Azure Blob URI: {uri!r}: {problem}",
                hint="use az://ACCOUNT/CONTAINER or az://ACCOUNT/CONTAINER/PREFIX (account: "
                "3-24 chars a-z, 0-9; container: 3-63 chars a-z, 0-9 and single '-')",
            )
        self.account = account
        self.container = container
        self.prefix = prefix.strip("/")
        base = f"az://{account}/{container}"
        self.uri = f"{base}/{self.prefix}" if self.prefix else base
        endpoint = env.AZURE_BLOB_ENDPOINT.text().rstrip("/")
        default_url = (
            f"{endpoint}/{account}" if endpoint else f"https://{account}.blob.core.windows.net"
        )
        self.account_url = (account_url or default_url).rstrip("/")
        self.max_concurrency = max(1, int(max_concurrency))
        self._root = f"{self.prefix}/" if self.prefix else ""
        self._credential = credential
        self._options = {**CLIENT_OPTIONS, **(client_options or {})}
        self._lock = threading.Lock()
        self._service: BlobServiceClient | None = None
        self._keyed = False  # whether the client came from a connection string
        self._account_key: str | None = None  # set when that string carries a key
        self._delegation_key: UserDelegationKey | None = None
        self._delegation_expiry: datetime.datetime | None = None

    # --- helpers ---------------------------------------------------------------------------

    def _client(self) -> BlobServiceClient:
        """The store's service client (created on first use, from the connection string or a
        token credential)."""
        with self._lock:
            if self._service is None:
                self._service = self._build()
            return self._service

    def _build(self) -> BlobServiceClient:
        connection = os.environ.get(CONNECTION_STRING_ENV, "").strip()
        if self._credential is None and connection:
            self._keyed = True
            return self._from_connection_string(connection)
        credential = self._credential if self._credential is not None else default_credential()
        with azure_errors(f"open a Blob Storage client for {self.uri}"):
            return BlobServiceClient(self.account_url, credential=credential, **self._options)

    def _from_connection_string(self, connection: str) -> BlobServiceClient:
        what = f"open {self.uri} with {CONNECTION_STRING_ENV}"
        try:
            with azure_errors(what):
                service = BlobServiceClient.from_connection_string(connection, **self._options)
        except ValueError:  # never echo the string: it holds a key
            raise CredentialsError(
                f"{what}: the connection string is malformed", hint=CONNECTION_HINT
            ) from None
        named = (service.account_name or "").lower()
        if named and named != self.account:
            raise CredentialsError(
                f"{what}: the connection string is for account {named!r}, not {self.account!r}",
                hint=CONNECTION_HINT,
            )
        self._account_key = getattr(service.credential, "account_key", None)
        return service

    def _key(self, key: str) -> str:
        """The full blob name of a store-relative key (the same key rules as LocalStore)."""
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ProviderError(f"invalid object key {key!r} in {self.uri}")
        return self._root + key

    def _where(self, key: str) -> str:
        return f"az://{self.account}/{self.container}/{self._root}{key}"

    def _blob(self, key: str) -> Any:
        return self._client().get_blob_client(self.container, self._key(key))

    def _containers(self) -> Any:
        return self._client().get_container_client(self.container)

    # --- the container ---------------------------------------------------------------------

    def ensure_bucket(self) -> Resource:
        """Make the container usable and return it as a Resource (kind "bucket", id = this
        store's URI, region None: a container has no location of its own).

        A missing container is created private (no anonymous access); a concurrent create is
        fine. An existing container is kept as it is, objects and access level included. The
        storage account must exist (it is made by the compute side): NotFound otherwise.
        Idempotent; blocks until the container is usable (a container deleted moments ago
        raises TransientError: Azure frees the name after about 30 s).
        """
        containers = self._containers()
        where = f"az://{self.account}/{self.container}"
        try:
            with azure_errors(f"check access to {where}"):
                containers.get_container_properties()
        except NotFound as err:
            if ACCOUNT_NOT_FOUND in error_codes(err):
                raise
            try:
                with azure_errors(f"create container {where}"):
                    containers.create_container()  # no public_access: private
            except ProviderError as create_err:
                if not already_exists(create_err):
                    raise
        return Resource(provider="azure", kind="bucket", id=self.uri, region=None, run_id="")

    # --- objects ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Write an object whole: readers see the old or the new one, never a part (one Put
        Blob, or blocks committed at once). Idempotent; blocks (the SDK retries 5xx)."""
        blob = self._blob(key)
        with azure_errors(f"put {self._where(key)}"):
            blob.upload_blob(
                data,
                overwrite=True,
                content_settings=ContentSettings(content_type=OCTET),
                max_concurrency=self.max_concurrency,
            )

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object. Raises NotFound for a missing key or container; with `max_bytes`,
        a ranged read of its first max_bytes + 1 bytes, and TooLarge when that many came.
        Blocks."""
        blob = self._blob(key)
        what = f"get {self._where(key)}"
        with azure_errors(what):
            data = self._download(blob, max_bytes).readall()
        return within(bytes(data), max_bytes, what)

    def _download(self, blob: Any, max_bytes: int | None) -> Any:
        """The blob's downloader: of the whole blob, or of its first max_bytes + 1 bytes. A
        range from 0 is refused (416) only for an empty blob, which the SDK reads again
        without one only when no range was asked for: then the whole (empty) blob is asked
        for here, and the caller's `within` still bounds what came. Raises the SDK's errors."""
        if max_bytes is None:
            return blob.download_blob(max_concurrency=self.max_concurrency)
        try:
            return blob.download_blob(
                max_concurrency=self.max_concurrency, offset=0, length=max_bytes + 1
            )
        except HttpResponseError as exc:
            if exc.status_code != 416:
                raise
            return blob.download_blob(max_concurrency=self.max_concurrency)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its ETag (from the download's own answer, so they belong together; a
        blob rewritten during a multi-part download is a TransientError, read again), or None
        when there is no object (or no container). Azure gives a blob a new ETag on every
        write. `max_bytes` bounds the read as for `get` (TooLarge). Blocks."""
        blob = self._blob(key)
        what = f"get {self._where(key)}"
        try:
            with azure_errors(what):
                download = self._download(blob, max_bytes)
                data = download.readall()
        except NotFound:
            return None
        try:
            return within(bytes(data), max_bytes, what), str(download.properties.etag)
        except TooLarge as exc:
            exc.tag = str(download.properties.etag)
            raise

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write the object only if its ETag is `tag` (If-Match), or only if there is none
        (`tag` None: If-None-Match: *); returns the new ETag. Azure decides atomically: a lost
        condition (412 ConditionNotMet, 409 BlobAlreadyExists, or the blob gone) raises
        PreconditionFailed; a missing container NotFound. Not idempotent: a retry after a lost
        reply fails although the first try wrote. Blocks."""
        blob = self._blob(key)
        what = f"put {self._where(key)} if " + ("absent" if tag is None else f"ETag {tag}")
        condition: dict[str, Any] = (
            {"overwrite": False}
            if tag is None
            else {"overwrite": True, "etag": tag, "match_condition": MatchConditions.IfNotModified}
        )
        try:
            with azure_errors(what):
                answer = blob.upload_blob(
                    data,
                    content_settings=ContentSettings(content_type=OCTET),
                    max_concurrency=self.max_concurrency,
                    **condition,
                )
        except ProviderError as err:  # ConditionNotMet is otherwise transient (errors.py)
            codes = error_codes(err)
            gone = tag is not None and "BlobNotFound" in codes
            if codes & LOST_CONDITION_CODES or gone:
                raise PreconditionFailed(err.message, codes=codes) from err
            raise
        return str(answer["etag"])

    def put_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Upload a file: up to one part (8 MiB) in one Put Blob, larger ones as blocks staged
        `max_concurrency` at a time and committed in one Put Block List (the object appears
        whole then). Resumable: a call after a failure stages only the blocks Azure does not
        hold yet for this version of the file (blob_transfers.py). `progress(n)` gets each
        block's bytes once staged. Idempotent; blocks."""
        size = os.path.getsize(path)
        part = transfer.part_bytes()
        if size > part:
            blob_transfers.upload(self, key, path, part, progress)
            return
        blob = self._blob(key)
        with open(path, "rb") as stream, azure_errors(f"upload {path} to {self._where(key)}"):
            blob.upload_blob(
                stream,
                length=size,
                overwrite=True,
                content_settings=ContentSettings(content_type=OCTET),
                max_concurrency=self.max_concurrency,
            )
        transfer.report(progress, size)

    def get_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Download to `path`, creating parent folders: parallel ranged reads pinned to the
        blob's ETag into the sidecar `.<name>.cloudtrain-part`, renamed into place when
        complete. Resumable: a call after a failure fetches only the missing ranges if the ETag
        is unchanged, else starts over. Raises NotFound, leaving no file. `progress(n)` gets
        each range's bytes. Blocks."""
        blob_transfers.download(self, key, path, transfer.part_bytes(), progress)

    def _blobs(self, prefix: str) -> Iterator[Any]:
        """BlobProperties of every blob under `prefix`, in the service's order."""
        if prefix.startswith("/"):
            raise ProviderError(f"invalid prefix {prefix!r} in {self.uri}")
        with azure_errors(f"list {self._where(prefix)}"):
            yield from self._containers().list_blobs(name_starts_with=self._root + prefix)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix` (plain name-prefix match, not folders),
        sorted by key, keys relative to the store. Folder placeholders (names ending in '/')
        are left out. Raises NotFound if the container is missing. Blocks."""
        out: list[ObjectInfo] = []
        for props in self._blobs(prefix):
            name = str(props.name)
            if name.endswith("/"):
                continue
            updated = props.last_modified.timestamp() if props.last_modified else 0.0
            out.append(ObjectInfo(name[len(self._root) :], int(props.size or 0), updated))
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Delete one object and its snapshots. Idempotent: a missing key (or container) is
        fine. Blocks."""
        blob = self._blob(key)
        with contextlib.suppress(NotFound), azure_errors(f"delete {self._where(key)}"):
            blob.delete_blob(delete_snapshots="include")

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (placeholders and snapshots included) through
        blob batches of 256 deletes, `DELETE_PARALLEL` batches at a time; returns how many
        objects were listed. Idempotent: nothing there (or no container) deletes 0, and a blob
        deleted meanwhile is fine. If any delete fails, all are still attempted and the first
        error is raised. Blocks."""
        try:
            names = [str(props.name) for props in self._blobs(prefix)]
        except NotFound:
            return 0
        batches = [names[i : i + DELETE_BATCH] for i in range(0, len(names), DELETE_BATCH)]
        results = parallel_map(self._delete_batch, batches, DELETE_PARALLEL)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return len(names)

    def _delete_batch(self, names: list[str]) -> None:
        where = f"az://{self.account}/{self.container}"
        with azure_errors(f"delete {len(names)} blobs in {where}"):
            responses = list(
                self._containers().delete_blobs(
                    *names, delete_snapshots="include", raise_on_any_failure=False
                )
            )
        for name, response in zip(names, responses, strict=False):
            if response.status_code not in _OK_DELETE_STATUS:
                failed = HttpResponseError(message=response.reason, response=response)
                raise translate(failed, f"delete {where}/{name}") from failed

    # --- presigned URLs --------------------------------------------------------------------

    def _user_delegation_key(self, expiry: datetime.datetime) -> UserDelegationKey:
        """A user delegation key valid until at least `expiry`: requested once and reused."""
        with self._lock:
            key, key_expiry = self._delegation_key, self._delegation_expiry
        if key is not None and key_expiry is not None and key_expiry >= expiry:
            return key
        start = _now() - CLOCK_SKEW
        key_expiry = _now() + DELEGATION_KEY_TTL
        with azure_errors(f"get a user delegation key for {self.account}"):
            key = self._client().get_user_delegation_key(start, key_expiry)
        with self._lock:
            self._delegation_key, self._delegation_expiry = key, key_expiry
        return key

    def _presign(self, method: str, key: str, ttl_s: int) -> str:
        full = self._key(key)
        what = f"presign {method} for {self._where(key)}"
        service = self._client()  # resolves the credentials (and the account key, if any)
        expiry = _now() + datetime.timedelta(seconds=max(1, min(int(ttl_s), MAX_PRESIGN_TTL_S)))
        permission = (
            BlobSasPermissions(read=True)
            if method == "GET"
            else BlobSasPermissions(create=True, write=True)
        )
        blob = service.get_blob_client(self.container, full)
        signing: dict[str, Any] = {"account_key": self._account_key}
        if self._account_key is None:
            if self._keyed:
                raise CredentialsError(
                    f"{what}: the connection string holds no AccountKey to sign with",
                    hint=CONNECTION_HINT,
                )
            signing = {"user_delegation_key": self._user_delegation_key(expiry)}
        https = urllib.parse.urlparse(str(blob.url)).scheme == "https"
        with azure_errors(what):
            sas = generate_blob_sas(
                account_name=self.account,
                container_name=self.container,
                blob_name=full,
                permission=permission,
                expiry=expiry,
                protocol="https" if https else None,
                **signing,
            )
        return f"{str(blob.url).split('?', 1)[0]}?{sas}"

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A SAS URL that GETs the object without credentials for min(ttl_s, 3600) seconds
        (read permission on this one blob; https only when the endpoint is https).

        Signed with the account key when the connection string holds one (locally, no call);
        otherwise a user delegation SAS: a `get_user_delegation_key` call about once an hour
        per store (each key lives 2 h and is reused while it outlives the URL). That needs a
        data role such as "Storage Blob Data Contributor", and the URL can do no more than the
        identity can. Raises CredentialsError if neither is possible (a connection string
        without a key). Thread-safe."""
        return self._presign("GET", key, ttl_s)

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A SAS URL that uploads the object with HTTP PUT for min(ttl_s, 3600) seconds (create
        and write permission on this one blob); signed as `presign_get` describes. Each PUT
        replaces the object whole; the container must exist.

        Azure's Put Blob requires the header `x-ms-blob-type: BlockBlob` (`BLOB_TYPE_HEADER`):
        without it Azure answers 400 MissingRequiredHeader (Azurite: a bare 400), so plain
        `curl -T FILE URL` fails. The caller must send it:
        `curl -fsS -H 'x-ms-blob-type: BlockBlob' -T FILE URL` (a GET with it is fine too)."""
        return self._presign("PUT", key, ttl_s)
