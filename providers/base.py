"""The provider interface: a Compute and an ObjectStore behind one Provider, plus their dataclasses.

Every adapter (local.py, aws/, gcp/, azure/) implements exactly this, and so do the two wrappers
the registry puts around each one it builds: the test-only fault injector (faults.py) and, outside
it, the one retry layer (retrying.py). Adapters turn SDK exceptions into `cloudtrain.core.errors`
types; nothing above this layer sees an SDK exception. Each method's docstring states whether it
is idempotent and whether it blocks. Adding a cloud: follow the checklist in providers/README.md;
the contract suite (tests/providers/) runs every check against every registered provider.
"""

from __future__ import annotations

import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from cloudtrain.core.errors import TooLarge
from cloudtrain.providers.parallel import Counter, first_error, parallel_map

if TYPE_CHECKING:
    from pydantic import BaseModel

    from cloudtrain.providers.account import AccountProbe

NodeState = Literal["pending", "running", "stopped", "terminated", "preempted"]
ALIVE_STATES: frozenset[str] = frozenset({"pending", "running"})
ROLES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")

_NAME_RE = re.compile(
    r"^ct-(?P<run>[a-z0-9-]+)-(?P<role>chief|worker|ps|evaluator|controller)-(?P<index>\d+)$"
)


def node_name(run_id: str, role: str, index: int) -> str:
    """The deterministic cloud name of a node: the idempotency key of its create."""
    return f"ct-{run_id}-{role}-{index}"


def parse_node_name(name: str) -> tuple[str, str, int] | None:
    """Inverse of `node_name`: (run_id, role, index), or None for a name cloudtrain did not make."""
    m = _NAME_RE.match(name)
    return (m["run"], m["role"], int(m["index"])) if m else None


def run_labels(run_id: str, role: str | None = None, index: int | None = None) -> dict[str, str]:
    """The tags/labels every resource of a run carries (keys valid on AWS, GCP and Azure)."""
    labels = {"cloudtrain-run": run_id}
    if role is not None:
        labels["cloudtrain-role"] = role
    if index is not None:
        labels["cloudtrain-index"] = str(index)
    return labels


@dataclass(frozen=True)
class ProviderConfig:
    """What an adapter is built from. Credentials never appear here: SDKs use their own chains.

    `options` is the provider's typed options model (the pydantic model its INFO's `options`
    names, e.g. GcpOptions), as `cloudtrain.run.configs.config_for` resolves it from
    job.yaml, config.yaml and the deprecated variables; empty means every option's default (how the
    node side builds a store: it has no pydantic). Adapters read it with `option(name)` and import
    no options module, so this stays standard library only. A plain mapping is still accepted (an
    older caller's, a test fixture's) and read the same way."""

    name: str
    region: str | None = None
    zone: str | None = None
    account: str | None = None  # the account INFO.account_field names; None: the SDK's default
    options: BaseModel | Mapping[str, Any] = field(default_factory=dict)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of option `name`, or `default` when it is unset (None) or absent. Pure."""
        if isinstance(self.options, Mapping):
            value = self.options.get(name)
        else:
            value = getattr(self.options, name, None)
        return default if value is None else value


@dataclass(frozen=True)
class Resource:
    """One cloud resource of a run. The ledger records it before its create call."""

    provider: str
    kind: str  # bucket | node | network | firewall | security-group | role | resource-group ...
    id: str  # deterministic name where the cloud allows one
    region: str | None
    run_id: str
    cloud_id: str | None = None  # the id the cloud assigned (sg-..., i-...), once known


@dataclass(frozen=True)
class Tagged:
    """One resource of any run, found by cloudtrain's tags (for `cloudtrain gc`)."""

    run_id: str
    kind: str  # "node", or the Resource kind (security-group, firewall, resource-group, ...)
    id: str  # the node name, or the Resource id (what `list_nodes`/`list_resources` report)
    created: float | None  # epoch seconds from the cloud, None if it does not say
    instance_type: str | None = None
    region: str | None = None  # None: a global resource (IAM) that does not say its run's region


