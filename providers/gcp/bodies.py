"""Compute Engine instance bodies and listings for cloudtrain, as pure functions.

`instance_body()` is the whole `instances.insert` request body (GCE's camelCase JSON) for one
node: machine type, GPUs (attached on n1, built in on a2/a3/g2), scheduling (TERMINATE on host
maintenance, spot, and `maxRunDuration` with DELETE as the node-side dead-man switch), labels,
the run's network tag, the `startup-script` metadata, the boot disk image (`images.image_for`),
and the VM's service account with the storage read-write scope. `to_node()` reads a listed
instance back.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import (
    Node,
    NodeRequest,
    NodeState,
    parse_node_name,
    run_labels,
)
from cloudtrain.providers.gcp.images import image_for

STORAGE_RW_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
DEFAULT_SERVICE_ACCOUNT = "default"  # the project's Compute Engine default service account
DISK_TYPE = "pd-balanced"
DEADLINE_GRACE_S = 600  # maxRunDuration outlives the controller's own deadline by this much
MIN_RUN_DURATION_S = 30  # GCE's minimum maxRunDuration
METADATA_VALUE_MAX = 256 * 1024  # GCE's limit on one metadata value

# catalog accelerator name -> GCE accelerator type (attached to n1 machine types)
ACCELERATOR_TYPES = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
}
BUILT_IN_GPU_FAMILIES = ("a2-", "a3-", "g2-")  # machine types whose GPUs come with the machine
STATES: dict[str, NodeState] = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "RUNNING": "running",
    "REPAIRING": "pending",
    "STOPPING": "stopped",
    "SUSPENDING": "stopped",
    "SUSPENDED": "stopped",
    "TERMINATED": "stopped",  # GCE's TERMINATED is a stopped VM: its disks remain
}
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def has_built_in_gpus(machine_type: str) -> bool:
    """Whether the machine type's GPUs come with it (a2, a3, g2). Pure."""
    return machine_type.startswith(BUILT_IN_GPU_FAMILIES)


def guest_accelerators(request: NodeRequest, zone: str) -> list[dict[str, Any]]:
    """The `guestAccelerators` of a node: GPUs attached to an n1 machine type, none for a
    machine type with built-in GPUs. Raises ProviderError for a GPU GCE does not attach to
    that machine type. Pure."""
    if request.accelerator_count <= 0 or has_built_in_gpus(request.instance_type):
        return []
    if not request.instance_type.startswith("n1-"):
        raise ProviderError(
            f"{request.accelerator} GPUs attach to n1 machine types only, not "
            f"{request.instance_type}",
            hint="drop instance_type: from job.yaml to let the planner pick one",
        )
    gce_type = ACCELERATOR_TYPES.get(str(request.accelerator))
    if gce_type is None:
        raise ProviderError(
            f"GPU {request.accelerator!r} cannot be attached to an n1 machine on GCP",
            hint=f"attachable GPUs: {', '.join(ACCELERATOR_TYPES)}",
        )
    return [
        {
            "acceleratorType": f"zones/{zone}/acceleratorTypes/{gce_type}",
            "acceleratorCount": request.accelerator_count,
        }
    ]


def has_gpus(request: NodeRequest) -> bool:
    """Whether the node has GPUs (attached or built in). Pure."""
    return request.accelerator_count > 0 or has_built_in_gpus(request.instance_type)


def scheduling(request: NodeRequest, run_seconds: float | None) -> dict[str, Any]:
    """GPU nodes terminate on host maintenance (GCE cannot live-migrate them) and no node
    restarts by itself (a node the cloud stopped is replaced by the controller). Spot nodes are
    SPOT and deleted when reclaimed; `run_seconds` becomes `maxRunDuration` (DELETE), the
    node-side dead-man switch. Pure."""
    body: dict[str, Any] = {
        "onHostMaintenance": "TERMINATE" if has_gpus(request) or request.spot else "MIGRATE",
        "automaticRestart": False,
    }
    if request.spot:
        body["provisioningModel"] = "SPOT"
        body["instanceTerminationAction"] = "DELETE"
    if run_seconds is not None:
        seconds = max(MIN_RUN_DURATION_S, math.ceil(run_seconds))
        body["maxRunDuration"] = {"seconds": str(seconds)}
        body["instanceTerminationAction"] = "DELETE"
    return body


