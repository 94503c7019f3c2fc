"""The run's node identity: a service account per run that reaches only the run's bucket prefix.

Each run gets its own service account, made through the IAM REST API
(`POST {IAM}/v1/projects/{project}/serviceAccounts`). Its account id is derived from the run id
alone (`account_id()`: `ct-` + a readable part of the run id + a short hash, 6-30 characters),
so a retry or a `down` from a fresh process finds the same account; its display name is
`cloudtrain run <run_id>` and its description names the run's bucket, so `find()` and
`tagged()` recognise it from the cloud alone (no ledger) and `delete()` knows which bucket
policy to clean.

The run's prefix binding (`prefix_binding`, `grant`: the controller's account's, see
controller_identity.py) is one binding on the run's bucket (uniform bucket-level access),
`roles/storage.objectAdmin` with the IAM condition (policy version 3)

    resource.name.startsWith("projects/_/buckets/B/objects/P")
      || api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("P")

where P is `<store prefix>cloudtrain/runs/<run_id>/`. The first half scopes object reads,
writes and deletes to the run's prefix; the second admits `storage.objects.list` (a
bucket-level permission that a condition on `resource.name` cannot narrow) only for listings
whose `prefix` lies inside the run's prefix. That is the documented way to grant a prefix
listing with IAM Conditions (the `objectListPrefix` API attribute,
https://cloud.google.com/iam/docs/conditions-attribute-reference, "API attributes").

The nodes' account gets less (`node_bindings`, `grant_node`; issue 29): the nodes run the
user's code, and the run's key (`control/key`) and the controllers' documents must stay out of
its reach. IAM allow policies only add up (no binding can deny), so the account gets two
bindings whose union is exactly what the agent uses:

- reads: `roles/storage.objectViewer` (storage.objects.get and .list) on the run's objects but
  `control/key`, and on listings inside the run's prefix, as above;
- writes: `roles/storage.objectAdmin` (create, delete -- which replacing an object needs too --,
  update and the multipart-upload permissions) only on the names the agent writes: its nodes'
  status/, heartbeat/, notice/, logs/, metrics/, trace/, the chief's checkpoints/, model/ and
  tensorboard/, attempt-<n>/ (registrations and checkpoints-ready) and control/orphaned.

So a node cannot read, write or delete `control/key`, and cannot write or delete cluster.json,
control/stop, control/lease, control/yield, control/launch.json, ledger/ or bundle/ (it reads
the first three). Rights are per run, not per node: every node of a run is the same account, so
one node may still write another node's status (per-node rules need one identity per node;
not done). attempt-<n>/ holds the controller's archived bootstrap logs too (text it shows, no
document it trusts). Roles and their permissions: "IAM roles for Cloud Storage",
https://cloud.google.com/storage/docs/access-control/iam-roles; replacing an object needs
storage.objects.create and storage.objects.delete: "IAM permissions for Cloud Storage",
https://cloud.google.com/storage/docs/access-control/iam-permissions; the condition syntax
(CEL: startsWith, &&, ||, !) and its limit of 12 logical operators per condition: "Overview of
IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview.

`CLOUDTRAIN_IAM_ENDPOINT=http://host:port` points the IAM calls at another endpoint with
anonymous credentials, as CLOUDTRAIN_GCE_ENDPOINT does for Compute Engine. The bucket policy is
read and written with google-cloud-storage, which honours STORAGE_EMULATOR_HOST itself.
Every error is translated by `errors.translate`: 429/5xx become TransientError, which the
callers (orchestrator, teardown, `create_nodes`) retry through `cloudtrain.retry`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cloudtrain.errors import NotFound, ProviderError, TransientError
from cloudtrain.jobs import protocol
from cloudtrain.providers.base import Resource, Tagged
from cloudtrain.providers.gcp.clients import GcpAuth
from cloudtrain.providers.gcp.errors import already_exists, error_codes, gcp_errors, translate
from cloudtrain.retry import retrying

KIND_SERVICE_ACCOUNT = "service_account"
IAM_ENDPOINT_ENV = "CLOUDTRAIN_IAM_ENDPOINT"
IAM_API = "https://iam.googleapis.com"
DISPLAY_PREFIX = "cloudtrain run "
OBJECT_ADMIN = "roles/storage.objectAdmin"
OBJECT_VIEWER = "roles/storage.objectViewer"
MAX_LOGICAL_OPERATORS = 12  # &&, || and ! in one IAM condition (IAM Conditions' limits)
# the run's key (cloudtrain/run_key.py `key_object`, a controller module this layer may not
# import), relative to the run's prefix: no node may read it
RUN_KEY_NAME = "control/key"
LIST_PREFIX_ATTRIBUTE = "storage.googleapis.com/objectListPrefix"
PROPAGATION_S = 60.0  # how long a new account may stay invisible to GCE and GCS (IAM is eventual)
# read-modify-write rounds of a bucket policy (a concurrent writer, or GCS not knowing a new
# account yet) before giving up; PROPAGATION_S bounds them too
POLICY_ATTEMPTS = 16
REQUEST_TIMEOUT_S = 60.0
DESCRIPTION_MAX = 256  # IAM's limits on a service account's description and display name
DISPLAY_MAX = 100
_ACCOUNT_ID_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")
_BUCKET_IN_DESCRIPTION = re.compile(r"gs://([a-z0-9][a-z0-9._-]*[a-z0-9])")
_NOT_VISIBLE = ("does not exist", "not found", "was not found")
_CONFLICT_CODES = frozenset({"409", "412"})
T = TypeVar("T")


def account_id(run_id: str) -> str:
    """The run's service account id: `ct-<up to 18 chars of the run id>-<8 hex>`, always 6-30
    characters of `[a-z]([-a-z0-9]*[a-z0-9])`, the same for the same run id. Pure."""
    readable = re.sub(r"[^a-z0-9-]+", "-", run_id.lower())[:18].strip("-")
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    value = f"ct-{readable}-{digest}" if readable else f"ct-{digest}"
    assert _ACCOUNT_ID_RE.match(value) and 6 <= len(value) <= 30, value
    return value


def service_account_email(project: str, run_id: str) -> str:
    """The email of the run's service account in `project` (a domain-scoped project
    `example.com:proj` has `...@proj.example.com.iam.gserviceaccount.com`). Pure."""
    domain, _, name = project.rpartition(":")
    host = f"{name}.{domain}" if domain else project
    return f"{account_id(run_id)}@{host}.iam.gserviceaccount.com"


def display_name(run_id: str) -> str:
    """The account's display name, `cloudtrain run <run_id>` (how listings recognise it). Pure."""
    return (DISPLAY_PREFIX + run_id)[:DISPLAY_MAX]


