"""A GCE VM's service account on the box's metadata server: the routes and the book of tokens.

GCE: "Authenticate workloads using service accounts", applications on the VM
(https://cloud.google.com/compute/docs/access/authenticate-workloads#applications): a program
on the VM asks the metadata server for an access token of the service account attached to the
instance, `GET http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/
default/token` with `Metadata-Flavor: Google`, answered `{"access_token", "expires_in",
"token_type": "Bearer"}`. The directory (`instance/service-accounts/` lists `default/` and the
account's email; `.../default/` lists `aliases`, `email`, `identity`, `scopes`, `token`),
`?recursive=true` (a JSON object of the directory: `aliases`, `email`, `scopes`), the text
entries `email` and `scopes` (one scope a line), and the rules: a request without
`Metadata-Flavor: Google` or with `X-Forwarded-For` is 403, every answer carries
`Metadata-Flavor: Google`, an unknown entry is 404 ("About VM metadata",
https://cloud.google.com/compute/docs/metadata/overview; "Predefined metadata keys",
https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys; "Query VM metadata",
https://cloud.google.com/compute/docs/metadata/querying-metadata). The server's root answers
200 with `Metadata-Flavor: Google` too: google-auth pings it (compute_engine/_metadata.py
`ping`, GET `http://$GCE_METADATA_IP`) to decide it runs on GCE.

`service_account_route(gce, book)` serves those for `MetadataServer.add_route` (tests/fakes/
metadata_server.py): the asking VM is the `/vm/<id>` of the path the boot harness hands each
VM (its GCE instance id), its account the instance's `serviceAccounts` in the GCE fake (so a VM
made again answers for the account it was made with). google-auth builds its URLs from
`GCE_METADATA_HOST` (`http://<host>/computeMetadata/v1/...`) and pings `GCE_METADATA_IP`; the
box sets both to `127.0.0.1:<port>/vm/<id>` (`vm_env`). The tokens are opaque and recorded in a
`TokenBook`, which the box's GCS front (tests/fakes/gcs_authorizer.py) asks who a bearer is, as
GCS validates an OAuth token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from tests.fakes.token_book import TokenBook

ACCOUNTS_PATH = "/computeMetadata/v1/instance/service-accounts/"
PROJECT_ID_PATH = "/computeMetadata/v1/project/project-id"
TOKEN_LIFETIME_S = 3599  # GCE's access tokens live about an hour
_FLAVOR = {"Metadata-Flavor": "Google"}
_ENTRIES = ("aliases", "email", "identity", "scopes", "token")

Answer = tuple[int, dict[str, str], bytes]


def token_book() -> TokenBook:
    """The book of the access tokens this metadata server issues (about an hour each)."""
    return TokenBook("ya29.box-", TOKEN_LIFETIME_S)


def instance_account(gce: Any, vm_id: str) -> dict[str, Any] | None:
    """The first `serviceAccounts` entry ({email, scopes}) of the GCE fake's instance of id
    `vm_id`, or None (no such instance, or none attached)."""
    for inst in gce.instances():
        if str(inst.get("id")) == vm_id:
            accounts = inst.get("serviceAccounts") or []
            return dict(accounts[0]) if accounts else None
    return None


def _text(body: str) -> Answer:
    return 200, {**_FLAVOR, "Content-Type": "application/text"}, body.encode()


def _json(payload: Any) -> Answer:
    return 200, {**_FLAVOR, "Content-Type": "application/json"}, json.dumps(payload).encode()


def _not_found() -> Answer:
    return 404, {**_FLAVOR, "Content-Type": "text/html"}, b"Not Found"


def service_account_route(gce: Any, book: TokenBook, project: str) -> Callable[..., Answer | None]:
    """The route (for `MetadataServer.add_route("/", ...)`) answering the root ping,
    `project/project-id` and `instance/service-accounts/...` of the asking VM; None (fall
    through) for every other path."""

    def handle(
        method: str,
        path: str,
        query: Mapping[str, list[str]],
        headers: Mapping[str, str],
        asker: str,
        client: str,
    ) -> Answer | None:
        if path not in ("/", "", PROJECT_ID_PATH) and not path.startswith(ACCOUNTS_PATH):
            return None
        if "x-forwarded-for" in headers or headers.get("metadata-flavor") != "Google":
            return 403, {"Content-Type": "text/html"}, b"Missing Metadata-Flavor:Google header."
        if path in ("/", ""):
            return _text("computeMetadata/\n")
        if method not in ("GET", "POST"):  # google-auth may POST for a token (mTLS off: GET)
            return 405, dict(_FLAVOR), b"Method Not Allowed"
        if path == PROJECT_ID_PATH:
            return _text(project)
        account = instance_account(gce, asker) if asker else None
        if account is None:
            return _not_found()
        email = str(account.get("email") or "")
        scopes = [str(s) for s in account.get("scopes") or []]
        rest = path[len(ACCOUNTS_PATH) :]
        if rest == "":
            return _text(f"default/\n{email}/\n")
        alias, _, entry = rest.partition("/")
        if alias not in ("default", email):
            return _not_found()
        recursive = (query.get("recursive") or [""])[-1].lower() == "true"
        if entry == "" and recursive:
            return _json({"aliases": ["default"], "email": email, "scopes": scopes})
        if entry == "":
            return _text("".join(f"{e}\n" for e in _ENTRIES))
        if entry == "email":
            return _text(email)
        if entry == "scopes":
            return _text("".join(f"{s}\n" for s in scopes))
        if entry == "aliases":
            return _text("default\n")
        if entry == "token":
            token = book.issue(email)
            return _json(
                {"access_token": token, "expires_in": TOKEN_LIFETIME_S, "token_type": "Bearer"}
            )
        return _not_found()

    return handle


def vm_env(metadata_url: str, vm_id: str, storage_front: str) -> dict[str, str | None]:
    """What a training node VM's environment gets so google-auth takes its instance's service
    account from the box's metadata server and google-cloud-storage goes through the GCS front
    (`STORAGE_EMULATOR_HOST`), as a VM on GCE reaches metadata.google.internal and GCS:
    GCE_METADATA_HOST / GCE_METADATA_IP (google-auth's compute_engine/_metadata.py builds
    `http://$GCE_METADATA_HOST/computeMetadata/v1/` and pings `http://$GCE_METADATA_IP`) name
    the VM's own view (`/vm/<id>`), NO_GCE_CHECK (which the box's laptop side sets) goes.
    `metadata_url` is the server's `http://host:port`."""
    view = metadata_url.removeprefix("http://").rstrip("/") + f"/vm/{vm_id}"
    return {
        "GCE_METADATA_HOST": view,
        "GCE_METADATA_IP": view,
        "NO_GCE_CHECK": None,
        "STORAGE_EMULATOR_HOST": storage_front,
    }
