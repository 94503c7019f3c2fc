"""Cloud TPU VM bodies and listings for cloudtrain, as pure functions (TPU API v2).

A TPU node is one TPU VM made by the TPU API (`tpu.googleapis.com` v2, `projects.locations.nodes`;
shapes from google-cloud-tpu's `tpu_v2.types.Node` and the API's discovery document,
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes). Its node id is the
node's name (`ct-<run>-<role>-<index>`, the create's idempotency key in its zone), it carries the
run's labels like a GCE instance (so `list_nodes`, `down` and `gc` find it) and the run's network
tag (so the run's firewall rules apply: `Node.tags` are "used to identify valid sources or targets
for network firewalls"), runs as the node's own service account and boots the same rendered
`startup-script` metadata as a GCE node.

A spot node is asked for through a queued resource (`projects.locations.queuedResources`) named as
the node, with the `spot` tier and one nodeSpec: Google recommends queued resources to get spot and
scarce TPU capacity ("Manage queued resources",
https://cloud.google.com/tpu/docs/queued-resources, and "Spot VMs",
https://cloud.google.com/tpu/docs/spot). The queued resource is part of its node: the node's ledger
row (recorded before either create) names both, `to_node` reports a queued resource that has no VM
yet as a pending node, and deleting the node deletes both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import Node, NodeRequest, NodeState
from cloudtrain.providers.gcp.bodies import (
    METADATA_VALUE_MAX,
    STORAGE_RW_SCOPE,
    labelled,
    labels,
)

# the QueuedResource field holding its node specs (tpu.v2 discovery document: QueuedResource.tpu)
TPU_FIELD = "tpu"

# tpu_v2.types.Node.State -> the project's node states. PREEMPTED: "TPU node has been preempted.
# Only applies to Preemptible TPU Nodes"; TERMINATED: "terminated due to maintenance or has
# reached the end of its life cycle (for preemptible nodes)" (google-cloud-tpu, cloud_tpu.py).
STATES: dict[str, NodeState] = {
    "CREATING": "pending",
    "READY": "running",
    "RESTARTING": "pending",
    "REIMAGING": "pending",
    "REPAIRING": "pending",
    "STARTING": "pending",
    "STOPPING": "stopped",
    "STOPPED": "stopped",
    "DELETING": "terminated",
    "PREEMPTED": "preempted",
    "TERMINATED": "terminated",
    "HIDING": "stopped",
    "HIDDEN": "stopped",
    "UNHIDING": "pending",
}
# tpu_v2.types.QueuedResourceState.State: a queued resource without its VM yet is a pending node
# while it may still become one, and a lost one (preempted) when its VM was taken back
QUEUED_PENDING = frozenset(
    {"CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES", "ACTIVE"}
)
QUEUED_WAITING = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"})
QUEUED_LOST: dict[str, NodeState] = {
    "FAILED": "terminated",
    "DELETING": "terminated",
    # "being deleted ... initiated by the user, or the Cloud TPU service"
    "SUSPENDING": "preempted",
    "SUSPENDED": "preempted",
}


def location(project: str, zone: str) -> str:
    """A TPU API location (a zone): `projects/P/locations/ZONE`. Pure."""
    return f"projects/{project}/locations/{zone}"


def node_body(
    request: NodeRequest,
    runtime: str,
    network: str,
    tag: str,
    service_account: str,
) -> dict[str, Any]:
    """The `nodes.create` body (the TPU API's camelCase JSON) of one TPU VM: its accelerator type
    (the request's instance type), runtime version, labels, network tag, network (external IPs
    for egress, as the GCE nodes have; the firewall admits nothing else), service account with
    the storage read-write scope, and `startup-script` metadata. Raises ProviderError for a
    startup script over GCE's 256 KiB metadata value limit. Pure."""
    if len(request.startup_script.encode()) > METADATA_VALUE_MAX:
        raise ProviderError(
            f"the startup script of {request.name} is over GCE's 256 KiB metadata limit",
            hint="keep job env values short; large files belong in the bundle",
        )
    return {
        "acceleratorType": request.instance_type,
        "runtimeVersion": runtime,
        "labels": labels(request),
        "tags": [tag],
        "metadata": {"startup-script": request.startup_script},
        "networkConfig": {"network": network, "enableExternalIps": True},
        "serviceAccount": {"email": service_account, "scope": [STORAGE_RW_SCOPE]},
    }


def queued_body(
    project: str, zone: str, name: str, node: Mapping[str, Any], valid_s: float
) -> dict[str, Any]:
    """The `queuedResources.create` body of a spot node: the spot tier, one nodeSpec whose node id
    is the node's name, and a queueing policy that lets the request lapse after `valid_s`
    seconds (the API's `validUntilDuration`), so a request cloudtrain gave up on is never
    fulfilled later. Pure."""
    return {
        TPU_FIELD: {
            "nodeSpec": [
                {"parent": location(project, zone), "nodeId": name, "node": dict(node)},
            ]
        },
        "spot": {},
        "queueingPolicy": {"validUntilDuration": f"{max(1, math.ceil(valid_s))}s"},
    }


def last(path: str | None) -> str:
    """The last segment of a resource name (`projects/P/locations/Z/nodes/N` -> N). Pure."""
    return str(path or "").rstrip("/").rsplit("/", 1)[-1]


def zone_of(path: str | None) -> str | None:
    """The zone of a TPU resource name (`projects/P/locations/ZONE/...`), or None. Pure."""
    parts = str(path or "").split("/")
    return parts[3] if len(parts) > 3 and parts[2] == "locations" else None


def to_node(data: Mapping[str, Any]) -> Node | None:
    """A Node from a listed TPU VM (the API's JSON), or None when its name and labels do not make
    it a cloudtrain node. Its instance type is the accelerator type. Pure."""
    name = last(data.get("name"))
    known = labelled(name, dict(data.get("labels") or {}))
    if known is None:
        return None
    endpoint = (data.get("networkEndpoints") or [{}])[0]
    access = endpoint.get("accessConfig") or {}
    scheduling = data.get("schedulingConfig") or {}
    return Node(
        name=name,
        run_id=known[0],
        role=known[1],
        index=known[2],
        state=STATES.get(str(data.get("state") or ""), "terminated"),
        private_ip=endpoint.get("ipAddress") or None,
        public_ip=access.get("externalIp") or None,
        # cloudtrain asks for a queued resource only for spot nodes
        spot=bool(
            scheduling.get("spot") or scheduling.get("preemptible") or data.get("queuedResource")
        ),
        zone=zone_of(data.get("name")),
        instance_type=str(data.get("acceleratorType") or "") or None,
        cloud_id=str(data["id"]) if data.get("id") else None,
    )


def queued_state(data: Mapping[str, Any]) -> str:
    """A queued resource's state (`state.state`), or "" when it says none. Pure."""
    return str((data.get("state") or {}).get("state") or "")


def queued_node(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node of a queued resource's (first) nodeSpec, or {}. Pure."""
    specs = (data.get(TPU_FIELD) or {}).get("nodeSpec") or [{}]
    return specs[0].get("node") or {}


def queued_to_node(data: Mapping[str, Any]) -> Node | None:
    """The pending (or lost) node a queued resource stands for while it has no TPU VM, or None
    when it is not cloudtrain's (its name and its nodeSpec's labels). Pure."""
    name = last(data.get("name"))
    node = queued_node(data)
    state = queued_state(data)
    listed = to_node({**node, "name": data.get("name"), "state": "CREATING"})
    if listed is None or listed.name != name:
        return None
    lost = QUEUED_LOST.get(state)
    if lost is None and state not in QUEUED_PENDING:
        lost = "terminated"
    return Node(
        name=listed.name,
        run_id=listed.run_id,
        role=listed.role,
        index=listed.index,
        state=lost or "pending",
        spot="spot" in data,
        zone=zone_of(data.get("name")),
        instance_type=listed.instance_type,
    )


def queued_error(data: Mapping[str, Any]) -> tuple[int, str]:
    """A FAILED queued resource's error (`state.failedData.error`: google.rpc.Status) as (code,
    message); (0, "") when it reports none. Pure."""
    error = ((data.get("state") or {}).get("failedData") or {}).get("error") or {}
    return int(error.get("code") or 0), str(error.get("message") or "")


# Bash for a TPU VM's bootstrap, before the agent starts (StartupBlocks.metadata): what
# TensorFlow's TPUClusterResolver(tpu="local") needs there. Google's TensorFlow tutorials on TPU VMs
# export TPU_NAME=local, and on a `-pjrt` runtime (TF >= 2.15) point TensorFlow at the TPU's PJRT
# plugin with NEXT_PLUGGABLE_DEVICE_USE_C_API=true and TF_PLUGGABLE_DEVICE_LIBRARY_PATH=
# /lib/libtpu.so ("Cloud TPU runtimes: PJRT", https://cloud.google.com/tpu/docs/runtimes, and the
# TF 2.x tutorials, e.g. https://cloud.google.com/tpu/docs/tutorials/resnet-2.x). TensorFlow's
# import fails when that path is missing (FileNotFoundError from load_pluggable_device_library,
# seen with TF 2.21 here), so it is set only where the library is.
TPU_ENV_SH = """
# a Cloud TPU VM: what TPUClusterResolver(tpu="local") needs
export TPU_NAME=local
case "$CT_TPU_RUNTIME" in
  *-pjrt*)
    if [ -e /lib/libtpu.so ]; then
      export NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so
    else
      phase "WARNING: no /lib/libtpu.so on this TPU VM ($CT_TPU_RUNTIME): TensorFlow sees no TPU"
    fi
    ;;
esac"""


def node_env(runtime: str, tensorflow: str) -> dict[str, str]:
    """The environment a TPU VM's bootstrap and agent get: the runtime version and the
    TensorFlow it ships (the bootstrap then uses the image's TensorFlow, never installing the GPU
    nodes' pinned one; jobs/startup.sh.j2 `image_stack`). Its GPU count is 0 by the strategy's
    device (cloudtrain/run/provisioning.py), not by this environment. Pure."""
    return {"CT_TPU_RUNTIME": runtime, "CT_TF_FROM_IMAGE": tensorflow}
