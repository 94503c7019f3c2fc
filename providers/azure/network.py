"""The run's network on Azure: its resource group, NSG, VNet/subnet, and each node's NIC.

By default every run has its own resource group `cloudtrain-<run_id>` (tagged `cloudtrain-run`),
so deleting that group after the VMs leaves nothing behind. With the `resource_group` option (its
deprecated variable still sets it, through provider_config) the run uses that existing group,
which is never deleted: then only the run's own NSG and VNet (`ct-<run_id>-nsg`,
`ct-<run_id>-vnet`) are. The NSG admits the TensorFlow ports from the VNet's address space only,
and SSH from the `ssh_cidr` option only when asked; NICs get a public IP only with SSH.
"""

from __future__ import annotations

from typing import Any

from cloudtrain.core.errors import NotFound, ProviderError
from cloudtrain.providers.azure.clients import ArmClients
from cloudtrain.providers.azure.errors import azure_errors
from cloudtrain.providers.base import Resource, RunInfo, Tagged, run_labels

KIND_GROUP, KIND_NSG, KIND_VNET = "resource-group", "nsg", "vnet"
TAG_RUN = "cloudtrain-run"
SUBNET = "nodes"


def user_group(configured: str | None = None) -> str | None:
    """The existing group every run uses: `configured` (the `resource_group` option, which the
    deprecated variable still sets through provider_config), or None (a group per run). Every
    function below takes the option as `rg`. Pure."""
    return (configured or "").strip() or None


def group_name(run_id: str, rg: str | None = None) -> str:
    """The resource group of a run's resources (`rg`: the `resource_group` option)."""
    return user_group(rg) or f"cloudtrain-{run_id}"


def nsg_name(run_id: str) -> str:
    """The run's network security group."""
    return f"ct-{run_id}-nsg"


def vnet_name(run_id: str) -> str:
    """The run's virtual network."""
    return f"ct-{run_id}-vnet"


def nic_name(node: str) -> str:
    """A node's network interface."""
    return f"{node}-nic"


def planned(run: RunInfo, region: str, rg: str | None = None) -> list[Resource]:
    """What `ensure` makes, for the ledger: the run's group, or in a user's group the NSG and
    VNet. Pure."""
    if user_group(rg) is None:
        return [Resource("azure", KIND_GROUP, group_name(run.run_id, rg), region, run.run_id)]
    return [
        Resource("azure", KIND_NSG, nsg_name(run.run_id), region, run.run_id),
        Resource("azure", KIND_VNET, vnet_name(run.run_id), region, run.run_id),
    ]


def ensure(
    clients: ArmClients,
    run: RunInfo,
    region: str,
    rg: str | None = None,
    cidr: str | None = None,
) -> list[Resource]:
    """The run's group (unless a user's), NSG (SSH from `cidr`, the `ssh_cidr` option) and VNet
    with its subnet. Idempotent (PUTs are create-or-update); blocks until all are provisioned."""
    from cloudtrain.providers.azure.bodies import nsg_body, vnet_body

    tags = run_labels(run.run_id)
    nsg = nsg_body(run, region, tags, cidr)  # a bad port range or SSH CIDR fails before any create
    group = group_name(run.run_id, rg)
    if user_group(rg) is None:
        with azure_errors(f"create resource group {group} in {region}"):
            clients.resource.resource_groups.create_or_update(
                group, {"location": region, "tags": tags}
            )
    with azure_errors(f"create network security group {nsg_name(run.run_id)} in {group}"):
        made = clients.network.network_security_groups.begin_create_or_update(
            group, nsg_name(run.run_id), nsg
        ).result()
    with azure_errors(f"create virtual network {vnet_name(run.run_id)} in {group}"):
        clients.network.virtual_networks.begin_create_or_update(
            group, vnet_name(run.run_id), vnet_body(region, str(made.id), tags)
        ).result()
    return planned(run, region, rg)


def subnet_id(clients: ArmClients, run_id: str, rg: str | None = None) -> str:
    """The id of the run's subnet. Raises ProviderError before `ensure`. Blocks."""
    group = group_name(run_id, rg)
    try:
        with azure_errors(f"look up the subnet of run {run_id}"):
            return str(clients.network.subnets.get(group, vnet_name(run_id), SUBNET).id)
    except NotFound:
        raise ProviderError(
            f"run {run_id} has no network in {group}",
            hint="ensure_network must run before create_node",
        ) from None