def description(run_id: str, bucket: str | None) -> str:
    """The account's description: the run and the bucket its binding is on. Raises
    ProviderError when it would not fit IAM's 256 characters (a very long bucket name). Pure."""
    text = f"{DISPLAY_PREFIX}{run_id}: node identity"
    if bucket:
        text += f", objects of gs://{bucket} under {protocol.run_prefix(run_id)} only"
    if len(text) > DESCRIPTION_MAX:
        raise ProviderError(
            f"run {run_id}: the bucket name gs://{bucket} is too long to record on the run's "
            "service account",
            hint="use a shorter bucket name, or set providers.gcp.service_account in job.yaml",
        )
    return text


def bucket_of(account: dict[str, Any]) -> str | None:
    """The bucket a listed account's description names, or None. Pure."""
    match = _BUCKET_IN_DESCRIPTION.search(str(account.get("description") or ""))
    return match.group(1) if match else None


def run_of(account: dict[str, Any]) -> str | None:
    """The run a listed account belongs to, or None when it is not one cloudtrain made: its
    display name must name a run whose derived account id is the account's own. Pure."""
    shown = str(account.get("displayName") or "")
    if not shown.startswith(DISPLAY_PREFIX):
        return None
    run_id = shown[len(DISPLAY_PREFIX) :]
    local = str(account.get("email") or "").split("@", 1)[0]
    return run_id if run_id and local == account_id(run_id) else None


