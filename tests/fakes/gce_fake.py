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
- `zones/{zone}/operations`: GET list (`filter`, paging); `zones/{zone}/operations/{op}`: GET;
  `.../{op}/wait`: POST.
- `aggregated/instances`: GET (`filter`; items keyed by `zones/{zone}`).
- `global/firewalls`: POST insert, GET list (`filter`, `maxResults`, `pageToken`);
  `global/firewalls/{name}`: GET, DELETE.
- `global/operations/{op}`: GET; `.../{op}/wait`: POST.
- `regions/{region}`: GET (any name like `us-central1` is UP; zones `{region}-a/-b/-c`, plus
  `-f` for us-central1, or what `set_region_zones(region, zones)` scripted; else 404).
- `zones`: GET list (`filter`, paging) of the zones of a few default and all scripted regions.
- the project itself (projects.get, with its `quotas[]`), and each region's `quotas[]`.

The account's rules (`fake.account`, tests/fakes/gcp_account.py: quotas and usage, sold-out
zones, the caller's denied permissions, disabled services) are enforced on every call, in
GCP's shapes (gce_quotas, gce_access), and answered by Resource Manager's
`projects/{p}:testIamPermissions` and Service Usage's `projects/{p}/services/{name}`, served
on the same server.

and, on the same server, IAM's `/v1/projects/{project}/serviceAccounts` (create, list, get,
delete: see gce_iam; point CLOUDTRAIN_IAM_ENDPOINT at `fake.url`). Instances keep the
`serviceAccounts` they were inserted with; with `require_known_service_accounts` on, an insert
naming an account the fake's IAM does not hold is refused (400) as on GCE.

Instance and firewall insert and delete honour `requestId` (a UUID, else 400) like GCE: a repeat
within the project answers the first request's operation as it stands and does nothing again.

Operations start PENDING and take `operation_polls_to_done` (default 2) GETs or waits of the
operation to finish: PENDING -> RUNNING -> DONE; 0 makes them DONE in the insert's answer. Their
effect lands when they are DONE: an inserted instance is PROVISIONING until then and RUNNING
after, a deleted instance is STOPPING until then and gone after. `fail_next_insert(zone,
reason)` makes the next instance insert(s) in that zone finish DONE with `error.errors[0].code =
reason` plus `httpErrorStatusCode`/`httpErrorMessage`, the instance vanishing as on GCE.
`preempt(name)` takes a SPOT instance back as GCE does (a `compute.instances.preempted`
operation, then its instanceTerminationAction).
Request errors have GCE's shape, `{"error": {"code", "message", "errors": [{"domain", "reason",
"message"}]}}`, with the matching HTTP status (404 notFound, 409 alreadyExists, 400 invalid).

Like GCE, the fake answers absolute `https://www.googleapis.com/compute/v1/...` URLs in `zone`,
`selfLink`, `targetLink`, `machineType`, `acceleratorType`, `network` and the disks' `diskType`
and `sourceImage` (relative ones given on insert are expanded; bare names are refused like GCE
does), and checks names, labels, metadata and network tags against GCE's formats (400 invalid).
It refuses too a `maxRunDuration` (30 s to 120 days) or SPOT scheduling without
`instanceTerminationAction` (for SPOT stricter than GCE, which defaults it to STOP), and an
`onHostMaintenance` other than TERMINATE (MIGRATE by default, except for SPOT) with guest
accelerators or SPOT. It answers scheduling defaults, a `tags.fingerprint`, and
`default_service_account(project)` for a service account `default`.

The fake is split by job: this module holds `GceFake` (lifecycle, inspection and scripting, the
request entry point) and re-exports the public names of gce_errors, gce_filters, gce_formats,
gce_faults, gce_instances, gce_listing and gce_regions; the routes live in the mixins of
gce_instances, gce_firewalls, gce_regions and gce_operations, dispatched by gce_routes and
served over HTTP by gce_http; gce_state holds the stored data.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.fakes.gce_access import AccessMixin
from tests.fakes.gce_errors import GceApiError
from tests.fakes.gce_faults import FAULT_HTTP_STATUS, HTTP_REASON, Fault
from tests.fakes.gce_filters import FilterTerm, matches_filter, parse_filter
from tests.fakes.gce_firewalls import FirewallsMixin
from tests.fakes.gce_formats import (
    API_ROOT,
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    MAX_LABELS,
    MAX_METADATA_TOTAL,
    MAX_METADATA_VALUE,
    METADATA_KEY_RE,
    NAME_RE,
)
from tests.fakes.gce_http import FakeHandler, FakeServer
from tests.fakes.gce_instances import InstancesMixin, default_service_account
from tests.fakes.gce_listing import MAX_RESULTS
from tests.fakes.gce_operations import FAKE_USER
from tests.fakes.gce_regions import REGION_RE, RegionsMixin
from tests.fakes.gce_routes import match_route
from tests.fakes.gce_state import State
from tests.fakes.serving import Served

__all__ = [
    "API_ROOT",
    "DEFAULT_POLLS_TO_DONE",
    "FAKE_USER",
    "FAULT_HTTP_STATUS",
    "HOST",
    "HTTP_REASON",
    "LABEL_KEY_RE",
    "LABEL_VALUE_RE",
    "MAX_LABELS",
    "MAX_METADATA_TOTAL",
    "MAX_METADATA_VALUE",
    "MAX_RESULTS",
    "METADATA_KEY_RE",
    "NAME_RE",
    "REGION_RE",
    "FilterTerm",
    "GceApiError",
    "GceFake",
    "default_service_account",
    "gce_fake",
    "matches_filter",
    "parse_filter",
    "start_gce_fake",
]

