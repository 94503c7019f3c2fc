"""Compute Engine nodes for cloudtrain: `GcpCompute`, the GCP side of the `Compute` interface.

A node is one instance named `ct-<run>-<role>-<index>` (GCE names are unique per zone, so the
name is the create's idempotency key), labelled `cloudtrain-run`, `cloudtrain-role` and
`cloudtrain-index`, tagged with the run's network tag. The labels are the source of truth:
`list_nodes` asks GCE (one aggregated list across zones), never local state. Each run also owns
its firewall rule(s) (`network`). Every insert and delete is awaited through our own
operation-wait loop (`clients`), which is where ZONE_RESOURCE_POOL_EXHAUSTED (NoCapacityError,
the orchestrator then tries the next zone) and QUOTA_EXCEEDED (QuotaError) surface.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

from cloudtrain.core.errors import NotFound, ProviderError, TransientError
from cloudtrain.jobs import protocol
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    ProviderConfig,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
)
from cloudtrain.providers.gcp import (
    controller_identity,
    identity,
    network,
    node_bindings,
    owned,
    tpu_bodies,
    tpu_types,
)
from cloudtrain.providers.gcp.bodies import (
    CONTROLLER_ROLE,
    DEADLINE_GRACE_S,
    has_gpus,
    instance_body,
    to_node,
)
from cloudtrain.providers.gcp.clients import (
    ComputeClients,
    GcpAuth,
    operation_name,
    wait_zone_operation,
)
from cloudtrain.providers.gcp.errors import already_exists, gcp_errors
from cloudtrain.providers.gcp.images import image_for
from cloudtrain.providers.gcp.tpu_nodes import TpuNodes
from cloudtrain.providers.ownership import Refusals
from cloudtrain.providers.startup_snippets import (
    METADATA_CURL,
    node_address,
    shutdown_at_deadline,
    wait_for_driver,
)

VENV_PYTHON = "/opt/cloudtrain/venv/bin/python"
# deprecated: the option providers.gcp.service_account (read only when the option is unset)
DRIVER_WAIT_S = 900  # how long a Deep Learning VM node waits for its driver install

# the node's internal IP (GCE "About VM metadata": instance/network-interfaces/0/ip)
_METADATA = node_address(
    f'{METADATA_CURL} --retry-connrefused -H "Metadata-Flavor: Google" '
    "http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/0/ip",
    "internal IP",
)

# A URL the controller could not sign (user credentials hold no key) is fetched with the VM's
# own service account (its node's: it reads the run's prefix, writes its own keys only): a token
# from the metadata server, sent to GCS's XML API only.
_STORAGE_HEADERS = """
storage_headers() {
  case "$1" in
    https://storage.googleapis.com/*) ;;
    *) return 0 ;;
  esac
  case "$1" in *X-Goog-Signature=*) return 0 ;; esac
  local token md="${GCE_METADATA_HOST:-metadata.google.internal}"
  token="$(curl -fsS --connect-timeout 2 --max-time 10 --retry 3 --retry-max-time 30 \\
    -H "Metadata-Flavor: Google" \\
    "http://$md/computeMetadata/v1/instance/service-accounts/default/token" |
    sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p')" || return 0
  if [ -n "$token" ]; then printf 'Authorization: Bearer %s\\n' "$token"; fi
}"""

# Deep Learning VM images install the driver at first boot (install-nvidia-driver=True), in
# parallel with this script: wait for it rather than install a second driver.
_DLVM_DRIVER_WAIT = wait_for_driver("the Deep Learning VM driver install", DRIVER_WAIT_S)

_SELF_SHUTDOWN = shutdown_at_deadline(
    "the instance's maxRunDuration deletes it a little later; this stops the GPU bill on time"
)


def _json(message: Any) -> dict[str, Any]:
    """A compute_v1 message as GCE's JSON (camelCase, int64 as strings)."""
    return json.loads(type(message).to_json(message))  # type: ignore[no-any-return]