def run_prefix(root: str, run_id: str) -> str:
    """The object-name prefix of the run in its bucket (`root` is the store's own prefix, empty
    or ending in '/'). Pure."""
    return f"{root}{protocol.run_prefix(run_id)}"


def prefix_condition(bucket: str, root: str, run_id: str) -> dict[str, str]:
    """The IAM condition (title, description, CEL expression) of the run's bucket binding: the
    run's objects, and listings inside the run's prefix (see the module docstring). Pure."""
    prefix = run_prefix(root, run_id)
    objects = json.dumps(f"projects/_/buckets/{bucket}/objects/{prefix}")
    listing = f'api.getAttribute({json.dumps(LIST_PREFIX_ATTRIBUTE)}, "")'
    expression = (
        f"resource.name.startsWith({objects}) || {listing}.startsWith({json.dumps(prefix)})"
    )
    return {
        "title": f"cloudtrain-{run_id}"[:100],
        "description": f"cloudtrain run {run_id}: gs://{bucket}/{prefix} only"[:256],
        "expression": expression,
    }


def prefix_binding(email: str, bucket: str, root: str, run_id: str) -> dict[str, Any]:
    """The run's bucket binding: objectAdmin for the account, under `prefix_condition`. Pure."""
    return {
        "role": OBJECT_ADMIN,
        "members": {f"serviceAccount:{email}"},
        "condition": prefix_condition(bucket, root, run_id),
    }


def node_writable(run_id: str) -> tuple[str, ...]:
    """The key prefixes (under `protocol.run_prefix`) the nodes' agents write and delete, from
    the protocol's key builders: every node's status/, heartbeat/, notice/, logs/, metrics/,
    trace/, the chief's checkpoints/, model/, tensorboard/, attempt-<n>/ (registrations, the
    checkpoints-ready marker) and control/orphaned. Pure."""
    mark = "\x00"  # a node id no key holds: the folder is what comes before it
    per_node = (
        proto_fn(run_id, mark).split(mark)[0]
        for proto_fn in (
            protocol.status_key,
            protocol.heartbeat_key,
            protocol.notice_key,
            protocol.logs_prefix,
            protocol.metrics_prefix,
            protocol.trace_key,
        )
    )
    return (
        *per_node,
        protocol.checkpoints_prefix(run_id),
        protocol.model_prefix(run_id),
        protocol.tensorboard_prefix(run_id),
        protocol.attempt_prefix(run_id, 0).removesuffix("0/"),
        protocol.orphaned_key(run_id),
    )


def _starts(value: str) -> str:
    return f"resource.name.startsWith({json.dumps(value)})"


def _condition(run_id: str, bucket: str, prefix: str, what: str, expression: str) -> dict[str, str]:
    suffix = f"-nodes-{what}"
    return {
        "title": f"cloudtrain-{run_id}"[: 100 - len(suffix)] + suffix,
        "description": f"cloudtrain run {run_id}: nodes {what} gs://{bucket}/{prefix}"[:256],
        "expression": expression,
    }


def node_bindings(email: str, bucket: str, root: str, run_id: str) -> list[dict[str, Any]]:
    """The nodes' account's bindings on the run's bucket (see the module docstring): reads of
    the run's objects but the run's key, and listings inside the run's prefix (objectViewer);
    writes and deletes of what the agents write only (objectAdmin on `node_writable`). Pure."""
    prefix = run_prefix(root, run_id)
    objects = f"projects/_/buckets/{bucket}/objects/{root}"
    listing = f'api.getAttribute({json.dumps(LIST_PREFIX_ATTRIBUTE)}, "")'
    run_objects = objects + protocol.run_prefix(run_id)
    reads = (
        f"({_starts(run_objects)} && !{_starts(run_objects + RUN_KEY_NAME)})"
        f" || {listing}.startsWith({json.dumps(prefix)})"
    )
    writes = " || ".join(_starts(objects + p) for p in node_writable(run_id))
    member = {f"serviceAccount:{email}"}
    return [
        {
            "role": OBJECT_VIEWER,
            "members": set(member),
            "condition": _condition(run_id, bucket, prefix, "read", reads),
        },
        {
            "role": OBJECT_ADMIN,
            "members": set(member),
            "condition": _condition(run_id, bucket, prefix, "write", writes),
        },
    ]