def ensure_nic(
    clients: ArmClients,
    run: RunInfo,
    node: str,
    region: str,
    zone: str | None,
    subnet: str,
    rg: str | None = None,
) -> tuple[str, str | None]:
    """The node's NIC (and a public IP when the run asks for SSH); returns the NIC id and its
    private IP. Idempotent; blocks."""
    from cloudtrain.providers.azure.bodies import nic_body, public_ip_body

    group, tags = group_name(run.run_id, rg), run_labels(run.run_id)
    public_ip = None
    if run.ssh:
        with azure_errors(f"create public IP {node}-ip in {group}", zone=zone):
            public_ip = str(
                clients.network.public_ip_addresses.begin_create_or_update(
                    group, f"{node}-ip", public_ip_body(region, zone, tags)
                )
                .result()
                .id
            )
    with azure_errors(f"create network interface {nic_name(node)} in {group}"):
        nic = clients.network.network_interfaces.begin_create_or_update(
            group, nic_name(node), nic_body(region, subnet, public_ip, tags)
        ).result()
    configs = nic.ip_configurations or []
    return str(nic.id), (str(configs[0].private_ip_address) if configs else None)


def private_ips(clients: ArmClients, run_id: str, rg: str | None = None) -> dict[str, str]:
    """NIC id (lower case) -> private IP, for the run's group. Blocks; {} without the group."""
    try:
        with azure_errors(f"list the network interfaces of run {run_id}"):
            nics: list[Any] = list(
                clients.network.network_interfaces.list(group_name(run_id, rg))
            )
    except NotFound:
        return {}
    out = {}
    for nic in nics:
        configs = nic.ip_configurations or []
        if configs and configs[0].private_ip_address:
            out[str(nic.id).lower()] = str(configs[0].private_ip_address)
    return out


def find(clients: ArmClients, run_id: str, region: str, rg: str | None = None) -> list[Resource]:
    """The run's network resources that exist: its own group, or in a user's group its NSG and
    VNet. Blocks."""
    group = group_name(run_id, rg)
    if user_group(rg) is None:
        with azure_errors(f"look up resource group {group}"):
            exists = clients.resource.resource_groups.check_existence(group)
        return [Resource("azure", KIND_GROUP, group, region, run_id)] if exists else []
    found = []
    for kind, name, ops in (
        (KIND_NSG, nsg_name(run_id), clients.network.network_security_groups),
        (KIND_VNET, vnet_name(run_id), clients.network.virtual_networks),
    ):
        try:
            with azure_errors(f"look up {name} in {group}"):
                ops.get(group, name)
            found.append(Resource("azure", kind, name, region, run_id))
        except NotFound:
            continue
    return found


def same_region(location: object, region: str) -> bool:
    """Whether an ARM `location` is `region` (ARM spells them with or without spaces). Pure."""
    return str(location or "").replace(" ", "").lower() == region.replace(" ", "").lower()


def tagged(clients: ArmClients, region: str, rg: str | None = None) -> list[Tagged]:
    """Every run's network resources in `region`, as `find` reports them: resource groups
    tagged `cloudtrain-run` and named after that run, or in a user's group its runs' NSGs and
    VNets (so tagged and named). ARM gives none of them a creation time. Blocks; read-only."""
    out: list[Tagged] = []
    group = user_group(rg)
    if group is None:
        with azure_errors("list cloudtrain's resource groups"):
            groups = list(clients.resource.resource_groups.list(filter=f"tagName eq '{TAG_RUN}'"))
        for g in groups:
            run_id = (g.tags or {}).get(TAG_RUN)
            ours = run_id and str(g.name).lower() == group_name(run_id).lower()
            if ours and same_region(g.location, region):
                out.append(Tagged(str(run_id), KIND_GROUP, str(g.name), None, region=region))
        return out
    for kind, name_of, ops in (
        (KIND_NSG, nsg_name, clients.network.network_security_groups),
        (KIND_VNET, vnet_name, clients.network.virtual_networks),
    ):
        try:
            with azure_errors(f"list the {kind}s in {group}"):
                listed = list(ops.list(group))
        except NotFound:
            continue
        for res in listed:
            run_id = (res.tags or {}).get(TAG_RUN)
            if run_id and res.name == name_of(run_id) and same_region(res.location, region):
                out.append(Tagged(run_id, kind, str(res.name), None, region=region))
    return out


def delete(clients: ArmClients, resources: list[Resource], rg: str | None = None) -> None:
    """Delete the run's group (never a user's: only its VNet and NSG there), waiting for each
    deletion. Idempotent: missing ones are fine. Blocks."""
    for kind in (KIND_VNET, KIND_NSG, KIND_GROUP):  # the VNet holds the NSG: it goes first
        for res in (r for r in resources if r.kind == kind):
            group = group_name(res.run_id, rg)
            try:
                with azure_errors(f"delete {kind} {res.id}"):
                    if kind == KIND_GROUP:
                        if res.id == user_group(rg):
                            continue
                        clients.resource.resource_groups.begin_delete(res.id).result()
                    elif kind == KIND_VNET:
                        clients.network.virtual_networks.begin_delete(group, res.id).result()
                    else:
                        ops = clients.network.network_security_groups
                        ops.begin_delete(group, res.id).result()
            except NotFound:
                continue
