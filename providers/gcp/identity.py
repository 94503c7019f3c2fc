"""The nodes' identities: one service account per node id of a run, reaching only what that node
writes in the run's bucket prefix (issue 29).

Each node id of `RunInfo.nodes` ("chief-0", "worker-1", ...) gets its own service account,
made through the IAM REST API (`POST {IAM}/v1/projects/{project}/serviceAccounts`); a
replacement of that node (a preempted spot VM made again) runs as the same account. Its
account id is derived from the run id and the node id alone (`node_account_id`: `ct-` + a
readable part of the run id + a short hash of the run + a short hash of the node, 6-30
characters), so a retry or a `down` from a fresh process finds the same accounts; its display
name is `cloudtrain run <run_id> node <node>` and its description names the bucket, so `find()`
and `tagged()` recognise it from the cloud alone (no ledger) and `delete()` knows which bucket
policy to clean. An account of an older cloudtrain (one per run: `account_id(run_id)`, shown as
`cloudtrain run <run_id>`) is still recognised, so `down` removes it.

A project holds at most 100 service accounts by default ("Quotas and limits" of IAM,
https://cloud.google.com/iam/quotas, "Service account quotas": "Service accounts per project:
100", raisable on request): a run of N nodes now takes N of them (and its controller one more).

The node accounts' bindings on the run's bucket are node_bindings.py's: reads of the run's
objects but the run's key, writes of only what `node_rights.node_writes` gives that node.

The controller's account (`prefix_binding`, `grant`: see controller_identity.py) gets one
binding on the run's bucket (uniform bucket-level access), `roles/storage.objectAdmin` with the
IAM condition (policy version 3)

    resource.name.startsWith("projects/_/buckets/B/objects/P")
      || api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("P")

where P is `<store prefix>cloudtrain/runs/<run_id>/`. The first half scopes object reads,
writes and deletes to the run's prefix; the second admits `storage.objects.list` (a
bucket-level permission that a condition on `resource.name` cannot narrow) only for listings
whose `prefix` lies inside the run's prefix. That is the documented way to grant a prefix
listing with IAM Conditions (the `objectListPrefix` API attribute,
https://cloud.google.com/iam/docs/conditions-attribute-reference, "API attributes").

`CLOUDTRAIN_IAM_ENDPOINT=http://host:port` points the IAM calls at another endpoint with
anonymous credentials, as CLOUDTRAIN_GCE_ENDPOINT does for Compute Engine. The bucket policy is
read and written with google-cloud-storage, which honours STORAGE_EMULATOR_HOST itself.
Every error is translated by `errors.translate`: 429/5xx become TransientError, which the
callers (orchestrator, teardown, `create_nodes`) retry through `cloudtrain.core.retry`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cloudtrain.core import env
from cloudtrain.core.errors import NotFound, ProviderError, TransientError
from cloudtrain.core.retry import retrying
from cloudtrain.jobs import protocol
from cloudtrain.providers.base import Resource, Tagged
from cloudtrain.providers.gcp.clients import GcpAuth
from cloudtrain.providers.gcp.errors import already_exists, error_codes, gcp_errors, translate
from cloudtrain.providers.gcp.node_bindings import (  # noqa: F401 (the nodes' roles, re-exported)
    LIST_PREFIX_ATTRIBUTE,
    MAX_LOGICAL_OPERATORS,
    OBJECT_ADMIN,
    OBJECT_VIEWER,
    node_bindings,
)

KIND_SERVICE_ACCOUNT = "service_account"
IAM_ENDPOINT_ENV = env.IAM_ENDPOINT.name
IAM_API = "https://iam.googleapis.com"
DISPLAY_PREFIX = "cloudtrain run "
NODE_INFIX = " node "  # a node account's display name: `cloudtrain run <run> node <node>`
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
    """The id of the one node account per run of an older cloudtrain (still recognised, so a
    `down` removes it): `ct-<up to 18 chars of the run id>-<8 hex>`, 6-30 characters of
    `[a-z]([-a-z0-9]*[a-z0-9])`. Pure."""
    readable = re.sub(r"[^a-z0-9-]+", "-", run_id.lower())[:18].strip("-")
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    value = f"ct-{readable}-{digest}" if readable else f"ct-{digest}"
    assert _ACCOUNT_ID_RE.match(value) and 6 <= len(value) <= 30, value
    return value


def email_domain(project: str) -> str:
    """The domain of `project`'s service accounts (a domain-scoped project `example.com:proj`
    has `...@proj.example.com.iam.gserviceaccount.com`). Pure."""
    domain, _, name = project.rpartition(":")
    host = f"{name}.{domain}" if domain else project
    return f"{host}.iam.gserviceaccount.com"


def service_account_email(project: str, run_id: str) -> str:
    """The email of an older cloudtrain's one node account of the run (`account_id`). Pure."""
    return f"{account_id(run_id)}@{email_domain(project)}"


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def node_account_prefix(run_id: str) -> str:
    """What every node account id of the run starts with: `ct-<up to 12 chars of the run
    id>-<6 hex of the run id>-`. Pure."""
    readable = re.sub(r"[^a-z0-9-]+", "-", run_id.lower())[:12].strip("-")
    digest = _hex(f"{run_id}/nodes", 6)
    return f"ct-{readable}-{digest}-" if readable else f"ct-{digest}-"


