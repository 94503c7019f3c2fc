"""azure-core / azure-identity exceptions -> cloudtrain errors. The only place Azure error codes
(ARM and Storage) are interpreted.

Use `with azure_errors("create VM ct-x-worker-0 in eastus zone 1", zone="1"):` around every SDK
call; `what` names the resource, so the message says what failed and the hint what to do. A
failed long-running operation (`poller.result()`) raises an HttpResponseError whose `.error.code`
is the operation's code (AllocationFailed, ...), so it needs no separate helper.

The error code decides before the exception type: ARM answers a quota or capacity failure with
409, which the management SDKs raise as ResourceExistsError, and a 409 "another operation is in
progress" is transient. Every error returned here carries the Azure codes it was made from in its
`codes` field (`error_codes(err)`), so a caller can tell one failure from another without
catching SDK exceptions; "already exists" is an AlreadyExists (a ProviderError):
`already_exists(err)`. Messages are scrubbed of secrets (`scrub`) as the error is made.

Messages never include credentials: SAS query strings (`sig=`) are cut from URLs, `AccountKey=`,
`sig=` and bearer tokens are redacted anywhere, and an identity error contributes its first line.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Any

from azure.core import exceptions as core

from cloudtrain.core.errors import (
    AlreadyExists,
    CloudtrainError,
    CredentialsError,
    NoCapacityError,
    NotFound,
    ProviderError,
    QuotaError,
    TransientError,
)

try:  # azure-identity's "no credential in the chain worked" (a ClientAuthenticationError)
    from azure.identity import CredentialUnavailableError
except ImportError:  # pragma: no cover - azure-identity not installed
    CredentialUnavailableError = core.ClientAuthenticationError  # type: ignore[assignment,misc]

LOGIN_HINT = (
    "run `az login` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET, or run "
    "on a VM with a managed identity)"
)
PERMISSION_HINT = (
    "the Azure identity lacks a role assignment for this; check `az role assignment list "
    "--assignee $(az ad signed-in-user show --query id -o tsv) --all`"
)
STORAGE_PERMISSION_HINT = (
    "blobs need a data role even for an account Owner: `az role assignment create --role "
    "'Storage Blob Data Contributor' --assignee ID --scope STORAGE_ACCOUNT_ID`; a storage "
    "firewall that excludes this machine, or a wrong key in AZURE_STORAGE_CONNECTION_STRING, "
    "is refused the same way"
)
POLICY_HINT = "an Azure Policy assignment forbids this request; ask the subscription's admin"
CAPACITY_HINT = "cloudtrain tries the region's next zone"

CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
    }
)
QUOTA_CODES = frozenset({"QuotaExceeded", "OperationNotAllowed"})  # with quota text only
TRANSIENT_CODES = frozenset(
    {
        "ServerBusy",
        "OperationTimedOut",
        "InternalError",
        "InternalServerError",
        "TooManyRequests",
        "RetryableError",
        "AnotherOperationInProgress",
        "OperationPreempted",
        "NetworkingInternalOperationError",
        "ContainerBeingDeleted",  # a container name is unavailable for a while after a delete
        # the downloader's if-match (a rewrite during a download); BlobStore.put_if's own
        # condition turns it into PreconditionFailed there
        "ConditionNotMet",
    }
)
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
NOT_FOUND_CODES = frozenset(
    {"ResourceNotFound", "ResourceGroupNotFound", "NotFound", "BlobNotFound", "ContainerNotFound"}
)
ALREADY_EXISTS_CODES = frozenset(
    {
        "ContainerAlreadyExists",
        "BlobAlreadyExists",
        "ResourceAlreadyExists",
        "AlreadyExists",
        "StorageAccountAlreadyExists",
        "StorageAccountAlreadyTaken",  # another subscription's: check error_codes() for it
    }
)
AUTHORIZATION_CODES = frozenset({"AuthorizationFailed", "LinkedAuthorizationFailed"})
STORAGE_PERMISSION_CODES = frozenset(
    {"AuthorizationPermissionMismatch", "AuthorizationFailure", "InsufficientAccountPermissions"}
)
LOGIN_CODES = frozenset(
    {
        "InvalidAuthenticationToken",
        "ExpiredAuthenticationToken",
        "InvalidAuthenticationTokenTenant",
        "AuthenticationFailed",
        "NoAuthenticationInformation",
    }
)
TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    core.ServiceRequestError,  # the request never got an answer (DNS, refused, timeout)
    core.ServiceResponseError,  # the answer broke off
    core.IncompleteReadError,
    ConnectionError,
)
# What `azure_errors` catches: everything the Azure SDKs raise for a failed call.
SDK_EXCEPTIONS: tuple[type[BaseException], ...] = (
    core.AzureError,
    core.DeserializationError,
    core.SerializationError,
    ConnectionError,
)

_QUOTA_RES = (
    re.compile(r"exceeding approved (?P<name>[\w .-]+?) quota"),
    re.compile(r"exceeding quota limits of (?P<name>[\w .-]+?)\."),
)
_QUOTA_DETAIL_RES = (  # (how a value is shown, where the message has it)
    ("limit {}", re.compile(r"(?:Current Limit|Maximum allowed): (?P<v>\d+)")),
    ("usage {}", re.compile(r"(?:Current Usage|Current in use): (?P<v>\d+)")),
    ("needs {} more", re.compile(r"(?:Additional Required|Additional requested): (?P<v>\d+)")),
    ("in {}", re.compile(r"Location: (?P<v>[\w-]+)")),
)
_ACTION_RE = re.compile(r"does not have (?:authorization|permission) to perform action(?:\(s\))? '")
_NAMESPACE_RE = re.compile(r"namespace '(?P<ns>[\w.]+)'")
_SAS_URL_RE = re.compile(r"(?P<url>https?://[^\s?'\"<>]+)\?[^\s'\"<>]*\bsig=[^\s'\"<>]*")
_SECRET_RE = re.compile(
    r"(?i)\b(?P<key>sig|accountkey|sharedaccesssignature|sharedaccesskey|client_secret)="
    r"[^&;\s'\"<>]+"
)
_BEARER_RE = re.compile(r"(?i)\bbearer\s+[\w.~+/=-]+")
# A storage account that does not exist has no DNS name: "does not resolve" is definitive
# (EAI_NONAME), unlike "Temporary failure in name resolution" (EAI_AGAIN, no DNS at all).
_UNRESOLVED_RE = re.compile(
    r"Name or service not known|nodename nor servname provided|No such host is known|"
    r"\[Errno -2\]|\[Errno 11001\]"
)
_BLOB_HOST_RE = re.compile(r"\b(?P<account>[a-z0-9]{3,24})\.blob\.core\.[a-z.]+[a-z]")
ACCOUNT_NOT_FOUND = "StorageAccountNotFound"  # cloudtrain's own code for that case
EXISTS_ERROR = "ResourceExistsError"  # tagged on a 409 that no more specific code explained
MAX_TEXT = 1200


def scrub(text: str) -> str:
    """`text` without SAS query strings, account keys, signatures or bearer tokens. Pure."""
    text = _SAS_URL_RE.sub(lambda m: m["url"], text)
    text = _SECRET_RE.sub(lambda m: f"{m['key']}=REDACTED", text)
    return _BEARER_RE.sub("Bearer REDACTED", text)


def error_codes(err: BaseException) -> frozenset[str]:
    """The Azure codes (and HTTP status, as a string) behind a translated error (its `codes`;
    empty for any other exception). Pure."""
    return frozenset(getattr(err, "codes", None) or ())


def already_exists(err: BaseException) -> bool:
    """Whether a translated error means "the resource already exists" (a container, a blob, a
    storage account name; a 409 that carries no more specific code): an AlreadyExists, or an
    error carrying such a code. Pure."""
    return isinstance(err, AlreadyExists) or bool(
        error_codes(err) & (ALREADY_EXISTS_CODES | {EXISTS_ERROR})
    )


def _codeset(codes: Iterable[str]) -> frozenset[str]:
    return frozenset(c for c in codes if c)


def _code_text(code: Any) -> str:
    """A code as text: the storage SDK reports StorageErrorCode enums (str() gives the name)."""
    if code is None:
        return ""
    return str(code.value if isinstance(code, Enum) else code)


def _codes(exc: core.HttpResponseError) -> list[str]:
    """Every code an HttpResponseError carries: the storage `error_code`, the ARM/OData error
    and its details (recursively), the x-ms-error-code header, and the HTTP status."""
    codes = [_code_text(getattr(exc, "error_code", None))]
    stack = [exc.error] if exc.error is not None else []
    while stack:
        item = stack.pop(0)
        codes.append(_code_text(getattr(item, "code", None)))
        stack.extend(getattr(item, "details", None) or [])
    headers = getattr(exc.response, "headers", None)
    if headers is not None:
        with contextlib.suppress(Exception):
            codes.append(_code_text(headers.get("x-ms-error-code")))
    if exc.status_code:
        codes.append(str(exc.status_code))
    return list(dict.fromkeys(c for c in codes if c))


def _messages(exc: core.HttpResponseError) -> list[str]:
    """The messages of the ARM/OData error and its details, or the storage message's first
    line (the rest is request id, time and the raw body)."""
    parts: list[str] = []
    stack = [exc.error] if exc.error is not None else []
    while stack:
        item = stack.pop(0)
        code, message = _code_text(getattr(item, "code", None)), getattr(item, "message", "")
        line = f"{code}: {message}" if code and message else (code or str(message or ""))
        if line and all(line not in p for p in parts):
            parts.append(line)
        stack.extend(getattr(item, "details", None) or [])
    if not parts:
        first = _first_line(exc)
        code = next((c for c in _codes(exc) if not c.isdigit()), "")
        parts.append(f"{code}: {first}" if code and code not in first else first)
    return parts


def _detail(exc: core.HttpResponseError) -> str:
    """What the service said: code: message pairs, and the HTTP status of a failed request."""
    text = "; ".join(_messages(exc))
    if exc.status_code and exc.status_code >= 300 and f"HTTP {exc.status_code}" not in text:
        text = f"{text} (HTTP {exc.status_code})"
    return text[:MAX_TEXT]


def _first_line(exc: BaseException) -> str:
    """An exception's own first line (identity errors list every credential tried after it)."""
    message = getattr(exc, "message", None) or (exc.args[0] if exc.args else "")
    text = str(message).strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _quota_name(text: str) -> str:
    """The quota a message names ("standardNCASv3_T4Family Cores (limit 0, usage 0, needs 4
    more, in eastus)"), or a generic name."""
    for regex in _QUOTA_RES:
        match = regex.search(text)
        if match:
            name = match["name"].strip()
            detail = [
                shown.format(found["v"])
                for shown, regex_ in _QUOTA_DETAIL_RES
                if (found := regex_.search(text))
            ]
            return f"{name} ({', '.join(detail)})" if detail else name
    return "Compute vCPU"


