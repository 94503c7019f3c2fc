"""Queued-resource routes of the TPU API fake: `TpuQueuedMixin`.

`projects.locations.queuedResources` of the TPU API v2 (discovery document tpu.v2.json): create
(`queuedResourceId` query parameter, body `QueuedResource` {tpu: {nodeSpec: [{parent, nodeId,
node}]}, spot: {} or guaranteed: {}}), get, list (`pageSize`, `pageToken`), delete (`force`).
The fake serves one node per request (`nodeSpec` of one entry with a `nodeId`: single-host
slices; multislice requests are refused). Its `node` is checked like a node create's
(tpu_nodes.validate_node); `spot` makes it a spot node.

States (QueuedResourceState.State, google-cloud-tpu tpu_v2/types/cloud_tpu.py): a created
request is ACCEPTED ("passed initial validation/admission control and has been persisted in
the queue"); each later GET or list of it is one step of time: to WAITING_FOR_RESOURCES while
its zone is sold out ("It will remain in this state until there are sufficient free
resources"), else to PROVISIONING, which creates its node (CREATING, `queuedResource` naming
the request), then ACTIVE with the node READY ("provisioned and ready for use"). A request
whose node would exceed the TPU quota turns FAILED with `failedData.error` (code 8, the
quota's message; that the quota refusal of a queued request arrives in `failedData` rather
than as a 429 is this fake's reading of FAILED's "could not be completed", not a quote). A
deleted or preempted node turns its request SUSPENDED ("have been deleted"; `stateInitiator`
USER or SERVICE: "initiated by the user, or the Cloud TPU service"). Delete: DELETING until
its operation is done, then gone; with a node still there it needs `force=true`, which deletes
the node too, else 400 FAILED_PRECONDITION. A `queueingPolicy.validUntilDuration` (the only
policy served) makes a request still waiting after it FAILED, code 4 (FAILED: "e.g., the 'valid
until' start timing constraint expired"). Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import math
import re
import time
from typing import Any

from tests.fakes.tpu_errors import (
    RESOURCE_EXHAUSTED_CODE,
    already_exists,
    failed_precondition,
    invalid,
    not_found,
)
from tests.fakes.tpu_nodes import TpuNodesMixin, check_node_id
from tests.fakes.tpu_operations import EMPTY, TYPE_ROOT, now, page
from tests.fakes.tpu_state import Outcome

DURATION_RE = re.compile(r"(\d+(?:\.\d{1,9})?)s")


def _valid_for(policy: Any) -> float | None:
    """The seconds of `queueingPolicy.validUntilDuration` (a google.protobuf.Duration in JSON:
    `"120s"`), or None; 400 for another queueing policy or a malformed duration."""
    if not policy:
        return None
    if not isinstance(policy, dict) or set(policy) != {"validUntilDuration"}:
        raise invalid("The TPU fake serves queueing_policy.valid_until_duration only.")
    match = DURATION_RE.fullmatch(str(policy["validUntilDuration"]))
    if match is None:
        raise invalid(f"Invalid duration: '{policy['validUntilDuration']}'.")
    return float(match[1])


class TpuQueuedMixin(TpuNodesMixin):
    """The `projects/{p}/locations/{zone}/queuedResources` routes and their state machine."""

    def _queued_name(self, project: str, zone: str, queued_id: str) -> str:
        return f"projects/{project}/locations/{zone}/queuedResources/{queued_id}"

    def _create_queued(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        project, zone = params["project"], params["zone"]
        queued_id = query.get("queuedResourceId", "")
        check_node_id(queued_id, "queued_resource_id")
        name = self._queued_name(project, zone, queued_id)
        if (project, zone, queued_id) in self._state.queued:
            raise already_exists(name)
        if not isinstance(body, dict):
            raise invalid("Required field 'queued_resource' not specified.")
        if "spot" in body and "guaranteed" in body:
            raise invalid("Only one of spot and guaranteed may be set.")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if len(specs) != 1 or not isinstance(specs[0], dict) or specs[0].get("multisliceParams"):
            raise invalid("The TPU fake serves queued resources of exactly one node_spec.")
        spec = specs[0]
        parent = f"projects/{project}/locations/{zone}"
        if spec.get("parent") != parent:
            raise invalid(f"node_spec.parent must be '{parent}', not '{spec.get('parent')}'.")
        node_id = str(spec.get("nodeId") or "")
        check_node_id(node_id, "node_spec.node_id")
        if (project, zone, node_id) in self._state.nodes:
            raise already_exists(self._node_name(project, zone, node_id))
        node = self.validate_node(project, zone, spec.get("node"))
        if "spot" in body:
            node["schedulingConfig"]["spot"] = True
        lapse = _valid_for(body.get("queueingPolicy"))
        queued = copy.deepcopy(body)
        queued.update(name=name, createTime=now(), state={"state": "ACCEPTED"})
        if lapse is not None:
            self._state.queued_deadlines[name] = time.time() + lapse
        queued["tpu"]["nodeSpec"][0]["node"] = node
        self._state.queued[(project, zone, queued_id)] = queued

        def finish() -> Outcome:
            current = self._state.queued.get((project, zone, queued_id), queued)
            return "response", {"@type": f"{TYPE_ROOT}.QueuedResource", **copy.deepcopy(current)}

        return self._new_operation(project, zone, "create", name, finish)

    def _step(self, key: tuple[str, str, str], queued: dict[str, Any]) -> None:
        """One step of time for a queued request (see the module docstring)."""
        project, zone, _ = key
        state = queued["state"]["state"]
        spec = queued["tpu"]["nodeSpec"][0]
        node_key = (project, zone, spec["nodeId"])
        if state in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
            node = copy.deepcopy(spec["node"])
            refusal = self._quota_refusal(project, zone, node)
            if time.time() > self._state.queued_deadlines.get(queued["name"], math.inf):
                error = {"code": 4, "message": "The valid_until time has passed.", "details": []}
                queued["state"] = {"state": "FAILED", "failedData": {"error": error}}
            elif refusal is not None:
                error = {"code": RESOURCE_EXHAUSTED_CODE, "message": str(refusal), "details": []}
                queued["state"] = {"state": "FAILED", "failedData": {"error": error}}
            elif self._sold_out(zone, bool(node["schedulingConfig"].get("spot"))):
                queued["state"] = {"state": "WAITING_FOR_RESOURCES"}
            elif node_key in self._state.nodes:
                name = self._node_name(*node_key)
                error = {"code": 6, "message": f"Resource '{name}' already exists", "details": []}
                queued["state"] = {"state": "FAILED", "failedData": {"error": error}}
            else:
                self._store_node(project, zone, spec["nodeId"], node, queued["name"])
                queued["state"] = {"state": "PROVISIONING", "provisioningData": {}}
        elif state == "PROVISIONING":
            node = self._state.nodes.get(node_key)
            if node is not None and node["state"] == "CREATING":
                node.update(state="READY", health="HEALTHY")
            queued["state"] = {"state": "ACTIVE", "activeData": {}}

    def _queued(self, params: dict[str, str]) -> tuple[tuple[str, str, str], dict[str, Any]]:
        key = (params["project"], params["zone"], params["queued"])
        queued = self._state.queued.get(key)
        if queued is None:
            raise not_found(self._queued_name(*key))
        return key, queued

    def _get_queued(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        key, queued = self._queued(params)
        self._step(key, queued)
        self._tick_target(queued["name"])
        return copy.deepcopy(queued)

    def _list_queued(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        project, zone = params["project"], params["zone"]
        items = []
        for key, queued in sorted(self._state.queued.items()):
            if key[:2] == (project, zone):
                self._step(key, queued)
                items.append(queued)
        return page(items, query, "queuedResources")

    def _delete_queued(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        key, queued = self._queued(params)
        node_key = (key[0], key[1], queued["tpu"]["nodeSpec"][0]["nodeId"])
        node = self._state.nodes.get(node_key)
        owned = node is not None and node.get("queuedResource") == queued["name"]
        force = query.get("force", "").lower() == "true"
        if owned and not force:
            raise failed_precondition(
                f"Queued resource {queued['name']} still has node {node_key[2]}: delete the node "
                "first, or delete the queued resource with force."
            )
        if queued["state"]["state"] == "DELETING":
            raise failed_precondition(f"Queued resource {queued['name']} is already DELETING.")
        queued["state"] = {"state": "DELETING", "deletingData": {}}
        if owned and node is not None:
            node["state"] = "DELETING"

        def finish() -> Outcome:
            if owned:
                current = self._state.nodes.get(node_key)
                if current is not None and current.get("queuedResource") == queued["name"]:
                    del self._state.nodes[node_key]
            if self._state.queued.get(key) is queued:
                del self._state.queued[key]
            return "response", dict(EMPTY)

        return self._new_operation(key[0], key[1], "delete", queued["name"], finish)

    def _node_gone(self, node: dict[str, Any]) -> None:
        """A node deleted by the user: its queued request (if any) is SUSPENDED."""
        self._suspend(node, "USER")

    def _suspend(self, node: dict[str, Any], initiator: str) -> None:
        for queued in self._state.queued.values():
            live = queued["state"]["state"] in ("PROVISIONING", "ACTIVE")
            if live and queued["name"] == node.get("queuedResource"):
                queued["state"] = {
                    "state": "SUSPENDED",
                    "suspendedData": {},
                    "stateInitiator": initiator,
                }
