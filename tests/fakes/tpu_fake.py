"""An in-memory HTTP fake of the Cloud TPU API v2, beside the GCE fake of the GCP box.

    from tests.fakes.tpu_fake import TpuFake, start_tpu_fake
    tpu = start_tpu_fake(gce)            # gce: the box's GceFake (its IAM, rights, services)
    client = tpu_v2.TpuClient(**tpu.client_kwargs())   # REST, anonymous, at tpu.url

Served under `/v2/projects/{project}/locations/{zone}` (TPU API v2 discovery document
tpu.v2.json, revision 20261001, google-api-python-client 2.202.0; the URLs, verbs and bodies
the google-cloud-tpu REST transport sends, tpu_v2/services/tpu/transports/rest_base.py):
`nodes` (create with `nodeId`, get, list, delete, `:stop`, `:start`: tpu_nodes),
`queuedResources` (create with `queuedResourceId`, get, list, delete with `force`:
tpu_queued), `operations` (get, list: tpu_operations), `acceleratorTypes` and
`runtimeVersions` (get, list: what the zone sells, tpu_catalog). Camel-case JSON; errors in
Google's model (tpu_errors). Like the GCE fake it shares that fake's lock, and its rules come
from the same account: the caller's denied permissions and disabled services
(tpu_access), the TPU quotas and sold-out zones that `fake.account` scripts
(tests/fakes/tpu_account.py).

Test side: `nodes()`, `queued_resources()`, `operations()` (copies, by project and zone),
`preempt(node_id)` (a spot or preemptible node PREEMPTED as Cloud TPU does, its queued request
SUSPENDED), `set_node_state(node_id, state)`, `add_network(project, name)` (a VPC besides
`default`), `requests`, `reset()`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.fakes.gce_fake import GceFake
from tests.fakes.gce_http import FakeHandler, FakeServer
from tests.fakes.serving import Served
from tests.fakes.tpu_access import is_spot
from tests.fakes.tpu_catalog import ACCELERATOR_TYPES, runtimes_in_zone, types_in_zone
from tests.fakes.tpu_errors import TpuApiError, invalid, not_found
from tests.fakes.tpu_operations import page
from tests.fakes.tpu_queued import TpuQueuedMixin
from tests.fakes.tpu_state import TpuState

if TYPE_CHECKING:
    from tests.fakes.tpu_account import TpuAccount

HOST = "127.0.0.1"
DEFAULT_POLLS_TO_DONE = 2
_ZONE = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/:]+)"
ROUTES = [
    (m, re.compile(_ZONE + p), a)
    for m, p, a in (
        ("POST", r"/nodes", "create_node"),
        ("GET", r"/nodes", "list_nodes"),
        ("GET", r"/nodes/(?P<node>[^/:]+)", "get_node"),
        ("DELETE", r"/nodes/(?P<node>[^/:]+)", "delete_node"),
        ("POST", r"/nodes/(?P<node>[^/:]+):stop", "stop_node"),
        ("POST", r"/nodes/(?P<node>[^/:]+):start", "start_node"),
        ("POST", r"/queuedResources", "create_queued"),
        ("GET", r"/queuedResources", "list_queued"),
        ("GET", r"/queuedResources/(?P<queued>[^/:]+)", "get_queued"),
        ("DELETE", r"/queuedResources/(?P<queued>[^/:]+)", "delete_queued"),
        ("GET", r"/operations", "list_operations"),
        ("GET", r"/operations/(?P<op>[^/:]+)", "get_operation"),
        ("GET", r"/acceleratorTypes", "list_accelerator_types"),
        ("GET", r"/acceleratorTypes/(?P<type>[^/:]+)", "get_accelerator_type"),
        ("GET", r"/runtimeVersions", "list_runtime_versions"),
        ("GET", r"/runtimeVersions/(?P<version>[^/:]+)", "get_runtime_version"),
    )
]


def match_route(method: str, path: str) -> tuple[str, dict[str, str]]:
    """The action serving `method path` and its decoded parameters; 404/405 as Google does."""
    known = False
    for route_method, pattern, action in ROUTES:
        match = pattern.fullmatch(path)
        if match:
            known = True
            if route_method == method:
                return action, {k: unquote(v) for k, v in match.groupdict().items()}
    if known:
        raise TpuApiError(405, f"Method {method} is not allowed on {path}.")
    raise TpuApiError(404, f"The requested URL {path} was not found on this server.")


class TpuFake(TpuQueuedMixin):
    """The TPU API's state and its HTTP server (see the module docstring). Thread-safe."""

    def __init__(self, gce: GceFake) -> None:
        self._gce = gce
        self._lock = gce._lock
        self._state = TpuState()
        self.operation_polls_to_done = DEFAULT_POLLS_TO_DONE
        self._served: Served | None = None
        self.url = ""

    @property
    def _rules_gcp(self) -> Any:
        return self._gce._state.account

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> TpuFake:
        """Serve on a free port of 127.0.0.1 in a daemon thread; ready when this returns."""
        server = FakeServer((HOST, 0), FakeHandler)
        server.fake = self  # type: ignore[assignment]  # the handler only calls .handle()
        self._served = Served(server, "tpu-fake")
        self.url = f"http://{HOST}:{self._served.port}"
        return self

    # the GCE fake's, which only use `_served` and `url`: shut down (idempotent); the
    # keyword arguments that point a client (here google-cloud-tpu's TpuClient) at the fake
    stop = GceFake.stop
    client_kwargs = GceFake.client_kwargs

    def reset(self) -> None:
        """Forget every node, queued resource, operation, network and TPU rule."""
        with self._lock:
            self._state = TpuState()
            self.operation_polls_to_done = DEFAULT_POLLS_TO_DONE

    @property
    def account(self) -> TpuAccount:
        """The account's TPU rules (tests/fakes/tpu_account.py)."""
        from tests.fakes.tpu_account import TpuAccount

        return TpuAccount(self)

    # -- inspection and scripting ---------------------------------------------------------

    def nodes(self, project: str | None = None, zone: str | None = None) -> list[dict]:
        """Copies of the stored nodes (as `get` answers them), by project, zone and id."""
        with self._lock:
            return [
                copy.deepcopy(n)
                for (p, z, _), n in sorted(self._state.nodes.items())
                if project in (None, p) and zone in (None, z)
            ]

    def queued_resources(self, project: str | None = None, zone: str | None = None) -> list[dict]:
        """Copies of the stored queued resources as they stand (reading them moves no time)."""
        with self._lock:
            return [
                copy.deepcopy(q)
                for (p, z, _), q in sorted(self._state.queued.items())
                if project in (None, p) and zone in (None, z)
            ]

    def operations(self, project: str | None = None) -> list[dict]:
        """Copies of every operation in creation order, without polling."""
        with self._lock:
            return [
                copy.deepcopy(op.body)
                for name, op in self._state.operations.items()
                if project is None or name.startswith(f"projects/{project}/")
            ]

    @property
    def requests(self) -> list[str]:
        """Every request served so far, as `METHOD /path?query`."""
        with self._lock:
            return list(self._state.requests)

    def add_network(self, project: str, name: str) -> None:
        """Give `project` a VPC network `name` besides `default` (which every project has)."""
        with self._lock:
            self._state.networks.add((project, name))

    def _node_by_id(self, node_id: str, zone: str | None) -> dict[str, Any]:
        for (_, where, name), node in self._state.nodes.items():
            if name == node_id and zone in (None, where):
                return node
        raise KeyError(f"no TPU node {node_id!r} in the fake")

    def set_node_state(self, node_id: str, state: str, zone: str | None = None) -> None:
        """Force the state of node `node_id` (e.g. STOPPED when its guest powers itself off);
        KeyError if there is none."""
        with self._lock:
            self._node_by_id(node_id, zone)["state"] = state

    def preempt(self, node_id: str, zone: str | None = None) -> dict[str, Any]:
        """Take a spot or preemptible node back as Cloud TPU does: it turns PREEMPTED (and
        stays listed until deleted) and its queued request, if any, SUSPENDED by the SERVICE.
        Returns the node; ValueError for an on-demand node, KeyError if there is none. Sources:
        Node.state PREEMPTED (discovery doc), QueuedResourceState SUSPENDED/stateInitiator
        SERVICE (google-cloud-tpu cloud_tpu.py); the 30 s notice before it is the metadata
        server's `instance/preempted`, not this."""
        with self._lock:
            node = self._node_by_id(node_id, zone)
            if not is_spot(node):
                raise ValueError(f"TPU node {node_id!r} is not spot: Cloud TPU never preempts it")
            node.update(state="PREEMPTED", health="HEALTH_UNSPECIFIED")
            self._suspend(node, "SERVICE")
            return copy.deepcopy(node)

    # -- the catalog routes ---------------------------------------------------------------

    def _list_accelerator_types(self, params: dict[str, str], query: dict[str, str], body: Any):
        base = f"projects/{params['project']}/locations/{params['zone']}/acceleratorTypes"
        items = [_accel_body(base, t.name) for t in types_in_zone(params["zone"])]
        return page(items, query, "acceleratorTypes")

    def _get_accelerator_type(self, params: dict[str, str], query: dict[str, str], body: Any):
        base = f"projects/{params['project']}/locations/{params['zone']}/acceleratorTypes"
        accel = ACCELERATOR_TYPES.get(params["type"])
        if accel is None or params["zone"] not in accel.zones:
            raise not_found(f"{base}/{params['type']}")
        return _accel_body(base, accel.name)

    def _list_runtime_versions(self, params: dict[str, str], query: dict[str, str], body: Any):
        base = f"projects/{params['project']}/locations/{params['zone']}/runtimeVersions"
        items = [{"name": f"{base}/{v}", "version": v} for v in runtimes_in_zone(params["zone"])]
        return page(items, query, "runtimeVersions")

    def _get_runtime_version(self, params: dict[str, str], query: dict[str, str], body: Any):
        base = f"projects/{params['project']}/locations/{params['zone']}/runtimeVersions"
        if params["version"] not in runtimes_in_zone(params["zone"]):
            raise not_found(f"{base}/{params['version']}")
        return {"name": f"{base}/{params['version']}", "version": params["version"]}

    # -- HTTP entry point -----------------------------------------------------------------

    def handle(self, method: str, raw_path: str, raw_body: bytes) -> tuple[int, dict[str, Any]]:
        """Serve one request: (HTTP status, JSON body)."""
        parts = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        with self._lock:
            self._state.requests.append(f"{method} {raw_path}")
        try:
            action, params = match_route(method, parts.path)
            body: Any = None
            if raw_body.strip():
                try:
                    body = json.loads(raw_body)
                except ValueError as exc:
                    raise invalid(f"Invalid JSON payload received. {exc}") from exc
            with self._lock:
                self._check_access(action, params, body)
                return 200, getattr(self, f"_{action}")(params, query, body)
        except TpuApiError as exc:
            return exc.code, exc.body()
        except Exception as exc:  # a fake bug: answer it loudly, in Google's shape
            return 500, TpuApiError(500, f"tpu fake: {exc!r}").body()


def _accel_body(base: str, name: str) -> dict[str, Any]:
    accel = ACCELERATOR_TYPES[name]
    config = {"type": accel.config_type, "topology": accel.topology}
    return {"name": f"{base}/{name}", "type": name, "acceleratorConfigs": [config]}


def start_tpu_fake(gce: GceFake) -> TpuFake:
    """A running, empty TPU fake on a free port of 127.0.0.1 beside `gce` (`.stop()` it)."""
    return TpuFake(gce).start()


@pytest.fixture
def tpu_fake() -> Iterator[TpuFake]:
    """A fresh TPU fake (over an unserved GCE fake's account) for one test, stopped after."""
    fake = start_tpu_fake(GceFake())
    try:
        yield fake
    finally:
        fake.stop()