if TYPE_CHECKING:
    from tests.fakes.gcp_account import GcpAccount

HOST = "127.0.0.1"
DEFAULT_POLLS_TO_DONE = 2


class GceFake(InstancesMixin, FirewallsMixin, RegionsMixin, AccessMixin):
    """The fake's state and its HTTP server. Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._state = State()
        self.operation_polls_to_done = DEFAULT_POLLS_TO_DONE
        self.require_known_service_accounts = False
        self._served: Served | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> GceFake:
        """Serve on a free port of 127.0.0.1 in a daemon thread; ready when this returns."""
        server = FakeServer((HOST, 0), FakeHandler)
        server.fake = self
        self._served = Served(server, "gce-fake")
        self.url = f"http://{HOST}:{self._served.port}"
        return self

    def stop(self) -> None:
        """Shut the server down and join its thread. Idempotent."""
        if self._served is not None:
            self._served.close()
            self._served = None

    def reset(self) -> None:
        """Forget every resource, operation, request id, serial text, scripted fault or region
        and logged request, and put `operation_polls_to_done` back to its default."""
        with self._lock:
            self._state = State()
            self.operation_polls_to_done = DEFAULT_POLLS_TO_DONE
            self.require_known_service_accounts = False

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that point a google-cloud-compute client at this fake."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        return {
            "credentials": AnonymousCredentials(),
            "transport": "rest",
            "client_options": ClientOptions(api_endpoint=self.url),
        }

    @property
    def account(self) -> GcpAccount:
        """The account's rules (quotas, capacity, the caller's rights, services): see
        tests/fakes/gcp_account.py."""
        from tests.fakes.gcp_account import GcpAccount

        return GcpAccount(self)

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

    def preempt(self, name: str, zone: str | None = None) -> dict[str, Any]:
        """Preempt SPOT (or preemptible) instance `name` as GCE does, not as a user's delete: a
        zone operation `compute.instances.preempted` (DONE at once, by `system`) targets it, and
        its `instanceTerminationAction` decides: DELETE deletes it (its autoDelete disks and
        ephemeral IPs with it: the fake stores neither apart), STOP leaves it TERMINATED.
        Returns the operation; ValueError for a standard instance, KeyError if there is none.
        Sources: compute.v1 discovery doc, Scheduling.instanceTerminationAction ("DELETE: Delete
        the VM"); docs.cloud.google.com/compute/docs/instances/create-use-spot (detecting
        preemption) and its "List preemption history" sample, which lists the zone's operations
        with `operationType="compute.instances.preempted"`. The 30 s notice before is the
        metadata server's `instance/preempted` (tests/fakes/metadata_server.py), not this."""
        with self._lock:
            hits = [
                (key, inst)
                for key, inst in self._state.instances.items()
                if key[2] == name and zone in (None, key[1])
            ]
            if not hits:
                raise KeyError(f"no instance {name!r} in the fake")
            (project, where, _), inst = hits[0]
            scheduling = inst.get("scheduling") or {}
            if not (scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible")):
                raise ValueError(f"instance {name!r} is not SPOT: GCE never preempts it")
            key, inst_id = hits[0][0], inst["id"]

            def taken() -> None:
                current = self._state.instances.get(key)
                if current is None or current["id"] != inst_id:
                    return
                if scheduling.get("instanceTerminationAction") == "DELETE":
                    del self._state.instances[key]
                else:
                    current["status"] = "TERMINATED"

            body = self._new_operation(
                project,
                f"zones/{where}",
                "compute.instances.preempted",
                inst["selfLink"],
                inst_id,
                taken,
            )
            op = self._state.operations[(project, f"zones/{where}", body["name"])]
            op.body.update(user="system", statusMessage="Instance was preempted.")
            op.polls_needed = 0
            self._settle(op)
            return copy.deepcopy(op.body)

    def set_region_zones(self, region: str, zones: Iterable[str] | None) -> None:
        """Script the zones (names like `us-east1-b`) that `regions/{region}` answers and the
        zone list shows; None restores the defaults. ValueError unless `region` is like GCE's."""
        if not REGION_RE.fullmatch(region):
            raise ValueError(f"not a GCE region name: {region!r}")
        with self._lock:
            if zones is None:
                self._state.region_zones.pop(region, None)
            else:
                self._state.region_zones[region] = [z.rsplit("/", 1)[-1] for z in zones]

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
                Fault(reason, message) for _ in range(count)
            )

    # -- HTTP entry point -----------------------------------------------------------------

    def handle(self, method: str, raw_path: str, raw_body: bytes) -> tuple[int, dict[str, Any]]:
        """Serve one request: (HTTP status, JSON body)."""
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        with self._lock:
            self._state.requests.append(f"{method} {raw_path}")
        try:
            route, params = match_route(method, parts.path)
            body: Any = None
            if raw_body.strip():
                try:
                    body = json.loads(raw_body)
                except ValueError as exc:
                    raise GceApiError(400, "parseError", f"Parse Error: {exc}") from exc
            with self._lock:
                self._check_access(route.action, params, body)
                return 200, getattr(self, f"_{route.action}")(params, query, body)
        except GceApiError as exc:
            return exc.code, exc.body()
        except Exception as exc:  # a fake bug: answer it loudly, in GCE's shape
            return 500, GceApiError(500, "backendError", f"gce fake: {exc!r}").body()


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
