"""Azure VMs for cloudtrain: `AzureCompute`, the Azure side of the `Compute` interface.

A node is one VM named `ct-<run>-<role>-<index>` in the run's resource group (`network`), tagged
`cloudtrain-run/role/index`, with a NIC (deleted with the VM), the startup script as cloud-init
`customData`, and a system-assigned managed identity. That identity gets two roles right after
the create: the subscription's node role (node_role.py: blob data actions only, none through
ARM) on the run's container only, under an ABAC condition
of that node's own (`identity.node_bucket_condition`: its keys and its role's), and "Virtual Machine
Contributor" on the VM itself, so the node can delete itself at the deadline (a stopped but
allocated Azure VM still bills). Both assignments are deleted with the node, and an evicted
VM's (Azure deletes the VM, never its role assignments) when the node is re-created or the run
torn down (`identity`). GPU nodes get the NvidiaGpuDriverLinux extension where `images.image_for`
says so. SkuNotAvailable, AllocationFailed and ZonalAllocationFailed surface as NoCapacityError,
so the orchestrator tries the next zone.
"""

from __future__ import annotations

import dataclasses
import ssl
import threading
import urllib.request
from datetime import datetime
from typing import Any

from cloudtrain.core.errors import NotFound, ProviderError
from cloudtrain.jobs import node_rights, protocol
from cloudtrain.providers.azure import controller_identity, identity, network, node_role, owned
from cloudtrain.providers.azure.account import (
    container_scope,
    default_account,
    default_container_scope,
    ensure_account,
    run_container,
)
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors
from cloudtrain.providers.azure.startup import startup_blocks
from cloudtrain.providers.azure.storage import BlobStore
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    NodeState,
    ProviderConfig,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
    parse_node_name,
    run_labels,
)
from cloudtrain.providers.ownership import Refusals

ZONES = ["1", "2", "3"]
POWER: dict[str, NodeState] = {
    "running": "running",
    "starting": "pending",
    "stopping": "stopped",
    "stopped": "stopped",
    "deallocating": "stopped",
    "deallocated": "stopped",
}


def _state(vm: Any) -> NodeState:
    """A VM's NodeState from its provisioning state and instance view."""
    provisioning = str(vm.provisioning_state or "")
    if provisioning in ("Failed", "Deleting"):
        return "terminated"
    view = getattr(vm, "instance_view", None)
    for status in getattr(view, "statuses", None) or []:
        code = str(status.code or "")
        if code.startswith("PowerState/"):
            return POWER.get(code.split("/", 1)[1], "terminated")
    return "running" if provisioning == "Succeeded" else "pending"


CONTROLLER_ROLE = "controller"  # the run's controller node (issue 17)


def _to_node(vm: Any, ips: dict[str, str]) -> Node | None:
    """A Node from a listed VM, or None when its name and tags do not make it one of ours."""
    tags = dict(vm.tags or {})
    parsed = parse_node_name(str(vm.name))
    if parsed is None or "cloudtrain-run" not in tags:
        return None
    nics = vm.network_profile.network_interfaces if vm.network_profile else []
    ip = ips.get(str(nics[0].id).lower()) if nics else None
    try:
        index = int(tags.get("cloudtrain-index", parsed[2]))
    except ValueError:
        index = parsed[2]
    return Node(
        name=str(vm.name),
        run_id=tags["cloudtrain-run"],
        role=tags.get("cloudtrain-role", parsed[1]),
        index=index,
        state=_state(vm),
        private_ip=ip,
        spot=vm.priority == "Spot",  # a str enum: str() would give its class name
        zone=(vm.zones or [None])[0],
        instance_type=str(vm.hardware_profile.vm_size) if vm.hardware_profile else None,
        cloud_id=str(vm.id),
    )


