"""A VM's managed identity on the box's Instance Metadata Service: the token route and its book.

Azure: "How to use managed identities for Azure resources on an Azure VM to acquire an access
token" (https://learn.microsoft.com/entra/identity/managed-identities-azure-resources/
how-to-use-vm-token): `GET http://169.254.169.254/metadata/identity/oauth2/token?api-version=
2018-02-01&resource=https://storage.azure.com/` with the header `Metadata: true` answers
`{access_token, refresh_token, expires_in, expires_on, ext_expires_in, not_before, resource,
token_type}` (numbers as strings) for the VM's system-assigned identity. Its "Error handling"
table: no `Metadata` header, a missing api-version or resource, or a VM without that identity
is 400 `{"error": "invalid_request", "error_description": ...}`; an unknown path is 404.

`imds_token_route(arm, book)` is that route for `MetadataServer.add_route` (tests/fakes/
metadata_server.py): the asking VM is the `/vm/<id>` of the path the boot harness hands each
VM, its identity the `principalId` the ARM fake holds for the VM of that `vmId` (so a VM made
again, with a new identity, gets tokens for the new one). azure-identity's
ManagedIdentityCredential (through msal) asks `$AZURE_POD_IDENTITY_AUTHORITY_HOST` +
`/metadata/identity/oauth2/token` when that variable is set, else 169.254.169.254: the box sets
it to the VM's own view. The tokens are opaque and recorded in a `TokenBook`, which the box's
Blob front (tests/fakes/blob_authorizer.py) asks who a bearer is, as Azure Storage validates an
Entra token.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.fakes.token_book import TokenBook

TOKEN_PATH = "/metadata/identity/oauth2/token"
STORAGE = "https://storage.azure.com/"  # the resource the Blob service accepts tokens for
TOKEN_LIFETIME_S = 86399  # IMDS tokens for a system-assigned identity live about 24 h

Answer = tuple[int, dict[str, str], bytes]


def token_book() -> TokenBook:
    """The book of the tokens this IMDS issues (about a day each)."""
    return TokenBook("box-mi-", TOKEN_LIFETIME_S)


def _error(status: int, description: str) -> Answer:
    body = {"error": "invalid_request", "error_description": description}
    return status, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(body).encode()


def principal_of_vm(arm: Any, vm_id: str) -> str | None:
    """The system-assigned identity's principal id of the ARM fake's VM whose vmId is `vm_id`,
    or None (no such VM, or no identity)."""
    for body in arm.resources(kind="virtualMachines"):
        if (body.get("properties") or {}).get("vmId") == vm_id:
            return (body.get("identity") or {}).get("principalId") or None
    return None


def imds_token_route(arm: Any, book: TokenBook) -> Any:
    """The IMDS token route (the module docstring): a MetadataServer route handler."""

    def handle(
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        asker: str,
        client: str,
    ) -> Answer | None:
        if path.rstrip("/") != TOKEN_PATH:
            return None
        if method != "GET":
            return _error(405, "Only GET is supported")
        if headers.get("metadata", "").lower() != "true":
            return _error(400, "Required metadata header not specified")
        if not query.get("api-version"):
            return _error(400, "Required query variable 'api-version' is missing")
        resource = (query.get("resource") or [""])[0]
        if not resource:
            return _error(400, "Required query variable 'resource' is missing")
        principal = principal_of_vm(arm, asker) if asker else None
        if principal is None:
            return _error(400, "Identity not found")
        now = int(time.time())
        token = book.issue(principal, resource)
        body = {
            "access_token": token,
            "refresh_token": "",
            "expires_in": str(TOKEN_LIFETIME_S),
            "expires_on": str(now + TOKEN_LIFETIME_S),
            "ext_expires_in": str(TOKEN_LIFETIME_S),
            "not_before": str(now),
            "resource": resource,
            "token_type": "Bearer",
        }
        return 200, {"Content-Type": "application/json; charset=utf-8"}, json.dumps(body).encode()

    return handle
