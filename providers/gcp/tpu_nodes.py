"""Cloud TPU VMs through the TPU API v2 (google-cloud-tpu's `tpu_v2.TpuClient`, REST): create,
describe, list, delete, and `gc`'s inventory. `GcpCompute` routes a node here when its instance
type is a TPU type (providers/gcp/tpu_types.py); bodies and read-backs are in tpu_bodies.py.

On demand, a node is one `nodes.create` (node id = the node's name). Spot, it is a queued resource
of that name (tpu_bodies.queued_body) waited for until ACTIVE: a request that stays waiting for
resources past the wait (`QUEUED_WAIT_S`, capped by the run's deadline) or that FAILED for want of
capacity is deleted and reported as a zone without capacity (NoCapacityError), so the run tries the
region's next zone as it does for a sold-out GCE zone.

Listing asks each zone that sells a TPU type cloudtrain may create (tpu_types' table: the
spec refuses any other, so no cloudtrain TPU VM lives elsewhere): the region's for `list`, all of
them for `gc`'s inventory (the list methods take one location; no page in reach documents a
wildcard location for them:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/list). It keeps what
carries the run's labels, so `down` after a kill -9 and `gc` find TPU VMs and queued resources as
they find instances; a region that sells no TPU costs no call. A project whose TPU API is off, an
identity that may not list TPUs, and a test box without a TPU fake (`CLOUDTRAIN_GCE_ENDPOINT` set,
`CLOUDTRAIN_TPU_ENDPOINT` not) have no TPU VMs to list: the listing is empty there, never an error
for a run without TPUs.

Every long-running operation is polled here with `get_operation` (never `Operation.result()`,
whose default polling waits up to a minute between asks).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cloudtrain.core import env
from cloudtrain.core.errors import (
    CloudtrainError,
    CredentialsError,
    NoCapacityError,
    NotFound,
    ProviderError,
    QuotaError,
    TransientError,
)
from cloudtrain.providers.base import Node, NodeRequest, Tagged
from cloudtrain.providers.gcp import identity, network, tpu_bodies, tpu_types
from cloudtrain.providers.gcp.clients import GcpAuth
from cloudtrain.providers.gcp.errors import (
    RATE_CODES,
    SDK_EXCEPTIONS,
    SERVICE_DISABLED_CODES,
    already_exists,
    error_codes,
    gcp_errors,
    translate,
)

ENDPOINT_ENV = env.TPU_ENDPOINT.name
OPERATION_TIMEOUT_S = 900.0  # a TPU VM create takes minutes
# how long a spot node's queued resource may wait for capacity: the run's boot timeout
# (jobspec/run_options.py RunOptions.boot_timeout_s), which it counts against anyway
QUEUED_WAIT_S = 1200.0
QUEUED_GRACE_S = 60.0  # a queued resource's validUntilDuration outlasts the wait by this much
POLL_S = (0.2, 5.0)  # first and longest pause between polls of an operation or a queued resource
# google.rpc.Code RESOURCE_EXHAUSTED: the TPU API's answer both for no capacity in the zone and for
# an exhausted quota (the message tells them apart)
RESOURCE_EXHAUSTED = 8
DEADLINE_EXCEEDED = 4  # google.rpc.Code: a queued resource whose valid-until time passed
CAPACITY_HINT = "cloudtrain tries the region's next zone; a spot TPU may be sold out for hours"
QUOTA_HINT = (
    "ask Google Cloud to raise the TPU quota it names (console: IAM & Admin > Quotas), or choose "
    "another region, TPU type or spot"
)


def tpu_client(auth: GcpAuth) -> Any | None:
    """A `tpu_v2.TpuClient` (REST) for `auth`, at $CLOUDTRAIN_TPU_ENDPOINT when set (anonymous
    credentials: the box's TPU fake), or None on a test box that fakes Compute Engine but not the
    TPU API (it has no TPU VMs). Makes no call."""
    endpoint = env.TPU_ENDPOINT.text() or None
    if endpoint is None and auth.endpoint is not None:
        return None
    from google.cloud import tpu_v2

    kwargs: dict[str, Any] = {"credentials": auth.credentials, "transport": "rest"}
    if endpoint is not None:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        kwargs["credentials"] = AnonymousCredentials()
        kwargs["client_options"] = ClientOptions(api_endpoint=endpoint)
    with gcp_errors("open a Cloud TPU client"):
        return tpu_v2.TpuClient(**kwargs)


def _json(message: Any) -> dict[str, Any]:
    """A proto-plus message as the API's JSON (camelCase, enums by name as the API sends them)."""
    text = type(message).to_json(message, use_integers_for_enums=False)
    return json.loads(text)  # type: ignore[no-any-return]


def status_error(what: str, code: int, message: str, zone: str | None) -> CloudtrainError:
    """The cloudtrain error of a TPU API `google.rpc.Status` (a failed operation or queued
    resource): RESOURCE_EXHAUSTED is an exhausted quota (QuotaError) when its message names a
    quota, else no capacity in the zone (NoCapacityError); others as `errors.translate`. Pure."""
    from google.api_core import exceptions as api

    err = translate(api.from_grpc_status(code, message or f"code {code}"), what, zone)
    if code == RESOURCE_EXHAUSTED and "quota" in message.lower():
        return QuotaError(err.message, hint=QUOTA_HINT, codes=error_codes(err))
    if code == RESOURCE_EXHAUSTED:
        return NoCapacityError(
            f"{what}: {message} (zone {zone})",
            zone=zone,
            hint=CAPACITY_HINT,
            codes=error_codes(err),
        )
    return err


@contextlib.contextmanager
def tpu_errors(what: str, zone: str | None = None) -> Iterator[None]:
    """`errors.gcp_errors`, but a 429 RESOURCE_EXHAUSTED that names a quota ("Quota limit
    'TPUV5sLitepodPerProjectPerRegionForTPUAPI' has been exceeded. Limit: 8 in region ...", the
    TPU API's words, not Compute Engine's "Quota '...' exceeded" that `errors` reads) is a
    QuotaError, never a retried TransientError; a request-rate limit stays transient."""
    try:
        yield
    except SDK_EXCEPTIONS as exc:
        err = translate(exc, what, zone)
        status = getattr(exc, "code", None)
        rate = bool(error_codes(err) & RATE_CODES)
        if status == 429 and not rate and "quota" in str(err.message).lower():
            raise QuotaError(err.message, hint=QUOTA_HINT, codes=error_codes(err)) from exc
        raise err from exc


class TpuNodes:
    """The TPU VMs and queued resources of one project. Thread-safe (the client is built once,
    under a lock; the REST client is safe from many threads)."""

    def __init__(
        self,
        auth: GcpAuth,
        region: str | None,
        queued_wait_s: float = QUEUED_WAIT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.auth = auth
        self.project = auth.project
        self.region = region
        self.queued_wait_s = queued_wait_s
        self._sleep = sleep
        self._lock = threading.Lock()
        self._client: Any = None
        self._built = False

    @property
    def client(self) -> Any | None:
        """The TpuClient (built on first use), or None where there is no TPU API to call."""
        with self._lock:
            if not self._built:
                self._client = tpu_client(self.auth)
                self._built = True
            return self._client

    def _need(self, what: str) -> Any:
        client = self.client
        if client is None:
            raise ProviderError(
                f"{what}: no Cloud TPU API on this test box",
                hint=f"set {ENDPOINT_ENV} to the TPU fake's endpoint",
            )
        return client

    # -- create ------------------------------------------------------------------------------

    def create(
        self,
        request: NodeRequest,
        zone: str,
        body: dict[str, Any],
        deadline: float | None,
        new_account: str | None,
    ) -> Node:
        """Create the TPU VM of `body` (tpu_bodies.node_body) in `zone`: a node (on demand) or a
        spot queued resource waited for until ACTIVE. Returns without waiting for boot. An
        existing live node of that name is returned as is (idempotent per name); a dead one, or
        a queued resource that failed or lost its VM, is deleted and a TransientError raised so
        the retry makes it afresh. Raises NoCapacityError(zone) when the zone has no capacity,
        does not sell the type (tpu_types; no call: the run's failover then tries its region's
        next zone), or a queued resource is not fulfilled in time (it is deleted first), and
        QuotaError for a quota.
        While `new_account` (a run's service account just made) is unknown, the create is tried
        again (identity.while_propagating). Blocks."""
        what = f"create TPU VM {request.name} ({request.instance_type}) in {zone}"
        known = tpu_types.tpu_type(request.instance_type)
        if known is not None and zone not in known.zones:  # capacity failover's other zones
            raise NoCapacityError(
                f"{what}: the zone does not sell {request.instance_type} (sold in "
                f"{', '.join(known.zones)})",
                zone=zone,
                hint="set zone: in job.yaml to one that sells it",
            )
        client = self._need(f"create TPU VM {request.name}")
        wait_s = self.queued_wait_s
        if deadline is not None:
            wait_s = max(1.0, min(wait_s, deadline - time.time()))
        try:
            self._propagating(
                lambda: self._create_once(client, request, zone, body, wait_s, what),
                what,
                new_account,
            )
        except ProviderError as err:
            if not already_exists(err):
                raise
            existing = self.get(zone, request.name)
            if existing is not None and existing.alive and not request.spot:
                return existing
            if request.spot and (existing is None or existing.alive):
                return self._await_queued(zone, request.name, wait_s, what)
            if existing is not None:
                self.delete(existing)
            raise TransientError(
                f"{what}: a TPU VM of that name was {existing.state if existing else 'gone'}; "
                "deleted it to make it afresh"
            ) from err
        if request.spot:
            return self._await_queued(zone, request.name, wait_s, what)
        node = self.get(zone, request.name)
        if node is None:
            raise ProviderError(f"{what}: the TPU VM vanished right after its create")
        return node

    def _create_once(
        self,
        client: Any,
        request: NodeRequest,
        zone: str,
        body: dict[str, Any],
        wait_s: float,
        what: str,
    ) -> None:
        from google.cloud import tpu_v2

        parent = tpu_bodies.location(self.project, zone)
        with tpu_errors(what, zone=zone):
            if request.spot:
                # lapses a minute after this wait gives up and deletes it: a backstop should
                # that delete never come (a controller killed while it waited)
                valid_s = wait_s + QUEUED_GRACE_S
                queued = tpu_bodies.queued_body(self.project, zone, request.name, body, valid_s)
                op = client.create_queued_resource(
                    request={
                        "parent": parent,
                        "queued_resource_id": request.name,
                        "queued_resource": tpu_v2.QueuedResource.from_json(json.dumps(queued)),
                    }
                )
            else:
                op = client.create_node(
                    request={
                        "parent": parent,
                        "node_id": request.name,
                        "node": tpu_v2.Node.from_json(json.dumps(body)),
                    }
                )
        self._wait(client, op.operation.name, what, zone)

    def _propagating(self, once: Callable[[], None], what: str, account: str | None) -> None:
        """`once()`, tried again while the TPU API does not know `account` yet."""

        def attempt() -> None:
            try:
                once()
            except ProviderError as err:
                if account is None or not identity.not_visible_yet(err, account):
                    raise
                raise identity.NotVisibleYet(
                    f"{what}: service account {account} is still unknown to Cloud TPU (IAM "
                    f"takes up to {identity.PROPAGATION_S:.0f}s to propagate a new account)"
                ) from err

        identity.while_propagating(attempt, what)

    def _await_queued(self, zone: str, name: str, wait_s: float, what: str) -> Node:
        """Poll the queued resource `name` until ACTIVE and return its node. FAILED, or still
        waiting after `wait_s`: it is deleted (force) and NoCapacityError (or the error it
        failed with) raised; SUSPENDED (its VM taken back before it booted): deleted, and a
        TransientError. Blocks."""
        client = self._need(what)
        path = f"{tpu_bodies.location(self.project, zone)}/queuedResources/{name}"
        deadline = time.monotonic() + wait_s
        pause = POLL_S[0]
        while True:
            with gcp_errors(f"describe queued resource {name} in {zone}", zone=zone):
                data = _json(client.get_queued_resource(name=path))
            state = tpu_bodies.queued_state(data)
            if state == "ACTIVE":
                node = self.get(zone, name)
                if node is not None:
                    return node
            elif state == "FAILED":
                code, message = tpu_bodies.queued_error(data)
                self._delete_queued(client, zone, name)
                if code in (0, DEADLINE_EXCEEDED):  # its validUntilDuration lapsed unfulfilled
                    raise NoCapacityError(
                        f"{what}: the queued resource failed unfulfilled (zone {zone}): "
                        f"{message or 'no reason given'}",
                        zone=zone,
                        hint=CAPACITY_HINT,
                    )
                raise status_error(what, code, message, zone)
            elif state in tpu_bodies.QUEUED_LOST:
                self._delete_queued(client, zone, name)
                raise TransientError(f"{what}: the queued resource was {state}; deleted it")
            if time.monotonic() >= deadline:
                self._delete_queued(client, zone, name)
                raise NoCapacityError(
                    f"{what}: the spot queued resource was still {state or 'not ACTIVE'} after "
                    f"{wait_s:.0f}s (zone {zone}); deleted it",
                    zone=zone,
                    hint=CAPACITY_HINT,
                )
            self._sleep(pause)
            pause = min(POLL_S[1], pause * 2)

    def _wait(self, client: Any, operation: str, what: str, zone: str | None) -> None:
        """Poll the long-running operation until done; raise the error it finished with."""
        deadline = time.monotonic() + OPERATION_TIMEOUT_S
        pause = POLL_S[0]
        while True:
            with gcp_errors(f"wait for: {what}", zone=zone):
                op = client.get_operation(request={"name": operation})
            if op.done:
                break
            if time.monotonic() >= deadline:
                raise TransientError(
                    f"{what}: not done after {OPERATION_TIMEOUT_S:.0f}s (operation {operation})"
                )
            self._sleep(pause)
            pause = min(POLL_S[1], pause * 2)
        if op.HasField("error") and op.error.code:
            raise status_error(what, op.error.code, op.error.message, zone)

    # -- read --------------------------------------------------------------------------------

    def get(self, zone: str, name: str) -> Node | None:
        """The node of that name in `zone` (its TPU VM, else its queued resource as a pending or
        lost node), or None. Blocks."""
        client = self._need(f"describe TPU VM {name}")
        loc = tpu_bodies.location(self.project, zone)
        try:
            with gcp_errors(f"describe TPU VM {name} in {zone}", zone=zone):
                return tpu_bodies.to_node(_json(client.get_node(name=f"{loc}/nodes/{name}")))
        except NotFound:
            pass
        try:
            with gcp_errors(f"describe queued resource {name} in {zone}", zone=zone):
                data = _json(client.get_queued_resource(name=f"{loc}/queuedResources/{name}"))
        except NotFound:
            return None
        return tpu_bodies.queued_to_node(data)

    def _listed(self, zones: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every TPU VM and every queued resource of the project in `zones`, as JSON; none where
        there is no TPU API, it is off, or this identity may not list them. Blocks."""
        client = self.client if zones else None
        if client is None:
            return [], []
        nodes: list[dict[str, Any]] = []
        queued: list[dict[str, Any]] = []
        try:
            for zone in zones:
                parent = tpu_bodies.location(self.project, zone)
                with gcp_errors(f"list the TPU VMs in {zone}", zone=zone):
                    nodes += [_json(n) for n in client.list_nodes(parent=parent)]
                with gcp_errors(f"list the TPU queued resources in {zone}", zone=zone):
                    queued += [_json(q) for q in client.list_queued_resources(parent=parent)]
        except CredentialsError as err:  # a missing tpu.nodes.list: it made no TPU VM either
            if error_codes(err) & {"403"} or "Permission" in err.message:
                return [], []
            raise
        except ProviderError as err:
            if error_codes(err) & SERVICE_DISABLED_CODES:  # the API is off: no TPU VMs
                return [], []
            raise
        return nodes, queued

    def list(self, run_id: str | None = None) -> list[Node]:
        """The TPU nodes of `run_id` (every run's when None), by label: each TPU VM, and each
        queued resource without its VM as a pending (or lost) node, in the region's TPU zones.
        Blocks."""
        nodes_data, queued_data = self._listed(tpu_zones(self.region))
        nodes = [n for n in map(tpu_bodies.to_node, nodes_data) if n is not None]
        names = {(n.zone, n.name) for n in nodes}
        for data in queued_data:
            node = tpu_bodies.queued_to_node(data)
            if node is not None and (node.zone, node.name) not in names:
                nodes.append(node)
        return sorted(
            (n for n in nodes if run_id is None or n.run_id == run_id), key=lambda n: n.name
        )

    def inventory(self) -> list[Tagged]:
        """Every cloudtrain TPU VM and queued resource of the project, each a "node" of its run
        (the name `list` reports), with the API's createTime, in every TPU zone (project-wide,
        as GCE's inventory). Blocks; read-only."""
        nodes_data, queued_data = self._listed(tpu_zones(None))
        out: dict[tuple[str | None, str], Tagged] = {}
        for data, node in [(d, tpu_bodies.queued_to_node(d)) for d in queued_data] + [
            (d, tpu_bodies.to_node(d)) for d in nodes_data
        ]:
            if node is None:
                continue
            region = node.zone.rsplit("-", 1)[0] if node.zone else None
            created = network.rfc3339_epoch(data.get("createTime"))
            out[(node.zone, node.name)] = Tagged(
                node.run_id, "node", node.name, created, node.instance_type, region
            )
        return list(out.values())

    # -- delete ------------------------------------------------------------------------------

    def delete(self, node: Node) -> None:
        """Delete the node's queued resource (force: with its TPU VM) and its TPU VM, and wait
        until both are gone. Idempotent: missing ones are fine. Blocks."""
        client = self._need(f"delete TPU VM {node.name}")
        zones = (
            [node.zone]
            if node.zone
            else sorted({n.zone for n in self.list(node.run_id) if n.name == node.name and n.zone})
        )
        for zone in zones:
            self._delete_queued(client, zone, node.name)
            what = f"delete TPU VM {node.name} in {zone}"
            path = f"{tpu_bodies.location(self.project, zone)}/nodes/{node.name}"
            try:
                with gcp_errors(what, zone=zone):
                    op = client.delete_node(name=path)
                self._wait(client, op.operation.name, what, zone)
            except NotFound:
                continue

    def _delete_queued(self, client: Any, zone: str, name: str) -> None:
        """Delete queued resource `name` with `force` (its VM too) and wait until it is gone;
        one already DELETING (the API refuses a second delete) is waited for. Missing is fine.
        Blocks."""
        what = f"delete queued resource {name} in {zone}"
        path = f"{tpu_bodies.location(self.project, zone)}/queuedResources/{name}"
        deadline = time.monotonic() + OPERATION_TIMEOUT_S
        pause = POLL_S[0]
        try:
            while True:
                with gcp_errors(f"describe queued resource {name} in {zone}", zone=zone):
                    data = _json(client.get_queued_resource(name=path))
                if tpu_bodies.queued_state(data) != "DELETING":
                    break
                if time.monotonic() >= deadline:
                    raise TransientError(f"{what}: still DELETING after {OPERATION_TIMEOUT_S:.0f}s")
                self._sleep(pause)
                pause = min(POLL_S[1], pause * 2)
            with gcp_errors(what, zone=zone):
                op = client.delete_queued_resource(request={"name": path, "force": True})
            self._wait(client, op.operation.name, what, zone)
        except NotFound:
            return


def tpu_zones(region: str | None) -> list[str]:
    """The zones that sell a TPU type cloudtrain may create (tpu_types), in `region` (all when
    None). Pure."""
    zones = {z for t in tpu_types.TPU_TYPES.values() for z in t.zones}
    return sorted(z for z in zones if region is None or z.rsplit("-", 1)[0] == region)