class AzureCompute(Compute):
    """VMs, their network and identities, in one subscription and region. Thread-safe: the base
    class fans `create_node` and `delete_node` out over a thread pool."""

    provider_name = "azure"
    # deleting the run's group deletes the VMs in it, the controller node's own included: the
    # controller tearing its run down deletes it last (base.Compute.holds_nodes_kinds)
    holds_nodes_kinds = frozenset({network.KIND_GROUP})

    def __init__(
        self,
        clients: ArmClients,
        region: str,
        zone: str | None = None,
        config: ProviderConfig | None = None,
    ) -> None:
        self.clients = clients
        # the options (resource_group, storage_account, ssh_cidr); none: the deprecated variables
        self.config = config or ProviderConfig(name="azure")
        self.rg: str | None = self.config.option("resource_group")
        self.storage_account: str | None = self.config.option("storage_account")
        self.region = region
        self.default_zone = zone
        self.subscription = clients.auth.subscription
        self._lock = threading.Lock()
        self._scopes: dict[str, str] = {}  # store URI -> its container's ARM scope
        self._subnets: dict[str, str] = {}  # run id -> subnet id

    # -- network ---------------------------------------------------------------------------

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """The run's resource group (or, in a user's group, its NSG and VNet). Pure."""
        return network.planned(run, self.region, self.rg)

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """Group, NSG (TF ports from the VNet only; SSH from one CIDR when asked) and VNet.
        Idempotent; blocks. The default storage account, whose container the nodes are
        granted, is made too if missing (normally `ensure_bucket` made it already), and the
        subscription's node role is created or brought up to date (node_role.py; it outlives
        the run, so it is not among the returned resources)."""
        made = network.ensure(
            self.clients, run, self.region, self.rg, self.config.option("ssh_cidr")
        )
        store = BlobStore(run.store_uri)
        if store.account == default_account(self.subscription, self.region, self.storage_account):
            ensure_account(self.clients, store.account, self.region)
        # the subscription's node role (node_role.py): not the run's, so not in `made`
        node_role.ensure(self.clients)
        return made

    def list_resources(self, run_id: str) -> list[Resource]:
        """The run's group (or NSG and VNet) that exist, and its controller's role assignments
        (by their derived ids, at the group and the run's containers). Blocks."""
        found = network.find(self.clients, run_id, self.region, self.rg)
        group = network.group_name(run_id, self.rg)
        seen: dict[str, Resource] = {}
        for container in sorted(self._containers(run_id)):
            for res in controller_identity.find(self.clients, run_id, group, container):
                seen.setdefault(res.id.lower(), res)
        return found + list(seen.values())

    # -- the controller node's identity ---------------------------------------------------

    def _controller_scopes(self, run: RunInfo) -> tuple[str, str]:
        """(group, container scope) of the run's controller grants. Raises ProviderError in a
        user's resource group: Contributor there would reach more than this run. Blocks once
        (the container's scope is looked up, then cached)."""
        if self.rg:
            raise ProviderError(
                f"run {run.run_id}: a controller node needs cloudtrain's own resource group "
                f"(providers.azure.resource_group is {self.rg!r}; Contributor there would reach "
                "more than this run)",
                hint="run with --detach --no-controller, or leave resource_group unset",
            )
        return network.group_name(run.run_id, self.rg), self._scope(run.store_uri)

    def needed_to_delete_self(self, resource: Resource) -> bool:
        """Only the grants at the run's resource group (Contributor deletes the VM); the
        container-scope ones go before the VM's delete, outside the guest's shutdown. Pure."""
        return "/containers/" not in resource.id.lower()

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The controller's four role assignments (controller_identity), by their ids. Pure
        but for one cached lookup of the container's scope."""
        group, container = self._controller_scopes(run)
        return controller_identity.planned(run.run_id, group, container, self.subscription)

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """Nothing to create yet: the controller runs under its VM's system-assigned identity,
        which `create_node` grants the four assignments right after the VM exists (as it does
        for the nodes). Checks the scopes (a user's group is refused). Idempotent; blocks."""
        self._controller_scopes(run)
        return []

    def delete_resources(self, resources: list[Resource]) -> None:
        """Remove what is left of the run's node grants (an evicted node's, which nothing else
        removes), then delete the run's group (everything left in it goes too), never a user's
        group. Idempotent; blocks; run after the nodes are deleted. Each is checked to be its
        run's first (`owned.not_runs`: its name and tag read from ARM, or a role assignment's
        derived id): NotTheRuns, after the others are deleted, names what was refused
        (cloudtrain/providers/ownership.py)."""
        refusals = Refusals()
        mine = []
        for res in resources:
            why = owned.not_runs(self.clients, res, self.rg)
            if why is None:
                mine.append(res)
            else:
                refusals.refuse(res, why)
        controller_identity.revoke(
            self.clients, [r.id for r in mine if r.kind == controller_identity.KIND]
        )
        for run_id in sorted({r.run_id for r in resources if r.run_id}):
            self._revoke_run_grants(run_id)
        network.delete(self.clients, mine, self.rg)
        refusals.check()

    def _revoke_run_grants(self, run_id: str) -> None:
        """Remove every grant cloudtrain made for a node of run `run_id` at its containers (and
        the same identities' grants on their VMs). Idempotent; blocks."""

        def of_run(node: str) -> bool:
            parsed = parse_node_name(node)
            return parsed is not None and parsed[0] == run_id

        group = network.group_name(run_id, self.rg)
        identity.revoke_stale(self.clients, self._containers(run_id), group, of_run)

    def _containers(self, run_id: str) -> set[str]:
        """Scopes that may hold the grants of run `run_id`'s nodes: its container in the default
        account, and the containers this process has granted on."""
        default = default_container_scope(
            self.subscription, self.region, run_container(run_id), self.storage_account
        )
        with self._lock:
            return {default, *self._scopes.values()}

    # -- nodes -----------------------------------------------------------------------------

    def _scope(self, store_uri: str) -> str:
        with self._lock:
            if store_uri in self._scopes:
                return self._scopes[store_uri]
        scope = container_scope(
            self.clients, BlobStore(store_uri), self.region, self.storage_account
        )
        with self._lock:
            self._scopes[store_uri] = scope
        return scope

    def _subnet(self, run_id: str) -> str:
        with self._lock:
            if run_id in self._subnets:
                return self._subnets[run_id]
        subnet = network.subnet_id(self.clients, run_id, self.rg)
        with self._lock:
            self._subnets[run_id] = subnet
        return subnet

    def _vm(self, group: str, name: str) -> Any | None:
        try:
            with azure_errors(f"describe VM {name} in {group}"):
                return self.clients.compute.virtual_machines.get(group, name, expand="instanceView")
        except NotFound:
            return None

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Create one VM (NIC first) and wait for it, then grant its identity the run's
        container and itself; a GPU node on the default image gets the driver extension (not
        awaited). An existing live VM of that name is returned; a failed or stopped one is
        deleted and made afresh. Raises NoCapacityError (with the zone) or QuotaError."""
        from cloudtrain.providers.azure.bodies import (
            driver_extension_body,
            throwaway_ssh_key,
            vm_body,
        )
        from cloudtrain.providers.azure.images import image_for

        group, name = network.group_name(run.run_id, self.rg), request.name
        if request.role == CONTROLLER_ROLE:  # on demand, the default CPU image, no GPU
            request = dataclasses.replace(
                request, spot=False, accelerator=None, accelerator_count=0, image=None
            )
        zone = request.zone or run.zone or self.default_zone
        existing = self._vm(group, name)
        if existing is not None:
            if _state(existing) in ("pending", "running"):
                node = _to_node(existing, network.private_ips(self.clients, run.run_id, self.rg))
                if node is not None:  # a retried create: its grants may not have been made
                    self._grant(run, existing, self._scope(run.store_uri))
                    return node
            self.delete_node(Node(name, run.run_id, request.role, request.index, "stopped"))
        gpu = request.accelerator_count > 0
        image = image_for(request.instance_type, gpu, request.image)
        scope = self._scope(run.store_uri)
        nic, private_ip = network.ensure_nic(
            self.clients, run, name, self.region, zone, self._subnet(run.run_id), self.rg
        )
        tags = run_labels(run.run_id, request.role, request.index)
        body = vm_body(request, self.region, zone, nic, throwaway_ssh_key(), image, tags)
        where = f"{self.region} zone {zone}" if zone else self.region
        what = f"create VM {name} ({request.instance_type}) in {where}"
        with azure_errors(what, zone=zone):
            vm = self.clients.compute.virtual_machines.begin_create_or_update(
                group, name, body
            ).result()
        self._grant(run, vm, scope)
        if image.driver_extension:  # only ever on a GPU size its manifest lists
            with azure_errors(f"add the NVIDIA driver extension to {name}"):
                self.clients.compute.virtual_machine_extensions.begin_create_or_update(
                    group, name, "NvidiaGpuDriverLinux", driver_extension_body(self.region, tags)
                )
        node = _to_node(vm, {nic.lower(): private_ip} if private_ip else {})
        assert node is not None  # the tags above make it ours
        return node

    def _grant(self, run: RunInfo, vm: Any, scope: str) -> None:
        """Grant VM `vm`'s identity the run's container (`scope`) and the VM itself, after
        removing the grants of the node's earlier identities (an evicted VM's: Azure leaves
        them); the controller VM gets the controller's grants instead (controller_identity).
        Idempotent; blocks."""
        tags = dict(getattr(vm, "tags", None) or {})
        if tags.get("cloudtrain-role") == CONTROLLER_ROLE:
            group, container = self._controller_scopes(run)
            principal = str(vm.identity.principal_id)
            controller_identity.grant(self.clients, run.run_id, group, container, principal)
            return
        from cloudtrain.providers.azure.bodies import VIRTUAL_MACHINE_CONTRIBUTOR

        name, principal = str(vm.name), str(vm.identity.principal_id)
        group = network.group_name(run.run_id, self.rg)
        identity.revoke_stale(self.clients, [scope], group, name.__eq__, keep=[principal])
        node = protocol.node_id(tags["cloudtrain-role"], int(tags["cloudtrain-index"]))
        # the chief among the plan's node ids (RunInfo.nodes); a caller that gives none gets
        # chief_of of the node alone: chief-0 and worker-0 have the chief's keys then
        chief = node == node_rights.chief_of(run.nodes or (node,))
        prefix = BlobStore(run.store_uri).prefix
        only = identity.node_bucket_condition(prefix, run.run_id, node, chief=chief)
        blob_role = node_role.role_guid(self.subscription)  # data actions only, no ARM action
        identity.grant(self.clients, scope, blob_role, principal, name, only)
        identity.grant(self.clients, str(vm.id), VIRTUAL_MACHINE_CONTRIBUTOR, principal, name)

    def list_nodes(self, run_id: str) -> list[Node]:
        """The run's VMs (tags in its group) with their power state. Blocks."""
        group = network.group_name(run_id, self.rg)
        try:
            with azure_errors(f"list the VMs of run {run_id}"):
                vms = list(self.clients.compute.virtual_machines.list(group, expand="instanceView"))
        except NotFound:
            return []
        ips = network.private_ips(self.clients, run_id, self.rg) if vms else {}
        nodes = [n for vm in vms if (n := _to_node(vm, ips)) is not None and n.run_id == run_id]
        return sorted(nodes, key=lambda n: n.name)

    def inventory(self) -> list[Tagged]:
        """Every run's VMs in this region and subscription (tagged `cloudtrain-run`, in the
        group `list_nodes` looks in; with ARM's timeCreated) and network resources (see
        `network.tagged`). Blocks; read-only."""
        with azure_errors("list the subscription's VMs"):
            vms = list(self.clients.compute.virtual_machines.list_all())
        out: list[Tagged] = []
        for vm in vms:
            node = _to_node(vm, {})
            parts = str(vm.id or "").split("/")
            group = parts[4] if len(parts) > 4 and parts[3].lower() == "resourcegroups" else ""
            if node is None or group.lower() != network.group_name(node.run_id, self.rg).lower():
                continue
            if not network.same_region(vm.location, self.region):
                continue
            created = getattr(vm, "time_created", None)
            when = created.timestamp() if isinstance(created, datetime) else None
            itype = node.instance_type
            out.append(Tagged(node.run_id, "node", node.name, when, itype, self.region))
        return out + network.tagged(self.clients, self.region, self.rg)

    def delete_node(self, node: Node) -> None:
        """Remove the node's role assignments, then delete the VM (its NIC, disk and public IP
        go with it) and wait. Idempotent: a missing VM is fine. Blocks.

        The assignments are found through the VM's identity (any scope), and by their names
        (derived from scope, role and principal) at the VM and the run's containers; an evicted
        VM's, whose identity is gone, are found by `delete_resources` and `create_node`."""
        group = network.group_name(node.run_id, self.rg)
        for assignment_id in self._grants_of(node, group):
            try:
                with azure_errors(f"remove a role of {node.name}"):
                    self.clients.authorization.role_assignments.delete_by_id(assignment_id)
            except NotFound:
                pass
        try:
            with azure_errors(f"delete VM {node.name} in {group}"):
                self.clients.compute.virtual_machines.begin_delete(group, node.name).result()
        except NotFound:
            return

    def _grants_of(self, node: Node, group: str) -> list[str]:
        """Ids of the role assignments the node's current identity holds (none once its VM is
        gone). Blocks."""
        vm = self._vm(group, node.name)
        principal = getattr(getattr(vm, "identity", None), "principal_id", None)
        if not principal:
            return []
        ids = {identity.vm_grant_id(self.subscription, group, node.name, str(principal))}
        for scope in self._containers(node.run_id):
            role = node_role.role_guid(self.subscription)
            ids.add(identity.assignment_id(scope, role, str(principal)))
        with azure_errors(f"list the roles of {node.name}"):
            found = self.clients.authorization.role_assignments.list_for_scope(
                f"/subscriptions/{self.subscription}", filter=f"principalId eq '{principal}'"
            )
            ids.update(str(a.id) for a in found)
        return sorted(ids)

    def console_output(self, node: Node) -> str:
        """The VM's serial log from boot diagnostics ('' if none or the VM is gone). Best
        effort; blocks."""
        group = network.group_name(node.run_id, self.rg)
        try:
            with azure_errors(f"read the serial log of {node.name}"):
                data = self.clients.compute.virtual_machines.retrieve_boot_diagnostics_data(
                    group, node.name
                )
        except (NotFound, ProviderError):
            return ""
        url = getattr(data, "serial_console_log_blob_uri", None)
        if not url:
            return ""
        context = ssl.create_default_context(cafile=self.clients.auth.verify)
        try:
            with urllib.request.urlopen(url, timeout=30, context=context) as resp:
                return bytes(resp.read()).decode(errors="replace")
        except OSError:
            return ""

    def zones(self) -> list[str]:
        """Availability zones to fail over to when the region has no capacity."""
        return list(ZONES)

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """See `providers/azure/startup.py`. Pure."""
        from cloudtrain.providers.azure.images import image_for

        gpu = request.accelerator_count > 0
        return startup_blocks(image_for(request.instance_type, gpu, request.image).driver_extension)