@dataclass(frozen=True)
class RunInfo:
    """What the compute side needs to know about a run to make its network and nodes."""

    run_id: str
    region: str | None
    zone: str | None
    port_range: tuple[int, int]
    ssh: bool = False
    store_uri: str = ""
    deadline: float | None = None  # epoch seconds the run must end by (node-side dead-man switch)
    # the node ids of the run's plan ("worker-0", ...): one identity each, whose bucket rights
    # are jobs/node_rights.py's for that node (the chief is `node_rights.chief_of(nodes)`)
    nodes: tuple[str, ...] = ()
    # what the nodes run on, for a compute that builds it once for every node (Slurm: a venv on
    # the shared filesystem); None where the run did not pack one (an adopted run)
    node_stack: NodeStack | None = None


@dataclass(frozen=True)
class NodeStack:
    """The node stack of a run: the requirements a bare Python installs (TensorFlow, tf-keras,
    a strategy's own build: cloudtrain/run/wheelhouse.py stack_pins) and the run's bundle on
    this machine, whose `wheel/` holds the cloudtrain wheel the nodes run, installed with its
    extra `extra` when not empty (the SDK of a bucket in another provider's store: "aws")."""

    pins: tuple[str, ...]
    bundle_path: str
    wheel_name: str
    extra: str = ""


@dataclass(frozen=True)
class NodeRequest:
    """One node to create. (run_id, role, index) is its identity: creating it twice makes one."""

    run_id: str
    role: str
    index: int
    instance_type: str
    startup_script: str
    zone: str | None = None
    spot: bool = False
    image: str | None = None
    disk_gb: int = 100
    accelerator: str | None = None
    accelerator_count: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return node_name(self.run_id, self.role, self.index)


@dataclass(frozen=True)
class Node:
    """A node as the cloud reports it (the cloud's tags are the source of truth)."""

    name: str
    run_id: str
    role: str
    index: int
    state: NodeState
    private_ip: str | None = None
    public_ip: str | None = None
    spot: bool = False
    zone: str | None = None
    instance_type: str | None = None
    cloud_id: str | None = None
    # the cloud's own words for the state, shown in its place: why a queued node waits and when
    # the scheduler expects to start it ("PENDING (Resources), start 2026-11-29 18:40:00");
    # untrusted
    detail: str | None = None

    @property
    def alive(self) -> bool:
        return self.state in ALIVE_STATES


@dataclass(frozen=True)
class ObjectInfo:
    """One object in a store listing. `key` is relative to the store's root."""

    key: str
    size: int
    updated: float  # seconds since the epoch


@dataclass(frozen=True)
class StartupBlocks:
    """The provider-specific pieces of jobs/startup.sh.j2 (bash snippets and values)."""

    python: str = "python3"  # the interpreter that runs the agent (a venv path on clouds)
    metadata: str = ""  # bash that exports node facts (address, port) before the agent starts
    self_shutdown: str = ""  # bash that arms the dead-man switch; `$DEADLINE_EPOCH` is set
    env: Mapping[str, str] = field(default_factory=dict)  # extra non-secret env for the agent
    install_stack: bool = True  # whether missing drivers/TensorFlow may be installed
    power_off: str = ""  # bash run after the agent exits: stop the node's bill (shutdown -h now)


def within(data: bytes, max_bytes: int | None, what: str) -> bytes:
    """`data` when `max_bytes` is None or it holds at most max_bytes; else raises TooLarge
    naming `what`. A store reads at most max_bytes + 1 bytes and hands them here. Pure."""
    if max_bytes is not None and len(data) > max_bytes:
        raise TooLarge(f"{what}: more than {max_bytes} bytes, not read")
    return data


def bound(max_bytes: int | None) -> dict[str, int]:
    """The keyword arguments a wrapper passes on for a read bounded by `max_bytes`: none for an
    unbounded read, so a store that predates the bound still serves it. Pure."""
    return {} if max_bytes is None else {"max_bytes": max_bytes}


