"""Instance routes of the GCE fake: `InstancesMixin`.

Serves insert, list (`filter`: see gce_listing), aggregated list, get, delete and serial port
output of instances. An insert is checked like GCE does (`validate_instance()`, then
`validate_instance_extras()`: scheduling, accelerators, tags, disk URLs; then the service
accounts it names, see gce_iam), stored PROVISIONING with GCE's defaults (absolute URLs, ids,
fingerprints of labels, metadata and tags, scheduling, the project's account for `default`,
NICs and IPs, disk names, sizes and modes), and turns RUNNING when its operation is DONE, or
vanishes then if a scripted fault of its zone was pending; a delete leaves the instance
STOPPING until its operation is DONE. A repeated `requestId` answers its first operation and
does nothing. Besides scripted faults, the account's rules (gce_quotas) fail an insert's
operation: a sold-out zone, a quota it would exceed. Methods run under the fake's lock.
"""

from __future__ import annotations

import copy
import uuid
import zlib
from typing import Any

from tests.fakes.gce_errors import GceApiError, invalid, invalid_field, not_found
from tests.fakes.gce_faults import Fault, fault_error
from tests.fakes.gce_filters import matches_filter, parse_filter
from tests.fakes.gce_formats import API_ROOT, NAME_RE, expand, now, validate_instance
from tests.fakes.gce_iam import IamMixin
from tests.fakes.gce_listing import page
from tests.fakes.gce_operations import OperationsMixin
from tests.fakes.gce_quotas import QuotasMixin

SCHEDULING_ENUMS = {
    "onHostMaintenance": ("MIGRATE", "TERMINATE"),
    "provisioningModel": ("STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"),
    "instanceTerminationAction": ("STOP", "DELETE"),
}
MAX_RUN_DURATION_SECONDS = (30, 120 * 24 * 3600)  # GCE's bounds: 30 s to 120 days


def default_service_account(project: str) -> str:
    """The email the fake answers for the `default` service account of `project` (GCE's
    `{project number}-compute@developer.gserviceaccount.com`, with a made-up stable number)."""
    number = 100_000_000_000 + zlib.crc32(project.encode())
    return f"{number}-compute@developer.gserviceaccount.com"


def _is_spot(scheduling: dict[str, Any]) -> bool:
    return scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible") is True


def validate_instance_extras(body: dict[str, Any]) -> None:
    """Raise GceApiError(400) for the scheduling, accelerator, tag and disk settings GCE refuses
    on insert (after `validate_instance()`)."""
    scheduling = body.get("scheduling") or {}
    where = "resource.scheduling"
    for key, allowed in SCHEDULING_ENUMS.items():
        value = scheduling.get(key)
        if value is not None and value not in allowed:
            raise invalid_field(f"{where}.{key}", value, f"Must be one of {', '.join(allowed)}.")
    duration = scheduling.get("maxRunDuration")
    if duration is not None:
        seconds = str((duration or {}).get("seconds", "0"))
        low, high = MAX_RUN_DURATION_SECONDS
        if not seconds.isdigit() or not low <= int(seconds) <= high:
            raise invalid_field(
                f"{where}.maxRunDuration.seconds", seconds, "Must be in [30, 10368000] (120 days)."
            )
    spot, action = _is_spot(scheduling), scheduling.get("instanceTerminationAction")
    maintenance = scheduling.get("onHostMaintenance") or ("TERMINATE" if spot else "MIGRATE")
    refusals = (
        (
            (scheduling.get("provisioningModel") == "SPOT" or duration is not None) and not action,
            ("instanceTerminationAction", ""),
            "Must be set for SPOT instances and for instances with a maxRunDuration.",
        ),
        (
            spot and maintenance != "TERMINATE",
            ("onHostMaintenance", maintenance),
            "Scheduling must have preemptible be false when OnHostMaintenance isn't TERMINATE.",
        ),
        (
            spot and scheduling.get("automaticRestart") is True,
            ("automaticRestart", "true"),
            "Preemptible instances cannot be automatically restarted.",
        ),
        (
            bool(body.get("guestAccelerators")) and maintenance != "TERMINATE",
            ("onHostMaintenance", maintenance),
            "Instances with guest accelerators do not support live migration.",
        ),
    )
    for refused, (key, value), why in refusals:
        if refused:
            raise invalid_field(f"{where}.{key}", value, why)
    for index, tag in enumerate((body.get("tags") or {}).get("items") or []):
        if not NAME_RE.fullmatch(str(tag)):
            why = f"Must be a match of regex '{NAME_RE.pattern}'"
            raise invalid_field(f"resource.tags.items[{index}]", tag, why)
    for index, disk in enumerate(body.get("disks") or []):
        init = disk.get("initializeParams") or {}
        for key, marker in (("diskType", "diskTypes/"), ("sourceImage", "images/")):
            if init.get(key) is not None and marker not in str(init[key]):
                raise invalid_field(
                    f"resource.disks[{index}].initializeParams.{key}",
                    init[key],
                    "The URL is malformed.",
                )


class InstancesMixin(IamMixin, OperationsMixin, QuotasMixin):
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
        project, zone = params["project"], params["zone"]
        replay = self._replayed(project, query)
        if replay is not None:
            return replay
        validate_instance(body)
        validate_instance_extras(body)
        self._check_instance_accounts(project, body)
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
        self._fill_instance_defaults(inst, project)
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
            disk.setdefault("type", "PERSISTENT")
            disk.setdefault("mode", "READ_WRITE")
            init = disk.get("initializeParams") or {}
            for ref in ("diskType", "sourceImage"):
                if init.get(ref):
                    init[ref] = expand(init[ref], project)
            if init.get("diskSizeGb"):
                disk.setdefault("diskSizeGb", init["diskSizeGb"])
        fault = self._take_fault(zone) or self._insert_fault(project, zone, inst)
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

        return self._new_operation(
            project,
            f"zones/{zone}",
            "insert",
            self_link,
            inst_id,
            finish,
            query.get("requestId", ""),
        )

    @staticmethod
    def _fill_instance_defaults(inst: dict[str, Any], project: str) -> None:
        """GCE's answer defaults for scheduling, tags and service accounts."""
        scheduling = inst.setdefault("scheduling", {})
        spot = _is_spot(scheduling)
        scheduling.setdefault("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
        scheduling.setdefault("automaticRestart", not spot)
        scheduling.setdefault("preemptible", False)
        if not scheduling["preemptible"]:
            scheduling.setdefault("provisioningModel", "STANDARD")
        tags = inst.setdefault("tags", {})
        tags["fingerprint"] = uuid.uuid4().hex[:12]
        for account in inst.get("serviceAccounts") or []:
            if account.get("email") == "default":
                account["email"] = default_service_account(project)

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
        replay = self._replayed(params["project"], query)
        if replay is not None:
            return replay
        inst = self._existing_instance(params)
        key, inst_id = self._instance_key(params), inst["id"]
        inst["status"] = "STOPPING"

        def finish() -> None:
            current = self._state.instances.get(key)
            if current is not None and current["id"] == inst_id:
                del self._state.instances[key]

        scope = f"zones/{params['zone']}"
        return self._new_operation(
            params["project"],
            scope,
            "delete",
            inst["selfLink"],
            inst_id,
            finish,
            query.get("requestId", ""),
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