def labels(request: NodeRequest) -> dict[str, str]:
    """The node's labels: the run, role and index, plus the request's own labels that are valid
    GCE labels (others are dropped rather than failing the create). Pure."""
    extra = {
        k: v
        for k, v in request.labels.items()
        if _LABEL_KEY.match(k) and _LABEL_VALUE.match(v) and not k.startswith("cloudtrain-")
    }
    return {**extra, **run_labels(request.run_id, request.role, request.index)}


CONTROLLER_ROLE = "controller"  # the run's controller node (issue 17)


def instance_body(
    request: NodeRequest,
    project: str,
    zone: str,
    network: str,
    tag: str,
    run_seconds: float | None,
    service_account: str = DEFAULT_SERVICE_ACCOUNT,
) -> dict[str, Any]:
    """The `instances.insert` body of one node (see the module docstring). Raises
    ProviderError for an unknown image, a GPU that does not fit the machine type, or a startup
    script over GCE's 256 KiB metadata limit. The controller node (role `controller`) is never
    spot and boots the default CPU image without accelerators, whatever the request says. Pure."""
    if request.role == CONTROLLER_ROLE:
        request = dataclasses.replace(
            request, spot=False, accelerator=None, accelerator_count=0, image=None
        )
    image = image_for(request.accelerator, has_gpus(request), request.image)
    if len(request.startup_script.encode()) > METADATA_VALUE_MAX:
        raise ProviderError(
            f"the startup script of {request.name} is over GCE's 256 KiB metadata limit",
            hint="keep job env values short; large files belong in the bundle",
        )
    metadata = [{"key": "startup-script", "value": request.startup_script}]
    if image.driver_by == "first-boot" and has_gpus(request):
        metadata.append({"key": "install-nvidia-driver", "value": "True"})
    body: dict[str, Any] = {
        "name": request.name,
        "machineType": f"zones/{zone}/machineTypes/{request.instance_type}",
        "labels": labels(request),
        "tags": {"items": [tag]},
        "metadata": {"items": metadata},
        "scheduling": scheduling(request, run_seconds),
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": image.ref,
                    "diskSizeGb": str(request.disk_gb),
                    "diskType": f"zones/{zone}/diskTypes/{DISK_TYPE}",
                    "labels": run_labels(request.run_id, request.role, request.index),
                },
            }
        ],
        "networkInterfaces": [
            {
                "network": network,
                # an external address for egress (packages, GCS); the firewall admits nothing
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
            }
        ],
        "serviceAccounts": [{"email": service_account, "scopes": [STORAGE_RW_SCOPE]}],
    }
    accelerators = guest_accelerators(request, zone)
    if accelerators:
        body["guestAccelerators"] = accelerators
    return body


def _last(url: str | None) -> str | None:
    return url.rstrip("/").rsplit("/", 1)[-1] if url else None


def labelled(name: str, tags: Mapping[str, str]) -> tuple[str, str, int] | None:
    """(run, role, index) of a VM (a GCE instance or a TPU VM) whose name and labels make it a
    cloudtrain node, the labels first; None otherwise. Pure."""
    parsed = parse_node_name(name)
    if parsed is None or "cloudtrain-run" not in tags:
        return None
    try:
        index = int(tags.get("cloudtrain-index", parsed[2]))
    except ValueError:
        index = parsed[2]
    return tags["cloudtrain-run"], tags.get("cloudtrain-role", parsed[1]), index


def to_node(instance: Mapping[str, Any]) -> Node | None:
    """A Node from a listed instance (GCE's JSON), or None when its name and labels do not make
    it a cloudtrain node. Pure."""
    name = str(instance.get("name") or "")
    known = labelled(name, dict(instance.get("labels") or {}))
    if known is None:
        return None
    nic = (instance.get("networkInterfaces") or [{}])[0]
    access = (nic.get("accessConfigs") or [{}])[0]
    spot = (instance.get("scheduling") or {}).get("provisioningModel") == "SPOT"
    return Node(
        name=name,
        run_id=known[0],
        role=known[1],
        index=known[2],
        state=STATES.get(str(instance.get("status") or ""), "terminated"),
        private_ip=nic.get("networkIP") or None,
        public_ip=access.get("natIP") or None,
        spot=spot,
        zone=_last(instance.get("zone")),
        instance_type=_last(instance.get("machineType")),
        cloud_id=str(instance["id"]) if instance.get("id") else None,
    )