class NotVisibleYet(TransientError):
    """A new service account is not known yet where it was used (IAM propagates it within
    about a minute): the call is tried again for up to PROPAGATION_S."""


class PolicyConflict(TransientError):
    """The bucket policy changed between its read and its write (409/412): read it again."""


def while_propagating(
    fn: Callable[[], T], what: str, retry_on: tuple[type[BaseException], ...] = (NotVisibleYet,)
) -> T:
    """`fn` through the one retry policy, retrying only `retry_on` (by default: a new account
    not visible yet), for up to PROPAGATION_S and POLICY_ATTEMPTS calls. Other errors propagate
    at once (the retry layer, providers/retrying.py, handles throttling). Blocks.

    Not a retry of the operation: an eventual-consistency wait. IAM takes up to a minute to
    make a new service account visible to GCE and GCS, and a bucket policy's read-modify-write
    must be redone when another writer changed it in between (its etag). Throttling and 5xx are
    never retried here: they propagate to the one retry layer, which retries the operation."""
    return retrying(
        fn,
        what=what,
        deadline_s=PROPAGATION_S,
        max_attempts=POLICY_ATTEMPTS,
        initial_s=0.05,
        max_s=8.0,
        retry_on=lambda exc: isinstance(exc, retry_on),
    )


def not_visible_yet(err: BaseException, email: str) -> bool:
    """Whether a translated error says the new account `email` does not exist (yet): what GCE
    and GCS answer while IAM propagates a new account. Pure."""
    text = str(getattr(err, "message", err)).lower()
    return email.lower() in text and any(s in text for s in _NOT_VISIBLE)


# --- the IAM REST API --------------------------------------------------------------------------


