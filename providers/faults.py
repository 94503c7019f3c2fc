"""A fault-injecting wrapper for any provider: latency, throttling, capacity errors, preemption.

`wrap(provider, FaultPlan(...))` returns a provider that behaves like the inner one but slower and
less reliable, as a real cloud is. Tests and benchmarks use it to check that fan-out, retries,
zone fallback and preemption recovery work; `FaultPlan.from_env()` reads the plan from
`$CLOUDTRAIN_FAULTS` (JSON) so the CLI can be wrapped from outside.

Faults are injected *around* the inner provider: a throttled call never reaches it; a lost reply
(`lost_reply_rate`) reaches it and then fails, which is what makes create idempotency matter.
Preemption is checked lazily in `list_nodes` (deterministic; no background threads).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from cloudtrain.core import env
from cloudtrain.core.errors import NoCapacityError, TransientError, UsageError
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

FAULTS_ENV = env.FAULTS.name
THROTTLED = "throttled (injected)"
_PER_KEY = ("capacity_errors", "preempt_after_s", "slow_create_s", "throttled_creates")


@dataclass
class FaultPlan:
    """What to inject. All zero/empty (the default) injects nothing."""

    latency_s: float = 0.0  # added to every compute call that reaches the cloud
    store_latency_s: float = 0.0  # added to every store call that reaches the bucket
    error_rate: float = 0.0  # fraction of compute calls throttled before reaching the cloud
    store_error_rate: float = 0.0  # the same for store calls
    # the bandwidth of put_file/get_file bytes (0: unlimited), shared by every transfer of the
    # provider's stores and their parallel parts: "a store that delivers slowly"
    store_bytes_per_s: float = 0.0
    lost_reply_rate: float = 0.0  # fraction of create_node calls that succeed, then raise
    capacity_errors: dict[str, int] = field(default_factory=dict)  # zone -> failing creates
    preempt_after_s: dict[str, float] = field(default_factory=dict)  # node name -> s after create
    # node -> extra seconds its create takes (a VM that is slow to provision; keys as
    # preempt_after_s: a node name, or its "role-index" suffix such as "worker-1")
    slow_create_s: dict[str, float] = field(default_factory=dict)
    # node -> how many of its create calls are throttled before any reaches the inner compute
    # (keys as preempt_after_s; a huge count throttles that node's creates always)
    throttled_creates: dict[str, int] = field(default_factory=dict)
    seed: int = 0  # seeds the random draws of the *_rate faults

    @property
    def store_faults(self) -> bool:
        """Whether any store fault is configured (else `store()` returns the inner store)."""
        return self.store_latency_s > 0 or self.store_error_rate > 0 or self.store_bytes_per_s > 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "fault plan") -> FaultPlan:
        """Build and validate a plan from a mapping (e.g. parsed JSON). Raises UsageError."""
        if not isinstance(data, Mapping):
            raise UsageError(f"{source} must be a JSON object, not {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(
                f"{source} has unknown keys {unknown}", hint=f"known: {', '.join(sorted(known))}"
            )
        plan = cls()
        try:
            for key, value in data.items():
                if key in _PER_KEY:
                    if not isinstance(value, Mapping):
                        raise TypeError(f"{key} must be an object")
                    conv = int if key in ("capacity_errors", "throttled_creates") else float
                    plan = replace(plan, **{key: {str(k): conv(v) for k, v in value.items()}})
                elif key == "seed":
                    plan = replace(plan, seed=int(value))
                else:
                    plan = replace(plan, **{key: float(value)})
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{source}: bad value: {exc}") from exc
        plan.validate(source)
        return plan

    @classmethod
    def from_env(
        cls, var: str = FAULTS_ENV, environ: Mapping[str, str] | None = None
    ) -> FaultPlan | None:
        """The plan in `$CLOUDTRAIN_FAULTS` (JSON), or None when unset/empty. Raises UsageError."""
        raw = env.by_name(var).text(environ)
        if not raw:
            return None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{var} is not valid JSON: {exc}", hint='e.g. {"latency_s": 1, "error_rate": 0.2}'
            ) from exc
        return cls.from_dict(data, source=var)

    def to_json(self) -> str:
        """The plan as JSON, the format `from_env` reads. Pure."""
        return json.dumps(asdict(self), sort_keys=True)

    def validate(self, source: str = "fault plan") -> None:
        """Raise UsageError for a negative latency/count or a rate outside [0, 1]. Pure."""
        for name in ("error_rate", "store_error_rate", "lost_reply_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"{source}: {name} must be between 0 and 1")
        negative = [
            n for n in ("latency_s", "store_latency_s", "store_bytes_per_s") if getattr(self, n) < 0
        ]
        negative += [f"capacity_errors[{z}]" for z, n in self.capacity_errors.items() if n < 0]
        negative += [f"preempt_after_s[{k}]" for k, s in self.preempt_after_s.items() if s < 0]
        negative += [f"slow_create_s[{k}]" for k, s in self.slow_create_s.items() if s < 0]
        negative += [f"throttled_creates[{k}]" for k, n in self.throttled_creates.items() if n < 0]
        if negative:
            raise UsageError(f"{source}: {', '.join(negative)} must not be negative")


def _node_key(per_node: Mapping[str, object], name: str) -> str | None:
    """The key of node `name` in a per-node plan keyed by full name or "role-index". Pure."""
    if name in per_node:
        return name
    return next((key for key in per_node if name.endswith("-" + key)), None)


def _for_node(per_node: Mapping[str, float], name: str) -> float | None:
    """The value for node `name` in a per-node plan keyed by full name or "role-index". Pure."""
    key = _node_key(per_node, name)
    return None if key is None else per_node[key]


class _Injector:
    """Latency and random throttling for one side (compute or store). Thread-safe."""

    def __init__(
        self, latency_s: float, error_rate: float, seed: int, bytes_per_s: float = 0.0
    ) -> None:
        self.latency_s = latency_s
        self.error_rate = error_rate
        self.bytes_per_s = bytes_per_s
        self._paced_until = 0.0  # monotonic time up to which the bandwidth is spoken for
        self.calls: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()  # calls failed by `gate`, per method
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def roll(self, rate: float) -> bool:
        if rate <= 0:
            return False
        with self._lock:
            return self._rng.random() < rate

    def gate(self, method: str) -> None:
        """Count the call, add latency, and maybe throttle it (before it reaches the inner side)."""
        self.count(method)
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        if self.roll(self.error_rate):
            self.throttle(method, THROTTLED)

    def pace(self, progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
        """`progress` behind the bandwidth limit: each report of n bytes books n / bytes_per_s
        seconds after what is booked already (all threads share one budget) and sleeps until
        its booking ends, then passes the report on. Unlimited: `progress` itself."""
        if self.bytes_per_s <= 0:
            return progress

        def paced(n: int) -> None:
            with self._lock:
                now = time.monotonic()
                self._paced_until = max(self._paced_until, now) + n / self.bytes_per_s
                delay = self._paced_until - now
            if delay > 0:
                time.sleep(delay)
            if progress is not None:
                progress(n)

        return paced

    def throttle(self, method: str, message: str) -> None:
        """Count a throttled call of `method` and raise the TransientError that says so."""
        with self._lock:
            self.throttled[method] += 1
        raise TransientError(message)


class FaultyCompute(Compute):
    """A Compute that injects `plan`'s faults around `inner`. Thread-safe.

    `calls` counts calls per method (throttled ones included); `created` lists the names of nodes
    this wrapper actually made (an idempotent re-create of a live node is not listed again). The
    inherited `create_nodes`/`delete_nodes` fan out over this class's per-node methods, so every
    node call sees its own faults. Each node named in `preempt_after_s` is preempted once.
    """

    def __init__(
        self, inner: Compute, plan: FaultPlan, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.plan = plan
        self.clock = clock
        self.take_traits(inner)
        self.created: list[str] = []
        self.lost_replies = 0  # creates that succeeded but answered with an error
        self._faults = _Injector(plan.latency_s, plan.error_rate, plan.seed)
        self._lock = threading.Lock()
        self._capacity_left = dict(plan.capacity_errors)
        self._throttles_left = dict(plan.throttled_creates)
        self._live: set[str] = set()  # made through this wrapper and not deleted since
        self._born: dict[str, float] = {}  # node name -> when this wrapper created it
        self._preempted: dict[str, Node] = {}  # preempted, not yet deleted through the wrapper
        self._preempted_once: set[str] = set()

    @property
    def calls(self) -> Counter[str]:
        """Calls per method name, throttled ones included (a live Counter; read, don't write)."""
        return self._faults.calls

    @property
    def throttled(self) -> Counter[str]:
        """Calls per method name that were throttled (a live Counter; read, don't write)."""
        return self._faults.throttled

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """Pure: passed through without faults."""
        self._faults.count("planned_network")
        return self.inner.planned_network(run)

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """The inner `ensure_network`, with latency and throttling. Idempotent; blocks."""
        self._faults.gate("ensure_network")
        return self.inner.ensure_network(run)

    def needed_to_delete_self(self, resource: Resource) -> bool:
        """See Compute.needed_to_delete_self. Pure."""
        return self.inner.needed_to_delete_self(resource)

    def planned_controller_identity(self, run: RunInfo) -> list[Resource]:
        """Pure: passed through without faults."""
        return self.inner.planned_controller_identity(run)

    def ensure_controller_identity(self, run: RunInfo) -> list[Resource]:
        """The inner `ensure_controller_identity`, with latency and throttling. Idempotent."""
        self._faults.gate("ensure_network")
        return self.inner.ensure_controller_identity(run)

    def prepare_nodes(self, run: RunInfo, requests: list[NodeRequest]) -> None:
        """Passed through without faults (a cache warm-up; `create_node` works without it)."""
        self.inner.prepare_nodes(run, requests)

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """The inner `create_node` with latency, throttling (random, and per node as
        `throttled_creates` says), per-zone capacity errors and lost replies. Idempotent per
        name (as the inner one is); does not wait for boot."""
        self._faults.gate("create_node")
        with self._lock:
            key = _node_key(self._throttles_left, request.name)
            throttle = key is not None and self._throttles_left[key] > 0
            if throttle:
                self._throttles_left[key] -= 1  # type: ignore[index]
        if throttle:
            self._faults.throttle("create_node", f"{THROTTLED}: create {request.name}")
        zone = request.zone or run.zone
        with self._lock:
            no_capacity = self._capacity_left.get(zone or "", 0) > 0
            if no_capacity:
                self._capacity_left[zone or ""] -= 1
        if no_capacity:
            raise NoCapacityError(
                f"no capacity for {request.instance_type} in zone {zone} (injected)", zone=zone
            )
        slow = _for_node(self.plan.slow_create_s, request.name)
        if slow:
            time.sleep(slow)
        node = self.inner.create_node(run, request)
        with self._lock:
            if node.name not in self._live:
                self._preempted.pop(node.name, None)  # a re-created node replaces its report
                self._live.add(node.name)
                self.created.append(node.name)
                self._born[node.name] = self.clock()
        if self._faults.roll(self.plan.lost_reply_rate):
            with self._lock:
                self.lost_replies += 1
            raise TransientError(f"{THROTTLED}: reply to create {request.name} lost")
        return node

    def create_allocation(
        self,
        run: RunInfo,
        requests: list[NodeRequest],
        on_created: Callable[[str, float, float], None] | None = None,
    ) -> list[Node]:
        """The inner `create_allocation` with latency (a gang compute's one create)."""
        self._faults.gate("create_allocation")
        return self.inner.create_allocation(run, requests, on_created)

    def list_nodes(self, run_id: str) -> list[Node]:
        """The inner `list_nodes` with latency and throttling. Nodes past their `preempt_after_s`
        are deleted through the inner compute here and reported as `preempted` until deleted
        through this wrapper. Blocks."""
        self._faults.gate("list_nodes")
        nodes = self.inner.list_nodes(run_id)
        now = self.clock()
        due: list[Node] = []
        with self._lock:
            for n in nodes:
                after = _for_node(self.plan.preempt_after_s, n.name)
                born = self._born.setdefault(n.name, now)
                if (
                    after is not None
                    and n.alive
                    and n.name not in self._preempted_once
                    and now - born >= after
                ):
                    self._preempted_once.add(n.name)
                    due.append(n)
        for n in due:
            self.inner.delete_node(n)
            with self._lock:
                self._live.discard(n.name)
                self._preempted[n.name] = replace(n, state="preempted", private_ip=None)
        with self._lock:
            gone = set(self._preempted)
            shown = [n for n in nodes if n.name not in gone]
            shown += [n for n in self._preempted.values() if n.run_id == run_id]
        return sorted(shown, key=lambda n: n.name)

    def delete_node(self, node: Node) -> None:
        """The inner `delete_node` with latency and throttling; clears a preempted report.
        Idempotent; blocks."""
        self._faults.gate("delete_node")
        self.inner.delete_node(node)
        with self._lock:
            self._preempted.pop(node.name, None)
            self._live.discard(node.name)
            self._born.pop(node.name, None)

    def allocation_seconds(self, run_id: str) -> dict[str, float]:
        """The inner `allocation_seconds`, unchanged. Blocks."""
        return self.inner.allocation_seconds(run_id)

    def list_resources(self, run_id: str) -> list[Resource]:
        """The inner `list_resources` with latency and throttling. Blocks."""
        self._faults.gate("list_resources")
        return self.inner.list_resources(run_id)

    def delete_resources(self, resources: list[Resource]) -> None:
        """The inner `delete_resources` with latency and throttling. Idempotent; blocks."""
        self._faults.gate("delete_resources")
        self.inner.delete_resources(resources)

    def inventory(self) -> list[Tagged]:
        """The inner `inventory` with latency and throttling (preemption is not applied: a
        preempted node is deleted from the inner compute already). Blocks; read-only."""
        self._faults.gate("inventory")
        return self.inner.inventory()

    def console_output(self, node: Node) -> str:
        """Passed through without faults (best effort anyway)."""
        self._faults.count("console_output")
        return self.inner.console_output(node)

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """Pure: passed through without faults."""
        return self.inner.startup_blocks(run, request)

    def zones(self) -> list[str]:
        """The inner compute's failover zones, plus any zone given capacity errors (so a test
        can script a full zone even where the inner compute has only one)."""
        zones = list(self.inner.zones())
        return zones + [z for z in self.plan.capacity_errors if z not in zones]


class FaultyStore:
    """An ObjectStore that adds latency/throttling to every call reaching `inner` except the
    (local) presign calls, and paces put_file/get_file to the injector's bandwidth. Thread-safe
    if the inner store is."""

    def __init__(self, inner: ObjectStore, faults: _Injector) -> None:
        self.inner = inner
        self.uri = inner.uri
        self._faults = faults

    @property
    def calls(self) -> Counter[str]:
        """Store calls per method, shared by every store of the same FaultyProvider."""
        return self._faults.calls

    def ensure_bucket(self) -> Resource:
        """See ObjectStore.ensure_bucket (idempotent; blocks), plus faults."""
        self._faults.gate("ensure_bucket")
        return self.inner.ensure_bucket()

    def put(self, key: str, data: bytes) -> None:
        """See ObjectStore.put (idempotent; blocks), plus faults."""
        self._faults.gate("put")
        self.inner.put(key, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """See ObjectStore.get (raises NotFound, TooLarge; blocks), plus faults."""
        self._faults.gate("get")
        return self.inner.get(key, **bound(max_bytes))

    def put_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """See ObjectStore.put_file (idempotent; blocks), plus faults: the plan's bandwidth
        paces the parts as the inner store reports them."""
        self._faults.gate("put_file")
        self.inner.put_file(key, path, self._faults.pace(progress))

    def get_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """See ObjectStore.get_file (raises NotFound; blocks), plus faults: the plan's bandwidth
        paces the parts as the inner store reports them."""
        self._faults.gate("get_file")
        self.inner.get_file(key, path, self._faults.pace(progress))

    def list(self, prefix: str) -> list[ObjectInfo]:
        """See ObjectStore.list (blocks), plus faults."""
        self._faults.gate("list")
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        """See ObjectStore.delete (idempotent), plus faults."""
        self._faults.gate("delete")
        self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        """See ObjectStore.delete_prefix (idempotent), plus faults."""
        self._faults.gate("delete_prefix")
        return self.inner.delete_prefix(prefix)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """See ObjectStore.get_tagged (None when missing; blocks), plus faults."""
        self._faults.gate("get_tagged")
        return self.inner.get_tagged(key, **bound(max_bytes))

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """See ObjectStore.put_if (raises PreconditionFailed; blocks), plus faults. The latency
        comes before the write reaches the bucket: a paused writer whose condition is stale by
        the time it arrives."""
        self._faults.gate("put_if")
        return self.inner.put_if(key, data, tag)

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """Passed through without faults (signing is local)."""
        return self.inner.presign_get(key, ttl_s)

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """Passed through without faults (signing is local)."""
        return self.inner.presign_put(key, ttl_s)


class FaultyProvider(ProviderWrapper):
    """`inner` with `plan`'s faults: `.compute` is a FaultyCompute (made lazily, once), and
    `.store(uri)` a FaultyStore when store faults are configured. Same `name` as `inner`."""

    def __init__(
        self, inner: Provider, plan: FaultPlan, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(inner)
        self.plan = plan
        self._clock = clock
        self.store_faults = _Injector(
            plan.store_latency_s, plan.store_error_rate, plan.seed + 1, plan.store_bytes_per_s
        )

    def wrap_compute(self, inner: Compute) -> FaultyCompute:
        """The inner compute with the plan's compute faults."""
        return FaultyCompute(inner, self.plan, self._clock)

    def store(self, uri: str) -> ObjectStore:
        """The inner store at `uri`, wrapped when store faults are configured. Creates nothing."""
        inner = self.inner.store(uri)
        return FaultyStore(inner, self.store_faults) if self.plan.store_faults else inner


def wrap(
    provider: Provider, plan: FaultPlan, clock: Callable[[], float] = time.monotonic
) -> Provider:
    """`provider` with `plan`'s faults injected (see FaultyProvider). Validates the plan; pure.

    Never wraps twice: a provider with faults already injected (at any depth of its `inner`
    chain) is returned as it is, `plan` unused. Faults always sit BELOW the retry layer, so a
    retrying provider (providers/retrying.py) gets them under its retries, not above them."""
    plan.validate()
    layer: object = provider
    while layer is not None:
        if isinstance(layer, FaultyProvider):
            return provider
        layer = getattr(layer, "inner", None)
    from cloudtrain.providers.retrying import RetryingProvider, wrap_provider

    if isinstance(provider, RetryingProvider):
        return wrap_provider(FaultyProvider(provider.inner, plan, clock))
    return FaultyProvider(provider, plan, clock)
