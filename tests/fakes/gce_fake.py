"""An in-memory HTTP fake of the Compute Engine REST API v1, for offline tests of a GCP adapter.

    from tests.fakes.gce_fake import GceFake, gce_fake, start_gce_fake

`start_gce_fake()` serves the fake on a free port of 127.0.0.1 (stdlib ThreadingHTTPServer, one
lock around all state); point google-cloud-compute's REST clients at `fake.url`:

    compute_v1.InstancesClient(credentials=AnonymousCredentials(), transport="rest",
                               client_options=ClientOptions(api_endpoint=fake.url))

(`fake.client_kwargs()` builds those keyword arguments). Never call `.result()` or `.done()` on
the ExtendedOperation that `insert()`/`delete()` return: they poll through an internal
ZoneOperationsClient built without `client_options`, i.e. the real Google endpoint. Loop over
`ZoneOperationsClient.wait(...)` / `GlobalOperationsClient.wait(...)` until `status == DONE`.

Served, under `/compute/v1/projects/{project}` (camelCase JSON, int64 fields as strings):

- `zones/{zone}/instances`: POST insert, GET list (`filter`, `maxResults`, `pageToken`),
  `zones/{zone}/instances/{name}`: GET, DELETE; `.../{name}/serialPort`: GET (`start`).
- `zones/{zone}/operations/{op}`: GET; `.../{op}/wait`: POST.
- `aggregated/instances`: GET (items keyed by `zones/{zone}`).
- `global/firewalls`: POST insert, GET list; `global/firewalls/{name}`: GET, DELETE.
- `global/operations/{op}`: GET; `.../{op}/wait`: POST.

Operations start PENDING and take `operation_polls_to_done` (default 2) GETs or waits of the
operation to finish: PENDING -> RUNNING -> DONE; 0 makes them DONE in the insert's answer. Their
effect lands when they are DONE: an inserted instance is PROVISIONING until then and RUNNING
after, a deleted instance is STOPPING until then and gone after. `fail_next_insert(zone,
reason)` makes the next instance insert(s) in that zone finish DONE with `error.errors[0].code =
reason` plus `httpErrorStatusCode`/`httpErrorMessage`, the instance vanishing as on GCE.
Request errors have GCE's shape, `{"error": {"code", "message", "errors": [{"domain", "reason",
"message"}]}}`, with the matching HTTP status (404 notFound, 409 alreadyExists, 400 invalid).

Like GCE, the fake answers absolute `https://www.googleapis.com/compute/v1/...` URLs in `zone`,
`selfLink`, `targetLink`, `machineType`, `acceleratorType` and `network` (relative ones given
on insert are expanded; bare names are refused like GCE does), and checks names, labels and
metadata against GCE's formats (400 invalid).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

HOST = "127.0.0.1"
API_ROOT = "https://www.googleapis.com/compute/v1"
DEFAULT_POLLS_TO_DONE = 2
MAX_RESULTS = 500  # GCE's default and maximum page size
FAKE_USER = "cloudtrain-tests@fake.invalid"

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_-]{0,63}")
METADATA_KEY_RE = re.compile(r"[a-zA-Z0-9_-]{1,128}")
MAX_LABELS = 64
MAX_METADATA_VALUE = 256 * 1024
MAX_METADATA_TOTAL = 512 * 1024

# How GCE reports capacity and quota failures in a finished operation.
FAULT_HTTP_STATUS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (503, "SERVICE UNAVAILABLE"),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (503, "SERVICE UNAVAILABLE"),
    "QUOTA_EXCEEDED": (403, "FORBIDDEN"),
}
HTTP_REASON = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 503: "SERVICE UNAVAILABLE"}


class GceApiError(Exception):
    """A request error, answered with GCE's error body and HTTP status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        """The JSON body GCE sends for this error."""
        detail = {"domain": "global", "reason": self.reason, "message": self.message}
        return {"error": {"code": self.code, "message": self.message, "errors": [detail]}}


