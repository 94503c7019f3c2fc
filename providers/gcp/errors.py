"""google-api-core / google-auth exceptions -> cloudtrain errors. The only place GCP error codes
and reasons are interpreted.

Use `with gcp_errors("create instance ct-x-worker-0 in us-central1-a", zone="us-central1-a"):`
around every SDK call; `what` names the resource, so the message says what failed and the hint
what to do. A finished Compute Engine Operation reports its failure in `error.errors` instead of
raising: pass it to `operation_error(what, op, zone)`.

Every error returned here carries the GCP codes/reasons it was made from in its `codes` field
(`error_codes(err)`), so a caller can tell one failure from another without catching SDK
exceptions; "already exists" is an AlreadyExists (a ProviderError): `already_exists(err)`.

Messages never include credentials: an auth error contributes its first line only (google-auth
puts raw token-endpoint responses in later arguments).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth

from cloudtrain.core.errors import (
    AlreadyExists,
    CloudtrainError,
    CredentialsError,
    NoCapacityError,
    NotFound,
    PreconditionFailed,
    ProviderError,
    QuotaError,
    TransientError,
)

try:  # google-cloud-storage's media errors (a checksum mismatch on download, a bad upload reply)
    from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
except ImportError:  # pragma: no cover - storage not installed (compute only)
    DataCorruption = InvalidResponse = None  # type: ignore[assignment,misc]

LOGIN_HINT = "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"
PERMISSION_HINT = (
    "the Google Cloud identity lacks an IAM permission for this; check `gcloud auth list` "
    "and the roles granted to it in the project"
)
CAPACITY_HINT = "cloudtrain tries the region's next zone"

# Per-zone capacity: Compute Engine operation codes, the bulk API's reason, and the message text.
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "insufficientCapacity",
    }
)
CAPACITY_TEXT = "does not have enough resources available to fulfill the request"
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "RESOURCE_QUOTA_EXCEEDED"})
# API request-rate limits (403 or 429): retry, never a quota to raise.
RATE_CODES = frozenset(
    {
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "RATE_LIMIT_EXCEEDED",
        "RESOURCE_OPERATION_RATE_EXCEEDED",
    }
)
# Operation codes that a retry (with backoff) can fix.
TRANSIENT_CODES = RATE_CODES | {
    "INTERNAL_ERROR",
    "RESOURCE_NOT_READY",  # e.g. a network still being created
    "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",  # e.g. a firewall of instances still being deleted
    "SERVICE_UNAVAILABLE",
    "backendError",
}
NOT_FOUND_CODES = frozenset({"RESOURCE_NOT_FOUND", "NOT_FOUND", "notFound"})
ALREADY_EXISTS_CODES = frozenset(
    {"RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS", "alreadyExists", "conflict", "409"}
)
SERVICE_DISABLED_CODES = frozenset({"accessNotConfigured", "SERVICE_DISABLED"})
PERMISSION_CODES = frozenset(
    {"IAM_PERMISSION_DENIED", "PERMISSION_DENIED", "forbidden", "insufficientPermissions"}
)
TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    api.TooManyRequests,  # 429 (and its gRPC twin ResourceExhausted)
    api.InternalServerError,  # 500
    api.BadGateway,  # 502
    api.ServiceUnavailable,  # 503
    api.GatewayTimeout,  # 504 (and DeadlineExceeded)
    ConnectionError,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    auth.TransportError,  # the token endpoint or metadata server could not be reached
)
# What `gcp_errors` catches: everything the Google SDKs raise for a failed call.
SDK_EXCEPTIONS: tuple[type[BaseException], ...] = (
    api.GoogleAPIError,
    auth.GoogleAuthError,
    requests.exceptions.RequestException,
    ConnectionError,
    *(e for e in (DataCorruption, InvalidResponse) if e is not None),
)

# The permission an access-denied message names: Compute Engine's "Required 'compute.instances.
# create' permission for 'projects/P/zones/Z/instances/N'", IAM's and Resource Manager's
# "Permission 'iam.serviceAccounts.create' denied on resource ..." (and Cloud Storage's
# "... does not have storage.buckets.create access to ..."), and IAM's older "Permission
# iam.serviceAccounts.create is required to perform this operation on project ...".
_PERMISSION_RE = re.compile(
    r"Required '(?P<a>[\w.]+)' permission|Permission '(?P<b>[\w.]+)' denied"
    r"|does not have (?P<c>[a-z]+\.[\w.]+) access|Permission (?P<d>[a-z]+\.[\w.]+) is required"
)
_SERVICE_RE = re.compile(r"apis/api/(?P<service>[\w.-]+\.googleapis\.com)/")
_QUOTA_RE = re.compile(r"Quota '(?P<name>[^']+)' exceeded\.?\s*(?:Limit:\s*(?P<limit>[\d.]+))?")
_QUOTA_SCOPE_RE = re.compile(r"(?P<scope>in region [\w-]+|in zone [\w-]+|globally)")


def error_codes(err: BaseException) -> frozenset[str]:
    """The GCP codes/reasons (and HTTP status, as a string) behind a translated error (its
    `codes`; empty for any other exception). Pure."""
    return frozenset(getattr(err, "codes", None) or ())


def already_exists(err: BaseException) -> bool:
    """Whether a translated error means "the resource already exists" (409 / ALREADY_EXISTS):
    an AlreadyExists, or an error carrying such a code. Pure."""
    return isinstance(err, AlreadyExists) or bool(error_codes(err) & ALREADY_EXISTS_CODES)


def _codes(codes: Iterable[str]) -> frozenset[str]:
    return frozenset(c for c in codes if c)


def _refused(text: str, codes: Iterable[str]) -> ProviderError:
    """A ProviderError, or an AlreadyExists when `codes` say the resource already exists."""
    tagged = _codes(codes)
    kind = AlreadyExists if tagged & ALREADY_EXISTS_CODES else ProviderError
    return kind(text, codes=tagged)


def _field(item: Any, name: str) -> Any:
    """`item[name]` for a dict, `item.name` for a proto/object; None if absent."""
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def _api_codes(exc: api.GoogleAPICallError) -> list[str]:
    """Reasons of a GoogleAPICallError: its ErrorInfo reason and each `errors[]` reason/code."""
    codes = [str(exc.code)] if exc.code else []
    if exc.reason:
        codes.append(str(exc.reason))
    for item in exc.errors:
        for name in ("reason", "code"):
            value = _field(item, name)
            if isinstance(value, str) and value:
                codes.append(value)
    return codes


def _api_text(exc: api.GoogleAPICallError) -> str:
    parts = [str(exc.message or "")]
    for item in exc.errors:
        message = _field(item, "message")
        if isinstance(message, str) and message and message not in parts[0]:
            parts.append(message)
    return "; ".join(p for p in parts if p) or type(exc).__name__


def denied_permission(text: str) -> str | None:
    """The IAM permission an access-denied message names, or None. Pure."""
    match = _PERMISSION_RE.search(text)
    return None if match is None else match["a"] or match["b"] or match["c"] or match["d"]


def _permission_hint(text: str) -> str:
    """The hint for an access-denied error: the permission to grant, when the message names it."""
    permission = denied_permission(text)
    if permission is None:
        return PERMISSION_HINT
    return (
        f"the Google Cloud identity lacks the IAM permission {permission}: grant it a role that "
        "holds it in the project (`cloudtrain check` lists every permission a run needs)"
    )


def _service_hint(text: str, metadata: Mapping[str, str] | None) -> str:
    """The hint for a disabled API: enable the one the error names (ErrorInfo metadata
    `service`, else the console link in the message), else compute and storage."""
    service = (metadata or {}).get("service")
    if not service:
        match = _SERVICE_RE.search(text)
        service = match["service"] if match else "compute.googleapis.com storage.googleapis.com"
    return f"enable the API: `gcloud services enable {service}`"


def _quota_name(text: str, metadata: Mapping[str, str] | None = None) -> str:
    """The quota a message names ("GPUS_ALL_REGIONS (limit 0.0 globally)"), or a generic name."""
    match = _QUOTA_RE.search(text)
    if match:
        name = match["name"]
        detail = [f"limit {match['limit']}"] if match["limit"] else []
        scope = _QUOTA_SCOPE_RE.search(text[match.end() :])
        if scope:
            detail.append(scope["scope"])
        return f"{name} ({' '.join(detail)})" if detail else name
    if metadata:
        for key in ("quota_limit", "quota_metric", "quota_id"):
            if metadata.get(key):
                return str(metadata[key])
    return "Compute Engine"


def _quota_error(
    text: str, codes: list[str], metadata: Mapping[str, str] | None = None
) -> CloudtrainError:
    name = _quota_name(text, metadata)
    short = name.split(" ")[0]
    message = text if f"'{short}'" in text else f"{text} (quota {name})"
    return QuotaError(
        message,
        hint=f"ask Google Cloud to raise the {name} quota (console: IAM & Admin > Quotas), "
        "or choose another region or GPU type",
        codes=_codes(codes),
    )


def _classify(
    text: str,
    codes: list[str],
    zone: str | None,
    metadata: Mapping[str, str] | None = None,
    tagged: list[str] | None = None,
) -> CloudtrainError | None:
    """The error for codes/text that decide it on their own (capacity, rate, quota), else None.
    The error carries `tagged` (default: `codes`)."""
    code_set = set(codes)
    carried = _codes(codes if tagged is None else tagged)
    if code_set & CAPACITY_CODES or CAPACITY_TEXT in text:
        where = f" (zone {zone})" if zone and zone not in text else ""
        return NoCapacityError(f"{text}{where}", zone=zone, hint=CAPACITY_HINT, codes=carried)
    if code_set & RATE_CODES:
        return TransientError(text, codes=carried)
    if code_set & QUOTA_CODES or _QUOTA_RE.search(text):
        return _quota_error(text, list(carried), metadata)
    if code_set & SERVICE_DISABLED_CODES:
        return ProviderError(text, hint=_service_hint(text, metadata), codes=carried)
    return None


def _first_line(exc: BaseException) -> str:
    """A google-auth error's own message, without the raw response it may carry."""
    arg = exc.args[0] if exc.args else ""
    text = str(arg).strip().splitlines()[0] if str(arg).strip() else type(exc).__name__
    return text[:300]


