"""Long-running operations of the TPU API fake: `TpuOperationsMixin`.

Node and queued-resource creates and deletes (and node stop/start) answer a
google.longrunning.Operation (TPU API v2 discovery document, schema `Operation`: `name`
`projects/P/locations/Z/operations/operation-...`, `metadata` an `OperationMetadata`
{createTime, target, verb, apiVersion}, `done`, then `response` or `error`). It starts
`done: false` and takes `operation_polls_to_done` (default 2) GETs of it to finish, 0 making it
done in the create's answer; its effect lands when it is done. A GET of the node a pending
operation targets counts as a poll of it too (time passes for a caller that polls the node,
not the operation). google-cloud-tpu's `Operation.result()` polls through
`/v2/{name=projects/*/locations/*/operations/*}` on the client's own endpoint (tpu_v2 REST
transport, `operations_client`), so it reaches the fake. `response` and `metadata` carry their
`@type` (google.cloud.tpu.v2.Node / QueuedResource / OperationMetadata, google.protobuf.Empty
for a delete), which the client unpacks. Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from tests.fakes.tpu_errors import invalid, not_found
from tests.fakes.tpu_state import Outcome, TpuOperation, TpuState

TYPE_ROOT = "type.googleapis.com/google.cloud.tpu.v2"
EMPTY = {"@type": "type.googleapis.com/google.protobuf.Empty"}
MAX_PAGE = 1000


def now() -> str:
    """An RFC 3339 UTC timestamp as the TPU API writes them."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def page(items: list[dict[str, Any]], query: dict[str, str], key: str) -> dict[str, Any]:
    """One page of `items` under `key` (`pageSize`, `pageToken` = the first item's index),
    with `nextPageToken` while items remain; an empty page leaves `key` out."""
    try:
        size = int(query.get("pageSize") or MAX_PAGE)
        start = int(query.get("pageToken") or "0")
    except ValueError as exc:
        raise invalid(f"Invalid page_size or page_token: {exc}") from exc
    if size < 0 or start < 0:
        raise invalid("page_size and page_token must not be negative")
    size = min(size or MAX_PAGE, MAX_PAGE)
    answer: dict[str, Any] = {}
    chunk = items[start : start + size]
    if chunk:
        answer[key] = copy.deepcopy(chunk)
    if start + size < len(items):
        answer["nextPageToken"] = str(start + size)
    return answer


class TpuOperationsMixin:
    """Operation bookkeeping and the operation routes."""

    _state: TpuState
    operation_polls_to_done: int

    def _new_id(self) -> str:
        return str(next(self._state.ids))

    def _new_operation(
        self,
        project: str,
        zone: str,
        verb: str,
        target: str,
        on_done: Callable[[], Outcome],
    ) -> dict[str, Any]:
        """Start an operation on `target` (a resource name); answers its body as it stands."""
        hexes = uuid.uuid4().hex
        stamp = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
        name = f"projects/{project}/locations/{zone}/operations/operation-{stamp}-{hexes[:24]}"
        body: dict[str, Any] = {
            "name": name,
            "metadata": {
                "@type": f"{TYPE_ROOT}.OperationMetadata",
                "createTime": now(),
                "target": target,
                "verb": verb,
                "cancelRequested": False,
                "apiVersion": "v2",
            },
            "done": False,
        }
        op = TpuOperation(body, max(0, int(self.operation_polls_to_done)), on_done)
        self._state.operations[name] = op
        self._settle(op)
        return copy.deepcopy(op.body)

    def _settle(self, op: TpuOperation) -> None:
        """Finish `op` once it has been polled enough: its effect lands, `done` turns true."""
        if op.body["done"] or op.polls < op.polls_needed:
            return
        kind, value = op.on_done()
        op.body[kind] = value
        op.body["metadata"]["endTime"] = now()
        op.body["done"] = True

    def _tick_target(self, target: str) -> None:
        """A GET of `target`: one poll of each pending operation on it."""
        for op in list(self._state.operations.values()):
            if not op.body["done"] and op.body["metadata"]["target"] == target:
                op.polls += 1
                self._settle(op)

    def _get_operation(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        name = f"projects/{params['project']}/locations/{params['zone']}/operations/{params['op']}"
        op = self._state.operations.get(name)
        if op is None:
            raise not_found(name)
        if not op.body["done"]:
            op.polls += 1
            self._settle(op)
        return copy.deepcopy(op.body)

    def _list_operations(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        """The zone's operations in creation order, as they stand (listing polls none)."""
        if query.get("filter", "").strip():
            raise invalid("the TPU fake does not filter operations")
        prefix = f"projects/{params['project']}/locations/{params['zone']}/operations/"
        items = [op.body for name, op in self._state.operations.items() if name.startswith(prefix)]
        return page(items, query, "operations")
