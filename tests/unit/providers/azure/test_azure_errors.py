"""The Azure error mapping (providers/azure/errors.py): each azure-core / azure-identity exception
becomes the right cloudtrain error. No emulator: the exceptions are raised by the real SDKs
(azure-mgmt-compute, azure-storage-blob, azure-identity) answering canned HTTP responses through
a fake transport, so their types, status codes and parsed error codes are the SDKs' own.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest

pytest.importorskip("azure.mgmt.compute")
pytest.importorskip("azure.storage.blob")

import requests
from azure.core import exceptions as core
from azure.core.credentials import AccessToken
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._requests_basic import RestRequestsTransportResponse
from azure.identity import EnvironmentCredential
from azure.mgmt.compute import ComputeManagementClient
from azure.storage.blob import BlobServiceClient

from cloudtrain.core.errors import (
    AlreadyExists,
    CredentialsError,
    NoCapacityError,
    NotFound,
    ProviderError,
    QuotaError,
    TransientError,
)
from cloudtrain.providers.azure.errors import (
    ACCOUNT_NOT_FOUND,
    already_exists,
    azure_errors,
    error_codes,
    scrub,
    translate,
)

SUB = "00000000-0000-0000-0000-00000000cafe"
ASYNC_OP = (
    f"https://management.azure.com/subscriptions/{SUB}/providers/Microsoft.Compute/locations/"
    "eastus/operations/op-1?api-version=2024-07-01"
)
QUOTA_MESSAGE = (
    "Operation could not be completed as it results in exceeding approved "
    "standardNCASv3_T4Family Cores quota. Additional details - Deployment Model: Resource "
    "Manager, Location: eastus, Current Limit: 0, Current Usage: 0, Additional Required: 4, "
    "(Minimum) New Limit Required: 4. Submit a request for Quota increase at "
    "https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/UsageAndQuota.ReactView"
)
SKU_MESSAGE = (
    "The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
    "Standard_NC4as_T4_v3' is currently not available in location 'eastus' zones '2' for "
    f"subscription '{SUB}'. Please try another size or deploy to a different location or zones."
)
AUTHZ_MESSAGE = (
    "The client 'me@example.com' with object id '1111' does not have authorization to perform "
    "action 'Microsoft.Compute/virtualMachines/write' over scope "
    f"'/subscriptions/{SUB}/resourceGroups/ct-r/providers/Microsoft.Compute/virtualMachines/vm' "
    "or the scope is invalid. If access was recently granted, please refresh your credentials."
)


class CannedTransport(HttpTransport):
    """An azure-core transport answering each request with the next canned (status, body,
    headers); a dict body is sent as JSON."""

    def __init__(self, *replies: tuple[int, Any, dict[str, str]]) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[str, str]] = []

    def __enter__(self) -> CannedTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        pass

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.seen.append((request.method, request.url))
        status, body, headers = self.replies.pop(0)
        is_json = isinstance(body, dict)
        data = json.dumps(body).encode() if is_json else str(body).encode()
        raw = requests.Response()
        raw.status_code = status
        raw.reason = "Canned"
        raw.raw = io.BytesIO(data)
        raw.url = request.url
        raw.headers.update(
            {"Content-Type": "application/json" if is_json else "application/xml", **headers}
        )
        response = RestRequestsTransportResponse(request=request, internal_response=raw)
        response.read()
        return response


class Token:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("fake-token", int(time.time()) + 3600)


def raised(call: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def arm_create_vm(*replies: tuple[int, Any, dict[str, str]]) -> BaseException:
    """What azure-mgmt-compute raises creating a VM (polling included) against `replies`."""
    client = ComputeManagementClient(
        Token(), SUB, transport=CannedTransport(*replies), retry_total=0
    )
    return raised(
        lambda: client.virtual_machines.begin_create_or_update(
            "ct-r", "vm", {"location": "eastus"}, polling_interval=0
        ).result()
    )


def arm_error(status: int, code: str, message: str, **extra: Any) -> BaseException:
    return arm_create_vm((status, {"error": {"code": code, "message": message, **extra}}, {}))


def lro_failure(code: str, message: str) -> BaseException:
    """A create accepted (201) whose operation then fails with `code`."""
    accepted = {"Azure-AsyncOperation": ASYNC_OP, "Retry-After": "0"}
    failed = {"status": "Failed", "error": {"code": code, "message": message}}
    return arm_create_vm((201, {"name": "vm"}, accepted), (200, failed, {}))


def storage_error(status: int, code: str, message: str = "Something failed.") -> BaseException:
    """What azure-storage-blob raises downloading a blob when the service answers `code`."""
    body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}'
    body += "\nRequestId:1\nTime:2026-01-01T00:00:00Z</Message></Error>"
    client = BlobServiceClient(
        "https://acct01.blob.core.windows.net",
        credential=Token(),
        transport=CannedTransport((status, body, {"x-ms-error-code": code})),
        retry_total=0,
    )
    return raised(lambda: client.get_blob_client("cont", "k").download_blob().readall())


# --- capacity and quota ------------------------------------------------------------------------


def test_a_409_sku_not_available_is_no_capacity_not_already_exists() -> None:
    exc = arm_error(409, "SkuNotAvailable", SKU_MESSAGE)
    assert isinstance(exc, core.ResourceExistsError), "the SDK maps every 409 to this"
    err = translate(exc, "create VM vm in eastus", zone="2")
    assert type(err) is NoCapacityError and err.zone == "2"
    assert not already_exists(err)
    assert "SkuNotAvailable" in str(err) and "next zone" in (err.hint or "")
    assert "(zone 2)" not in str(err), "the message names the zone already"
    assert "(zone 3)" in str(translate(exc, "create VM", zone="3"))


@pytest.mark.parametrize(
    "code",
    [
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
    ],
)
def test_a_failed_operation_for_capacity_is_no_capacity(code: str) -> None:
    exc = lro_failure(code, "Allocation failed. We do not have sufficient capacity.")
    assert type(exc) is core.HttpResponseError and exc.status_code == 200
    err = translate(exc, "create VM vm", zone="1")
    assert type(err) is NoCapacityError and err.zone == "1"
    assert code in str(err) and "(zone 1)" in str(err)
    assert code in error_codes(err)


def test_an_operation_not_allowed_over_quota_names_the_quota_family() -> None:
    err = translate(arm_error(409, "OperationNotAllowed", QUOTA_MESSAGE), "create VM vm")
    assert type(err) is QuotaError and not already_exists(err)
    assert "standardNCASv3_T4Family Cores" in str(err)
    assert "standardNCASv3_T4Family Cores (limit 0, usage 0, needs 4 more, in eastus)" in (
        err.hint or ""
    )
    failed = translate(lro_failure("OperationNotAllowed", QUOTA_MESSAGE), "create VM vm")
    assert type(failed) is QuotaError


def test_other_quota_messages() -> None:
    core_limit = (
        "Operation results in exceeding quota limits of Core. Maximum allowed: 10, Current in "
        "use: 8, Additional requested: 4."
    )
    err = translate(arm_error(400, "QuotaExceeded", core_limit), "create VM vm")
    assert type(err) is QuotaError and "exceeding quota limits of Core" in str(err)
    assert "the Core (limit 10, usage 8, needs 4 more) quota" in (err.hint or "")
    spot = "Operation could not be completed as it results in exceeding approved Total Regional "
    spot += "Low-priority Cores quota. Location: westus2, Current Limit: 3"
    err = translate(arm_error(409, "OperationNotAllowed", spot), "create VM vm")
    assert type(err) is QuotaError and "Total Regional Low-priority Cores" in (err.hint or "")
    assert type(translate(arm_error(400, "QuotaExceeded", "Quota exceeded."), "x")) is QuotaError


def test_operation_not_allowed_without_a_quota_is_a_plain_provider_error() -> None:
    text = "Operation 'start' is not allowed since the VM is marked for deletion."
    err = translate(arm_error(409, "OperationNotAllowed", text), "start VM vm")
    assert type(err) is ProviderError and "OperationNotAllowed: Operation 'start'" in str(err)


# --- permissions and credentials ---------------------------------------------------------------


def test_authorization_failed_names_the_missing_permission() -> None:
    exc = arm_error(403, "AuthorizationFailed", AUTHZ_MESSAGE)
    err = translate(exc, "create VM vm")
    assert type(err) is CredentialsError
    assert str(err).startswith(
        "create VM vm: the Azure identity lacks permission Microsoft.Compute/virtualMachines/write"
    )
    assert "Microsoft.Compute/virtualMachines/write" in (err.hint or "")
    linked = (
        "The client 'me' with object id '1' has permission to perform action "
        "'Microsoft.Compute/virtualMachines/write' on scope 'x'; however, it does not have "
        "permission to perform action(s) 'Microsoft.Network/virtualNetworks/subnets/join/action' "
        "on the linked scope(s) 'y' or the linked scope(s) are invalid."
    )
    err = translate(arm_error(403, "LinkedAuthorizationFailed", linked), "create VM vm")
    assert "lacks permission Microsoft.Network/virtualNetworks/subnets/join/action" in str(err)


def test_missing_registration_and_policy() -> None:
    message = (
        "The subscription is not registered to use namespace 'Microsoft.Compute'. See "
        "https://aka.ms/rps-not-found for how to register subscriptions."
    )
    unregistered = {"error": {"code": "MissingSubscriptionRegistration", "message": message}}
    # The management SDK first tries to register the namespace itself (a POST .../register,
    # then a GET every 10 s with no time limit); when that POST is refused, the 409 surfaces.
    refused = {"error": {"code": "AuthorizationFailed", "message": "no register/action"}}
    exc = arm_create_vm((409, unregistered, {}), (403, refused, {}))
    err = translate(exc, "create VM")
    assert type(err) is ProviderError and not already_exists(err)
    assert "az provider register --namespace Microsoft.Compute" in (err.hint or "")
    policy = translate(arm_error(403, "RequestDisallowedByPolicy", "Denied by policy."), "x")
    assert type(policy) is ProviderError and "Policy" in (policy.hint or "")


def test_identity_errors_say_az_login_and_keep_the_first_line_only() -> None:
    credential = EnvironmentCredential()  # no AZURE_CLIENT_* here: unavailable
    exc = raised(lambda: credential.get_token("https://management.azure.com/.default"))
    assert isinstance(exc, core.ClientAuthenticationError)
    err = translate(exc, "list VMs")
    assert type(err) is CredentialsError and "az login" in (err.hint or "")
    assert str(err).startswith("list VMs: no usable Azure credentials: ")
    refused = core.ClientAuthenticationError(
        message="AADSTS7000215: Invalid client secret provided.\nclient_secret=hunter2 trace"
    )
    err = translate(refused, "list VMs")
    assert "AADSTS7000215" in str(err) and "hunter2" not in str(err)


def test_token_and_permission_errors_from_services() -> None:
    expired = translate(arm_error(401, "ExpiredAuthenticationToken", "Token expired."), "x")
    assert type(expired) is CredentialsError and "az login" in (expired.hint or "")
    mismatch = translate(
        storage_error(403, "AuthorizationPermissionMismatch", "This request is not authorized"),
        "get az://acct01/cont/k",
    )
    assert type(mismatch) is CredentialsError
    assert "Storage Blob Data Contributor" in (mismatch.hint or "")
    assert "AuthorizationPermissionMismatch" in str(mismatch)
    other = translate(arm_error(403, "SomethingForbidden", "No."), "x")
    assert type(other) is CredentialsError and "role assignment" in (other.hint or "")


# --- not found, already exists, transient -------------------------------------------------------


def test_not_found_and_already_exists() -> None:
    missing = translate(
        arm_error(404, "ResourceGroupNotFound", "Resource group 'r' not found"), "x"
    )
    assert type(missing) is NotFound and not already_exists(missing)
    blob = translate(storage_error(404, "BlobNotFound", "The specified blob does not exist."), "g")
    assert type(blob) is NotFound
    assert str(blob).startswith("g: BlobNotFound: The specified blob does not exist.")
    assert "RequestId" not in str(blob)
    exists = translate(storage_error(409, "ContainerAlreadyExists"), "create container")
    assert type(exists) is AlreadyExists and already_exists(exists)  # a ProviderError (issue 15)
    assert "ContainerAlreadyExists" in error_codes(exists) and "409" in error_codes(exists)
    bare = translate(core.ResourceExistsError("exists"), "create")
    assert type(bare) is AlreadyExists and already_exists(bare)


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_throttling_and_server_errors_are_transient(status: int) -> None:
    err = translate(arm_error(status, "Whatever", "Try later."), "list VMs")
    assert type(err) is TransientError and err.retryable
    assert f"HTTP {status}" in str(err)


def test_transient_codes_beat_the_409_mapping() -> None:
    busy = arm_error(409, "AnotherOperationInProgress", "Another operation on the VM is running.")
    assert isinstance(busy, core.ResourceExistsError)
    err = translate(busy, "delete VM vm")
    assert type(err) is TransientError and not already_exists(err)
    deleting = translate(storage_error(409, "ContainerBeingDeleted"), "create container")
    assert type(deleting) is TransientError
    assert type(translate(storage_error(503, "ServerBusy"), "put")) is TransientError


def test_connection_failures_are_transient_except_an_account_that_does_not_resolve() -> None:
    for exc in (
        core.ServiceRequestError("HTTPConnection(host='x', port=1): Connection refused"),
        core.ServiceResponseError("Connection aborted."),
        core.ServiceRequestError(
            "Failed to resolve 'acct01.blob.core.windows.net' ([Errno -3] Temporary failure in "
            "name resolution)"
        ),
    ):
        err = translate(exc, "get k")
        assert type(err) is TransientError and "cannot reach Azure" in str(err)
    gone = core.ServiceRequestError(
        "HTTPSConnectionPool(host='nosuchacct01.blob.core.windows.net', port=443): Max retries "
        'exceeded with url: /c/k?se=x&sp=r&sig=SECRET%3D (Caused by NameResolutionError("Failed '
        "to resolve 'nosuchacct01.blob.core.windows.net' ([Errno -2] Name or service not known)\"))"
    )
    plain = core.ServiceRequestError("Bearer token authentication is not permitted for non-TLS")
    assert type(translate(plain, "get k")) is ProviderError, "a misconfiguration, not a retry"
    err = translate(gone, "get az://nosuchacct01/c/k")
    assert type(err) is NotFound and ACCOUNT_NOT_FOUND in error_codes(err)
    assert "storage account 'nosuchacct01' does not exist" in str(err)
    assert "SECRET" not in str(err)


# --- secrets and plumbing ----------------------------------------------------------------------


def test_no_sas_signature_or_key_survives_in_a_message() -> None:
    url = "https://acct01.blob.core.windows.net/c/k%20x?se=2026-01-01&sp=r&sv=1&sr=b&sig=S3CR%2FT"
    exc = core.ServiceResponseError(
        f"Connection broken for {url} with AccountKey=KEY/+=;EndpointSuffix=core.windows.net "
        "Authorization: Bearer eyJ0eXAi.eyJhdWQi.c2ln"
    )
    text = str(translate(exc, f"download {url}"))
    assert "S3CR" not in text and "KEY/+=" not in text and "eyJ0eXAi" not in text
    assert "https://acct01.blob.core.windows.net/c/k%20x" in text
    assert "AccountKey=REDACTED" in text
    assert scrub("no secrets here") == "no secrets here"


def test_storage_error_code_enums_are_read_by_value() -> None:
    exc = storage_error(403, "AuthorizationFailure", "This request is not authorized.")
    assert type(exc).__name__ == "HttpResponseError"
    assert "StorageErrorCode" in str(type(exc.error_code)), "the SDK reports an enum"  # type: ignore[attr-defined]
    err = translate(exc, "list")
    assert "AuthorizationFailure" in error_codes(err)
    assert "StorageErrorCode." not in str(err)


def test_other_sdk_errors_and_the_context_manager() -> None:
    odd = translate(core.DecodeError("bad JSON"), "list VMs")
    assert type(odd) is ProviderError and "bad JSON" in str(odd)
    teapot = translate(arm_error(418, "Teapot", "I am a teapot."), "brew")
    assert type(teapot) is ProviderError and "Teapot: I am a teapot. (HTTP 418)" in str(teapot)
    source = core.ResourceNotFoundError("gone")
    with pytest.raises(NotFound) as info, azure_errors("get k"):
        raise source
    assert info.value.__cause__ is source
    with pytest.raises(KeyError), azure_errors("get k"):
        raise KeyError("not an SDK error")
    with pytest.raises(ValueError):
        translate(ValueError("plain"), "x")
