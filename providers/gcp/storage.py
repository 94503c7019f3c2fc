"""Google Cloud Storage as a cloudtrain ObjectStore: `gs://bucket[/prefix]`, keys relative to the
prefix.

Every SDK call runs inside `gcp_errors(...)`, which names the object and turns google-api-core /
google-auth exceptions into `cloudtrain.core.errors` types; nothing above this module sees an SDK
exception. Credentials come from the SDK's chain (Application Default Credentials); with
`STORAGE_EMULATOR_HOST` set, google-cloud-storage talks to that endpoint with the
environment's credentials when it has some (`environment_credentials`: a VM's own service
account from its metadata server sends its token, as on GCS) and anonymously when it has none.
Nothing is logged, least of all a token.

- Buckets: only the default bucket (`cloudtrain-...`) and buckets this class creates are
  configured: uniform bucket-level access on, public access prevention "enforced". GCS always
  encrypts at rest (Google-managed keys). A user's existing bucket is only checked, never changed.
- Objects: whole-object writes (a single request up to 8 MiB, then resumable uploads in 8 MiB
  chunks); put_file/get_file resume after a failure (gcs_transfers.py); downloads land in a
  hidden sidecar that is renamed when complete.
- Presigned URLs: V4, at most one hour; see `presign_get` for how they are signed.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import google.auth
import google.auth.transport.requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth
from google.auth.credentials import AnonymousCredentials, Credentials, Signing
from google.cloud import storage
from google.cloud.storage.constants import PUBLIC_ACCESS_PREVENTION_ENFORCED
from google.cloud.storage.retry import DEFAULT_RETRY

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import (
    CredentialsError,
    NotFound,
    PreconditionFailed,
    ProviderError,
    TooLarge,
    TransientError,
)
from cloudtrain.providers import transfer
from cloudtrain.providers.base import ObjectInfo, Resource, within
from cloudtrain.providers.gcp import gcs_transfers
from cloudtrain.providers.gcp.errors import already_exists, gcp_errors
from cloudtrain.providers.parallel import parallel_map
from cloudtrain.providers.transfer import Progress
from cloudtrain.providers.uri_rules import uri_problem

MiB = 1024 * 1024
RESUMABLE_THRESHOLD = 8 * MiB  # larger objects go up as resumable uploads...
CHUNK_SIZE = 8 * MiB  # ...in chunks of this size (a multiple of 256 KiB), each retried alone
DEFAULT_BUCKET_PREFIX = "cloudtrain-"
MAX_PRESIGN_TTL_S = 3600
XML_API = "https://storage.googleapis.com"  # GET/PUT of /{bucket}/{object}, signed or with OAuth
DELETE_PARALLEL = 8  # concurrent single-object deletes in delete_prefix
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # read by google-cloud-storage itself, too
# READ_RETRY: reads (get, get_file, list) pass retry=None. The registry's RetryingStore retries
# every store call (providers/retrying.py); google-cloud-storage's DEFAULT_RETRY (up to 120 s on
# a 503 or a connection error) under it multiplied the wait: one unreachable read took minutes.
OCTET = "application/octet-stream"
# get_tagged reads the object's generation, then that generation's bytes: an object replaced in
# between is read again, at most this many times.
TAGGED_READS = 5
LIST_FIELDS = "items(name,size,updated),nextPageToken"  # partial responses: faster listings
SIGN_HINT = (
    "sign as a service account: `gcloud auth application-default login "
    "--impersonate-service-account=SA_EMAIL`, a key in GOOGLE_APPLICATION_CREDENTIALS, or the "
    "provider option naming a signer service account; the caller needs "
    "roles/iam.serviceAccountTokenCreator on it (a VM also needs the cloud-platform scope)"
)


def environment_credentials() -> Credentials | None:
    """With STORAGE_EMULATOR_HOST set: the credentials the environment has (Application Default
    Credentials: a key file, gcloud's, or a VM's service account from its metadata server), so
    requests carry the caller's own identity as they do on GCS; None when it has none (the SDK
    then sends none: anonymous). Blocks for ADC's lookup (on a machine with no metadata server
    its ping fails fast, or NO_GCE_CHECK=true skips it). Never used without an emulator: there
    ADC's errors propagate."""
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _project = google.auth.default()
    except DefaultCredentialsError:
        return None
    return credentials


