"""The box caller's TPU rights, the TPU API's enablement, quotas and capacity: `TpuAccessMixin`.

Rights and services are the GCE fake's (one caller, one project policy: `AccountRules.denied`
and `.disabled` of tests/fakes/gce_state.py), so Resource Manager's `testIamPermissions` and
Service Usage's `services.get` that the GCE fake serves answer what the TPU fake enforces.
Each route needs the permission Cloud TPU's IAM reference names for it
(docs.cloud.google.com/iam/docs/roles-permissions/tpu: tpu.nodes.create/get/list/delete/start/
stop, tpu.operations.get/list, tpu.acceleratortypes.get/list, tpu.runtimeversions.get/list;
queued resources: tpu.queuedResources.create/get/list/delete); a create naming a service
account needs iam.serviceAccounts.actAs on it too (the TPU VM runs as it). A denied one is
403 PERMISSION_DENIED naming it; a disabled `tpu.googleapis.com` refuses every call with 403
SERVICE_DISABLED (tpu_errors).

Quota: a node counts its accelerator type's size (TensorCores or chips, tpu_catalog) against
its region's limit for its generation, the Preemptible limit for a spot or preemptible node;
usage is every node of the project not PREEMPTED, STOPPED or TERMINATED, plus scripted extra
usage. A direct create over the limit is refused at once, 429 RESOURCE_EXHAUSTED (a real
TPU create's refusal, marin-community/marin#1612). Limits are generous until a test scripts
them (tests/fakes/tpu_account.py).

Capacity: a sold-out zone fails a direct create's operation with code 8 "There is no more
capacity in the zone" (tpu_errors.no_capacity), and keeps a queued resource in
WAITING_FOR_RESOURCES ("It will remain in this state until there are sufficient free resources
to begin provisioning": QueuedResourceState.State, google-cloud-tpu
tpu_v2/types/cloud_tpu.py). Methods run under the fake's lock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.fakes.tpu_catalog import ACCELERATOR_TYPES, quota_limit_name
from tests.fakes.tpu_errors import (
    TPU_API,
    permission_denied,
    quota_exceeded,
    service_disabled,
)

if TYPE_CHECKING:
    from tests.fakes.gce_state import AccountRules
    from tests.fakes.tpu_state import TpuState

EVERY = "*"
DEFAULT_LIMIT = 100_000.0
ACTION_PERMISSIONS: dict[str, str] = {
    "create_node": "tpu.nodes.create",
    "get_node": "tpu.nodes.get",
    "list_nodes": "tpu.nodes.list",
    "delete_node": "tpu.nodes.delete",
    "stop_node": "tpu.nodes.stop",
    "start_node": "tpu.nodes.start",
    "get_operation": "tpu.operations.get",
    "list_operations": "tpu.operations.list",
    "create_queued": "tpu.queuedResources.create",
    "get_queued": "tpu.queuedResources.get",
    "list_queued": "tpu.queuedResources.list",
    "delete_queued": "tpu.queuedResources.delete",
    "get_accelerator_type": "tpu.acceleratortypes.get",
    "list_accelerator_types": "tpu.acceleratortypes.list",
    "get_runtime_version": "tpu.runtimeversions.get",
    "list_runtime_versions": "tpu.runtimeversions.list",
}
ACT_AS = "iam.serviceAccounts.actAs"
TPU_ENFORCED = frozenset({*ACTION_PERMISSIONS.values(), ACT_AS})
IDLE_STATES = ("PREEMPTED", "STOPPED", "TERMINATED")


def region_of(zone: str) -> str:
    """`us-west4` for `us-west4-a`. Pure."""
    return zone.rsplit("-", 1)[0]


def is_spot(node: dict[str, Any]) -> bool:
    """Whether a node body is spot or preemptible. Pure."""
    scheduling = node.get("schedulingConfig") or {}
    return bool(scheduling.get("spot") or scheduling.get("preemptible"))


def _names_account(action: str, body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    if action == "create_queued":
        specs = ((body.get("tpu") or {}).get("nodeSpec")) or []
        nodes = [s.get("node") or {} for s in specs if isinstance(s, dict)]
    else:
        nodes = [body] if action == "create_node" else []
    return any((n.get("serviceAccount") or {}).get("email") for n in nodes)


class TpuAccessMixin:
    """The caller's rights, the API's state, quotas and capacity."""

    _state: TpuState
    _rules_gcp: AccountRules

    def _check_access(self, action: str, params: dict[str, str], body: Any) -> None:
        """Refuse as Google does when the TPU API is disabled or a needed permission is denied."""
        project = params.get("project", "")
        if TPU_API in self._rules_gcp.disabled:
            raise service_disabled(project)
        needed = [ACTION_PERMISSIONS[action]]
        if action in ("create_node", "create_queued") and _names_account(action, body):
            needed.append(ACT_AS)
        for permission in needed:
            if permission in self._rules_gcp.denied:
                raise permission_denied(permission, _resource(action, params))

    def _limit(self, region: str, generation: str, spot: bool) -> float:
        limits = self._state.rules.limits
        for key in ((region, generation, spot), (EVERY, generation, spot)):
            if key in limits:
                return limits[key]
        return DEFAULT_LIMIT

    def _tpu_usage(self, project: str) -> dict[tuple[str, str, bool], float]:
        used = dict(self._state.rules.extra_usage)
        for (p, zone, _), node in self._state.nodes.items():
            accel = ACCELERATOR_TYPES.get(str(node.get("acceleratorType")))
            if p != project or accel is None or node.get("state") in IDLE_STATES:
                continue
            key = (region_of(zone), accel.generation, is_spot(node))
            used[key] = used.get(key, 0.0) + accel.size
        return used

    def _quota_refusal(self, project: str, zone: str, node: dict[str, Any]) -> Exception | None:
        """The 429 a create of `node` (a validated body) gets over its quota, else None."""
        accel = ACCELERATOR_TYPES[str(node["acceleratorType"])]
        spot, region = is_spot(node), region_of(zone)
        limit = self._limit(region, accel.generation, spot)
        used = self._tpu_usage(project).get((region, accel.generation, spot), 0.0)
        if used + accel.size > limit:
            return quota_exceeded(quota_limit_name(accel.generation, spot), limit, region)
        return None

    def _sold_out(self, zone: str, spot: bool) -> bool:
        sold = self._state.rules.sold_out
        return any(where in sold and (spot or not sold[where]) for where in (zone, EVERY))


def _resource(action: str, params: dict[str, str]) -> str:
    base = f"projects/{params.get('project', '')}/locations/{params.get('zone', '')}"
    for key, collection in (("node", "nodes"), ("queued", "queuedResources")):
        if key in params:
            return f"{base}/{collection}/{params[key]}"
    return base