def node_account_id(run_id: str, node: str) -> str:
    """Node `node`'s service account id in run `run_id`: `node_account_prefix` + 5 hex of the
    run and node ids; always 6-30 characters of `[a-z]([-a-z0-9]*[a-z0-9])`, the same for the
    same run and node (a replacement node, a retry, a fresh `down` find it). Pure."""
    value = node_account_prefix(run_id) + _hex(f"{run_id}/{node}", 5)
    assert _ACCOUNT_ID_RE.match(value) and 6 <= len(value) <= 30, value
    return value


def node_email(project: str, run_id: str, node: str) -> str:
    """The email of node `node`'s account of run `run_id` in `project`. Pure."""
    return f"{node_account_id(run_id, node)}@{email_domain(project)}"


def is_node_email(project: str, run_id: str, email: str) -> bool:
    """Whether `email` has the shape of one of the run's node accounts in `project` (by name
    only: `run_of` checks the account itself), or is the run's account of an older
    cloudtrain. Pure."""
    local, _, domain = email.partition("@")
    if domain != email_domain(project):
        return False
    if local == account_id(run_id):
        return True
    prefix = node_account_prefix(run_id)
    tail = local[len(prefix) :]
    hexes = all(c in "0123456789abcdef" for c in tail)
    return local.startswith(prefix) and len(tail) == 5 and hexes


def display_name(run_id: str, node: str) -> str:
    """Node `node`'s account's display name, `cloudtrain run <run_id> node <node>` (how
    listings recognise it). Raises ProviderError over IAM's 100 characters. Pure."""
    text = f"{DISPLAY_PREFIX}{run_id}{NODE_INFIX}{node}"
    if len(text) > DISPLAY_MAX:
        raise ProviderError(f"run {run_id}: the node id {node} is too long to name its account")
    return text


def description(run_id: str, node: str, bucket: str | None) -> str:
    """Node `node`'s account's description: the run, the node and the bucket its bindings are
    on. Raises ProviderError when it would not fit IAM's 256 characters (a very long bucket
    name). Pure."""
    text = f"{DISPLAY_PREFIX}{run_id}{NODE_INFIX}{node}: node identity"
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


def node_of(account: dict[str, Any]) -> tuple[str, str] | None:
    """(run id, node id) of a listed node account, or None when it is not one cloudtrain made:
    its display name must name a run and node whose derived account id is the account's own.
    Pure."""
    shown = str(account.get("displayName") or "")
    if not shown.startswith(DISPLAY_PREFIX) or NODE_INFIX not in shown:
        return None
    run_id, _, node = shown[len(DISPLAY_PREFIX) :].rpartition(NODE_INFIX)
    local = str(account.get("email") or "").split("@", 1)[0]
    if run_id and node and local == node_account_id(run_id, node):
        return run_id, node
    return None