@dataclass(frozen=True)
class _Auth:
    """How this store's clients authenticate, resolved once per store."""

    credentials: Credentials | None  # None: the SDK's own choice (anonymous on the emulator)
    project: str | None
    emulator: str | None  # STORAGE_EMULATOR_HOST when set


class GcsStore:
    """An ObjectStore on Google Cloud Storage. Thread-safe: one SDK client per thread, sharing
    one set of credentials. Building a store makes no call and reads no credentials.

    `project` is where a missing bucket is created (default: GOOGLE_CLOUD_PROJECT or the ADC
    project); `location` its location (default: the GCS default, multi-region US). Pass the
    compute region so nodes read their bucket in-region. `credentials` overrides ADC;
    `signer_email` names the service account that signs URLs through IAM when the credentials
    hold no key (user ADC). With `node_identity_fallback`, a URL that cannot be signed is the
    plain XML API URL instead, for a node that authenticates as its own service account.
    """

    def __init__(
        self,
        uri: str,
        project: str | None = None,
        *,
        location: str | None = None,
        credentials: Credentials | None = None,
        signer_email: str | None = None,
        node_identity_fallback: bool = False,
    ) -> None:
        parsed = urllib.parse.urlparse(uri)
        bucket = parsed.netloc
        problem = uri_problem(uri, "gs")  # the spec's rule too (providers/uri_rules.py)
        if problem:
            raise ProviderError(
                f"not a GCS bucket URI: {uri!r}: {problem}",
                hint="use gs://BUCKET or gs://BUCKET/PREFIX (3-63 chars: a-z, 0-9, '-', '_', '.')",
            )
        self.bucket = bucket
        self.prefix = parsed.path.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        self.project = project
        self.location = location
        self.signer_email = signer_email
        self.node_identity_fallback = node_identity_fallback
        self._root = f"{self.prefix}/" if self.prefix else ""
        self._given_credentials = credentials
        self._lock = threading.Lock()
        self._local = threading.local()
        self._auth: _Auth | None = None

    # --- helpers ---------------------------------------------------------------------------

    def _resolve_auth(self) -> _Auth:
        """Credentials and project, found once (ADC unless given; none on the emulator)."""
        with self._lock:
            if self._auth is None:
                emulator = os.environ.get(EMULATOR_ENV) or None
                credentials = self._given_credentials
                project = self.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None
                if credentials is None and emulator is None:
                    with gcp_errors(f"find Google Cloud credentials for {self.uri}"):
                        credentials, adc_project = google.auth.default()
                    project = project or adc_project
                elif credentials is None:
                    credentials = environment_credentials()
                self._auth = _Auth(credentials, project, emulator)
            return self._auth

    def _client(self) -> storage.Client:
        """This thread's SDK client (created on first use)."""
        client: storage.Client | None = getattr(self._local, "client", None)
        if client is None:
            auth_ = self._resolve_auth()
            kwargs: dict[str, Any] = {"credentials": auth_.credentials}
            if auth_.project or auth_.emulator is None:
                # None: no second ADC lookup for a project (only bucket creation needs one)
                kwargs["project"] = auth_.project
            with gcp_errors(f"open a Cloud Storage client for {self.uri}"):
                client = storage.Client(**kwargs)
            # google-cloud-storage 3.x's bucket metadata cache (for its OpenTelemetry spans) GETs
            # the bucket in a background thread for every new client, and again after each 404
            # (storage/_bucket_metadata_cache.py: check_and_evict): a billed request per missing
            # object a poll asks for (notice/, control/stop), none of which we use
            if getattr(client, "_bucket_metadata_cache", None) is not None:
                client._bucket_metadata_cache = None
            self._local.client = client
        return client

    def _key(self, key: str) -> str:
        """The full object name of a store-relative key (the same key rules as LocalStore)."""
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ProviderError(f"invalid object key {key!r} in {self.uri}")
        return self._root + key

    def _where(self, key: str) -> str:
        return f"gs://{self.bucket}/{self._root}{key}"

    def _blob(self, key: str, chunk_size: int | None = None) -> Any:
        return self._client().bucket(self.bucket).blob(self._key(key), chunk_size=chunk_size)

    def _is_default(self) -> bool:
        return self.bucket.startswith(DEFAULT_BUCKET_PREFIX)

    # --- the bucket ------------------------------------------------------------------------

    def ensure_bucket(self) -> Resource:
        """Make the bucket usable and return it as a Resource (id = this store's URI, region =
        the bucket's location, lower case).

        A missing bucket is created in `project` at `location` with uniform bucket-level access
        and public access prevention "enforced" (GCS encrypts every object at rest). The
        default bucket (`cloudtrain-...`) gets those two settings re-applied if they were
        changed. A user-given bucket that exists is only checked for access, never changed (with
        object-level permissions only, listing it is the check). A name taken by another
        project raises ProviderError. Idempotent (a concurrent create is fine); blocks until the
        bucket is usable.
        """
        bucket = self._existing_bucket()
        if bucket is None:
            bucket = self._create()
            crash_point("bucket")
            self._secure(bucket)
        elif self._is_default():
            self._secure(bucket)
        location = bucket.location or self.location
        return Resource(
            provider="gcp",
            kind="bucket",
            id=self.uri,
            region=location.lower() if location else None,
            run_id="",
        )

    def _existing_bucket(self) -> Any | None:
        """The bucket with its metadata loaded, or None if it does not exist."""
        client = self._client()
        bucket = client.bucket(self.bucket)
        what = f"check access to gs://{self.bucket}"
        try:
            with gcp_errors(what):
                bucket.reload()
            return bucket
        except NotFound:
            return None
        except CredentialsError as err:
            if not isinstance(err.__cause__, api.Forbidden):
                raise
            if self._is_default():
                raise CredentialsError(
                    f"{what}: access denied: the name may belong to another project",
                    hint="set `checkpoint: gs://YOUR-BUCKET/PREFIX` in job.yaml",
                ) from err
        # A user's bucket shared at object level (no storage.buckets.get): listing must work.
        with gcp_errors(what):
            pages = client.list_blobs(self.bucket, prefix=self._root, max_results=1)
            next(iter(pages), None)
        return bucket

    def _create(self) -> Any:
        """Create the bucket with its privacy settings in the request; a concurrent create of
        the same bucket by us is fine, a name owned by someone else is a ProviderError."""
        auth_ = self._resolve_auth()
        what = f"create bucket gs://{self.bucket}" + (
            f" in {self.location}" if self.location else ""
        )
        if not auth_.project and auth_.emulator is None:
            raise ProviderError(
                f"{what}: no Google Cloud project to create it in",
                hint="set project: in job.yaml, GOOGLE_CLOUD_PROJECT, or "
                "`gcloud config set project PROJECT`",
            )
        client = self._client()
        bucket = client.bucket(self.bucket)
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        bucket.iam_configuration.public_access_prevention = PUBLIC_ACCESS_PREVENTION_ENFORCED
        if self._is_default():  # run data is disposable: deleted objects are not kept 7 days
            bucket.soft_delete_policy.retention_duration_seconds = 0
        try:
            with gcp_errors(what):
                return client.create_bucket(bucket, project=auth_.project, location=self.location)
        except ProviderError as err:
            if not already_exists(err):
                raise
            taken = err
        bucket = client.bucket(self.bucket)
        try:
            with gcp_errors(f"check access to gs://{self.bucket}"):
                bucket.reload()
        except CredentialsError:
            raise ProviderError(
                f"{what}: the name gs://{self.bucket} belongs to another project",
                hint="set `checkpoint: gs://YOUR-BUCKET/PREFIX` in job.yaml",
            ) from taken
        return bucket

    def _secure(self, bucket: Any) -> None:
        """Uniform bucket-level access on and public access prevention enforced (one PATCH,
        only if either is off). Idempotent."""
        iam = bucket.iam_configuration
        if (
            iam.uniform_bucket_level_access_enabled
            and iam.public_access_prevention == PUBLIC_ACCESS_PREVENTION_ENFORCED
        ):
            return
        iam.uniform_bucket_level_access_enabled = True
        iam.public_access_prevention = PUBLIC_ACCESS_PREVENTION_ENFORCED
        with gcp_errors(f"make gs://{self.bucket} private (uniform access, no public access)"):
            bucket.patch(retry=DEFAULT_RETRY)

    # --- objects ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Write an object whole: readers see the old or the new one, never a part.
        Idempotent; blocks (retried by the SDK on 429/5xx)."""
        chunk = CHUNK_SIZE if len(data) > RESUMABLE_THRESHOLD else None
        blob = self._blob(key, chunk)
        with gcp_errors(f"put {self._where(key)}"):
            blob.upload_from_string(data, content_type=OCTET)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object (checksum-verified when whole). Raises NotFound for a missing key or
        bucket; with `max_bytes`, one ranged read of its first max_bytes + 1 bytes, and
        TooLarge when that many came. Blocks."""
        blob = self._blob(key)
        what = f"get {self._where(key)}"
        with gcp_errors(what):
            if max_bytes is None:  # retry=None: one retry layer, see READ_RETRY
                return bytes(blob.download_as_bytes(retry=None))
            data = bytes(blob.download_as_bytes(start=0, end=max_bytes, retry=None))
        return within(data, max_bytes, what)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its generation (as text), or None when there is no object (or no
        bucket). Two requests: the metadata, then the bytes of that generation with
        ifGenerationMatch, so bytes and tag always belong together; an object replaced in between
        is read again (at most TAGGED_READS times, then TransientError). An object whose
        metadata says it holds more than `max_bytes` is TooLarge before any byte is read.
        Blocks."""
        where = self._where(key)
        bucket = self._client().bucket(self.bucket)
        for _ in range(TAGGED_READS):
            with gcp_errors(f"get {where}"):
                blob = bucket.get_blob(self._key(key), retry=None)  # None: no object or bucket
            if blob is None:
                return None
            generation = int(blob.generation)
            if max_bytes is not None and (blob.size or 0) > max_bytes:
                too = TooLarge(f"get {where}: {blob.size} bytes, more than {max_bytes}: not read")
                too.tag = str(generation)
                raise too
            try:
                with gcp_errors(f"get {where} at generation {generation}"):
                    data = blob.download_as_bytes(if_generation_match=generation, retry=None)
            except (NotFound, PreconditionFailed):
                continue  # replaced (or deleted) since the metadata was read
            return bytes(data), str(generation)
        raise TransientError(f"get {where}: it changed on each of {TAGGED_READS} reads")

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write the object only if its generation is `tag` (ifGenerationMatch; `tag` None:
        ifGenerationMatch=0, only if there is no live object); returns the new generation. GCS
        decides atomically and answers 412 when the condition does not hold
        (cloud.google.com/storage/docs/request-preconditions): PreconditionFailed. A missing
        bucket raises NotFound. One attempt (retry=None: RetryingStore is the one retry layer).
        Not idempotent: a retry after a lost reply fails although the first try wrote. Blocks."""
        if tag is not None and not tag.isdigit():
            raise PreconditionFailed(f"put {self._where(key)}: {tag!r} is not a GCS generation")
        generation = 0 if tag is None else int(tag)
        chunk = CHUNK_SIZE if len(data) > RESUMABLE_THRESHOLD else None
        blob = self._blob(key, chunk)
        with gcp_errors(f"put {self._where(key)} if generation is {generation}"):
            blob.upload_from_string(
                data, content_type=OCTET, if_generation_match=generation, retry=None
            )
        return str(blob.generation)

    def put_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Upload a file: up to one part (8 MiB) in one request, larger ones through a
        resumable upload session in part-sized chunks (gcs_transfers.py). Resumable: a call
        after a failure continues the session kept in the transfer state from the offset GCS
        reports; a changed file or an expired session starts over. The object appears whole when
        the upload completes. `progress(n)` gets the bytes GCS acknowledged. Idempotent;
        blocks."""
        size = os.path.getsize(path)
        chunk = transfer.part_bytes(align=gcs_transfers.CHUNK_ALIGN)
        if size > chunk:
            gcs_transfers.upload(self, key, path, chunk, progress)
            return
        blob = self._blob(key)
        with gcp_errors(f"upload {path} to {self._where(key)}"):
            blob.upload_from_filename(os.fspath(path), content_type=OCTET)
        transfer.report(progress, size)

    def get_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Download to `path`, creating parent folders: the object's generation, then parallel
        ranged reads pinned to it into the sidecar `.<name>.cloudtrain-part`, renamed into place
        when complete (an object of one part: one checksum-verified read). Resumable: a call
        after a failure fetches only the missing ranges of the same generation, else starts
        over. Raises NotFound, leaving no file. `progress(n)` gets each range's bytes. Blocks."""
        gcs_transfers.download(self, key, path, transfer.part_bytes(), progress)

    def _names(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """(full name, blob) of every object under `prefix`, in the service's order."""
        if prefix.startswith("/"):
            raise ProviderError(f"invalid prefix {prefix!r} in {self.uri}")
        with gcp_errors(f"list {self._where(prefix)}"):
            blobs = self._client().list_blobs(
                self.bucket, prefix=self._root + prefix, fields=LIST_FIELDS, retry=None
            )
            for blob in blobs:
                yield blob.name, blob

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix` (plain name-prefix match, not folders),
        sorted by key, keys relative to the store. Console "folder" placeholders (names ending
        in '/') are not objects and are left out. Raises NotFound if the bucket is missing.
        Blocks."""
        out: list[ObjectInfo] = []
        for name, blob in self._names(prefix):
            if name.endswith("/"):
                continue
            updated = blob.updated.timestamp() if blob.updated else 0.0
            out.append(ObjectInfo(name[len(self._root) :], int(blob.size or 0), updated))
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Delete one object. Idempotent: a missing key (or bucket) is fine. Blocks."""
        self._delete_name(self._key(key))

    def _delete_name(self, name: str) -> None:
        blob = self._client().bucket(self.bucket).blob(name)
        with contextlib.suppress(NotFound), gcp_errors(f"delete gs://{self.bucket}/{name}"):
            blob.delete()

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (folder placeholders included), `DELETE_PARALLEL`
        single deletes at a time; returns how many objects were listed. Idempotent: nothing
        there (or no bucket) deletes 0, and an object deleted meanwhile is fine. If any delete
        fails, all are still attempted and the first error is raised. Blocks."""
        try:
            names = [name for name, _ in self._names(prefix)]
        except NotFound:
            return 0
        results = parallel_map(self._delete_name, names, DELETE_PARALLEL)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return len(names)

    # --- presigned URLs --------------------------------------------------------------------

    def _presign(self, method: str, key: str, ttl_s: int) -> str:
        try:
            return self._sign(method, key, ttl_s)
        except CredentialsError:
            if not self.node_identity_fallback:
                raise
            # the node sends its own service account's token (see GcpCompute.startup_blocks)
            return f"{XML_API}/{self.bucket}/{urllib.parse.quote(self._key(key), safe='/~')}"

    def _sign(self, method: str, key: str, ttl_s: int) -> str:
        full = self._key(key)
        expiration = datetime.timedelta(seconds=max(1, min(int(ttl_s), MAX_PRESIGN_TTL_S)))
        what = f"presign {method} for {self._where(key)}"
        auth_ = self._resolve_auth()
        client = self._client()
        blob = client.bucket(self.bucket).blob(full)
        credentials = auth_.credentials
        if isinstance(credentials, Signing):
            with _signing_errors(what):
                return str(
                    blob.generate_signed_url(version="v4", method=method, expiration=expiration)
                )
        if auth_.emulator is not None:
            # The emulator serves GET and PUT on the path a V4 URL has and checks no signature.
            base = str(client.api_endpoint).rstrip("/")
            return f"{base}/{self.bucket}/{urllib.parse.quote(full, safe='/~')}"
        if credentials is None or isinstance(credentials, AnonymousCredentials):
            raise CredentialsError(
                f"{what}: anonymous credentials cannot sign URLs", hint=SIGN_HINT
            )
        with gcp_errors(f"refresh the Google Cloud credentials to {what}"):
            if not credentials.valid:
                credentials.refresh(google.auth.transport.requests.Request())
        email = self.signer_email or getattr(credentials, "service_account_email", None)
        if not email or email == "default":
            raise CredentialsError(
                f"{what}: these credentials ({type(credentials).__name__}) hold no private key "
                "and name no service account to sign with",
                hint=SIGN_HINT,
            )
        with _signing_errors(what):
            return str(
                blob.generate_signed_url(
                    version="v4",
                    method=method,
                    expiration=expiration,
                    service_account_email=email,
                    access_token=credentials.token,
                )
            )

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A URL that GETs the object without credentials (`curl -fsS URL`) for
        min(ttl_s, 3600) seconds (at least 1). Does not check that the object exists.

        How it is signed, by the credentials in use:
        - a private key or a signer (service-account key file, impersonated service account):
          a V4 signed URL made locally (impersonated credentials sign through IAM);
        - on the emulator (STORAGE_EMULATOR_HOST set) with credentials that cannot sign, such as
          its default anonymous ones: the unsigned URL `{emulator}/{bucket}/{object}`, the same
          path a V4 URL has. The emulator checks no signature, so this URL does not expire;
        - other credentials (user ADC, a VM's metadata-server account): a V4 URL signed by IAM
          signBlob as `signer_email` or the credentials' own service account, after refreshing
          them. Raises CredentialsError if no service account is known or IAM refuses (the
          caller needs roles/iam.serviceAccountTokenCreator on it), unless the store was made
          with `node_identity_fallback`: then the unsigned URL
          `https://storage.googleapis.com/{bucket}/{object}`, which a Compute Engine node
          reads and writes with its service account's token.
        Blocks only for an IAM signBlob call or a credentials refresh.
        """
        return self._presign("GET", key, ttl_s)

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A URL that uploads the object with HTTP PUT (`curl -fsS -T FILE URL`) without
        credentials for min(ttl_s, 3600) seconds; signed as `presign_get` describes. No
        Content-Type or other header is signed, so any (or none) may be sent. Each PUT replaces
        the object whole; the bucket must exist. Blocks only to sign through IAM."""
        return self._presign("PUT", key, ttl_s)


@contextlib.contextmanager
def _signing_errors(what: str) -> Iterator[None]:
    """`gcp_errors`, except that IAM refusing to sign (a google-auth TransportError naming the
    sign call) is a CredentialsError, not a transient network failure."""
    try:
        with gcp_errors(what):
            yield
    except TransientError as err:
        cause = err.__cause__
        text = str(cause) if isinstance(cause, auth.TransportError) else ""
        if any(s in text for s in ("signBytes", "sign_bytes", "signBlob")):
            first = text.strip().splitlines()[0][:300]
            raise CredentialsError(
                f"{what}: IAM refused to sign: {first}", hint=SIGN_HINT
            ) from cause
        raise