def _not_found(resource: str) -> GceApiError:
    return GceApiError(404, "notFound", f"The resource '{resource}' was not found")


def _invalid(message: str) -> GceApiError:
    return GceApiError(400, "invalid", message)


def _invalid_field(field_name: str, value: Any, why: str) -> GceApiError:
    return _invalid(f"Invalid value for field '{field_name}': '{value}'. {why}")


def _now() -> str:
    """An RFC 3339 timestamp as GCE writes them."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _expand(value: str, project: str) -> str:
    """GCE answers absolute URLs for references given as `zones/...` or `projects/...`."""
    if value.startswith(("https://", "http://")):
        return value
    if value.startswith("projects/"):
        return f"{API_ROOT}/{value}"
    return f"{API_ROOT}/projects/{project}/{value.lstrip('/')}"


# ---------------------------------------------------------------------------------------------
# List filters: `field = "value"`, `field=value`, `field != value`, `field eq regex`,
# `field ne regex`, `field:*` (present), optionally parenthesized, joined by spaces or AND.

_TERM_RE = re.compile(
    r"""\s*\(?\s*
    (?P<field>[A-Za-z_][\w.-]*)\s*
    (?P<op>!=|=|:|\beq\b|\bne\b)\s*
    (?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[^\s()"']+)
    \s*\)?\s*""",
    re.VERBOSE,
)
_AND_RE = re.compile(r"AND\s+")


@dataclass(frozen=True)
class FilterTerm:
    """One comparison of a list filter."""

    field: str
    op: str
    value: str


def parse_filter(text: str) -> list[FilterTerm]:
    """Parse a conjunction of comparisons; raise GceApiError(400) on anything else (e.g. OR)."""
    terms: list[FilterTerm] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        match = _TERM_RE.match(text, pos)
        if match is None:
            raise _invalid(f"Invalid list filter expression (fake supports AND only): {text!r}")
        value = match["value"]
        if value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        terms.append(FilterTerm(match["field"], match["op"], value))
        pos = match.end()
        conj = _AND_RE.match(text, pos)
        if conj is not None:
            pos = conj.end()
    return terms


def _lookup(obj: Any, path: str) -> list[Any]:
    """Every value at a dotted path, lists flattened at each level."""
    current = [obj]
    for part in path.split("."):
        found: list[Any] = []
        for item in current:
            if isinstance(item, dict) and part in item:
                value = item[part]
                found.extend(value if isinstance(value, list) else [value])
        current = found
    return current


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matches_filter(obj: dict[str, Any], terms: list[FilterTerm]) -> bool:
    """Whether a resource satisfies every term."""
    for term in terms:
        values = [_scalar(v) for v in _lookup(obj, term.field) if not isinstance(v, dict)]
        if term.op == ":" and term.value == "*":
            hit = bool(_lookup(obj, term.field))
        elif term.op in ("=", ":"):
            hit = term.value in values
        elif term.op == "!=":
            hit = term.value not in values
        else:
            try:
                pattern = re.compile(term.value)
            except re.error as exc:
                raise _invalid(f"Invalid regular expression in filter: {term.value!r}") from exc
            any_match = any(pattern.fullmatch(v) for v in values)
            hit = any_match if term.op == "eq" else not any_match
        if not hit:
            return False
    return True


# ---------------------------------------------------------------------------------------------


@dataclass
class _Operation:
    """A zonal or global operation and what happens when it is DONE."""

    body: dict[str, Any]
    polls_needed: int
    on_done: Callable[[], dict[str, Any] | None] = lambda: None  # returns error fields, if any
    polls: int = 0


@dataclass
class _Route:
    method: str
    pattern: re.Pattern[str]
    action: str


_PROJECT = r"/compute/v1/projects/(?P<project>[^/]+)"
_ZONE = _PROJECT + r"/zones/(?P<zone>[^/]+)"
_ROUTES = [
    _Route(m, re.compile(p), a)
    for m, p, a in (
        ("POST", _ZONE + r"/instances", "insert_instance"),
        ("GET", _ZONE + r"/instances", "list_instances"),
        ("GET", _ZONE + r"/instances/(?P<name>[^/]+)", "get_instance"),
        ("DELETE", _ZONE + r"/instances/(?P<name>[^/]+)", "delete_instance"),
        ("GET", _ZONE + r"/instances/(?P<name>[^/]+)/serialPort", "serial_port"),
        ("GET", _ZONE + r"/operations/(?P<op>[^/]+)", "get_operation"),
        ("POST", _ZONE + r"/operations/(?P<op>[^/]+)/wait", "wait_operation"),
        ("GET", _PROJECT + r"/aggregated/instances", "aggregated_instances"),
        ("POST", _PROJECT + r"/global/firewalls", "insert_firewall"),
        ("GET", _PROJECT + r"/global/firewalls", "list_firewalls"),
        ("GET", _PROJECT + r"/global/firewalls/(?P<name>[^/]+)", "get_firewall"),
        ("DELETE", _PROJECT + r"/global/firewalls/(?P<name>[^/]+)", "delete_firewall"),
        ("GET", _PROJECT + r"/global/operations/(?P<op>[^/]+)", "get_operation"),
        ("POST", _PROJECT + r"/global/operations/(?P<op>[^/]+)/wait", "wait_operation"),
    )
]


def _host_numbers() -> Iterator[int]:
    """Host numbers of 10.128.0.0/16 in order (10.128.0.2 first), skipping .0, .1 and .255."""
    return (n for n in itertools.count(2) if n % 256 not in (0, 1, 255))


@dataclass
class _Fault:
    reason: str
    message: str | None = None


@dataclass
class _State:
    instances: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str, str], _Operation] = field(default_factory=dict)
    serial: dict[str, str] = field(default_factory=dict)
    faults: dict[str, list[_Fault]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(4_611_686_018_427_387_904))
    hosts: Iterator[int] = field(default_factory=lambda: _host_numbers())


class GceFake:
    """The fake's state and its HTTP server. Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state = _State()
        self.operation_polls_to_done = DEFAULT_POLLS_TO_DONE
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> GceFake:
        """Serve on a free port of 127.0.0.1 in a daemon thread; ready when this returns."""
        server = _Server((HOST, 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="gce-fake", kwargs={"poll_interval": 0.05}
        )
        self._thread.daemon = True
        self._thread.start()
        self.url = f"http://{HOST}:{server.server_address[1]}"
        return self

    def stop(self) -> None:
        """Shut the server down and join its thread. Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def reset(self) -> None:
        """Forget every resource, operation, serial text, scripted fault and logged request, and
        put `operation_polls_to_done` back to its default."""
        with self._lock:
            self._state = _State()
            self.operation_polls_to_done = DEFAULT_POLLS_TO_DONE

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that point a google-cloud-compute client at this fake."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        return {
            "credentials": AnonymousCredentials(),
            "transport": "rest",
            "client_options": ClientOptions(api_endpoint=self.url),
        }

    # -- inspection and scripting ---------------------------------------------------------

    def instances(self, project: str | None = None, zone: str | None = None) -> list[dict]:
        """Copies of the stored instances (as `get` answers them), by project, zone and name."""
        with self._lock:
            return [
                copy.deepcopy(inst)
                for (p, z, _), inst in sorted(self._state.instances.items())
                if project in (None, p) and zone in (None, z)
            ]

    def firewalls(self, project: str | None = None) -> list[dict]:
        """Copies of the stored firewall rules, by project and name."""
        with self._lock:
            return [
                copy.deepcopy(rule)
                for (p, _), rule in sorted(self._state.firewalls.items())
                if project in (None, p)
            ]

    def operations(self, project: str | None = None) -> list[dict]:
        """Copies of every operation (zonal and global) in creation order, without polling."""
        with self._lock:
            return [
                copy.deepcopy(op.body)
                for (p, _, _), op in self._state.operations.items()
                if project in (None, p)
            ]

    @property
    def requests(self) -> list[str]:
        """Every request served so far, as `METHOD /path?query`."""
        with self._lock:
            return list(self._state.requests)

    def set_serial(self, name: str, text: str) -> None:
        """Set the serial port 1 output of instance `name` (in any zone; it may not exist yet)."""
        with self._lock:
            self._state.serial[name] = text

    def append_serial(self, name: str, text: str) -> None:
        """Append to the serial port 1 output of instance `name`."""
        with self._lock:
            self._state.serial[name] = self._state.serial.get(name, "") + text

    def set_instance_status(self, name: str, status: str, zone: str | None = None) -> None:
        """Force the status of instance `name` (e.g. TERMINATED after a spot preemption)."""
        with self._lock:
            hits = [
                i
                for (_, z, n), i in self._state.instances.items()
                if n == name and zone in (None, z)
            ]
            if not hits:
                raise KeyError(f"no instance {name!r} in the fake")
            for inst in hits:
                inst["status"] = status

    def fail_next_insert(
        self,
        zone: str,
        reason: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
        count: int = 1,
        message: str | None = None,
    ) -> None:
        """Make the operations of the next `count` instance inserts in `zone` (any project) end
        DONE with `error.errors[0].code == reason`; the instances vanish when they do.
        Known reasons: ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS) (HTTP 503), QUOTA_EXCEEDED
        (HTTP 403); any other code fails with HTTP 400 unless `message` is given."""
        with self._lock:
            self._state.faults.setdefault(zone, []).extend(
                _Fault(reason, message) for _ in range(count)
            )

    # -- HTTP entry point -----------------------------------------------------------------

    def handle(self, method: str, raw_path: str, raw_body: bytes) -> tuple[int, dict[str, Any]]:
        """Serve one request: (HTTP status, JSON body)."""
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        with self._lock:
            self._state.requests.append(f"{method} {raw_path}")
        try:
            route, params = self._route(method, parts.path)
            body: Any = None
            if raw_body.strip():
                try:
                    body = json.loads(raw_body)
                except ValueError as exc:
                    raise GceApiError(400, "parseError", f"Parse Error: {exc}") from exc
            with self._lock:
                return 200, getattr(self, f"_{route.action}")(params, query, body)
        except GceApiError as exc:
            return exc.code, exc.body()
        except Exception as exc:  # a fake bug: answer it loudly, in GCE's shape
            return 500, GceApiError(500, "backendError", f"gce fake: {exc!r}").body()

    @staticmethod
    def _route(method: str, path: str) -> tuple[_Route, dict[str, str]]:
        known_path = False
        for route in _ROUTES:
            match = route.pattern.fullmatch(path)
            if match is None:
                continue
            known_path = True
            if route.method == method:
                return route, {k: unquote(v) for k, v in match.groupdict().items()}
        if known_path:
            raise GceApiError(405, "httpMethodNotAllowed", f"{method} is not allowed on {path}")
        raise GceApiError(404, "notFound", f"The fake has no resource at {path}")

    # -- helpers --------------------------------------------------------------------------

    def _new_id(self) -> str:
        return str(next(self._state.ids))

    def _new_operation(
        self,
        project: str,
        scope: str,
        operation_type: str,
        target_link: str,
        target_id: str,
        on_done: Callable[[], dict[str, Any] | None],
    ) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        hexes = uuid.uuid4().hex
        name = f"operation-{int(now.timestamp() * 1000)}-{hexes[:13]}-{hexes[13:21]}-{hexes[21:29]}"
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
            "insertTime": _now(),
            "selfLink": f"{API_ROOT}/projects/{project}/{scope}/operations/{name}",
        }
        if scope.startswith("zones/"):
            body["zone"] = f"{API_ROOT}/projects/{project}/{scope}"
        op = _Operation(body, max(0, int(self.operation_polls_to_done)), on_done)
        self._state.operations[(project, scope, name)] = op
        self._settle(op)
        return copy.deepcopy(op.body)

    def _settle(self, op: _Operation) -> None:
        """Bring an operation's status in line with how often it has been polled."""
        body = op.body
        if body["status"] == "DONE":
            return
        if op.polls >= op.polls_needed:
            body.setdefault("startTime", _now())
            error = op.on_done()
            if error:
                body.update(error)
            body.update(status="DONE", progress=100, endTime=_now())
        elif op.polls > 0 and body["status"] == "PENDING":
            body.update(status="RUNNING", startTime=_now())

    def _poll(self, params: dict[str, str]) -> dict[str, Any]:
        scope = f"zones/{params['zone']}" if "zone" in params else "global"
        key = (params["project"], scope, params["op"])
        op = self._state.operations.get(key)
        if op is None:
            raise _not_found(f"projects/{key[0]}/{scope}/operations/{key[2]}")
        if op.body["status"] != "DONE":
            op.polls += 1
            self._settle(op)
        return copy.deepcopy(op.body)

    def _page(
        self, items: list[dict[str, Any]], query: dict[str, str], self_link: str, kind: str
    ) -> dict[str, Any]:
        if query.get("filter", "").strip():
            terms = parse_filter(query["filter"])
            items = [i for i in items if matches_filter(i, terms)]
        try:
            size = int(query.get("maxResults") or MAX_RESULTS)
            start = int(query.get("pageToken") or "0")
        except ValueError as exc:
            raise _invalid(f"Invalid maxResults or pageToken: {exc}") from exc
        if not 0 <= size <= MAX_RESULTS:
            raise _invalid_field("maxResults", size, f"Must be in [0, {MAX_RESULTS}].")
        size = size or MAX_RESULTS
        answer: dict[str, Any] = {"kind": kind, "id": self_link, "selfLink": self_link}
        page = items[start : start + size]
        if page:
            answer["items"] = copy.deepcopy(page)
        if start + size < len(items):
            answer["nextPageToken"] = str(start + size)
        return answer

    # -- instances ------------------------------------------------------------------------

    def _instance_key(self, params: dict[str, str]) -> tuple[str, str, str]:
        return params["project"], params["zone"], params["name"]

    def _existing_instance(self, params: dict[str, str]) -> dict[str, Any]:
        key = self._instance_key(params)
        inst = self._state.instances.get(key)
        if inst is None:
            raise _not_found(f"projects/{key[0]}/zones/{key[1]}/instances/{key[2]}")
        return inst

    @staticmethod
    def _validate_instance(body: Any) -> None:
        if not isinstance(body, dict):
            raise _invalid("Required field 'resource' not specified")
        name = body.get("name", "")
        if not NAME_RE.fullmatch(str(name)):
            raise _invalid_field(
                "resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'"
            )
        machine_type = str(body.get("machineType") or "")
        if "machineTypes/" not in machine_type:
            raise _invalid_field(
                "resource.machineType",
                machine_type,
                "Must be a URL to a valid Compute resource of the correct type.",
            )
        for index, acc in enumerate(body.get("guestAccelerators") or []):
            acc_type = str(acc.get("acceleratorType") or "")
            if "acceleratorTypes/" not in acc_type:
                raise _invalid_field(
                    f"resource.guestAccelerators[{index}].acceleratorType",
                    acc_type,
                    "Must be a URL to a valid Compute resource of the correct type.",
                )
        labels = body.get("labels") or {}
        if len(labels) > MAX_LABELS:
            raise _invalid_field("resource.labels", "", f"At most {MAX_LABELS} labels.")
        for key, value in labels.items():
            if not LABEL_KEY_RE.fullmatch(key):
                raise _invalid_field(
                    "resource.labels", "", f"Label key '{key}' violates format constraints."
                )
            if not LABEL_VALUE_RE.fullmatch(str(value)):
                raise _invalid_field(
                    "resource.labels", "", f"Label value '{value}' violates format constraints."
                )
        items = (body.get("metadata") or {}).get("items") or []
        total = 0
        for item in items:
            key, value = str(item.get("key", "")), str(item.get("value", ""))
            if not METADATA_KEY_RE.fullmatch(key):
                raise _invalid_field("resource.metadata", "", f"Invalid metadata key '{key}'.")
            size = len(value.encode())
            if size > MAX_METADATA_VALUE:
                raise _invalid_field(
                    "resource.metadata", "", f"Metadata value of '{key}' exceeds 256 KB."
                )
            total += size + len(key)
        if total > MAX_METADATA_TOTAL:
            raise _invalid_field("resource.metadata", "", "Metadata exceeds 512 KB in total.")
        if len({str(item.get("key")) for item in items}) != len(items):
            raise _invalid_field("resource.metadata", "", "Duplicate metadata keys.")

    def _insert_instance(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        self._validate_instance(body)
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
            creationTimestamp=_now(),
            machineType=_expand(inst["machineType"], project),
        )
        inst.setdefault("labels", {})
        if inst["labels"]:
            inst["labelFingerprint"] = uuid.uuid4().hex[:12]
        metadata = inst.setdefault("metadata", {})
        metadata.update(kind="compute#metadata", fingerprint=uuid.uuid4().hex[:12])
        for acc in inst.get("guestAccelerators") or []:
            if acc.get("acceleratorType"):
                acc["acceleratorType"] = _expand(acc["acceleratorType"], project)
        nics = inst.get("networkInterfaces") or [{}]
        inst["networkInterfaces"] = nics
        for index, nic in enumerate(nics):
            nic.setdefault("kind", "compute#networkInterface")
            nic.setdefault("name", f"nic{index}")
            nic["network"] = _expand(nic.get("network") or "global/networks/default", project)
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
                return self._fault_error(fault, project, zone, inst)
            if current is not None and current["id"] == inst_id:
                if current["status"] == "PROVISIONING":
                    current["status"] = "RUNNING"
                current["lastStartTimestamp"] = _now()
            return None

        return self._new_operation(project, f"zones/{zone}", "insert", self_link, inst_id, finish)

    def _take_fault(self, zone: str) -> _Fault | None:
        queue = self._state.faults.get(zone)
        return queue.pop(0) if queue else None

    @staticmethod
    def _fault_error(
        fault: _Fault, project: str, zone: str, inst: dict[str, Any]
    ) -> dict[str, Any]:
        region = zone.rsplit("-", 1)[0]
        details: list[dict[str, Any]] = []
        if fault.reason.startswith("ZONE_RESOURCE_POOL_EXHAUSTED"):
            message = (
                f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                "available to fulfill the request.  Try a different zone, or try again later."
            )
            details.append(
                {
                    "help": {
                        "links": [
                            {
                                "description": "Troubleshooting documentation",
                                "url": "https://cloud.google.com/compute/docs/resource-error",
                            }
                        ]
                    }
                }
            )
        elif fault.reason == "QUOTA_EXCEEDED":
            accs = inst.get("guestAccelerators") or []
            gpu = accs[0]["acceleratorType"].rsplit("/", 1)[-1] if accs else ""
            gpu = gpu.removeprefix("nvidia-").removeprefix("tesla-")
            metric = f"NVIDIA_{gpu.upper().replace('-', '_')}_GPUS" if gpu else "CPUS"
            message = f"Quota '{metric}' exceeded.  Limit: 0.0 in region {region}."
            details.append(
                {
                    "quotaInfo": {
                        "metricName": f"compute.googleapis.com/{metric.lower()}",
                        "limitName": f"{metric.replace('_', '-')}-per-project-region",
                        "dimensions": {"region": region},
                        "limit": 0,
                    }
                }
            )
        else:
            message = f"Operation failed: {fault.reason}"
        status, status_text = FAULT_HTTP_STATUS.get(fault.reason, (400, HTTP_REASON[400]))
        errors = {"code": fault.reason, "message": fault.message or message}
        if details:
            errors["errorDetails"] = details
        return {
            "error": {"errors": [errors]},
            "httpErrorStatusCode": status,
            "httpErrorMessage": status_text,
        }

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
        return self._page(items, query, link, "compute#instanceList")

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
            raise _invalid(f"Invalid start or port: {exc}") from exc
        if not 1 <= port <= 4:
            raise _invalid_field("port", port, "Must be in [1, 4].")
        contents = data[start:] if port == 1 else b""
        return {
            "kind": "compute#serialPortOutput",
            "contents": contents.decode(errors="replace"),
            "start": str(min(start, len(data))),
            "next": str(len(data) if port == 1 else 0),
            "selfLink": f"{inst['selfLink']}/serialPort",
        }

    # -- operations -----------------------------------------------------------------------

    def _get_operation(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return self._poll(params)

    def _wait_operation(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return self._poll(params)

    # -- firewalls ------------------------------------------------------------------------

    def _existing_firewall(self, params: dict[str, str]) -> dict[str, Any]:
        rule = self._state.firewalls.get((params["project"], params["name"]))
        if rule is None:
            raise _not_found(f"projects/{params['project']}/global/firewalls/{params['name']}")
        return rule

    def _insert_firewall(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _invalid("Required field 'resource' not specified")
        project, name = params["project"], str(body.get("name", ""))
        if not NAME_RE.fullmatch(name):
            raise _invalid_field(
                "resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'"
            )
        resource = f"projects/{project}/global/firewalls/{name}"
        if (project, name) in self._state.firewalls:
            raise GceApiError(409, "alreadyExists", f"The resource '{resource}' already exists")
        rule = copy.deepcopy(body)
        rule_id = self._new_id()
        rule.update(
            kind="compute#firewall",
            id=rule_id,
            selfLink=f"{API_ROOT}/{resource}",
            creationTimestamp=_now(),
            network=_expand(rule.get("network") or "global/networks/default", project),
        )
        rule.setdefault("priority", 1000)
        rule.setdefault("direction", "INGRESS")
        rule.setdefault("disabled", False)
        rule.setdefault("logConfig", {"enable": False})
        self._state.firewalls[(project, name)] = rule
        return self._new_operation(
            project, "global", "insert", rule["selfLink"], rule_id, lambda: None
        )

    def _list_firewalls(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        items = [r for (p, _), r in sorted(self._state.firewalls.items()) if p == project]
        link = f"{API_ROOT}/projects/{project}/global/firewalls"
        return self._page(items, query, link, "compute#firewallList")

    def _get_firewall(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        return copy.deepcopy(self._existing_firewall(params))

    def _delete_firewall(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        rule = self._existing_firewall(params)
        key, rule_id = (params["project"], params["name"]), rule["id"]

        def finish() -> None:
            current = self._state.firewalls.get(key)
            if current is not None and current["id"] == rule_id:
                del self._state.firewalls[key]

        return self._new_operation(
            params["project"], "global", "delete", rule["selfLink"], rule_id, finish
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: GceFake


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's requests session expects
    timeout = 30  # an idle keep-alive connection frees its thread after this
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for a delayed ACK
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        status, payload = self.server.fake.handle(self.command, self.path, raw)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Silence the per-request log lines."""


def start_gce_fake() -> GceFake:
    """A running, empty GCE fake on a free port of 127.0.0.1 (call `.stop()` when done)."""
    return GceFake().start()


@pytest.fixture
def gce_fake() -> Iterator[GceFake]:
    """A fresh GCE fake for one test, stopped afterwards."""
    fake = start_gce_fake()
    try:
        yield fake
    finally:
        fake.stop()
