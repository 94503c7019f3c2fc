"""The one retry layer: a provider whose Compute and ObjectStore calls go through the one policy.

`wrap_provider(p)` is applied ONCE, by the registry, when it builds a provider (`get_provider`,
`open_store`), outside the test-only fault injector (`faults.wrap`). Nothing above it (the
controller, the CLI, the Python API, the node agent) retries a provider call, and nothing below
it (an adapter) retries a whole operation: an adapter keeps only its own eventual-consistency
waits (a new IAM identity becoming visible, instances reaching `terminated`), each saying why
in a comment where it is.

Every operation has ONE stated deadline, in `DEADLINES_S` below. A call that raised a retryable
error (`cloudtrain.core.errors.TransientError`: throttling, 5xx, a dropped connection) is called
again with jittered backoff, at most `cloudtrain.core.retry.MAX_ATTEMPTS` times in all, stopping
before a sleep that would cross the deadline; then the last error propagates unchanged. Any
other error (NotFound, NoCapacityError, QuotaError, access denied) propagates at once.

The fan-outs (`create_nodes`, `delete_nodes`, `delete_listed`) are not operations of their own:
`RetryingCompute` inherits them from `Compute`, so they fan out over THIS layer's per-node
`create_node`/`delete_node`, and each node is retried here, once, with the per-node deadline.
An adapter that deletes many nodes in one call (it overrides `delete_listed`, as AWS does) has
that call retried as a whole instead. Every retried operation is idempotent, so calling it
again is safe. Thread-safe if the inner provider is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cloudtrain.core.retry import is_retryable, retrying
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    ObjectInfo,
    ObjectStore,
    Provider,
    ProviderWrapper,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
    bound,
)

T = TypeVar("T")

# The deadline of each operation, in seconds from its first call. Read at call time (tests may
# patch an entry). Compute calls that create or delete something may each block for minutes
# (a delete waits until the node is gone); the deadline bounds the RETRIES, not one call, so a
# slow call is never cut short. create_node's covers GCP's wait for a new service account
# (providers/gcp/identity.py PROPAGATION_S, 60 s) inside one attempt.
DEADLINES_S: dict[str, float] = {
    # Compute
    "ensure_network": 120.0,
    "prepare_nodes": 120.0,
    "create_node": 120.0,
    "create_allocation": 120.0,  # a gang compute's one create of all the run's nodes (Slurm)
    "list_nodes": 120.0,
    "delete_node": 120.0,
    "delete_listed": 120.0,  # only for adapters that delete many nodes in one call (AWS)
    "list_resources": 120.0,
    "delete_resources": 120.0,
    "inventory": 120.0,
    "zones": 120.0,
    "console_output": 30.0,  # best effort: a boot log is diagnostics, never worth a minute
    # ObjectStore (the bucket the controller and the nodes talk through)
    "ensure_bucket": 60.0,
    "put": 60.0,
    "get": 60.0,
    "put_file": 60.0,
    "get_file": 60.0,
    "list": 60.0,
    "delete": 60.0,
    "delete_prefix": 60.0,
    "get_tagged": 60.0,
    "put_if": 60.0,
}
# Pure or local calls: passed through, never retried (no cloud call to throttle).
NOT_RETRIED: tuple[str, ...] = ("planned_network", "startup_blocks", "presign_get", "presign_put")


def _retry(op: str, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
    """`fn` through the one policy with operation `op`'s deadline. Blocks."""
    deadline = DEADLINES_S[op] if deadline_s is None else deadline_s
    return retrying(fn, what=what, deadline_s=deadline)


def _overrides(obj: object, method: str) -> bool:
    """Whether `obj`'s class replaces `Compute`'s own `method` (e.g. a batch delete). Pure."""
    return getattr(type(obj), method, None) is not getattr(Compute, method)


