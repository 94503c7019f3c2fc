"""IAM allow-policy routes of the GCE fake: `PoliciesMixin` (a project's, a service account's).

Served on the fake's own server, at the paths of the real APIs:

- Resource Manager v1, `POST /v1/projects/{project}:getIamPolicy` and `:setIamPolicy`
  (https://cloud.google.com/resource-manager/reference/rest/v1/projects/getIamPolicy);
- IAM v1, `POST /v1/projects/{project}/serviceAccounts/{email}:getIamPolicy` and
  `:setIamPolicy` (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts).

Strict where GCP is (IAM "Policy versions", https://cloud.google.com/iam/docs/policies#versions;
"Overview of IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview):

- setIamPolicy takes `{"policy": {...}}` (`updateMask` optional); a policy with a conditional
  binding must say `version: 3` (400 otherwise); a condition needs a non-empty `expression`
  and `title`; IAM Conditions' limits (tests/fakes/iam_limits.py: at most 12 logical operators
  and 12,800 characters in an expression, a title of 100 and a description of 256 characters,
  20 conditional bindings of one role and principal) are 400 INVALID_ARGUMENT, nothing
  written; a binding's role starts with `roles/`; a `serviceAccount:` member must be an
  account the fake's IAM holds (400, as GCP refuses an unknown service account); a stale
  `etag` is refused with 409 ABORTED (concurrent change). Each accepted write is recorded
  (`policy_writes`).
- getIamPolicy reads `options.requestedPolicyVersion`: asked below 3, a policy with conditions
  comes back as GCP sends it then, version 1 with the conditions stripped and the roles renamed
  `<role>_withcond_<hash>`, so an adapter that forgets to ask for version 3 and writes that
  back breaks its bindings, visibly.
- A project starts with one binding of its own (`roles/owner` for `user:owner@example.com`);
  deleting a service account turns its members into `deleted:serviceAccount:<email>?uid=<id>`
  in every policy, as IAM does for a deleted principal.

Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from typing import Any

from tests.fakes import iam_limits
from tests.fakes.gce_errors import GceApiError
from tests.fakes.gce_state import State

OWNER = "user:owner@example.com"


class PolicyApiError(GceApiError):
    """An error in the shape IAM and Resource Manager send (`status`, no `errors` list)."""

    def body(self) -> dict[str, Any]:
        status = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "ABORTED"}.get(self.code, "")
        return {"error": {"code": self.code, "message": self.message, "status": status}}


class PoliciesMixin:
    """The getIamPolicy/setIamPolicy routes of projects and service accounts."""

    _state: State

    # -- what tests read ----------------------------------------------------------------------

    def iam_policy(self, kind: str, name: str) -> dict[str, Any]:
        """A copy of the stored policy of ("project", project) or ("account", email)."""
        with self._lock:  # type: ignore[attr-defined]
            return copy.deepcopy(self._policy(kind, name))

    def policy_writes(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every accepted setIamPolicy: (kind, name, the request body), in order."""
        with self._lock:  # type: ignore[attr-defined]
            return copy.deepcopy(self._state.policy_writes)

    # -- storage ------------------------------------------------------------------------------

    def _policy(self, kind: str, name: str) -> dict[str, Any]:
        key = (kind, name)
        if key not in self._state.policies:
            bindings = [{"role": "roles/owner", "members": [OWNER]}] if kind == "project" else []
            self._state.policies[key] = {"version": 1, "etag": _etag(), "bindings": bindings}
        return self._state.policies[key]

    def _account_email(self, project: str, key: str) -> str:
        for (p, email), account in self._state.service_accounts.items():
            if project in ("-", p) and key in (email, account["uniqueId"]):
                return email
        raise PolicyApiError(404, "notFound", f"Unknown service account: {key}")

    def _mark_deleted(self, email: str, unique_id: str) -> None:
        """A deleted account's members become `deleted:serviceAccount:...` everywhere."""
        gone = f"serviceAccount:{email}"
        for policy in self._state.policies.values():
            for b in policy["bindings"]:
                b["members"] = [
                    f"deleted:{m}?uid={unique_id}" if m == gone else m for m in b["members"]
                ]

    # -- routes -------------------------------------------------------------------------------

    def _get_project_policy(self, params: dict[str, str], query: Any, body: Any) -> Any:
        return self._read("project", params["project"], body)

    def _set_project_policy(self, params: dict[str, str], query: Any, body: Any) -> Any:
        return self._write("project", params["project"], body)

    def _get_account_policy(self, params: dict[str, str], query: Any, body: Any) -> Any:
        return self._read(
            "account", self._account_email(params["project"], params["account"]), body
        )

    def _set_account_policy(self, params: dict[str, str], query: Any, body: Any) -> Any:
        email = self._account_email(params["project"], params["account"])
        return self._write("account", email, body)

    def _read(self, kind: str, name: str, body: Any) -> dict[str, Any]:
        options = (body or {}).get("options") or {} if isinstance(body, dict) else {}
        asked = int(options.get("requestedPolicyVersion") or 1)
        if asked not in (1, 2, 3):
            raise PolicyApiError(400, "invalid", f"Invalid requestedPolicyVersion {asked}")
        policy = copy.deepcopy(self._policy(kind, name))
        if asked < 3 and any("condition" in b for b in policy["bindings"]):
            policy["version"] = 1
            for b in policy["bindings"]:
                cond = b.pop("condition", None)
                if cond is not None:
                    digest = hashlib.sha256(repr(cond).encode()).hexdigest()[:16]
                    b["role"] = f"{b['role']}_withcond_{digest}"
        return policy

    def _write(self, kind: str, name: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("policy"), dict):
            raise PolicyApiError(400, "invalid", "setIamPolicy needs a body {'policy': {...}}")
        new = copy.deepcopy(body["policy"])
        current = self._policy(kind, name)
        if new.get("etag") and new["etag"] != current["etag"]:
            raise PolicyApiError(
                409, "aborted", "There were concurrent policy changes. Please retry."
            )
        version = int(new.get("version") or 1)
        bindings = new.get("bindings") or []
        for b in bindings:
            self._check_binding(b, version)
        problem = iam_limits.policy_problem(bindings)
        if problem:
            raise PolicyApiError(400, "invalid", problem)
        self._state.policy_writes.append((kind, name, copy.deepcopy(body)))
        stored = {
            "version": version,
            "etag": _etag(),
            "bindings": [{**b, "members": sorted(set(b["members"]))} for b in bindings],
        }
        self._state.policies[(kind, name)] = stored
        return copy.deepcopy(stored)

    def _check_binding(self, b: Any, version: int) -> None:
        if not isinstance(b, dict) or not str(b.get("role") or "").startswith("roles/"):
            raise PolicyApiError(400, "invalid", f"Invalid binding (role): {b!r}")
        members = b.get("members")
        if not isinstance(members, list) or not members:
            raise PolicyApiError(400, "invalid", f"A binding needs members: {b!r}")
        cond = b.get("condition")
        if cond is not None:
            if version < 3:
                raise PolicyApiError(
                    400,
                    "invalid",
                    "Invalid argument: a policy with conditional role bindings must have "
                    f"version 3, not {version}",
                )
            if not isinstance(cond, dict) or not str(cond.get("expression") or "").strip():
                raise PolicyApiError(400, "invalid", f"A condition needs an expression: {b!r}")
            if not str(cond.get("title") or ""):
                raise PolicyApiError(400, "invalid", f"A condition needs a title: {cond!r}")
        known = {e for (_, e) in self._state.service_accounts}
        for m in members:
            if str(m).startswith("serviceAccount:") and m.split(":", 1)[1] not in known:
                raise PolicyApiError(
                    400, "invalid", f"Service account {m.split(':', 1)[1]} does not exist."
                )


def _etag() -> str:
    return uuid.uuid4().hex[:12]
