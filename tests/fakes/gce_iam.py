"""IAM service-account routes of the GCE fake: `IamMixin`.

Served on the fake's own server, under `/v1/projects/{project}/serviceAccounts` (the paths of
`https://iam.googleapis.com`; point CLOUDTRAIN_IAM_ENDPOINT at the fake's URL):

- `POST .../serviceAccounts` with `{"accountId", "serviceAccount": {"displayName",
  "description"}}`: 200 with the ServiceAccount; 409 ALREADY_EXISTS for a taken id; 400
  INVALID_ARGUMENT for an id outside 6-30 chars of `[a-z]([-a-z0-9]*[a-z0-9])`, a display name
  over 100 or a description over 256 characters.
- `GET .../serviceAccounts` (`pageSize`, `pageToken`): `{"accounts": [...], "nextPageToken"}`,
  `accounts` left out when there are none.
- `GET` / `DELETE .../serviceAccounts/{email or uniqueId}` (project may be `-`): 404 NOT_FOUND
  for an unknown account; a delete answers `{}`.

The IAM policies of projects and accounts (getIamPolicy/setIamPolicy, strict about conditions
and policy versions) are gce_policies'; a deleted account leaves `deleted:` members there.

Errors have IAM's shape, `{"error": {"code", "message", "status"}}`. The mixin also checks the
accounts an instance insert names (`_check_instance_accounts`): with
`require_known_service_accounts` on, an account other than `default` that the fake's IAM does
not hold is refused with 400, as GCE does; `lag_service_accounts(n)` makes the next `n` inserts
naming a non-default account fail so even when it exists (IAM propagating a new account).
Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import re
import uuid
import zlib
from typing import Any

from tests.fakes.gce_errors import GceApiError
from tests.fakes.gce_policies import PoliciesMixin
from tests.fakes.gce_state import State

ACCOUNT_ID_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")
STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "ALREADY_EXISTS"}
MAX_PAGE = 100


class IamApiError(GceApiError):
    """A request error answered in IAM's shape (`status`, no `errors` list)."""

    def body(self) -> dict[str, Any]:
        """The JSON body IAM sends for this error."""
        status = STATUS.get(self.code, "UNKNOWN")
        return {"error": {"code": self.code, "message": self.message, "status": status}}


def account_email(project: str, account_id: str) -> str:
    """The email IAM gives account `account_id` of `project`."""
    return f"{account_id}@{project}.iam.gserviceaccount.com"


class IamMixin(PoliciesMixin):
    """The `serviceAccounts` routes and the instance-insert account check; the IAM policies of
    projects and accounts (gce_policies)."""

    _state: State
    _lock: Any  # the fake's RLock
    require_known_service_accounts: bool

    def lag_service_accounts(self, count: int = 1) -> None:
        """Make the next `count` instance inserts naming a non-default account fail with 400
        "does not exist", as while IAM propagates a new account to Compute Engine."""
        with self._lock:
            self._state.account_lag += count

    def service_accounts(self, project: str | None = None) -> list[dict[str, Any]]:
        """Copies of the stored service accounts, by project and email."""
        with self._lock:
            return [
                copy.deepcopy(a)
                for (p, _), a in sorted(self._state.service_accounts.items())
                if project in (None, p)
            ]

    def _find_account(self, project: str, key: str) -> tuple[str, str]:
        for (p, email), account in self._state.service_accounts.items():
            if project in ("-", p) and key in (email, account["uniqueId"]):
                return p, email
        raise IamApiError(404, "notFound", f"Unknown service account: {key}")

    def _create_account(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        body = body if isinstance(body, dict) else {}
        account_id = str(body.get("accountId") or "")
        fields = body.get("serviceAccount") or {}
        if not (6 <= len(account_id) <= 30 and ACCOUNT_ID_RE.match(account_id)):
            raise IamApiError(400, "invalid", f"Invalid accountId: {account_id!r}")
        shown, about = str(fields.get("displayName") or ""), str(fields.get("description") or "")
        if len(shown) > 100 or len(about) > 256:
            raise IamApiError(400, "invalid", "displayName or description is too long")
        email = account_email(project, account_id)
        if (project, email) in self._state.service_accounts:
            raise IamApiError(
                409,
                "alreadyExists",
                f"Service account {account_id} already exists within project projects/{project}.",
            )
        unique = str(100_000_000_000_000_000_000 + zlib.crc32(email.encode()))
        account = {
            "name": f"projects/{project}/serviceAccounts/{email}",
            "projectId": project,
            "uniqueId": unique,
            "email": email,
            "displayName": shown,
            "description": about,
            "etag": uuid.uuid4().hex[:8],
            "oauth2ClientId": unique,
        }
        self._state.service_accounts[(project, email)] = account
        return copy.deepcopy(account)

    def _list_accounts(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        items = [a for (p, _), a in sorted(self._state.service_accounts.items()) if p == project]
        try:
            size = min(MAX_PAGE, int(query.get("pageSize") or 20))
            start = int(query.get("pageToken") or "0")
        except ValueError as exc:
            raise IamApiError(400, "invalid", f"Invalid pageSize or pageToken: {exc}") from exc
        answer: dict[str, Any] = {}
        chunk = items[start : start + size]
        if chunk:
            answer["accounts"] = copy.deepcopy(chunk)
        if start + size < len(items):
            answer["nextPageToken"] = str(start + size)
        return answer

    def _get_account(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        key = self._find_account(params["project"], params["account"])
        return copy.deepcopy(self._state.service_accounts[key])

    def _delete_account(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        key = self._find_account(params["project"], params["account"])
        gone = self._state.service_accounts.pop(key)
        self._state.policies.pop(("account", key[1]), None)
        self._mark_deleted(key[1], gone["uniqueId"])
        return {}

    def _check_instance_accounts(self, project: str, body: dict[str, Any]) -> None:
        """400 for an instance naming an account GCE would not know (see the module docstring)."""
        for index, account in enumerate(body.get("serviceAccounts") or []):
            email = str(account.get("email") or "")
            if email in ("", "default"):
                continue
            known = any(e == email for (_, e) in self._state.service_accounts)
            lagging = self._state.account_lag > 0
            if lagging:
                self._state.account_lag -= 1
            if lagging or (self.require_known_service_accounts and not known):
                raise GceApiError(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.serviceAccounts[{index}].email': "
                    f"'{email}'. Service account {email} does not exist.",
                )
