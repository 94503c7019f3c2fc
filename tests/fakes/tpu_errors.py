"""Request errors of the TPU API fake, in Google's error model.

The TPU API answers errors as every One Platform API does (cloud.google.com/apis/design/errors):
the HTTP status plus `{"error": {"code", "message", "status", "details": [...]}}`, `status` the
google.rpc.Code name of the HTTP status (400 INVALID_ARGUMENT or FAILED_PRECONDITION, 403
PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS, 429 RESOURCE_EXHAUSTED). `TpuApiError`
is raised anywhere inside a request and answered by the fake's entry point; google-api-core
turns it into the matching exception class (`exceptions.from_http_response`). The helpers build
the ones the fake raises:

- `permission_denied`: 403 with an ErrorInfo {reason IAM_PERMISSION_DENIED, metadata
  {permission}} (the box's IAM shape, tests/fakes/gce_access.py);
- `service_disabled`: 403 PERMISSION_DENIED, "Cloud TPU API has not been used in project N
  before or it is disabled ...", ErrorInfo reason SERVICE_DISABLED with metadata {service
  tpu.googleapis.com, consumer} (cloud.google.com/service-usage/docs/troubleshoot);
- `quota_exceeded`: 429 RESOURCE_EXHAUSTED "Quota limit 'L' has been exceeded. Limit: N in
  region R." (the text of a real TPU create refusal, marin-community/marin#1612) with a
  QuotaFailure detail.

`no_capacity()` is not raised: it is the `error` (google.rpc.Status) a create operation ends
with in a zone without capacity, code 8 (RESOURCE_EXHAUSTED): "There is no more capacity in
the zone "Z"; you can try in another zone where Cloud TPU Nodes are offered (see
https://cloud.google.com/tpu/docs/regions)" (as Terraform's TPU v2 VM test quotes it,
hashicorp/terraform-provider-google#21243: "Error code 8, message: There is no more capacity
...").
"""

from __future__ import annotations

from typing import Any

from tests.fakes.gce_access import project_number

TPU_API = "tpu.googleapis.com"
STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
}
RESOURCE_EXHAUSTED_CODE = 8  # google.rpc.Code
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


class TpuApiError(Exception):
    """A request error, answered with Google's error body and HTTP status."""

    def __init__(
        self,
        code: int,
        message: str,
        status: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, "UNKNOWN")
        self.details = details or []

    def body(self) -> dict[str, Any]:
        """The JSON body Google sends for this error."""
        error = {"code": self.code, "message": self.message, "status": self.status}
        return {"error": {**error, "details": self.details}}


def not_found(resource: str) -> TpuApiError:
    """404 NOT_FOUND for `resource` (`projects/p/locations/z/nodes/n`)."""
    return TpuApiError(404, f"Resource '{resource}' was not found")


def already_exists(resource: str) -> TpuApiError:
    """409 ALREADY_EXISTS for `resource`."""
    return TpuApiError(409, f"Resource '{resource}' already exists")


def invalid(message: str) -> TpuApiError:
    """400 INVALID_ARGUMENT with `message`."""
    return TpuApiError(400, message)


def failed_precondition(message: str) -> TpuApiError:
    """400 FAILED_PRECONDITION with `message` (a request the resource's state forbids)."""
    return TpuApiError(400, message, "FAILED_PRECONDITION")


def permission_denied(permission: str, resource: str) -> TpuApiError:
    """403 PERMISSION_DENIED naming `permission` and `resource`."""
    info = {
        "@type": ERROR_INFO,
        "reason": "IAM_PERMISSION_DENIED",
        "domain": "iam.googleapis.com",
        "metadata": {"permission": permission, "resource": resource},
    }
    message = f"Permission '{permission}' denied on '{resource}' (or it may not exist)."
    return TpuApiError(403, message, details=[info])


def service_disabled(project: str) -> TpuApiError:
    """403 for any call while the TPU API is disabled in `project`."""
    number = project_number(project)
    message = (
        f"Cloud TPU API has not been used in project {number} before or it is disabled. Enable "
        f"it by visiting https://console.developers.google.com/apis/api/{TPU_API}/overview"
        f"?project={number} then retry. If you enabled this API recently, wait a few minutes "
        "for the action to propagate to our systems and retry."
    )
    info = {
        "@type": ERROR_INFO,
        "reason": "SERVICE_DISABLED",
        "domain": "googleapis.com",
        "metadata": {"service": TPU_API, "consumer": f"projects/{number}"},
    }
    return TpuApiError(403, message, details=[info])


def quota_exceeded(limit_name: str, limit: float, region: str) -> TpuApiError:
    """429 RESOURCE_EXHAUSTED for a create over the TPU quota `limit_name` of `region`."""
    message = f"Quota limit '{limit_name}' has been exceeded. Limit: {limit:g} in region {region}."
    failure = {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"subject": f"region:{region}", "description": message}],
    }
    return TpuApiError(429, message, details=[failure])


def no_capacity(zone: str) -> dict[str, Any]:
    """The google.rpc.Status a create operation ends with in a zone without TPU capacity."""
    return {
        "code": RESOURCE_EXHAUSTED_CODE,
        "message": (
            f'There is no more capacity in the zone "{zone}"; you can try in another zone '
            "where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)"
        ),
        "details": [],
    }