@runtime_checkable
class ObjectStore(Protocol):
    """A bucket (or a prefix of one). Keys are '/'-separated and relative to `uri`."""

    uri: str

    def ensure_bucket(self) -> Resource:
        """Create the bucket if missing: private, encrypted. Idempotent; blocks until usable."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Write an object whole (atomically for readers). Idempotent; blocks."""
        ...

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object. With `max_bytes`, a bounded read: at most max_bytes + 1 bytes of it
        come into memory, and one that holds more raises TooLarge (never retried). Raises
        NotFound. Blocks."""
        ...

    def put_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """Upload a file; a large one in parallel parts (or a resumable session), and a call
        after a failed one resumes it: parts the store holds already are not sent again
        (providers/transfer.py). `progress(n)`, if given, is called from any thread with the
        bytes of each part once the store has it. Idempotent; blocks."""
        ...

    def get_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """Download to `path`, creating parent folders; the file appears whole when complete.
        A large object comes as parallel ranged reads into a hidden sidecar beside `path`
        (`.<name>.cloudtrain-part`, see transfer.is_sidecar), and a call after a failed one
        fetches only the missing ranges if the object is unchanged. `progress(n)` as for
        put_file. Raises NotFound. Blocks."""
        ...

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key. Blocks."""
        ...

    def delete(self, key: str) -> None:
        """Delete one object. Idempotent: a missing key is fine."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; returns how many. Idempotent."""
        ...

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A URL that GETs the object without credentials for `ttl_s` seconds (at most 1 h)."""
        ...

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A URL that PUTs the object without credentials for `ttl_s` seconds (at most 1 h)."""
        ...

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its version tag (S3 ETag, GCS generation, Azure ETag, local: a
        content-and-write stamp), or None when there is none. `max_bytes` bounds the read as
        for `get` (TooLarge). Blocks."""
        ...

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write the object only if its current tag is `tag` (None: only if there is no object),
        atomically against every other writer (S3 If-Match/If-None-Match, GCS
        ifGenerationMatch, Azure If-Match/If-None-Match, local: a lock and an atomic rename).
        Returns the new tag. Raises PreconditionFailed when the condition does not hold; never
        retried by the retry layer. Blocks."""
        ...


