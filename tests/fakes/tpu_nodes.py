"""Node routes of the TPU API fake: `TpuNodesMixin` (and the checks a node body gets).

`projects.locations.nodes` of the TPU API v2 (discovery document tpu.v2.json, revision
20261001, in google-api-python-client 2.202.0 `googleapiclient/discovery_cache/documents/`):
create (`nodeId` query parameter, body `Node`), get, list (`pageSize`, `pageToken`), delete,
stop, start; each change answers an operation (tpu_operations).

`validate_node()` refuses with 400 INVALID_ARGUMENT what the API refuses: a node id that is not
an RFC 1035 label of at most 63 characters (the Compute Engine name rule the TPU VM's instance
takes), both or neither of `acceleratorType` and `acceleratorConfig` ("mutually exclusive"), an
accelerator type or config the zone does not sell (tpu_catalog), a runtime version the zone
does not offer, labels, metadata and tags outside Compute Engine's formats (gce_formats: a TPU
VM is a Compute Engine VM), a network or subnetwork the project lacks (`NetworkConfig.network`:
"It must be a preexisting Google Compute Engine network. If none is provided, "default" will be
used"), and a service account the box's IAM does not hold (`ServiceAccount.email`: "If empty,
default Compute service account will be used").

A created node is CREATING until its operation is done, then READY (`health` HEALTHY, one
`networkEndpoints` entry per host with its internal IP, port 8470, and an external IP when
`enableExternalIps`); the operation fails (code 8, no capacity) and the node vanishes when its
zone is sold out. A delete leaves it DELETING until done; stop: STOPPING then STOPPED; start:
STARTING then READY. Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.fakes.gce_formats import (
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    MAX_LABELS,
    MAX_METADATA_VALUE,
    METADATA_KEY_RE,
    NAME_RE,
)
from tests.fakes.gce_instances import default_service_account
from tests.fakes.tpu_access import TpuAccessMixin, is_spot, region_of
from tests.fakes.tpu_catalog import (
    ACCELERATOR_TYPES,
    config_type_name,
    runtime_fits,
    runtimes_in_zone,
    type_for_config,
)
from tests.fakes.tpu_errors import (
    already_exists,
    failed_precondition,
    invalid,
    no_capacity,
    not_found,
)
from tests.fakes.tpu_operations import EMPTY, TYPE_ROOT, TpuOperationsMixin, now, page
from tests.fakes.tpu_state import Outcome

NETWORK_RE = re.compile(
    r"(?:(?:https://www\.googleapis\.com/compute/v1/)?projects/(?P<project>[^/]+)/global/networks/)?"
    r"(?P<name>[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"
)
SUBNET_RE = re.compile(r"(?:projects/[^/]+/regions/(?P<region>[^/]+)/subnetworks/)?(?P<name>[^/]+)")
TPU_PORT = 8470  # NetworkEndpoint.port of a TPU worker (TPUClusterResolver's default)


def _field(name: str, value: Any, why: str) -> Exception:
    return invalid(f"Invalid value for field '{name}': '{value}'. {why}")


def check_node_id(node_id: str, what: str = "node_id") -> None:
    """400 unless `node_id` is an RFC 1035 label (1-63 lowercase letters, digits, '-')."""
    if not NAME_RE.fullmatch(node_id or ""):
        raise _field(what, node_id, f"Must be a match of regex '{NAME_RE.pattern}'.")


def _check_formats(node: dict[str, Any]) -> None:
    labels = node.get("labels") or {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise _field("node.labels", "", f"At most {MAX_LABELS} labels.")
    for key, value in labels.items():
        if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(str(value)):
            raise _field("node.labels", f"{key}={value}", "Label violates format constraints.")
    metadata = node.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _field("node.metadata", metadata, "Must be a map of strings.")
    for key, value in metadata.items():
        if not METADATA_KEY_RE.fullmatch(key):
            raise _field("node.metadata", key, "Invalid metadata key.")
        if len(str(value).encode()) > MAX_METADATA_VALUE:
            raise _field("node.metadata", key, "Metadata value exceeds 256 KB.")
    for index, tag in enumerate(node.get("tags") or []):
        if not NAME_RE.fullmatch(str(tag)):
            raise _field(f"node.tags[{index}]", tag, f"Must match '{NAME_RE.pattern}'.")
    if len(str(node.get("description") or "")) > 512:
        raise _field("node.description", "", "At most 512 characters.")


class TpuNodesMixin(TpuAccessMixin, TpuOperationsMixin):
    """The `projects/{p}/locations/{zone}/nodes` routes and the node checks."""

    _gce: Any  # the GCE fake whose IAM holds the project's service accounts

    def _node_name(self, project: str, zone: str, node_id: str) -> str:
        return f"projects/{project}/locations/{zone}/nodes/{node_id}"

    def _accelerator(self, zone: str, node: dict[str, Any]) -> str:
        """The node's accelerator type name, checked against what `zone` sells."""
        given, config = node.get("acceleratorType"), node.get("acceleratorConfig")
        if bool(given) == bool(config):
            raise invalid("Exactly one of accelerator_type and accelerator_config must be set.")
        if config:
            kind = config_type_name(config.get("type"))
            accel = type_for_config(kind or "", str(config.get("topology") or ""))
            if accel is None:
                raise _field("node.accelerator_config", config, "Unknown type or topology.")
        else:
            accel = ACCELERATOR_TYPES.get(str(given))
        if accel is None or zone not in accel.zones:
            raise invalid(f"Accelerator type '{given or config}' is not available in zone {zone}.")
        return accel.name

    def _check_network(self, project: str, zone: str, node: dict[str, Any]) -> dict[str, Any]:
        net = copy.deepcopy(node.get("networkConfig") or {})
        match = NETWORK_RE.fullmatch(str(net.get("network") or "default"))
        if match is None or match["project"] not in (None, project):
            raise _field("node.network_config.network", net.get("network"), "Malformed name.")
        name = match["name"]
        if name != "default" and (project, name) not in self._state.networks:
            raise invalid(f"Network 'projects/{project}/global/networks/{name}' does not exist.")
        sub = SUBNET_RE.fullmatch(str(net.get("subnetwork") or name))
        wrong_region = sub is not None and sub["region"] not in (None, region_of(zone))
        if sub is None or sub["name"] != name or wrong_region:  # auto mode: one per region
            raise invalid(f"Subnetwork '{net.get('subnetwork')}' does not exist in network {name}.")
        net["network"] = f"projects/{project}/global/networks/{name}"
        net["subnetwork"] = f"projects/{project}/regions/{region_of(zone)}/subnetworks/{name}"
        net.setdefault("enableExternalIps", False)
        return net

    def _check_account(self, project: str, node: dict[str, Any]) -> dict[str, Any]:
        account = copy.deepcopy(node.get("serviceAccount") or {})
        email = str(account.get("email") or "")
        known = {e for (_, e) in self._gce._state.service_accounts}
        if email and email != default_service_account(project) and email not in known:
            raise invalid(f"Service account {email} does not exist.")
        account["email"] = email or default_service_account(project)
        account.setdefault("scope", ["https://www.googleapis.com/auth/cloud-platform"])
        return account

    def validate_node(self, project: str, zone: str, node: Any) -> dict[str, Any]:
        """The stored form of create body `node` (defaults filled), or TpuApiError(400)."""
        if not isinstance(node, dict):
            raise invalid("Required field 'node' not specified.")
        accel = self._accelerator(zone, node)
        runtime = str(node.get("runtimeVersion") or "")
        if runtime not in runtimes_in_zone(zone):
            raise invalid(f"Runtime version '{runtime}' is not available in zone {zone}.")
        if not runtime_fits(runtime, ACCELERATOR_TYPES[accel].generation):
            raise invalid(f"Runtime version '{runtime}' does not support accelerator type {accel}.")
        scheduling = node.get("schedulingConfig") or {}
        if scheduling.get("spot") and scheduling.get("preemptible"):
            raise invalid("Only one of spot and preemptible may be set.")
        _check_formats(node)
        stored = copy.deepcopy(node)
        stored.update(
            acceleratorType=accel,
            acceleratorConfig={
                "type": ACCELERATOR_TYPES[accel].config_type,
                "topology": ACCELERATOR_TYPES[accel].topology,
            },
            networkConfig=self._check_network(project, zone, node),
            serviceAccount=self._check_account(project, node),
            schedulingConfig=dict(scheduling),
        )
        return stored

    def _store_node(
        self, project: str, zone: str, node_id: str, node: dict[str, Any], queued: str = ""
    ) -> dict[str, Any]:
        """Store a validated node CREATING (409 if the id is taken); answers it."""
        key = (project, zone, node_id)
        name = self._node_name(project, zone, node_id)
        if key in self._state.nodes:
            raise already_exists(name)
        host = next(self._state.hosts)
        endpoint: dict[str, Any] = {"ipAddress": f"10.130.{host // 256}.{host % 256}"}
        endpoint["port"] = TPU_PORT
        if node["networkConfig"].get("enableExternalIps"):
            endpoint["accessConfig"] = {"externalIp": f"35.186.{host // 256}.{host % 256}"}
        node.update(
            name=name,
            id=self._new_id(),
            state="CREATING",
            createTime=now(),
            apiVersion="V2",
            networkEndpoints=[endpoint],
            cidrBlock="10.130.0.0/20",
        )
        if queued:
            node["queuedResource"] = queued
        self._state.nodes[key] = node
        return node

    def _node(self, params: dict[str, str]) -> dict[str, Any]:
        key = (params["project"], params["zone"], params["node"])
        node = self._state.nodes.get(key)
        if node is None:
            raise not_found(self._node_name(*key))
        return node

    def _answer(self, node: dict[str, Any]) -> Outcome:
        return "response", {"@type": f"{TYPE_ROOT}.Node", **copy.deepcopy(node)}

    def _create_node(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        project, zone = params["project"], params["zone"]
        node_id = query.get("nodeId", "")
        check_node_id(node_id)
        if (project, zone, node_id) in self._state.nodes:
            raise already_exists(self._node_name(project, zone, node_id))
        node = self.validate_node(project, zone, body)
        refusal = self._quota_refusal(project, zone, node)
        if refusal is not None:
            raise refusal
        sold_out = self._sold_out(zone, is_spot(node))
        node = self._store_node(project, zone, node_id, node)
        key, node_uid = (project, zone, node_id), node["id"]

        def finish() -> Outcome:
            current = self._state.nodes.get(key)
            if sold_out:
                if current is not None and current["id"] == node_uid:
                    del self._state.nodes[key]
                return "error", no_capacity(zone)
            if current is not None and current["id"] == node_uid and current["state"] == "CREATING":
                current.update(state="READY", health="HEALTHY")
            return self._answer(current or node)

        return self._new_operation(project, zone, "create", node["name"], finish)

    def _get_node(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        node = self._node(params)
        self._tick_target(node["name"])
        return copy.deepcopy(self._node(params))

    def _list_nodes(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        project, zone = params["project"], params["zone"]
        items = [
            n for (p, z, _), n in sorted(self._state.nodes.items()) if (p, z) == (project, zone)
        ]
        return page(items, query, "nodes")

    def _delete_node(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        node = self._node(params)
        key, node_uid = (params["project"], params["zone"], params["node"]), node["id"]
        node["state"] = "DELETING"

        def finish() -> Outcome:
            current = self._state.nodes.get(key)
            if current is not None and current["id"] == node_uid:
                del self._state.nodes[key]
                self._node_gone(current)
            return "response", dict(EMPTY)

        return self._new_operation(key[0], key[1], "delete", node["name"], finish)

    def _node_gone(self, node: dict[str, Any]) -> None:
        """Hook: a node was deleted (the queued resources mixin marks its request)."""

    def _transition(
        self, params: dict[str, str], verb: str, start: str, mid: str, end: str
    ) -> dict:
        node = self._node(params)
        if node["state"] != start:
            raise failed_precondition(
                f"Cannot {verb} node {node['name']} in state {node['state']}; it must be {start}."
            )
        node["state"], node_uid = mid, node["id"]
        key = (params["project"], params["zone"], params["node"])

        def finish() -> Outcome:
            current = self._state.nodes.get(key)
            if current is not None and current["id"] == node_uid and current["state"] == mid:
                current["state"] = end
            return self._answer(current or node)

        return self._new_operation(key[0], key[1], verb, node["name"], finish)

    def _stop_node(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        return self._transition(params, "stop", "READY", "STOPPING", "STOPPED")

    def _start_node(self, params: dict[str, str], query: dict[str, str], body: Any) -> dict:
        return self._transition(params, "start", "STOPPED", "STARTING", "READY")