class RetryingCompute(Compute):
    """`inner` with every Compute call retried by the one policy (see the module docstring).

    Idempotent to build: wrapping a RetryingCompute wraps its inner compute instead.
    """

    def __init__(self, inner: Compute) -> None:
        self.inner: Compute = inner.inner if isinstance(inner, RetryingCompute) else inner
        self.take_traits(self.inner)

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """See Compute.planned_network (pure: not retried)."""
        return self.inner.planned_network(run)

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """See Compute.ensure_network; retried. Idempotent; blocks."""
        what = f"network of run {run.run_id}"
        return _retry("ensure_network", what, lambda: self.inner.ensure_network(run))

    def needed_to_delete_self(self, resource: Resource) -> bool:
        """See Compute.needed_to_delete_self. Pure."""
        return self.inner.needed_to_delete_self(resource)

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """See Compute.planned_controller_identity (pure: not retried)."""
        return self.inner.planned_controller_identity(run)

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """See Compute.ensure_controller_identity; retried. Idempotent; blocks."""
        what = f"controller identity of run {run.run_id}"
        return _retry("ensure_network", what, lambda: self.inner.ensure_controller_identity(run))

    def prepare_nodes(self, run: RunInfo, requests: list[NodeRequest]) -> None:
        """See Compute.prepare_nodes; retried. Idempotent; blocks."""
        what = f"prepare {len(requests)} node(s) of run {run.run_id}"
        _retry("prepare_nodes", what, lambda: self.inner.prepare_nodes(run, requests))

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """See Compute.create_node; retried (idempotent per name). Does not wait for boot."""
        what = f"create node {request.name}"
        return _retry("create_node", what, lambda: self.inner.create_node(run, request))

    def create_allocation(
        self,
        run: RunInfo,
        requests: list[NodeRequest],
        on_created: Callable[[str, float, float], None] | None = None,
    ) -> list[Node]:
        """See Compute.create_allocation; retried as a whole (idempotent per run). Does not
        wait for the allocation to start."""
        what = f"create the allocation of run {run.run_id} ({len(requests)} node(s))"
        return _retry(
            "create_allocation",
            what,
            lambda: self.inner.create_allocation(run, requests, on_created),
        )

    def list_nodes(self, run_id: str) -> list[Node]:
        """See Compute.list_nodes; retried. Blocks."""
        what = f"list nodes of {run_id}"
        return _retry("list_nodes", what, lambda: self.inner.list_nodes(run_id))

    def delete_node(self, node: Node) -> None:
        """See Compute.delete_node; retried. Idempotent; blocks until gone."""
        _retry("delete_node", f"delete node {node.name}", lambda: self.inner.delete_node(node))

    def delete_listed(self, nodes: list[Node]) -> None:
        """See Compute.delete_listed. Fans out over this layer's `delete_node` (each node
        retried once, here); an inner compute with a batch delete of its own has that one call
        retried as a whole. Idempotent; blocks until gone."""
        if not _overrides(self.inner, "delete_listed"):
            super().delete_listed(nodes)
            return
        if nodes:
            what = f"delete {len(nodes)} node(s) of {nodes[0].run_id}"
            _retry("delete_listed", what, lambda: self.inner.delete_listed(nodes))

    def allocation_seconds(self, run_id: str) -> dict[str, float]:
        """See Compute.allocation_seconds; retried. Blocks; read-only."""
        what = f"accounting of {run_id}'s allocations"
        return _retry("list_nodes", what, lambda: self.inner.allocation_seconds(run_id))

    def list_resources(self, run_id: str) -> list[Resource]:
        """See Compute.list_resources; retried. Blocks."""
        what = f"list resources of {run_id}"
        return _retry("list_resources", what, lambda: self.inner.list_resources(run_id))

    def delete_resources(self, resources: list[Resource]) -> None:
        """See Compute.delete_resources; retried. Idempotent; blocks."""
        what = f"delete {len(resources)} resource(s)"
        _retry("delete_resources", what, lambda: self.inner.delete_resources(resources))

    def inventory(self) -> list[Tagged]:
        """See Compute.inventory; retried. Blocks; read-only."""
        what = f"list cloudtrain resources in {self.provider_name}"
        return _retry("inventory", what, self.inner.inventory)

    def console_output(self, node: Node) -> str:
        """See Compute.console_output; retried briefly (best effort)."""
        what = f"boot log of {node.name}"
        return _retry("console_output", what, lambda: self.inner.console_output(node))

    def zones(self) -> list[str]:
        """See Compute.zones; retried. Blocks."""
        return _retry("zones", f"list zones of {self.provider_name}", self.inner.zones)

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """See Compute.startup_blocks (pure: not retried)."""
        return self.inner.startup_blocks(run, request)