class Compute(ABC):
    """The VMs and their network.

    Subclasses implement the per-node calls (`create_node`, `delete_node`); the base class fans
    them out in parallel, so creating or deleting N nodes costs about one call's latency, not N.
    No method retries: the one retry layer (providers/retrying.py) wraps every provider the
    registry builds, and an adapter keeps only its cloud's eventual-consistency waits.
    """

    provider_name: str = ""
    max_parallel: int = 64
    # resource kinds whose delete deletes the nodes inside them (Azure's resource group): the
    # controller node tearing its run down deletes them last, after itself (teardown's `spare`)
    holds_nodes_kinds: frozenset[str] = frozenset()
    # whether a node that powers itself off is deleted by the cloud (AWS: the instances'
    # InstanceInitiatedShutdownBehavior=terminate): the controller node then deletes its
    # identity first and ends by powering off, needing no right to delete its own VM
    deletes_on_power_off: bool = False
    # True: a gang scheduler's compute (Slurm): a run's nodes are ONE allocation, made whole or
    # not at all, never a partial cluster. `create_nodes` is then given every node of the run
    # at once and calls `create_allocation`; no node is created alone (`create_node` refuses),
    # and losing one node loses them all, so a recovery creates every node again (a new
    # allocation). False: each node is created, replaced and deleted alone (the VMs).
    gang: bool = False
    # what a wrapper of a compute (the retry layer, the fault injector, the lease's fence) takes
    # from the compute it wraps (`take_traits`): the callers read them through the wrapper
    TRAITS: tuple[str, ...] = (
        "provider_name", "max_parallel", "holds_nodes_kinds", "deletes_on_power_off", "gang",
    )  # fmt: skip

    def take_traits(self, inner: Compute) -> None:
        """Copy every one of `TRAITS` from `inner`: a wrapper's constructor. Pure."""
        for name in self.TRAITS:
            setattr(self, name, getattr(inner, name))

    @abstractmethod
    def planned_network(self, run: RunInfo) -> list[Resource]:
        """The network/identity resources `ensure_network` will make, for the ledger. Pure."""

    @abstractmethod
    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """Firewall/SG/NSG (+ identity) so the run's nodes reach each other on `port_range` only.
        Idempotent; blocks until usable."""

    @abstractmethod
    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Create one node. Idempotent per (run_id, role, index): an existing live node is returned.
        Returns without waiting for boot. Raises NoCapacityError/QuotaError naming zone and type."""

    @abstractmethod
    def list_nodes(self, run_id: str) -> list[Node]:
        """The run's nodes as the cloud's tags report them, deleted ones excluded. Blocks."""

    @abstractmethod
    def delete_node(self, node: Node) -> None:
        """Delete one node and wait until it is gone. Idempotent: a missing node is fine."""

    @abstractmethod
    def list_resources(self, run_id: str) -> list[Resource]:
        """The run's network/identity resources, found by tag (so `down` needs no ledger)."""

    @abstractmethod
    def delete_resources(self, resources: list[Resource]) -> None:
        """Delete network/identity resources. Idempotent: missing ones are fine. Blocks."""

    @abstractmethod
    def inventory(self) -> list[Tagged]:
        """Every cloudtrain-tagged node and network/identity resource in this compute's
        region/account, of every run; deleted ones excluded. For each run, the same nodes and
        resources `list_nodes`/`list_resources` report. Blocks; read-only."""

    def prepare_nodes(self, run: RunInfo, requests: list[NodeRequest]) -> None:
        """Resolve once what a batch of creates shares (zone names, images, a group id) before
        `create_nodes` fans out, so N creates do not each look it up. Optional: the default
        does nothing, and `create_node` must work without it. Idempotent; blocks."""
        return None

    def create_nodes(
        self,
        run: RunInfo,
        requests: list[NodeRequest],
        on_created: Callable[[str, float, float], None] | None = None,
    ) -> list[Node]:
        """`prepare_nodes`, then `self.create_node` for every request in parallel (a gang
        compute: `self.create_allocation` of them all instead). Idempotent;
        does not wait for boot. Retries nothing itself: on a provider from the registry, `self`
        is a RetryingCompute (providers/retrying.py), whose `create_node` retries each node.
        Adapters override `create_node` and `prepare_nodes`, never this.

        Every request is attempted; if any failed, the first error is raised after all have
        finished, so the caller knows the full set that may exist (the ledger has them all).
        `on_created(name, start, end)` hears of each call as it returns ("<name> (failed)" for
        one that raised), from the fan-out's threads (the run's trace)."""
        from cloudtrain.core.crashpoints import crash_point

        if self.gang:
            return self.create_allocation(run, requests, on_created)
        if requests:
            self.prepare_nodes(run, requests)
        done = Counter()

        def create(req: NodeRequest) -> Node:
            start = time.time()
            try:
                node = self.create_node(run, req)
            except Exception:
                if on_created is not None:  # a zone without capacity: its calls count too
                    on_created(f"{req.name} (failed)", start, time.time())
                raise
            if on_created is not None:  # the node's create call, timed (the run's trace)
                on_created(req.name, start, time.time())
            if done.bump() == 1 and len(requests) > 1:
                crash_point("between-creates")
            return node

        return first_error(parallel_map(create, requests, self.max_parallel))

    def create_allocation(
        self,
        run: RunInfo,
        requests: list[NodeRequest],
        on_created: Callable[[str, float, float], None] | None = None,
    ) -> list[Node]:
        """A gang compute's create (`gang`): one allocation holding every request's node, all
        or none. Idempotent per run: while the run has an allocation, its nodes are returned
        and nothing more is asked for. Returns without waiting for the allocation to start.
        `on_created` as for `create_nodes`. Raises ProviderError (NoCapacityError,
        QuotaError) with the scheduler's reason when it refuses. Not offered by a per-node
        compute."""
        raise NotImplementedError(f"{type(self).__name__} creates nodes one by one")

    def allocation_seconds(self, run_id: str) -> dict[str, float]:
        """A gang compute's own accounting: how long each of the run's allocations held its
        nodes, by its cloud id (Slurm: sacct's elapsed seconds per job, queue time not
        counted); the run's bill is settled to it once its nodes are gone. Final only for
        allocations that have ended. {} where the compute keeps none (the VM computes: the
        ledger's own times are the bill). Blocks; read-only."""
        return {}

    def delete_nodes(self, run_id: str, names: list[str] | None = None) -> None:
        """Delete the run's nodes (all, or `names`) in parallel and wait until they are gone
        (`self.list_nodes`, then `self.delete_listed`). Idempotent: a missing node is fine."""

        nodes = [n for n in self.list_nodes(run_id) if names is None or n.name in names]
        self.delete_listed(nodes)

    def delete_listed(self, nodes: list[Node]) -> None:
        """Delete nodes the caller has just listed: `self.delete_node` for each, in parallel;
        wait until they are gone. Idempotent. Retries nothing itself (see `create_nodes`). An
        adapter whose cloud deletes many nodes in one call may override this; the retry layer
        then retries that call as a whole."""
        from cloudtrain.core.crashpoints import crash_point

        done = Counter()

        def delete(node: Node) -> None:
            self.delete_node(node)
            if done.bump() == 1:
                crash_point("teardown-half")

        first_error(parallel_map(delete, nodes, self.max_parallel))

    def console_output(self, node: Node) -> str:
        """The boot log of a node that never reported, if the cloud keeps one. Best effort."""
        return ""

    def needed_to_delete_self(self, resource: Resource) -> bool:
        """Whether the controller node needs this identity resource of its own to delete its own
        VM (so it is deleted after that call). Pure. Default: all of them."""
        return True

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The controller node's own identity (role, policy, account, grants) that
        `ensure_controller_identity` makes, for the ledger before they exist. Every kind starts
        with `controller-` (teardown deletes them after everything else). Pure. Default: none
        (local: the controller node is this user's process)."""
        return []

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """Create the controller node's identity, scoped to this run only
        (docs/managed-runs.md); a NodeRequest with role `controller` runs under it.
        Idempotent; blocks until it is usable. Default: none."""
        return []

    def zones(self) -> list[str]:
        """Zones of the region a run may fail over to when its zone has no capacity, in the
        catalog's naming. Empty: only the planned zone is tried."""
        return []

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """The provider's pieces of the startup script for one node."""
        return StartupBlocks()


class Provider(ABC):
    """A cloud (or this machine): its compute plus object stores addressed by URI."""

    name: str = ""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    @property
    @abstractmethod
    def compute(self) -> Compute:
        """The compute side (created lazily; may open SDK clients)."""

    @abstractmethod
    def store(self, uri: str) -> ObjectStore:
        """An ObjectStore rooted at `uri` (this provider's scheme). Does not create anything."""

    @abstractmethod
    def default_store_uri(self, run_id: str) -> str:
        """The auto bucket used when the spec gives no `checkpoint` URI."""

    def owns_bucket(self, uri: str) -> bool:
        """Whether teardown may delete the bucket at `uri` (never a user-given one)."""
        return False

    def account(self) -> str | None:
        """The cloud account the run is made in (GCP project, Azure subscription), for the
        ledger, so `down` and `status` reach the same one. None where there is no such thing."""
        return self.config.account

    def account_probe(self, tpu: bool = False) -> AccountProbe | None:
        """The read-only probe of the caller's account (providers/account.py): credentials,
        APIs, rights, quotas; of a TPU run (`tpu`: its strategy's device is a Cloud TPU VM) the
        TPU API and rights too, where the cloud sells TPUs. None where there is no account to
        ask (local). Creates nothing; may open SDK clients."""
        return None


class ProviderWrapper(Provider):
    """A provider around another (the fault injector, the retry layer): the same name and
    config; `compute` is the inner compute wrapped by `wrap_compute` (made lazily, once,
    thread-safe); what touches no cloud passes through. Subclasses define `wrap_compute` and
    `store`."""

    def __init__(self, inner: Provider) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.name = inner.name
        self._compute: Compute | None = None
        self._lock = threading.Lock()

    @abstractmethod
    def wrap_compute(self, inner: Compute) -> Compute:
        """The wrapper's compute around `inner`. Called once."""

    @property
    def compute(self) -> Compute:
        """The wrapped compute (the inner one is created on first access). Thread-safe."""
        with self._lock:
            if self._compute is None:
                self._compute = self.wrap_compute(self.inner.compute)
            return self._compute

    def default_store_uri(self, run_id: str) -> str:
        """Passed through (pure)."""
        return self.inner.default_store_uri(run_id)

    def owns_bucket(self, uri: str) -> bool:
        """Passed through (pure)."""
        return self.inner.owns_bucket(uri)

    def account(self) -> str | None:
        """Passed through."""
        return self.inner.account()

    def account_probe(self, tpu: bool = False) -> AccountProbe | None:
        """Passed through: a probe only reads, and its caller says what failed."""
        return self.inner.account_probe(tpu)
