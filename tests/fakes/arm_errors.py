"""Request errors of the ARM fake, in Azure Resource Manager's shape.

`ArmApiError` is raised anywhere inside a request and answered by the fake's entry point as ARM
does: the HTTP status plus `{"error": {"code", "message"}}` (and `target` when one field is at
fault), with any extra headers (e.g. `Retry-After` on 429/503). The SDKs turn such an answer
into `azure.core.exceptions.HttpResponseError` (ResourceNotFoundError for 404,
ResourceExistsError for 409, ClientAuthenticationError for 401) whose `.error.code` is `code`.
The helpers build the errors the fake raises most often.
"""

from __future__ import annotations

from typing import Any


class ArmApiError(Exception):
    """A request error, answered with ARM's error body and HTTP status."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        target: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.target = target
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body ARM sends for this error."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        return {"error": error}


def not_found(kind: str, name: str, group: str) -> ArmApiError:
    """404 ResourceNotFound for resource `name` of type `kind` (e.g. Microsoft.Compute/...)."""
    return ArmApiError(
        404,
        "ResourceNotFound",
        f"The Resource '{kind}/{name}' under resource group '{group}' was not found. For more "
        "details please go to https://aka.ms/ARMResourceNotFoundFix",
    )


def group_not_found(group: str) -> ArmApiError:
    """404 ResourceGroupNotFound."""
    return ArmApiError(
        404, "ResourceGroupNotFound", f"Resource group '{group}' could not be found."
    )


def invalid_parameter(message: str, target: str | None = None) -> ArmApiError:
    """400 InvalidParameter, optionally naming the field at fault."""
    return ArmApiError(400, "InvalidParameter", message, target)


def conflict(message: str) -> ArmApiError:
    """409 Conflict."""
    return ArmApiError(409, "Conflict", message)


def in_use(code: str, message: str) -> ArmApiError:
    """400 with a Network `...InUse...` code: a resource another one still references."""
    return ArmApiError(400, code, message)
