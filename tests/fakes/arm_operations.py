"""Long-running operations of the ARM fake: `OperationsMixin`, the base of the handler mixins.

`_start_lro()` records an `Operation` and answers the headers that announce it:
`Azure-AsyncOperation: {url}/subscriptions/{sub}/providers/{ns}/locations/{loc}/operations/{id}
?api-version=...` (style `async`), or `Location: {url}/subscriptions/{sub}/operationresults/{id}
?api-version=...` (style `location`, as resource group deletion answers; storage account
creation uses `.../providers/Microsoft.Storage/locations/{loc}/asyncoperations/{id}`), each with
`Retry-After: 0`. An operation answers `InProgress` to its first `lro_polls` GETs (taken when it
starts; 0 finishes it at once), then runs its effect (`on_done`, which returns an error dict
to fail it) and answers `Succeeded` or `Failed` with `error: {code, message}` from then on.
Async status bodies are `{"name", "status", "startTime"[, "endTime"][, "error"]}`; location
polls answer 202 while in progress, then 200 with the operation's result body (or the error,
with its status).
Methods run under the fake's lock; the mixin relies on the fake's `_state`, `url`, `lro_polls`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from tests.fakes.arm_errors import ArmApiError
from tests.fakes.arm_http import Reply
from tests.fakes.arm_ids import now
from tests.fakes.arm_routes import Req
from tests.fakes.arm_state import Operation, State

OPERATION_API_VERSION = "2024-11-01"


class OperationsMixin:
    """Operation bookkeeping and the operation routes (see the module docstring)."""

    _state: State
    url: str
    lro_polls: int

    def _start_lro(
        self,
        sub: str,
        namespace: str,
        location: str,
        on_done: Callable[[], dict[str, Any] | None],
        style: str = "async",
        result: Callable[[], Any] | None = None,
    ) -> dict[str, str]:
        """Record a new operation (see the module docstring); the headers announcing it."""
        op_id = str(uuid.uuid4())
        location = location.replace(" ", "").lower() or "global"
        op = Operation(
            op_id,
            namespace,
            location,
            max(0, int(self.lro_polls)),
            on_done,
            style,
            result or (lambda: None),
            start_time=now(),
        )
        self._state.operations[op_id] = op
        if op.polls_needed == 0:
            self._finish(op)
        query = f"api-version={OPERATION_API_VERSION}"
        if style == "location":
            url = f"{self.url}/subscriptions/{sub}/operationresults/{op_id}?{query}"
            if namespace == "Microsoft.Storage":
                url = (
                    f"{self.url}/subscriptions/{sub}/providers/{namespace}/locations/{location}"
                    f"/asyncoperations/{op_id}?monitor=true&{query}"
                )
            return {"Location": url, "Retry-After": "0"}
        url = (
            f"{self.url}/subscriptions/{sub}/providers/{namespace}/locations/{location}"
            f"/operations/{op_id}?{query}"
        )
        return {"Azure-AsyncOperation": url, "Retry-After": "0"}

    def _finish(self, op: Operation) -> None:
        if op.status != "InProgress":
            return
        op.error = op.on_done()
        op.status = "Failed" if op.error else "Succeeded"
        op.end_time = now()

    def _advance(self, op_id: str) -> Operation:
        op = self._state.operations.get(op_id)
        if op is None:
            raise ArmApiError(
                404, "ResourceNotFound", f"The operation '{op_id}' could not be found."
            )
        if op.status == "InProgress":
            if op.polls < op.polls_needed:
                op.polls += 1
            else:
                self._finish(op)
        return op

    def _poll_async(self, req: Req) -> Reply:
        op = self._advance(req.params["op"])
        body: dict[str, Any] = {"name": op.id, "status": op.status, "startTime": op.start_time}
        if op.status == "InProgress":
            return Reply(200, body, {"Retry-After": "0"})
        body["endTime"] = op.end_time
        if op.error:
            body["error"] = {k: v for k, v in op.error.items() if k != "status"}
        return Reply(200, body)

    def _poll_location(self, req: Req) -> Reply:
        op = self._advance(req.params["op"])
        if op.status == "InProgress":
            return Reply(202, None, {"Retry-After": "0"})
        if op.error:
            error = dict(op.error)
            raise ArmApiError(int(error.pop("status", 409)), error["code"], error["message"])
        result = op.result()
        return Reply(200, result) if result is not None else Reply(200, None)
