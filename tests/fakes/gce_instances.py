"""Instance routes of the GCE fake: `InstancesMixin`.

Serves insert, list, aggregated list, get, delete and serial port output of instances. An
insert is checked like GCE does, stored PROVISIONING with GCE's defaults filled in (absolute
URLs, ids, fingerprints, NIC names and IPs, disk device names), and turns RUNNING when its
operation is DONE, or vanishes then if a scripted fault of its zone was pending; a delete
leaves the instance STOPPING until its operation is DONE. Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.fakes.gce_errors import GceApiError, invalid, invalid_field, not_found
from tests.fakes.gce_faults import Fault, fault_error
from tests.fakes.gce_filters import matches_filter, parse_filter
from tests.fakes.gce_formats import API_ROOT, expand, now, validate_instance
from tests.fakes.gce_listing import page
from tests.fakes.gce_operations import OperationsMixin


class InstancesMixin(OperationsMixin):
    """The `zones/{zone}/instances` and `aggregated/instances` routes."""

    def _instance_key(self, params: dict[str, str]) -> tuple[str, str, str]:
        return params["project"], params["zone"], params["name"]

    def _existing_instance(self, params: dict[str, str]) -> dict[str, Any]:
        key = self._instance_key(params)
        inst = self._state.instances.get(key)
        if inst is None:
            raise not_found(f"projects/{key[0]}/zones/{key[1]}/instances/{key[2]}")
        return inst

    def _insert_instance(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        validate_instance(body)
        project, zone = params["project"], params["zone"]
        name = body["name"]
        key = (project, zone, name)
        resource = f"projects/{project}/zones/{zone}/instances/{name}"
        if key in self._state.instances:
            raise GceApiError(409, "alreadyExists", f"The resource '{resource}' already exists")
        inst = copy.deepcopy(body)
        inst_id = self._new_id()
        self_link = f"{API_ROOT}/{resource}"
        inst.update(
            kind="compute#instance",
            id=inst_id,
            name=name,
            status="PROVISIONING",
            zone=f"{API_ROOT}/projects/{project}/zones/{zone}",
            selfLink=self_link,
            creationTimestamp=now(),
            machineType=expand(inst["machineType"], project),
        )
        inst.setdefault("labels", {})
        if inst["labels"]:
            inst["labelFingerprint"] = uuid.uuid4().hex[:12]
        metadata = inst.setdefault("metadata", {})
        metadata.update(kind="compute#metadata", fingerprint=uuid.uuid4().hex[:12])
        for acc in inst.get("guestAccelerators") or []:
            if acc.get("acceleratorType"):
                acc["acceleratorType"] = expand(acc["acceleratorType"], project)
        nics = inst.get("networkInterfaces") or [{}]
        inst["networkInterfaces"] = nics
        for index, nic in enumerate(nics):
            nic.setdefault("kind", "compute#networkInterface")
            nic.setdefault("name", f"nic{index}")
            nic["network"] = expand(nic.get("network") or "global/networks/default", project)
            high, low = divmod(next(self._state.hosts), 256)
            nic.setdefault("networkIP", f"10.128.{high}.{low}")
            for access in nic.get("accessConfigs") or []:
                access.setdefault("kind", "compute#accessConfig")
                access.setdefault("type", "ONE_TO_ONE_NAT")
                access.setdefault("natIP", f"34.118.{high}.{low}")
        for index, disk in enumerate(inst.get("disks") or []):
            disk.setdefault("kind", "compute#attachedDisk")
            disk.setdefault("index", index)
            disk.setdefault("deviceName", name if disk.get("boot") else f"persistent-disk-{index}")
        fault = self._take_fault(zone)
        self._state.instances[key] = inst

        def finish() -> dict[str, Any] | None:
            current = self._state.instances.get(key)
            if fault is not None:
                if current is not None and current["id"] == inst_id:
                    del self._state.instances[key]
                return fault_error(fault, project, zone, inst)
            if current is not None and current["id"] == inst_id:
                if current["status"] == "PROVISIONING":
                    current["status"] = "RUNNING"
                current["lastStartTimestamp"] = now()
            return None

        return self._new_operation(project, f"zones/{zone}", "insert", self_link, inst_id, finish)

    def _take_fault(self, zone: str) -> Fault | None:
        queue = self._state.faults.get(zone)
        return queue.pop(0) if queue else None

    def _list_instances(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project, zone = params["project"], params["zone"]
        items = [
            inst
            for (p, z, _), inst in sorted(self._state.instances.items())
            if p == project and z == zone
        ]
        link = f"{API_ROOT}/projects/{project}/zones/{zone}/instances"
        return page(items, query, link, "compute#instanceList")

    def _aggregated_instances(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        terms = parse_filter(query.get("filter", ""))
        scoped: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for (p, z, _), inst in sorted(self._state.instances.items()):
            if p == project and matches_filter(inst, terms):
                scoped.setdefault(f"zones/{z}", {"instances": []})["instances"].append(
                    copy.deepcopy(inst)
                )
        link = f"{API_ROOT}/projects/{project}/aggregated/instances"
        answer: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": link,
            "selfLink": link,
        }
        if scoped:
            answer["items"] = scoped
        return answer

    def _get_instance(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return copy.deepcopy(self._existing_instance(params))

    def _delete_instance(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        inst = self._existing_instance(params)
        key, inst_id = self._instance_key(params), inst["id"]
        inst["status"] = "STOPPING"

        def finish() -> None:
            current = self._state.instances.get(key)
            if current is not None and current["id"] == inst_id:
                del self._state.instances[key]

        scope = f"zones/{params['zone']}"
        return self._new_operation(
            params["project"], scope, "delete", inst["selfLink"], inst_id, finish
        )

    def _serial_port(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        inst = self._existing_instance(params)
        data = self._state.serial.get(params["name"], "").encode()
        try:
            start = max(0, int(query.get("start") or "0"))
            port = int(query.get("port") or "1")
        except ValueError as exc:
            raise invalid(f"Invalid start or port: {exc}") from exc
        if not 1 <= port <= 4:
            raise invalid_field("port", port, "Must be in [1, 4].")
        contents = data[start:] if port == 1 else b""
        return {
            "kind": "compute#serialPortOutput",
            "contents": contents.decode(errors="replace"),
            "start": str(min(start, len(data))),
            "next": str(len(data) if port == 1 else 0),
            "selfLink": f"{inst['selfLink']}/serialPort",
        }
