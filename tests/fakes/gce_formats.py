"""GCE's wire formats as the fake writes and checks them.

The fake answers absolute `https://www.googleapis.com/compute/v1/...` URLs for resource
references (`expand()` completes the relative ones a client may send) and RFC 3339 timestamps
(`now()`), and refuses with 400 invalid what GCE refuses on insert: names that are not RFC 1035
labels, machine and accelerator types that are bare names instead of URLs, malformed or too many
labels, and malformed, duplicate or oversized metadata (`validate_instance()`).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from tests.fakes.gce_errors import invalid, invalid_field

API_ROOT = "https://www.googleapis.com/compute/v1"

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
METADATA_KEY_RE = re.compile(r"[a-zA-Z0-9_-]{1,128}")
MAX_LABELS = 64
MAX_METADATA_VALUE = 256 * 1024
MAX_METADATA_TOTAL = 512 * 1024


def now() -> str:
    """An RFC 3339 timestamp as GCE writes them."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def expand(value: str, project: str) -> str:
    """GCE answers absolute URLs for references given as `zones/...` or `projects/...`."""
    if value.startswith(("https://", "http://")):
        return value
    if value.startswith("projects/"):
        return f"{API_ROOT}/{value}"
    return f"{API_ROOT}/projects/{project}/{value.lstrip('/')}"


def validate_instance(body: Any) -> None:
    """Raise GceApiError(400) unless `body` is an instance GCE would accept on insert."""
    if not isinstance(body, dict):
        raise invalid("Required field 'resource' not specified")
    name = body.get("name", "")
    if not NAME_RE.fullmatch(str(name)):
        raise invalid_field("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
    machine_type = str(body.get("machineType") or "")
    if "machineTypes/" not in machine_type:
        raise invalid_field(
            "resource.machineType",
            machine_type,
            "Must be a URL to a valid Compute resource of the correct type.",
        )
    for index, acc in enumerate(body.get("guestAccelerators") or []):
        acc_type = str(acc.get("acceleratorType") or "")
        if "acceleratorTypes/" not in acc_type:
            raise invalid_field(
                f"resource.guestAccelerators[{index}].acceleratorType",
                acc_type,
                "Must be a URL to a valid Compute resource of the correct type.",
            )
    labels = body.get("labels") or {}
    if len(labels) > MAX_LABELS:
        raise invalid_field("resource.labels", "", f"At most {MAX_LABELS} labels.")
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(key):
            raise invalid_field(
                "resource.labels", "", f"Label key '{key}' violates format constraints."
            )
        if not LABEL_VALUE_RE.fullmatch(str(value)):
            raise invalid_field(
                "resource.labels", "", f"Label value '{value}' violates format constraints."
            )
    items = (body.get("metadata") or {}).get("items") or []
    total = 0
    for item in items:
        key, value = str(item.get("key", "")), str(item.get("value", ""))
        if not METADATA_KEY_RE.fullmatch(key):
            raise invalid_field("resource.metadata", "", f"Invalid metadata key '{key}'.")
        size = len(value.encode())
        if size > MAX_METADATA_VALUE:
            raise invalid_field(
                "resource.metadata", "", f"Metadata value of '{key}' exceeds 256 KB."
            )
        total += size + len(key)
    if total > MAX_METADATA_TOTAL:
        raise invalid_field("resource.metadata", "", "Metadata exceeds 512 KB in total.")
    if len({str(item.get("key")) for item in items}) != len(items):
        raise invalid_field("resource.metadata", "", "Duplicate metadata keys.")