class GcpCompute(Compute):
    """Instances and firewall rules of one project and region. Thread-safe: the base class
    fans `create_node` and `delete_node` out over a thread pool."""

    provider_name = "gcp"

    def __init__(
        self,
        auth: GcpAuth,
        region: str,
        zone: str | None = None,
        config: ProviderConfig | None = None,
    ) -> None:
        self.auth = auth
        # the options (network, service_account, ssh_cidr); none: the deprecated variables
        self.config = config or ProviderConfig(name="gcp")
        self.default_zone = zone
        self.project = auth.project
        self.region = region
        self.clients = ComputeClients(auth)
        self._zones: list[str] | None = None
        self._lock = threading.Lock()
        self._iam: identity.IamClient | None = None
        self._storage_client: Any = None
        self.tpus = TpuNodes(auth, region)  # TPU VMs (strategy tpu): builds its client on first use

    # -- network and identity --------------------------------------------------------------

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """The firewall rule(s) and, unless the `service_account` option names the nodes'
        account, one service account per node id of `run.nodes` that `ensure_network` makes.
        Pure."""
        planned = [
            Resource("gcp", network.KIND_FIREWALL, name, "global", run.run_id)
            for name in network.rule_names(run)
        ]
        if self._user_account() is None:
            planned += [identity.as_resource(self.project, run.run_id, n) for n in run.nodes]
        return planned

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """The run's firewall (its TF ports from its network tag to its network tag, SSH from
        the `ssh_cidr` option only if asked), then one service account per node id of
        `run.nodes`, each with its bindings on the run's bucket: reads of the run's objects but
        its key, writes of that node's own keys only (node_bindings.py, in one policy write).
        A bucket that does not exist yet gets no binding (the accounts then reach nothing).
        Idempotent; blocks until in force (new accounts are waited for up to a minute)."""
        made = network.ensure_firewalls(
            self.clients, run, self.config.option("network"), self.config.option("ssh_cidr")
        )
        if self._user_account() is not None:
            return made
        store = _store_of(run.store_uri)
        bucket, root = (store.bucket, store.prefix) if store else (None, "")
        accounts = {node: self.iam.create(run.run_id, node, bucket) for node in run.nodes}
        emails = {
            node: identity.as_resource(self.project, run.run_id, node, account).id
            for node, account in accounts.items()
        }
        if bucket is not None and emails:
            identity.grant_nodes(
                self._storage(),
                bucket,
                f"{root}/" if root else "",
                run.run_id,
                emails,
                node_bindings.chief_of(run.nodes),
            )
        return made + [
            identity.as_resource(self.project, run.run_id, node, account)
            for node, account in accounts.items()
        ]

    def list_resources(self, run_id: str) -> list[Resource]:
        """The run's firewall rules (by name: GCE firewalls carry no labels), its node service
        accounts (by their display names, checked against their derived ids), and its
        controller's account and grants (controller_identity.find). Blocks."""
        found = network.find_firewalls(self.clients, run_id)
        accounts = identity.runs_accounts(self.iam.list(), run_id)
        found += [
            Resource(
                "gcp",
                identity.KIND_SERVICE_ACCOUNT,
                str(a["email"]),
                "global",
                run_id,
                a.get("uniqueId") and str(a["uniqueId"]),
            )
            for a in accounts
        ]
        nodes = [str(a["email"]) for a in accounts]
        user = self._user_account()
        return found + controller_identity.find(self.iam, run_id, [user] if user else nodes)

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The controller's service account, its project grants and its grant on the nodes'
        account (controller_identity.planned). Pure."""
        return controller_identity.planned(self.project, run.run_id, self._node_accounts(run))

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The controller's service account with its grants, scoped to this run: its VMs in the
        region's zones, its firewall rules, acting as each node's account, its bucket prefix
        (controller_identity). Idempotent; blocks until written (a new account is waited for)."""
        store = _store_of(run.store_uri)
        bucket, root = (store.bucket, store.prefix) if store else (None, "")
        zones = {z for z in (run.zone, self.default_zone) if z} | set(self.zones())
        return controller_identity.ensure(
            self.iam,
            self._storage(),
            run.run_id,
            sorted(zones),
            self._node_accounts(run),
            network.rule_names(dataclasses.replace(run, ssh=True)),
            bucket,
            f"{root}/" if root else "",
        )

    def delete_resources(self, resources: list[Resource]) -> None:
        """Delete the run's firewall rules, then each run service account: its bindings on the
        bucket its description names first, then the account; before them, the controller's
        grants and account (controller_identity.delete). Idempotent: missing ones are fine;
        other kinds are ignored. Blocks. What is not the run's (`owned.not_runs`: its name, and
        what carries it, read first) is never deleted: NotTheRuns names it after the others
        are (cloudtrain/providers/ownership.py)."""
        refusals = Refusals()
        mine = []
        for res in resources:
            why = owned.not_runs(self.clients, self.iam, res)
            if why is None:
                mine.append(res)
            else:
                refusals.refuse(res, why)
        self._delete_runs_own(mine)
        refusals.check()

    def _delete_runs_own(self, resources: list[Resource]) -> None:
        controller_identity.delete(self.iam, self._storage(), resources)
        for res in resources:
            if res.kind == network.KIND_FIREWALL:
                network.delete_firewall(self.clients, res.id)
        accounts = [
            (res.id, self.iam.get(res.id))
            for res in resources
            if res.kind == identity.KIND_SERVICE_ACCOUNT
        ]
        by_bucket: dict[str, list[str]] = {}
        for email, account in accounts:
            bucket = identity.bucket_of(account) if account is not None else None
            if bucket is not None:
                by_bucket.setdefault(bucket, []).append(email)
        for bucket, emails in sorted(by_bucket.items()):
            identity.revoke(self._storage(), emails, bucket)
        for email, account in accounts:
            if account is not None:
                self.iam.delete(email)

    @property
    def iam(self) -> identity.IamClient:
        """The IAM service-account client (built on first use; makes no call)."""
        with self._lock:
            if self._iam is None:
                self._iam = identity.IamClient(self.auth)
            return self._iam

    def _storage(self) -> Any:
        with self._lock:
            if self._storage_client is None:
                self._storage_client = identity.storage_client(self.auth)
            return self._storage_client

    # -- nodes -----------------------------------------------------------------------------

    def _user_account(self) -> str | None:
        """The user's own account for the nodes (`_user_account`), or None."""
        return _user_account(self.config.option("service_account"))

    def _service_account(self, run: RunInfo, node: str) -> str:
        """Node `node`'s account: the `service_account` option, else its own in the run."""
        return self._user_account() or identity.node_email(self.project, run.run_id, node)

    def _node_accounts(self, run: RunInfo) -> list[str]:
        """Every node account of the run (the controller acts as each): the `service_account`
        option's, else one per node id of `run.nodes`."""
        user = self._user_account()
        if user is not None:
            return [user]
        return [identity.node_email(self.project, run.run_id, n) for n in run.nodes]

    def _zone_of(self, run: RunInfo, request: NodeRequest) -> str:
        zone = request.zone or run.zone or self.default_zone
        if not zone:
            raise ProviderError(
                f"no zone for {request.name}: GCE creates instances in a zone",
                hint=f"set zone: in job.yaml (e.g. {self.region}-a)",
            )
        return zone

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Insert one instance and wait for its operation (not for boot). An existing live
        instance of that name is returned as is; a stopped one (preempted, or stopped by the
        cloud) is deleted and made afresh. Idempotent per name. Raises NoCapacityError (with
        the zone) for ZONE_RESOURCE_POOL_EXHAUSTED, QuotaError for QUOTA_EXCEEDED."""
        from google.cloud import compute_v1

        if _is_tpu(request.instance_type):
            return self._create_tpu(run, request)
        zone = self._zone_of(run, request)
        controller = request.role == CONTROLLER_ROLE
        if controller:  # the controller node: its own scoped account (controller_identity)
            account = controller_identity.controller_email(self.project, run.run_id)
        else:  # the node id's own account: a replacement runs as the node it replaces
            account = self._service_account(run, protocol.node_id(request.role, request.index))
        run_seconds = None
        if run.deadline is not None:
            run_seconds = run.deadline - time.time() + DEADLINE_GRACE_S
        body = instance_body(
            request,
            self.project,
            zone,
            network.network_url(self.project, self.config.option("network")),
            network.run_tag(run.run_id),
            run_seconds,
            account,
        )
        what = f"create instance {request.name} ({request.instance_type}) in {zone}"
        resource = compute_v1.Instance.from_json(json.dumps(body))
        waits_for = None if self._user_account() is not None and not controller else account
        try:
            self._insert(zone, resource, what, waits_for)
        except ProviderError as err:
            if not already_exists(err):
                raise
            existing = self._get(zone, request.name)
            if existing is not None and existing.alive:
                return existing
            if existing is not None:
                self.delete_node(existing)
            raise TransientError(
                f"{what}: an instance of that name was stopped; deleted it to make it afresh"
            ) from err
        node = self._get(zone, request.name)
        if node is None:
            raise ProviderError(f"{what}: the instance vanished right after its create")
        return node

    def _create_tpu(self, run: RunInfo, request: NodeRequest) -> Node:
        """A TPU VM (tpu_nodes.TpuNodes.create): the node id's own account, the run's network
        and tag, the runtime of the `tpu_runtime` option or the type's default. Blocks."""
        account = self._service_account(run, protocol.node_id(request.role, request.index))
        body = tpu_bodies.node_body(
            request,
            self.tpu_runtime(request.instance_type),
            network.network_url(self.project, self.config.option("network")),
            network.run_tag(run.run_id),
            account,
        )
        waits_for = None if self._user_account() is not None else account
        return self.tpus.create(request, self._zone_of(run, request), body, run.deadline, waits_for)

    def tpu_runtime(self, tpu_type: str) -> str:
        """The runtime version a node of `tpu_type` boots: the `tpu_runtime` option, else the
        type's default (tpu_types). Raises ProviderError for one that does not fit. Pure."""
        known = tpu_types.tpu_type(tpu_type)
        if known is None:
            raise ProviderError(f"{tpu_type!r} is not a Cloud TPU type cloudtrain knows")
        try:
            return tpu_types.resolved_runtime(known, self.config.option("tpu_runtime"))
        except ValueError as err:
            raise ProviderError(str(err), hint="set providers.gcp.tpu_runtime") from err

    def _insert(self, zone: str, resource: Any, what: str, new_account: str | None) -> None:
        """Insert and wait for the operation. While GCE does not know `new_account` yet (a
        run's account just made: IAM is eventually consistent) the insert is tried again
        (`identity.while_propagating`); then NotVisibleYet, a TransientError. Blocks."""

        def once() -> None:
            try:
                with gcp_errors(what, zone=zone):
                    op = self.clients.instances.insert(
                        project=self.project, zone=zone, instance_resource=resource
                    )
                wait_zone_operation(self.clients, zone, operation_name(op), what)
            except ProviderError as err:
                if new_account is None or not identity.not_visible_yet(err, new_account):
                    raise
                raise identity.NotVisibleYet(
                    f"{what}: service account {new_account} is still unknown to Compute Engine "
                    f"(IAM takes up to {identity.PROPAGATION_S:.0f}s to propagate a new account)"
                ) from err

        identity.while_propagating(once, what)

    def _get(self, zone: str, name: str) -> Node | None:
        """The node of that name in `zone`, or None. Blocks."""
        try:
            with gcp_errors(f"describe instance {name} in {zone}", zone=zone):
                inst = self.clients.instances.get(project=self.project, zone=zone, instance=name)
        except NotFound:
            return None
        return to_node(_json(inst))

    def list_nodes(self, run_id: str) -> list[Node]:
        """The run's instances in every zone, by label (one aggregated list call). Deleted
        instances are gone from GCE, so they are not listed. Blocks."""
        what = f"list the nodes of run {run_id}"
        nodes: list[Node] = []
        with gcp_errors(what):
            pager = self.clients.instances.aggregated_list(
                request={"project": self.project, "filter": f'labels.cloudtrain-run = "{run_id}"'}
            )
            for _scope, scoped in pager:
                for inst in scoped.instances:
                    node = to_node(_json(inst))
                    if node is not None and node.run_id == run_id:
                        nodes.append(node)
        nodes += self.tpus.list(run_id)  # TPU VMs and spot queued resources (strategy tpu)
        return sorted(nodes, key=lambda n: n.name)

    def inventory(self) -> list[Tagged]:
        """Every instance of the project labelled `cloudtrain-run`, in every zone (as
        `list_nodes` and so teardown reach them), every firewall rule cloudtrain made, of
        every run, with GCE's creationTimestamp, and every run's node service accounts.
        Project-wide, not only this region. Blocks; read-only."""
        out: list[Tagged] = []
        with gcp_errors("list cloudtrain's instances"):
            pager = self.clients.instances.aggregated_list(
                request={"project": self.project, "filter": "labels.cloudtrain-run:*"}
            )
            for _scope, scoped in pager:
                for inst in scoped.instances:
                    data = _json(inst)
                    node = to_node(data)
                    if node is None:
                        continue
                    region = node.zone.rsplit("-", 1)[0] if node.zone else None
                    created = network.rfc3339_epoch(data.get("creationTimestamp"))
                    out.append(
                        Tagged(node.run_id, "node", node.name, created, node.instance_type, region)
                    )
        listed = self.iam.list()
        accounts = identity.tagged(listed) + controller_identity.tagged(listed)
        out += self.tpus.inventory()  # TPU VMs and queued resources, by the same labels
        return out + network.tagged_firewalls(self.clients) + accounts

    def delete_node(self, node: Node) -> None:
        """Delete one instance and wait until it is gone. Idempotent: a missing instance is
        fine. Blocks."""
        if _is_tpu(node.instance_type):
            self.tpus.delete(node)  # with its queued resource
            return
        if node.zone:
            zones = [node.zone]
        else:  # not from a listing: find it by name
            listed = [n for n in self.list_nodes(node.run_id) if n.name == node.name and n.zone]
            for tpu in (n for n in listed if _is_tpu(n.instance_type)):
                self.tpus.delete(tpu)
            zones = [n.zone for n in listed if not _is_tpu(n.instance_type)]
        for zone in zones:
            what = f"delete instance {node.name} in {zone}"
            try:
                with gcp_errors(what, zone=zone):
                    op = self.clients.instances.delete(
                        project=self.project, zone=zone, instance=node.name
                    )
                wait_zone_operation(self.clients, zone, operation_name(op), what)
            except NotFound:
                continue

    def console_output(self, node: Node) -> str:
        """The instance's serial port 1 output ('' if none or the instance is gone). Best
        effort; blocks."""
        if not node.zone:
            return ""
        try:
            with gcp_errors(f"read the serial console of {node.name}", zone=node.zone):
                out = self.clients.instances.get_serial_port_output(
                    request={
                        "project": self.project,
                        "zone": node.zone,
                        "instance": node.name,
                        "port": 1,
                    }
                )
        except NotFound:
            return ""
        return str(out.contents or "")

    def zones(self) -> list[str]:
        """The region's zones (the catalog's naming), for capacity failover. Cached; blocks
        once."""
        with self._lock:
            if self._zones is not None:
                return list(self._zones)
        with gcp_errors(f"list the zones of {self.region}"):
            region = self.clients.regions.get(project=self.project, region=self.region)
        zones = sorted(str(z).rstrip("/").rsplit("/", 1)[-1] for z in region.zones)
        with self._lock:
            self._zones = zones
        return list(zones)

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """A venv Python (made by the script when the stack is missing), the address from the
        metadata server (unless CLOUDTRAIN_NODE_HOST is set), the VM's own token for unsigned
        GCS URLs, a wait for the Deep Learning VM
        driver install on such images, a `shutdown -h` at the deadline, and power-off when the
        agent exits. A TPU VM's also say its runtime and the TensorFlow that ships with it (the
        bootstrap uses that one) and export what TPUClusterResolver(tpu="local") needs
        (tpu_bodies.TPU_ENV_SH). Pure."""
        tpu = _is_tpu(request.instance_type)
        gpu = has_gpus(request) and not tpu  # a TPU slice's chips are no GPUs
        metadata = _METADATA + _STORAGE_HEADERS
        if gpu and image_for(request.accelerator, gpu, request.image).driver_by == "first-boot":
            metadata += _DLVM_DRIVER_WAIT
        env = {"GOOGLE_CLOUD_PROJECT": self.project}
        if tpu:  # the runtime image's TensorFlow, TPU_NAME=local
            runtime = self.tpu_runtime(request.instance_type)
            env.update(tpu_bodies.node_env(runtime, tpu_types.runtime_tensorflow(runtime)))
            metadata += tpu_bodies.TPU_ENV_SH
        return StartupBlocks(
            python=VENV_PYTHON,
            metadata=metadata,
            self_shutdown=_SELF_SHUTDOWN,
            env=env,
            install_stack=True,
            power_off="shutdown -h now",
        )


def _is_tpu(instance_type: str | None) -> bool:
    """Whether a node's instance type is a Cloud TPU type (a TPU VM, not a GCE instance). Pure."""
    return bool(instance_type) and tpu_types.tpu_type(str(instance_type)) is not None


def _user_account(configured: str | None = None) -> str | None:
    """The user's own account for the nodes: `configured` (the `service_account` option, which
    the deprecated variable still sets through provider_config), or None (the run gets its
    own). Pure."""
    return (configured or "").strip() or None


def _store_of(store_uri: str) -> Any:
    """The run's GcsStore (its bucket and prefix), or None for no gs:// store. Makes no call."""
    if not store_uri.startswith("gs://"):
        return None
    from cloudtrain.providers.gcp.storage import GcsStore

    return GcsStore(store_uri)
