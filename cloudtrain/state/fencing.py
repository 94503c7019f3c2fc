"""Fencing: nobody creates or deletes a node of a run without the run's current lease term.

`FencedProvider(provider, lease)` is the provider a controller acts through once it holds the
lease (cloudtrain/state/lease.py). Every call of its compute that makes or removes something
(network, identity, nodes, resources) first proves the lease is still this process's with a
conditional renewal (`Lease.check`) and raises LeaseLost when it is not: a controller that was
paused, lost the lease to `attach` or `cloudtrain down`, and resumes, does nothing. Reads pass
through. The store passes through too: what a stale controller could write there (the cluster
document, a stop request) is a request to the nodes, never a resource.
"""

from __future__ import annotations

from collections.abc import Callable

from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    ObjectStore,
    Provider,
    ProviderWrapper,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
)
from cloudtrain.state.lease import Lease


class FencedCompute(Compute):
    """The inner compute; every mutating call checks the lease first (one conditional write).
    The fan-outs check once, then fan out over the inner compute's per-node calls."""

    def __init__(self, inner: Compute, lease: Lease) -> None:
        self.inner, self.lease = inner, lease
        self.take_traits(inner)

    # --- mutating: fenced ------------------------------------------------------------------
    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """Fenced Compute.ensure_network. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        return self.inner.ensure_network(run)

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """Fenced Compute.ensure_controller_identity. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        return self.inner.ensure_controller_identity(run)

    def prepare_nodes(self, run: RunInfo, requests: list[NodeRequest]) -> None:
        """Fenced Compute.prepare_nodes. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        self.inner.prepare_nodes(run, requests)

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Fenced Compute.create_node. Raises LeaseLost. Idempotent per name; blocks."""
        self.lease.check()
        return self.inner.create_node(run, request)

    def create_nodes(
        self,
        run: RunInfo,
        requests: list[NodeRequest],
        on_created: Callable[[str, float, float], None] | None = None,
    ) -> list[Node]:
        """One check, then the inner fan-out. Raises LeaseLost. Blocks."""
        self.lease.check()
        return self.inner.create_nodes(run, requests, on_created)

    def delete_node(self, node: Node) -> None:
        """Fenced Compute.delete_node. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        self.inner.delete_node(node)

    def delete_nodes(self, run_id: str, names: list[str] | None = None) -> None:
        """One check, then the inner fan-out. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        self.inner.delete_nodes(run_id, names)

    def delete_listed(self, nodes: list[Node]) -> None:
        """One check, then the inner fan-out. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        self.inner.delete_listed(nodes)

    def delete_resources(self, resources: list[Resource]) -> None:
        """Fenced Compute.delete_resources. Raises LeaseLost. Idempotent; blocks."""
        self.lease.check()
        self.inner.delete_resources(resources)

    # --- reads and pure calls: passed through ------------------------------------------------
    def planned_network(self, run: RunInfo) -> list[Resource]:
        """See Compute.planned_network. Pure."""
        return self.inner.planned_network(run)

    def needed_to_delete_self(self, resource: Resource) -> bool:
        """See Compute.needed_to_delete_self. Pure."""
        return self.inner.needed_to_delete_self(resource)

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """See Compute.planned_controller_identity. Pure."""
        return self.inner.planned_controller_identity(run)

    def list_nodes(self, run_id: str) -> list[Node]:
        """See Compute.list_nodes. Blocks."""
        return self.inner.list_nodes(run_id)

    def allocation_seconds(self, run_id: str) -> dict[str, float]:
        """See Compute.allocation_seconds. Blocks."""
        return self.inner.allocation_seconds(run_id)

    def list_resources(self, run_id: str) -> list[Resource]:
        """See Compute.list_resources. Blocks."""
        return self.inner.list_resources(run_id)

    def inventory(self) -> list[Tagged]:
        """See Compute.inventory. Blocks."""
        return self.inner.inventory()

    def console_output(self, node: Node) -> str:
        """See Compute.console_output. Best effort."""
        return self.inner.console_output(node)

    def zones(self) -> list[str]:
        """See Compute.zones."""
        return self.inner.zones()

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """See Compute.startup_blocks. Pure."""
        return self.inner.startup_blocks(run, request)


class FencedProvider(ProviderWrapper):
    """`provider`, acting only while `lease` holds (see the module)."""

    def __init__(self, inner: Provider, lease: Lease) -> None:
        super().__init__(inner)
        self.lease = lease

    def wrap_compute(self, inner: Compute) -> FencedCompute:
        """The fenced compute around the inner one."""
        return FencedCompute(inner, self.lease)

    def store(self, uri: str) -> ObjectStore:
        """The inner provider's store (not fenced: see the module)."""
        return self.inner.store(uri)