def translate(exc: BaseException, what: str, zone: str | None = None) -> CloudtrainError:
    """The cloudtrain error for a Google SDK exception raised while doing `what`. Pure.

    DefaultCredentialsError/RefreshError -> CredentialsError (log in again); Unauthorized ->
    CredentialsError; Forbidden -> CredentialsError (a missing permission) unless it is a rate
    limit (TransientError), a quota (QuotaError) or a disabled API (ProviderError); NotFound ->
    NotFound; PreconditionFailed (412, a generation precondition) -> PreconditionFailed;
    Conflict/AlreadyExists -> AlreadyExists (a ProviderError; Aborted,
    a concurrent change, is a TransientError);
    429/500/502/503/504 and connection failures -> TransientError; anything that reports
    ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] -> NoCapacityError(zone); QUOTA_EXCEEDED ->
    QuotaError naming the quota. Other SDK errors -> ProviderError; a non-SDK exception is
    re-raised unchanged.
    """
    if isinstance(exc, api.RetryError):
        cause = exc.cause
        if isinstance(cause, SDK_EXCEPTIONS):
            return translate(cause, f"{what} (gave up retrying)", zone)
        return TransientError(f"{what}: gave up retrying: {exc.message}")
    if isinstance(exc, auth.DefaultCredentialsError):
        return CredentialsError(
            f"{what}: no usable Google Cloud credentials: {_first_line(exc)}", hint=LOGIN_HINT
        )
    if isinstance(exc, auth.RefreshError):
        return CredentialsError(
            f"{what}: the Google Cloud credentials could not be refreshed: {_first_line(exc)}",
            hint=LOGIN_HINT,
        )
    if isinstance(exc, api.GoogleAPICallError):
        codes = _api_codes(exc)
        text = f"{what}: {_api_text(exc)}"
        metadata = exc.metadata if isinstance(exc.metadata, Mapping) else None
        decided = _classify(text, codes, zone, metadata)
        if decided is not None:
            return decided
        if isinstance(exc, api.NotFound):
            return NotFound(text, codes=_codes(codes))
        if isinstance(exc, api.PreconditionFailed):  # 412: an ifGenerationMatch that did not hold
            return PreconditionFailed(text, codes=_codes(codes))
        if isinstance(exc, api.Aborted):  # a concurrent change (gRPC ABORTED), not a duplicate
            return TransientError(text, codes=_codes(c for c in codes if c != "409"))
        if isinstance(exc, api.Conflict):  # 409, and its subclass AlreadyExists
            return AlreadyExists(text, codes=_codes(codes))
        if isinstance(exc, api.Unauthorized):
            return CredentialsError(text, hint=LOGIN_HINT, codes=_codes(codes))
        if isinstance(exc, api.Forbidden):
            return CredentialsError(text, hint=_permission_hint(text), codes=_codes(codes))
        status = int(exc.code or 0)
        if isinstance(exc, TRANSIENT_EXCEPTIONS) or status in (408, 429) or status >= 500:
            return TransientError(text, codes=_codes(codes))
        return _refused(text, codes)
    if DataCorruption is not None and isinstance(exc, DataCorruption):
        return TransientError(f"{what}: checksum mismatch in transfer: {_first_line(exc)}")
    if InvalidResponse is not None and isinstance(exc, InvalidResponse):
        status = int(getattr(getattr(exc, "response", None), "status_code", 0) or 0)
        text = f"{what}: unexpected response (HTTP {status or '?'}): {_first_line(exc)}"
        if status == 404:
            return NotFound(text, codes=_codes([str(status)]))
        if status == 412:  # a generation precondition (cloud.google.com/storage/docs/request-
            return PreconditionFailed(text, codes=_codes([str(status)]))  # preconditions)
        if status in (408, 429) or status >= 500:
            return TransientError(text, codes=_codes([str(status)]))
        return _refused(text, [str(status)] if status else [])
    if isinstance(exc, TRANSIENT_EXCEPTIONS):
        return TransientError(f"{what}: cannot reach Google Cloud: {_first_line(exc)}")
    if isinstance(exc, SDK_EXCEPTIONS):
        return ProviderError(f"{what}: {_first_line(exc)}")
    raise exc