def _quota_error(text: str, codes: list[str]) -> CloudtrainError:
    name = _quota_name(text)
    family = name.split(" (")[0]
    message = text if family in text else f"{text} (quota {name})"
    return QuotaError(
        scrub(message),
        hint=f"the {name} quota is too small: request more (Azure portal > Quotas > "
        "Compute; `az vm list-usage --location REGION` shows it), or choose another region "
        "or VM size",
        codes=_codeset(codes),
    )


def _permission(text: str) -> str | None:
    """The action an AuthorizationFailed message says is missing (the last one named)."""
    match = _ACTION_RE.search(text)
    if not match:
        return None
    return text[match.end() :].split("'", 1)[0] or None


def _classify(what: str, detail: str, codes: list[str], zone: str | None) -> CloudtrainError | None:
    """The error for codes/text that decide it whatever the exception type, else None."""
    code_set = set(codes)
    text = f"{what}: {detail}"
    if code_set & CAPACITY_CODES:
        shown = (f"zone {zone}", f"zones '{zone}'")
        where = f" (zone {zone})" if zone and not any(s in text for s in shown) else ""
        return NoCapacityError(
            scrub(f"{text}{where}"), zone=zone, hint=CAPACITY_HINT, codes=_codeset(codes)
        )
    quota_text = any(r.search(detail) for r in _QUOTA_RES)
    if (
        quota_text
        or "QuotaExceeded" in code_set
        or (code_set & QUOTA_CODES and "quota" in detail.lower())
    ):
        return _quota_error(text, codes)
    if code_set & AUTHORIZATION_CODES:
        action = _permission(detail)
        if action is None:
            return CredentialsError(scrub(text), hint=PERMISSION_HINT, codes=_codeset(codes))
        return CredentialsError(
            scrub(f"{what}: the Azure identity lacks permission {action}: {detail}"),
            hint=f"grant it a role that allows {action} (e.g. Contributor) on the "
            "subscription or resource group, then `az login` again",
            codes=_codeset(codes),
        )
    if "MissingSubscriptionRegistration" in code_set:
        match = _NAMESPACE_RE.search(detail)
        namespace = match["ns"] if match else "NAMESPACE"
        return ProviderError(
            scrub(text),
            hint=f"register the resource provider once: `az provider register --namespace "
            f"{namespace}` (it takes a few minutes)",
            codes=_codeset(codes),
        )
    if "RequestDisallowedByPolicy" in code_set:
        return ProviderError(scrub(text), hint=POLICY_HINT, codes=_codeset(codes))
    if code_set & STORAGE_PERMISSION_CODES:
        return CredentialsError(scrub(text), hint=STORAGE_PERMISSION_HINT, codes=_codeset(codes))
    if code_set & LOGIN_CODES:
        return CredentialsError(scrub(text), hint=LOGIN_HINT, codes=_codeset(codes))
    if code_set & TRANSIENT_CODES:
        return TransientError(scrub(text), codes=_codeset(codes))
    if code_set & NOT_FOUND_CODES:
        return NotFound(scrub(text), codes=_codeset(codes))
    if code_set & ALREADY_EXISTS_CODES:
        return AlreadyExists(scrub(text), codes=_codeset(codes))
    return None


