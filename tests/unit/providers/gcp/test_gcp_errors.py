"""The GCP error mapping (providers/gcp/errors.py): each SDK exception, and each error a finished
Compute Engine operation carries, becomes the right cloudtrain error (no emulator needed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("google.api_core")

import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

from cloudtrain.core.errors import (
    AlreadyExists,
    CredentialsError,
    NoCapacityError,
    NotFound,
    ProviderError,
    QuotaError,
    TransientError,
)
from cloudtrain.providers.gcp.errors import (
    already_exists,
    error_codes,
    gcp_errors,
    operation_error,
    translate,
)

# --- error translation -------------------------------------------------------------------------

CAPACITY_MESSAGE = (
    "The zone 'projects/p/zones/us-central1-a' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later."
)


def test_credentials_errors_name_the_login_command_and_never_leak_tokens() -> None:
    err = translate(auth.DefaultCredentialsError("Could not find ADC"), "list gs://b")
    assert isinstance(err, CredentialsError)
    assert "gcloud auth application-default login" in (err.hint or "")
    refresh = auth.RefreshError(
        "invalid_grant: Bad Request", {"error": "invalid_grant", "access_token": "ya29.SECRET"}
    )
    err = translate(refresh, "list gs://b")
    assert isinstance(err, CredentialsError)
    assert "SECRET" not in str(err) and "invalid_grant" in str(err)
    assert isinstance(translate(api.Unauthorized("bad token"), "x"), CredentialsError)


def test_forbidden_is_a_missing_permission() -> None:
    err = translate(api.Forbidden("caller does not have storage.objects.get"), "get gs://b/k")
    assert type(err) is CredentialsError
    assert "permission" in (err.hint or "")
    assert "get gs://b/k" in str(err)


def test_not_found_and_conflicts() -> None:
    assert type(translate(api.NotFound("no such object"), "get")) is NotFound
    for exc in (api.Conflict("bucket exists"), api.AlreadyExists("instance exists")):
        err = translate(exc, "create")
        assert type(err) is AlreadyExists and isinstance(err, ProviderError)  # issue 15
        assert already_exists(err)
    aborted = translate(api.Aborted("concurrent change"), "patch")
    assert isinstance(aborted, TransientError) and not already_exists(aborted)
    assert not already_exists(translate(api.NotFound("x"), "get"))


@pytest.mark.parametrize(
    "exc",
    [
        api.TooManyRequests("slow down"),
        api.ResourceExhausted("slow down"),
        api.InternalServerError("oops"),
        api.BadGateway("oops"),
        api.ServiceUnavailable("oops"),
        api.GatewayTimeout("oops"),
        api.DeadlineExceeded("oops"),
        ConnectionError("reset"),
        requests.exceptions.ConnectionError("refused"),
        requests.exceptions.ReadTimeout("timed out"),
        auth.TransportError("metadata server unreachable"),
        api.RetryError("Timeout of 120.0s exceeded", api.ServiceUnavailable("503")),
        api.Forbidden("Rate exceeded", errors=[{"reason": "rateLimitExceeded"}]),
        DataCorruption(None, "Checksum mismatch while downloading"),
        InvalidResponse(SimpleNamespace(status_code=503), "Unexpected status"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_errors(exc: BaseException) -> None:
    err = translate(exc, "put gs://b/k")
    assert type(err) is TransientError and err.retryable
    assert str(err).startswith("put gs://b/k")


@pytest.mark.parametrize(
    "exc",
    [
        api.BadRequest(CAPACITY_MESSAGE, errors=[{"reason": "ZONE_RESOURCE_POOL_EXHAUSTED"}]),
        api.ServiceUnavailable("x", error_info={"reason": "insufficientCapacity"}),
        api.GoogleAPICallError(
            "x", error_info={"reason": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}
        ),
        api.BadRequest(CAPACITY_MESSAGE),  # the message alone says it
    ],
    ids=["reason", "bulk-503", "error-info", "message"],
)
def test_zone_capacity_errors(exc: BaseException) -> None:
    err = translate(exc, "create instance ct-r-worker-0", zone="us-central1-a")
    assert isinstance(err, NoCapacityError)
    assert err.zone == "us-central1-a"
    assert "next zone" in (err.hint or "")


def test_quota_errors_name_the_quota() -> None:
    exc = api.Forbidden(
        "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
        errors=[{"reason": "quotaExceeded", "message": "Quota 'GPUS_ALL_REGIONS' exceeded."}],
    )
    err = translate(exc, "create instance ct-r-chief-0", zone="us-central1-a")
    assert isinstance(err, QuotaError)
    assert "GPUS_ALL_REGIONS" in str(err)
    assert "GPUS_ALL_REGIONS (limit 0.0 globally)" in (err.hint or "")
    info = api.TooManyRequests(
        "Quota exceeded",
        error_info={"reason": "RESOURCE_QUOTA_EXCEEDED", "metadata": {"quota_limit": "VMs"}},
    )
    err = translate(info, "create")
    assert isinstance(err, QuotaError) and "VMs" in str(err)


def test_a_disabled_api_says_how_to_enable_it() -> None:
    exc = api.Forbidden(
        "Compute Engine API has not been used", errors=[{"reason": "accessNotConfigured"}]
    )
    err = translate(exc, "list instances")
    assert type(err) is ProviderError
    assert "gcloud services enable" in (err.hint or "")


def test_gcp_errors_chains_sdk_exceptions_and_passes_others() -> None:
    with pytest.raises(NotFound) as err, gcp_errors("get gs://b/k"):
        raise api.NotFound("gone")
    assert isinstance(err.value.__cause__, api.NotFound)
    assert "404" in error_codes(err.value)
    with pytest.raises(ValueError), gcp_errors("x"):
        raise ValueError("a bug, not a cloud error")
    with pytest.raises(ValueError):
        translate(ValueError("x"), "x")


def op(*errors: tuple[str, str], status: int = 0) -> dict[str, Any]:
    """A finished Operation as the compute REST API returns it."""
    body: dict[str, Any] = {"kind": "compute#operation", "name": "op-1", "status": "DONE"}
    if errors:
        body["error"] = {"errors": [{"code": c, "message": m} for c, m in errors]}
    if status:
        body["http_error_status_code"] = status
    return body


def test_operation_errors() -> None:
    assert operation_error("create", op()) is None
    cap = operation_error(
        "create ct-r-worker-0",
        op(("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", CAPACITY_MESSAGE)),
        zone="us-central1-a",
    )
    assert isinstance(cap, NoCapacityError) and cap.zone == "us-central1-a"
    assert "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in error_codes(cap)
    assert isinstance(
        operation_error("c", op(("ZONE_RESOURCE_POOL_EXHAUSTED", "no")), "z"), NoCapacityError
    )
    quota = operation_error(
        "create ct-r-chief-0",
        op(("QUOTA_EXCEEDED", "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 1.0 in region us-east1.")),
    )
    assert isinstance(quota, QuotaError)
    assert "NVIDIA_T4_GPUS (limit 1.0 in region us-east1)" in (quota.hint or "")
    assert type(operation_error("d", op(("RESOURCE_NOT_FOUND", "gone")))) is NotFound
    exists = operation_error("c", op(("RESOURCE_ALREADY_EXISTS", "exists")), "z")
    assert type(exists) is AlreadyExists and exists is not None and already_exists(exists)
    for code in (
        "RATE_LIMIT_EXCEEDED",
        "RESOURCE_NOT_READY",
        "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",
    ):
        assert type(operation_error("d", op((code, "later")))) is TransientError
    other = operation_error("c", op(("INVALID_FIELD_VALUE", "bad disk"), status=400))
    assert type(other) is ProviderError and other is not None
    assert "INVALID_FIELD_VALUE: bad disk" in str(other) and "400" in error_codes(other)
    mixed = operation_error(
        "c", op(("INVALID_FIELD_VALUE", "x"), ("ZONE_RESOURCE_POOL_EXHAUSTED", "y")), "z"
    )
    assert isinstance(mixed, NoCapacityError), "capacity wins: another zone may work"


def test_operation_errors_from_compute_v1_protos() -> None:
    compute_v1 = pytest.importorskip("google.cloud.compute_v1")
    assert operation_error("c", compute_v1.Operation(status="DONE")) is None
    failed = compute_v1.Operation(
        status="DONE",
        http_error_status_code=403,
        error=compute_v1.Error(
            errors=[compute_v1.Errors(code="QUOTA_EXCEEDED", message="Quota 'CPUS' exceeded.")]
        ),
    )
    err = operation_error("create", failed, zone="us-central1-a")
    assert isinstance(err, QuotaError) and "CPUS" in (err.hint or "")