class IamClient:
    """The IAM service-account calls cloudtrain makes, over `AuthorizedSession` with the
    adapter's credentials (anonymous with CLOUDTRAIN_IAM_ENDPOINT). Thread-safe."""

    def __init__(self, auth: GcpAuth) -> None:
        self.project = auth.project
        self._credentials = auth.credentials
        self._lock = threading.Lock()
        self._session: Any = None

    def _base(self) -> str:
        endpoint = os.environ.get(IAM_ENDPOINT_ENV, "").strip()
        return (endpoint or IAM_API).rstrip("/") + "/v1"

    def _open(self) -> Any:
        with self._lock:
            if self._session is None:
                from google.auth.credentials import AnonymousCredentials
                from google.auth.transport.requests import AuthorizedSession

                overridden = bool(os.environ.get(IAM_ENDPOINT_ENV, "").strip())
                credentials = AnonymousCredentials() if overridden else self._credentials
                self._session = AuthorizedSession(credentials)
            return self._session

    def call(
        self,
        method: str,
        path: str,
        what: str,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One IAM request (`path` under IAM's /v1, or an absolute URL of another Google API on
        the same credentials); the JSON answer. HTTP errors are translated (`errors.translate`):
        404 NotFound, 409 a ProviderError with `already_exists`, 429/5xx TransientError.
        Blocks."""
        from google.api_core import exceptions as api

        session = self._open()
        with gcp_errors(what):
            response = session.request(
                method,
                path if path.startswith(("http://", "https://")) else f"{self._base()}/{path}",
                json=body,
                params=params,
                timeout=REQUEST_TIMEOUT_S,
            )
        if response.status_code >= 400:
            exc = api.from_http_response(response)
            raise translate(exc, what) from exc
        return dict(response.json()) if response.content else {}

    def _path(self, email: str) -> str:
        return f"projects/{self.project}/serviceAccounts/{email}"

    def create(self, run_id: str, bucket: str | None) -> dict[str, Any]:
        """Create the run's account, or return it if it exists (409: a retry, or a concurrent
        create). Raises ProviderError if an account of that id belongs to something else.
        Idempotent; blocks."""
        email = service_account_email(self.project, run_id)
        body = {
            "accountId": account_id(run_id),
            "serviceAccount": {
                "displayName": display_name(run_id),
                "description": description(run_id, bucket),
            },
        }
        what = f"create service account {email}"
        try:
            return self.call("POST", f"projects/{self.project}/serviceAccounts", what, body)
        except ProviderError as err:
            if not already_exists(err):
                raise
        account = self.get(email)
        if account is None:  # it exists, but reads lag behind (IAM is eventually consistent)
            raise TransientError(f"{what}: it exists but cannot be read yet")
        if run_of(account) != run_id:
            raise ProviderError(
                f"{what}: an account of that id exists and is not cloudtrain's for run {run_id}",
                hint="delete it, or set providers.gcp.service_account in job.yaml",
            )
        return account

    def get(self, email: str) -> dict[str, Any] | None:
        """The account, or None if it does not exist. Blocks."""
        try:
            return self.call("GET", self._path(email), f"read service account {email}")
        except NotFound:
            return None

    def list(self) -> list[dict[str, Any]]:
        """Every service account of the project (all pages). Blocks."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            params: dict[str, Any] = {"pageSize": 100}
            if token:
                params["pageToken"] = token
            page = self.call(
                "GET",
                f"projects/{self.project}/serviceAccounts",
                f"list the service accounts of project {self.project}",
                params=params,
            )
            out += list(page.get("accounts") or [])
            token = str(page.get("nextPageToken") or "")
            if not token:
                return out

    def delete(self, email: str) -> None:
        """Delete the account. Idempotent: a missing one is fine. Blocks."""
        try:
            self.call("DELETE", self._path(email), f"delete service account {email}")
        except NotFound:
            return


# --- the bucket policy -------------------------------------------------------------------------


def _update_policy(
    client: Any,
    bucket_name: str,
    change: Callable[[list[dict[str, Any]]], bool],
    what: str,
    new_account: str | None = None,
) -> None:
    """Read-modify-write the bucket's IAM policy (version 3) with its etag: `change` edits the
    bindings in place and says whether anything changed (nothing changed: no write). A
    concurrent writer (409/412), or GCS not knowing `new_account` yet, makes it read again
    (`while_propagating`); then the last such error, a TransientError. Raises NotFound for a
    missing bucket. Blocks."""

    def once() -> None:
        bucket = client.bucket(bucket_name)
        with gcp_errors(f"read the IAM policy of gs://{bucket_name}"):
            policy = bucket.get_iam_policy(requested_policy_version=3)
        bindings = [dict(b) for b in policy.bindings]
        if not change(bindings):
            return
        policy.version = 3
        policy.bindings = bindings
        try:
            with gcp_errors(what):
                bucket.set_iam_policy(policy)
        except ProviderError as err:
            if error_codes(err) & _CONFLICT_CODES:
                raise PolicyConflict(f"{what}: the policy kept changing underneath") from err
            if new_account is not None and not_visible_yet(err, new_account):
                raise NotVisibleYet(f"{what}: {new_account} is unknown to Cloud Storage") from err
            raise

    while_propagating(once, what, (PolicyConflict, NotVisibleYet))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("role") == b.get("role") and a.get("condition") == b.get("condition")