@contextlib.contextmanager
def gcp_errors(what: str, zone: str | None = None) -> Iterator[None]:
    """Translate Google SDK exceptions raised inside the block (see `translate`); the SDK
    exception becomes the `__cause__`. Other exceptions pass through unchanged."""
    try:
        yield
    except SDK_EXCEPTIONS as exc:
        raise translate(exc, what, zone) from exc


def operation_error(what: str, op: Any, zone: str | None = None) -> CloudtrainError | None:
    """The error a finished Compute Engine Operation reports in `error.errors`, or None.

    `op` is a `compute_v1.Operation` or its JSON dict. Each entry's `code` decides, most
    specific first: ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] -> NoCapacityError(zone);
    QUOTA_EXCEEDED -> QuotaError naming the quota; RESOURCE_NOT_FOUND -> NotFound;
    RESOURCE_ALREADY_EXISTS -> AlreadyExists (a ProviderError); rate limits,
    RESOURCE_NOT_READY, RESOURCE_IN_USE_BY_ANOTHER_RESOURCE, INTERNAL_ERROR -> TransientError;
    permission codes -> CredentialsError; anything else -> ProviderError. Pure.
    """
    error = _field(op, "error")
    items = list(_field(error, "errors") or []) if error is not None else []
    if not items:
        return None
    codes = [str(_field(i, "code") or "") for i in items]
    messages = [str(_field(i, "message") or "") for i in items]
    detail = "; ".join(
        f"{c}: {m}" if c and m else (c or m) for c, m in zip(codes, messages, strict=True)
    )
    text = f"{what}: {detail}"
    status = _field(op, "http_error_status_code") or 0
    tagged = [*codes, str(status)] if status else codes
    decided = _classify(text, codes, zone, tagged=tagged)
    if decided is not None:
        return decided
    code_set = set(codes)
    if code_set & NOT_FOUND_CODES:
        return NotFound(text, codes=_codes(tagged))
    if code_set & ALREADY_EXISTS_CODES:
        return AlreadyExists(text, codes=_codes(tagged))
    if code_set & TRANSIENT_CODES:
        return TransientError(text, codes=_codes(tagged))
    if code_set & PERMISSION_CODES:
        return CredentialsError(text, hint=_permission_hint(text), codes=_codes(tagged))
    return _refused(text, tagged)