class RetryingStore:
    """`inner` with each call retried by the one policy, except the (local) presign calls.

    The controller and the node agents talk only through the bucket, so a throttled bucket call
    must never end a run. Every ObjectStore method but `put_if` is idempotent, so retrying one
    as a whole is safe; `put_if` is retried too, and its docstring says what a caller must do.
    Idempotent to build: wrapping a RetryingStore wraps its inner store instead.
    `deadline_s`, when given, replaces every store operation's deadline from `DEADLINES_S`.
    """

    def __init__(self, inner: ObjectStore, deadline_s: float | None = None) -> None:
        self.inner = inner.inner if isinstance(inner, RetryingStore) else inner
        self.uri = self.inner.uri
        self.deadline_s = deadline_s

    def _call(self, op: str, what: str, fn: Callable[[], T]) -> T:
        return _retry(op, f"{what} ({self.uri})", fn, self.deadline_s)

    def ensure_bucket(self) -> Resource:
        """See ObjectStore.ensure_bucket; retried. Idempotent; blocks."""
        return self._call("ensure_bucket", "ensure bucket", self.inner.ensure_bucket)

    def put(self, key: str, data: bytes) -> None:
        """See ObjectStore.put; retried. Idempotent; blocks."""
        self._call("put", f"put {key}", lambda: self.inner.put(key, data))

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """See ObjectStore.get; retried (NotFound and TooLarge are raised at once). Blocks."""
        return self._call("get", f"get {key}", lambda: self.inner.get(key, **bound(max_bytes)))

    def _transfer(
        self,
        op: str,
        what: str,
        fn: Callable[[Callable[[int], None]], None],
        progress: Callable[[int], None] | None,
    ) -> None:
        """`fn(progress)` retried like any call; and when it still fails with a retryable error
        after moving bytes, retried again with a fresh deadline (each call resumes where the
        last stopped, so a transfer that keeps making progress is never given up; one that
        moved nothing for a whole deadline is). Blocks."""
        while True:
            moved = 0

            def counting(n: int) -> None:
                nonlocal moved
                moved += n
                if progress is not None:
                    progress(n)

            try:
                self._call(op, what, lambda: fn(counting))
                return
            except Exception as exc:
                if not is_retryable(exc) or moved == 0:
                    raise

    def put_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """See ObjectStore.put_file; retried, each retry resuming (see `_transfer`).
        Idempotent; blocks."""
        self._transfer(
            "put_file", f"upload {key}", lambda p: self.inner.put_file(key, path, p), progress
        )

    def get_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """See ObjectStore.get_file; retried, each retry resuming (see `_transfer`); NotFound
        is raised at once. Blocks."""
        self._transfer(
            "get_file", f"download {key}", lambda p: self.inner.get_file(key, path, p), progress
        )

    def list(self, prefix: str) -> list[ObjectInfo]:
        """See ObjectStore.list; retried. Blocks."""
        return self._call("list", f"list {prefix}", lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        """See ObjectStore.delete; retried. Idempotent."""
        self._call("delete", f"delete {key}", lambda: self.inner.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        """See ObjectStore.delete_prefix; retried. Idempotent."""
        what = f"delete {prefix}"
        return self._call("delete_prefix", what, lambda: self.inner.delete_prefix(prefix))

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """See ObjectStore.get_tagged; retried like `get` (a missing object is None). Blocks."""
        return self._call(
            "get_tagged", f"get {key}", lambda: self.inner.get_tagged(key, **bound(max_bytes))
        )

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """See ObjectStore.put_if; retried on TransientError only (PreconditionFailed, like
        every non-retryable error, is raised at once). Not idempotent: when a reply was lost,
        the retry finds the first try's own write and raises PreconditionFailed although the
        object now holds `data`. A caller must therefore treat PreconditionFailed as "read
        again and decide" (get_tagged), never as "nothing was written" (cloudtrain/state/lease.py
        re-reads the lease and finds itself its owner). Blocks."""
        what = f"put {key} if " + ("absent" if tag is None else f"tag {tag}")
        return self._call("put_if", what, lambda: self.inner.put_if(key, data, tag))

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """See ObjectStore.presign_get (local signing: not retried)."""
        return self.inner.presign_get(key, ttl_s)

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """See ObjectStore.presign_put (local signing: not retried)."""
        return self.inner.presign_put(key, ttl_s)


class RetryingProvider(ProviderWrapper):
    """`inner` with its compute a RetryingCompute (made lazily, once) and every store it opens
    a RetryingStore. Same `name` and `config` as `inner`."""

    def wrap_compute(self, inner: Compute) -> RetryingCompute:
        """The inner compute, every call retried by the one policy."""
        return RetryingCompute(inner)

    def store(self, uri: str) -> RetryingStore:
        """The inner store at `uri`, retrying. Creates nothing."""
        return RetryingStore(self.inner.store(uri))


def wrap_provider(provider: Provider) -> Provider:
    """`provider` with every compute and store call retried by the one policy (see
    RetryingProvider). Idempotent: a provider wrapped already is returned as it is. Pure."""
    if isinstance(provider, RetryingProvider):
        return provider
    return RetryingProvider(provider)
