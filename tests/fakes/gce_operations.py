"""Operations of the GCE fake: `OperationsMixin`, the base of the resource handler mixins.

Every insert and delete answers a new zonal or global operation (`_new_operation()`), which
starts PENDING and takes `operation_polls_to_done` GETs or waits of it (`_poll()`) to go through
RUNNING to DONE, 0 making it DONE at once; its effect (the `on_done` callback, which may return
error fields) lands when it is DONE. An insert or delete given a `requestId` query parameter (a
UUID) records its operation under it; `_replayed()` answers a later request of the same project
with that `requestId` the recorded operation as it stands, so its handler does not act again, as
GCE does. The mixin also serves the operation GET and wait routes, the zone's operation list
(`filter`, paging: as `gcloud compute operations list --filter=operationType=...` reads it) and
hands out resource ids.
It relies on the fake's `_state` and `operation_polls_to_done`, and its methods run under the
fake's lock.
"""

from __future__ import annotations

import copy
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from tests.fakes.gce_errors import invalid_field, not_found
from tests.fakes.gce_formats import API_ROOT, now
from tests.fakes.gce_listing import page
from tests.fakes.gce_state import Operation, State

FAKE_USER = "cloudtrain-tests@fake.invalid"


class OperationsMixin:
    """Operation bookkeeping and the operation routes (see the module docstring)."""

    _state: State
    operation_polls_to_done: int

    def _new_id(self) -> str:
        return str(next(self._state.ids))

    def _replayed(self, project: str, query: dict[str, str]) -> dict[str, Any] | None:
        """The operation an earlier request of `project` with this `requestId` started, as it
        stands (not polled), or None; 400 invalid unless the `requestId` is a non-zero UUID."""
        request_id = query.get("requestId", "")
        if not request_id:
            return None
        key = self._state.request_ids.get((project, _request_key(request_id)))
        return None if key is None else copy.deepcopy(self._state.operations[key].body)

    def _new_operation(
        self,
        project: str,
        scope: str,
        operation_type: str,
        target_link: str,
        target_id: str,
        on_done: Callable[[], dict[str, Any] | None],
        request_id: str = "",
    ) -> dict[str, Any]:
        stamp = dt.datetime.now(dt.UTC)
        hexes = uuid.uuid4().hex
        name = (
            f"operation-{int(stamp.timestamp() * 1000)}-{hexes[:13]}-{hexes[13:21]}-{hexes[21:29]}"
        )
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": self._new_id(),
            "name": name,
            "operationType": operation_type,
            "targetLink": target_link,
            "targetId": target_id,
            "status": "PENDING",
            "user": FAKE_USER,
            "progress": 0,
            "insertTime": now(),
            "selfLink": f"{API_ROOT}/projects/{project}/{scope}/operations/{name}",
        }
        if scope.startswith("zones/"):
            body["zone"] = f"{API_ROOT}/projects/{project}/{scope}"
        op = Operation(body, max(0, int(self.operation_polls_to_done)), on_done)
        self._state.operations[(project, scope, name)] = op
        if request_id:
            self._state.request_ids[(project, _request_key(request_id))] = (project, scope, name)
        self._settle(op)
        return copy.deepcopy(op.body)

    def _settle(self, op: Operation) -> None:
        """Bring an operation's status in line with how often it has been polled."""
        body = op.body
        if body["status"] == "DONE":
            return
        if op.polls >= op.polls_needed:
            body.setdefault("startTime", now())
            error = op.on_done()
            if error:
                body.update(error)
            body.update(status="DONE", progress=100, endTime=now())
        elif op.polls > 0 and body["status"] == "PENDING":
            body.update(status="RUNNING", startTime=now())

    def _poll(self, params: dict[str, str]) -> dict[str, Any]:
        scope = f"zones/{params['zone']}" if "zone" in params else "global"
        key = (params["project"], scope, params["op"])
        op = self._state.operations.get(key)
        if op is None:
            raise not_found(f"projects/{key[0]}/{scope}/operations/{key[2]}")
        if op.body["status"] != "DONE":
            op.polls += 1
            self._settle(op)
        return copy.deepcopy(op.body)

    def _get_operation(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return self._poll(params)

    def _wait_operation(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return self._poll(params)

    def _list_operations(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        """The zone's operations in creation order, as they stand (listing polls none)."""
        project, scope = params["project"], f"zones/{params['zone']}"
        ops = self._state.operations.items()
        items = [op.body for (p, s, _), op in ops if (p, s) == (project, scope)]
        link = f"{API_ROOT}/projects/{project}/{scope}/operations"
        return page(items, query, link, "compute#operationList")


def _request_key(request_id: str) -> str:
    """A `requestId` in canonical form; GceApiError(400) unless it is a UUID other than zero."""
    try:
        parsed = uuid.UUID(request_id)
    except ValueError:
        parsed = None
    if parsed is None or parsed.int == 0:
        raise invalid_field(
            "requestId", request_id, "Must be a valid UUID other than the zero UUID."
        )
    return str(parsed)
