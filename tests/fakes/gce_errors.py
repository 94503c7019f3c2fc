"""Request errors of the GCE fake, in GCE's shape.

`GceApiError` is raised anywhere inside a request and answered by the fake's HTTP entry point as
GCE does: the HTTP status plus `{"error": {"code", "message", "errors": [{"domain", "reason",
"message"}]}}`. The helpers build the errors the fake raises most often: 404 notFound for a
missing resource and 400 invalid for a malformed request or field.
"""

from __future__ import annotations

from typing import Any


class GceApiError(Exception):
    """A request error, answered with GCE's error body and HTTP status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        """The JSON body GCE sends for this error."""
        detail = {"domain": "global", "reason": self.reason, "message": self.message}
        return {"error": {"code": self.code, "message": self.message, "errors": [detail]}}


def not_found(resource: str) -> GceApiError:
    """404 notFound for `resource` (e.g. `projects/p/zones/z/instances/n`)."""
    return GceApiError(404, "notFound", f"The resource '{resource}' was not found")


def invalid(message: str) -> GceApiError:
    """400 invalid with `message`."""
    return GceApiError(400, "invalid", message)


def invalid_field(field_name: str, value: Any, why: str) -> GceApiError:
    """400 invalid for a bad value of one request field."""
    return invalid(f"Invalid value for field '{field_name}': '{value}'. {why}")
