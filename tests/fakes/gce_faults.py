"""Scripted insert failures of the GCE fake and how GCE reports them.

`GceFake.fail_next_insert()` queues a `Fault` per zone; the next instance insert there takes it,
and its operation finishes DONE with the error fields `fault_error()` builds: `error.errors[0]`
with the fault's `code` and GCE's message (and `errorDetails`: a help link for
ZONE_RESOURCE_POOL_EXHAUSTED, quota info for QUOTA_EXCEEDED), plus the `httpErrorStatusCode`
and `httpErrorMessage` GCE sets (503, 403, or 400 for any other code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# How GCE reports capacity and quota failures in a finished operation.
FAULT_HTTP_STATUS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (503, "SERVICE UNAVAILABLE"),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (503, "SERVICE UNAVAILABLE"),
    "QUOTA_EXCEEDED": (403, "FORBIDDEN"),
}
HTTP_REASON = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 503: "SERVICE UNAVAILABLE"}


@dataclass
class Fault:
    """One scripted failure of an instance insert."""

    reason: str
    message: str | None = None
    # a QUOTA_EXCEEDED of a known quota (gce_quotas): its metric, limit and region or "global"
    metric: str | None = None
    limit: float = 0.0
    scope: str | None = None


def _guessed_metric(inst: dict[str, Any]) -> str:
    """The GPU metric of a scripted QUOTA_EXCEEDED naming no metric: the instance's first GPU's
    (`nvidia-tesla-t4` -> NVIDIA_T4_GPUS), else CPUS."""
    accs = inst.get("guestAccelerators") or []
    gpu = accs[0]["acceleratorType"].rsplit("/", 1)[-1] if accs else ""
    gpu = gpu.removeprefix("nvidia-").removeprefix("tesla-")
    return f"NVIDIA_{gpu.upper().replace('-', '_')}_GPUS" if gpu else "CPUS"


def fault_error(fault: Fault, project: str, zone: str, inst: dict[str, Any]) -> dict[str, Any]:
    """The fields GCE sets on the operation of insert `inst` failing with `fault`."""
    region = zone.rsplit("-", 1)[0]
    details: list[dict[str, Any]] = []
    if fault.reason.startswith("ZONE_RESOURCE_POOL_EXHAUSTED"):
        message = (
            f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
            "available to fulfill the request.  Try a different zone, or try again later."
        )
        details.append(
            {
                "help": {
                    "links": [
                        {
                            "description": "Troubleshooting documentation",
                            "url": "https://cloud.google.com/compute/docs/resource-error",
                        }
                    ]
                }
            }
        )
    elif fault.reason == "QUOTA_EXCEEDED":
        metric = fault.metric or _guessed_metric(inst)
        scope = fault.scope or region
        # "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally." (fastai/course-v3#165);
        # a regional one says "in region R"
        where = "globally" if scope == "global" else f"in region {scope}"
        message = f"Quota '{metric}' exceeded.  Limit: {float(fault.limit)} {where}."
        info: dict[str, Any] = {
            "metricName": f"compute.googleapis.com/{metric.lower()}",
            "limitName": f"{metric.replace('_', '-')}-per-project"
            + ("" if scope == "global" else "-region"),
            "limit": fault.limit,
        }
        if scope != "global":
            info["dimensions"] = {"region": scope}
        details.append({"quotaInfo": info})
    else:
        message = f"Operation failed: {fault.reason}"
    status, status_text = FAULT_HTTP_STATUS.get(fault.reason, (400, HTTP_REASON[400]))
    errors = {"code": fault.reason, "message": fault.message or message}
    if details:
        errors["errorDetails"] = details
    return {
        "error": {"errors": [errors]},
        "httpErrorStatusCode": status,
        "httpErrorMessage": status_text,
    }