def translate(exc: BaseException, what: str, zone: str | None = None) -> CloudtrainError:
    """The cloudtrain error for an Azure SDK exception raised while doing `what`. Pure.

    Codes first: SkuNotAvailable, AllocationFailed, ZonalAllocationFailed,
    Overconstrained[Zonal]AllocationRequest -> NoCapacityError(zone); QuotaExceeded (or
    OperationNotAllowed about a quota) -> QuotaError naming the quota family;
    [Linked]AuthorizationFailed -> CredentialsError naming the missing action;
    MissingSubscriptionRegistration -> ProviderError with `az provider register`;
    RequestDisallowedByPolicy -> ProviderError; storage permission codes -> CredentialsError
    (data role hint); throttling, busy and "in progress" codes -> TransientError. Then types:
    ClientAuthenticationError (CredentialUnavailableError included) -> CredentialsError (log
    in); ResourceNotFoundError -> NotFound; the already-exists codes, and a ResourceExistsError
    without a code of its own -> AlreadyExists (a ProviderError; `already_exists(err)` is true,
    as it is for any other ResourceExistsError); other 401/403 -> CredentialsError; 408/429/5xx
    (not 501), ServiceRequestError and ServiceResponseError -> TransientError, except a blob
    endpoint whose name does not resolve: NotFound (the storage account does not exist; code
    StorageAccountNotFound); anything else from the SDK -> ProviderError. A non-SDK exception is
    re-raised unchanged.
    """
    if isinstance(exc, core.ClientAuthenticationError) and exc.response is None:
        # azure-identity: no usable credential, or the token endpoint refused
        return CredentialsError(
            scrub(f"{what}: no usable Azure credentials: {_first_line(exc)}"),
            hint=LOGIN_HINT,
            codes=_codeset([type(exc).__name__]),
        )
    if isinstance(exc, core.HttpResponseError):
        codes = _codes(exc)
        detail = _detail(exc)
        text = f"{what}: {detail}"
        decided = _classify(what, detail, codes, zone)
        if decided is not None:
            return decided
        status = int(exc.status_code or 0)
        if isinstance(exc, core.ResourceNotFoundError) or status == 404:
            return NotFound(scrub(text), codes=_codeset(codes))
        if isinstance(exc, core.ResourceExistsError):
            # a bare 409: "already exists"; one with a code of its own (OperationNotAllowed,
            # ...) stays a ProviderError, tagged as before so `already_exists` is unchanged
            specific = any(not c.isdigit() for c in codes)
            kind = ProviderError if specific else AlreadyExists
            return kind(scrub(text), codes=_codeset([*codes, EXISTS_ERROR]))
        if isinstance(exc, core.ClientAuthenticationError) or status == 401:
            return CredentialsError(scrub(text), hint=LOGIN_HINT, codes=_codeset(codes))
        if status == 403:
            return CredentialsError(scrub(text), hint=PERMISSION_HINT, codes=_codeset(codes))
        if status in TRANSIENT_STATUS or (status > 500 and status != 501):
            return TransientError(scrub(text), codes=_codeset(codes))
        return ProviderError(scrub(text), codes=_codeset(codes))
    if isinstance(exc, core.ServiceRequestError):
        if "non-TLS" in str(exc):  # azure-core sends bearer tokens over https only
            return ProviderError(
                scrub(f"{what}: {_first_line(exc)}"),
                hint="use an https:// endpoint",
                codes=_codeset([type(exc).__name__]),
            )
        host = _BLOB_HOST_RE.search(str(exc))
        if host and _UNRESOLVED_RE.search(str(exc)):
            return NotFound(
                scrub(
                    f"{what}: storage account {host['account']!r} does not exist ({host[0]} "
                    "does not resolve)"
                ),
                hint="check the az://ACCOUNT/... URI; cloudtrain's own account is made "
                "when the run starts",
                codes=_codeset([ACCOUNT_NOT_FOUND]),
            )
    if isinstance(exc, TRANSIENT_EXCEPTIONS):
        return TransientError(
            scrub(f"{what}: cannot reach Azure: {_first_line(exc)}"), codes=_codeset([])
        )
    if isinstance(exc, SDK_EXCEPTIONS):
        return ProviderError(
            scrub(f"{what}: {_first_line(exc)}"), codes=_codeset([type(exc).__name__])
        )
    raise exc


@contextlib.contextmanager
def azure_errors(what: str, zone: str | None = None) -> Iterator[None]:
    """Translate Azure SDK exceptions raised inside the block (see `translate`); the SDK
    exception becomes the `__cause__`. Other exceptions pass through unchanged."""
    try:
        yield
    except SDK_EXCEPTIONS as exc:
        raise translate(exc, what, zone) from exc