def grant(client: Any, email: str, bucket: str, root: str, run_id: str) -> bool:
    """Give the account the run's prefix binding on `bucket` (and no other binding there): the
    controller's grant. Returns False, granting nothing, when the bucket does not exist (yet):
    the account then reaches no object at all. A new account that GCS does not know yet is
    waited for up to PROPAGATION_S. Idempotent; blocks."""
    wanted = [prefix_binding(email, bucket, root, run_id)]
    what = f"grant {email} the prefix {run_prefix(root, run_id)} of gs://{bucket}"
    return _grant(client, email, bucket, wanted, what)


def grant_node(client: Any, email: str, bucket: str, root: str, run_id: str) -> bool:
    """Give the nodes' account its bindings on `bucket` (`node_bindings`, and no other binding
    there: a binding of an older cloudtrain, the whole prefix, goes). False, granting nothing,
    when the bucket does not exist (yet). Waits for a new account like `grant`. Idempotent;
    blocks."""
    wanted = node_bindings(email, bucket, root, run_id)
    what = f"grant {email} the node rights on {run_prefix(root, run_id)} of gs://{bucket}"
    return _grant(client, email, bucket, wanted, what)


def _grant(client: Any, email: str, bucket: str, wanted: list[dict[str, Any]], what: str) -> bool:
    """Make `email`'s bindings on `bucket` exactly `wanted` (by role and condition), keeping
    every other member's. False when the bucket does not exist. Idempotent; blocks."""
    member = f"serviceAccount:{email}"

    def change(bindings: list[dict[str, Any]]) -> bool:
        before = [(b["role"], sorted(b.get("members") or ()), b.get("condition")) for b in bindings]
        for b in bindings:
            if not any(_same(b, w) for w in wanted):
                b["members"] = set(b.get("members") or ()) - {member}
        kept = [b for b in bindings if b.get("members")]
        for w in wanted:
            mine = next((b for b in kept if _same(b, w)), None)
            if mine is None:
                kept.append(dict(w))
            else:
                mine["members"] = set(mine.get("members") or ()) | {member}
        bindings[:] = kept
        after = [(b["role"], sorted(b.get("members") or ()), b.get("condition")) for b in kept]
        return sorted(before, key=repr) != sorted(after, key=repr)

    try:
        _update_policy(client, bucket, change, what, new_account=email)
    except NotFound:
        return False
    return True


def revoke(client: Any, email: str, bucket: str) -> None:
    """Remove the account from every binding of `bucket` (bindings left empty go). Idempotent:
    no such binding, or no bucket, is fine. Blocks."""
    member = f"serviceAccount:{email}"

    def change(bindings: list[dict[str, Any]]) -> bool:
        if not any(member in (b.get("members") or ()) for b in bindings):
            return False
        for b in bindings:
            b["members"] = set(b.get("members") or ()) - {member}
        bindings[:] = [b for b in bindings if b["members"]]
        return True

    try:
        _update_policy(client, bucket, change, f"remove {email} from gs://{bucket}")
    except NotFound:
        return


def storage_client(auth: GcpAuth) -> Any:
    """A google-cloud-storage client for bucket policies: the adapter's credentials, or
    anonymous ones on the emulator (STORAGE_EMULATOR_HOST). Makes no call."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    credentials = AnonymousCredentials() if emulated else auth.credentials
    with gcp_errors("open a Cloud Storage client for bucket policies"):
        return storage.Client(project=auth.project, credentials=credentials)


def as_resource(project: str, run_id: str, account: dict[str, Any] | None = None) -> Resource:
    """The account as a Resource (id = its email, region `global`). Pure."""
    email = str((account or {}).get("email") or service_account_email(project, run_id))
    unique = (account or {}).get("uniqueId")
    return Resource("gcp", KIND_SERVICE_ACCOUNT, email, "global", run_id, unique and str(unique))


def tagged(iam: IamClient) -> list[Tagged]:
    """Every run's service account in the project (see `run_of`), as Tagged (IAM reports no
    creation time; region None: global). Blocks; read-only."""
    out = []
    for account in iam.list():
        run_id = run_of(account)
        if run_id is not None:
            out.append(Tagged(run_id, KIND_SERVICE_ACCOUNT, str(account["email"]), None))
    return out