def run_of(account: dict[str, Any]) -> str | None:
    """The run a listed node account belongs to (`node_of`, or an older cloudtrain's one
    account of a run, `cloudtrain run <run_id>` with `account_id(run_id)`), or None when it is
    not one cloudtrain made. Pure."""
    found = node_of(account)
    if found is not None:
        return found[0]
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
        endpoint = env.IAM_ENDPOINT.text()
        return (endpoint or IAM_API).rstrip("/") + "/v1"

    def _open(self) -> Any:
        with self._lock:
            if self._session is None:
                from google.auth.credentials import AnonymousCredentials
                from google.auth.transport.requests import AuthorizedSession

                overridden = bool(env.IAM_ENDPOINT.text())
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

    def create(self, run_id: str, node: str, bucket: str | None) -> dict[str, Any]:
        """Create node `node`'s account of run `run_id`, or return it if it exists (409: a
        retry, or a concurrent create). Raises ProviderError if an account of that id belongs
        to something else. Idempotent; blocks."""
        email = node_email(self.project, run_id, node)
        body = {
            "accountId": node_account_id(run_id, node),
            "serviceAccount": {
                "displayName": display_name(run_id, node),
                "description": description(run_id, node, bucket),
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
        if node_of(account) != (run_id, node):
            raise ProviderError(
                f"{what}: an account of that id exists and is not cloudtrain's for node {node} "
                f"of run {run_id}",
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
    new_accounts: list[str] | None = None,
) -> None:
    """Read-modify-write the bucket's IAM policy (version 3) with its etag: `change` edits the
    bindings in place and says whether anything changed (nothing changed: no write). A
    concurrent writer (409/412), or GCS not knowing one of `new_accounts` yet, makes it read again
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
            unknown = [a for a in new_accounts or () if not_visible_yet(err, a)]
            if unknown:
                raise NotVisibleYet(f"{what}: {unknown[0]} is unknown to Cloud Storage") from err
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


def grant_nodes(
    client: Any, bucket: str, root: str, run_id: str, emails: dict[str, str], chief: str | None
) -> bool:
    """Give each node account (`emails`: node id -> email) its bindings on `bucket`
    (`node_bindings.node_bindings`, the chief's for `chief`; and no other binding there: a
    binding of an older cloudtrain goes), in one read-modify-write of the bucket policy.
    False, granting nothing, when the bucket does not exist (yet). Waits for new accounts like
    `grant`. Idempotent; blocks."""
    wanted = {
        email: node_bindings(email, bucket, root, run_id, node, chief=node == chief)
        for node, email in emails.items()
    }
    what = f"grant the node accounts of {run_prefix(root, run_id)} of gs://{bucket} their rights"
    return _grant_many(client, bucket, wanted, what)


def _grant(client: Any, email: str, bucket: str, wanted: list[dict[str, Any]], what: str) -> bool:
    """Make `email`'s bindings on `bucket` exactly `wanted`; see `_grant_many`."""
    return _grant_many(client, bucket, {email: wanted}, what)


def _grant_many(
    client: Any, bucket: str, wanted_by: dict[str, list[dict[str, Any]]], what: str
) -> bool:
    """Make each account's bindings on `bucket` exactly its `wanted_by` list (by role and
    condition), keeping every other member's. False when the bucket does not exist.
    Idempotent; blocks."""

    def change(bindings: list[dict[str, Any]]) -> bool:
        before = [(b["role"], sorted(b.get("members") or ()), b.get("condition")) for b in bindings]
        kept = bindings
        for email, wanted in wanted_by.items():
            member = f"serviceAccount:{email}"
            for b in kept:
                if not any(_same(b, w) for w in wanted):
                    b["members"] = set(b.get("members") or ()) - {member}
            kept = [b for b in kept if b.get("members")]
            for w in wanted:
                mine = next((b for b in kept if _same(b, w)), None)
                if mine is None:
                    kept.append(dict(w))
                else:
                    mine["members"] = set(mine.get("members") or ()) | {member}
        bindings[:] = kept
        after = [(b["role"], sorted(b.get("members") or ()), b.get("condition")) for b in kept]
        return sorted(before, key=repr) != sorted(after, key=repr)

    new_accounts = list(wanted_by)
    try:
        _update_policy(client, bucket, change, what, new_accounts=new_accounts)
    except NotFound:
        return False
    return True


def revoke(client: Any, email: str | list[str], bucket: str) -> None:
    """Remove the account(s) from every binding of `bucket` (bindings left empty go), in one
    read-modify-write. Idempotent: no such binding, or no bucket, is fine. Blocks."""
    emails = [email] if isinstance(email, str) else list(email)
    members = {f"serviceAccount:{e}" for e in emails}

    def change(bindings: list[dict[str, Any]]) -> bool:
        if not any(members & set(b.get("members") or ()) for b in bindings):
            return False
        for b in bindings:
            b["members"] = set(b.get("members") or ()) - members
        bindings[:] = [b for b in bindings if b["members"]]
        return True

    try:
        _update_policy(client, bucket, change, f"remove {', '.join(emails)} from gs://{bucket}")
    except NotFound:
        return


def storage_client(auth: GcpAuth) -> Any:
    """A google-cloud-storage client for bucket policies: the adapter's credentials, or on an
    emulator (STORAGE_EMULATOR_HOST) the environment's own (`storage.environment_credentials`;
    anonymous when it has none). Makes no call but ADC's lookup on an emulator."""
    from google.cloud import storage

    from cloudtrain.providers.gcp.storage import environment_credentials

    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    credentials = environment_credentials() if emulated else auth.credentials
    with gcp_errors("open a Cloud Storage client for bucket policies"):
        return storage.Client(project=auth.project, credentials=credentials)


def as_resource(
    project: str, run_id: str, node: str, account: dict[str, Any] | None = None
) -> Resource:
    """Node `node`'s account (or the listed `account`) as a Resource (id = its email, region
    `global`). Pure."""
    email = str((account or {}).get("email") or node_email(project, run_id, node))
    unique = (account or {}).get("uniqueId")
    return Resource("gcp", KIND_SERVICE_ACCOUNT, email, "global", run_id, unique and str(unique))


def runs_accounts(accounts: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The run's node accounts (`run_of`) among `accounts` (an IAM listing). Pure."""
    return [a for a in accounts if run_of(a) == run_id]


def tagged(accounts: list[dict[str, Any]]) -> list[Tagged]:
    """Every run's node account among `accounts` (an IAM listing; see `run_of`), as Tagged
    (IAM reports no creation time; region None: global). Pure."""
    out = []
    for account in accounts:
        run_id = run_of(account)
        if run_id is not None:
            out.append(Tagged(run_id, KIND_SERVICE_ACCOUNT, str(account["email"]), None))
    return out
