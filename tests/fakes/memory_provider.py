"""An in-memory Provider: a TEST FIXTURE, not an adapter. Nothing here touches a cloud or a disk.

It sits below wrappers under test (e.g. `providers.faults`) and keeps exact books: `calls` counts
every method call that reached it and `creations` how many times each node name was really made,
so tests can prove that a retried create did not make a duplicate.

For failover (cloudtrain/run/failover.py) a compute can be scripted as a region of a new account:
zones (`zone_names`), how many more nodes fit in a zone (`capacity`, and `spot_capacity` for spot
nodes only: NoCapacityError naming the zone once it is out), and how many nodes the region's
quota allows (`quota`: QuotaError past it). `MemoryClouds` builds one provider per (cloud,
region), named as that cloud, the regions of a cloud sharing its buckets.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from cloudtrain.core.errors import (
    NoCapacityError,
    NotFound,
    PreconditionFailed,
    QuotaError,
    TooLarge,
)
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    ObjectInfo,
    Provider,
    ProviderConfig,
    Resource,
    RunInfo,
    Tagged,
)

Objects = dict[str, tuple[bytes, float, str]]  # key -> (data, updated, tag)
_TAGS = itertools.count(1)  # every write of every MemoryStore gets a tag never used before


def _new_tag() -> str:
    return f"m{next(_TAGS)}"


class MemoryCompute(Compute):
    """Nodes in a dict keyed by name. Creates are instant and idempotent per name. Thread-safe."""

    provider_name = "memory"

    def __init__(self, region: str = "mem-1", zone_names: list[str] | None = None) -> None:
        self.region = region
        self.zone_names = list(zone_names or [])
        # the scripted account (see the module): None is no limit
        self.capacity: dict[str, int] = {}
        self.spot_capacity: dict[str, int] = {}
        self.quota: int | None = None
        # called with each node made (a test's stand-in for the node's agent)
        self.on_create: Callable[[RunInfo, Node], None] | None = None
        self.nodes: dict[str, Node] = {}
        self.networks: dict[str, list[Resource]] = {}
        self.calls: Counter[str] = Counter()
        self.creations: Counter[str] = Counter()
        self.born: dict[str, float] = {}  # node name or run id (network) -> when it was made
        self.clock = time.time  # what `born` is stamped with (tests may replace it)
        # create_node calls running at once, and the most seen: a fan-out's proof without a clock
        self.creates_in_flight = 0
        self.peak_creates_in_flight = 0
        # called inside create_node while it counts as in flight (a test may hold creates there)
        self.create_hook: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._next_ip = 0

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """One firewall resource per run. Pure."""
        return [
            Resource(self.provider_name, "firewall", f"ct-{run.run_id}-fw", run.region, run.run_id)
        ]

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """Record the run's firewall. Idempotent."""
        self._count("ensure_network")
        with self._lock:
            self.born.setdefault(f"net:{run.run_id}", self.clock())
            return list(self.networks.setdefault(run.run_id, self.planned_network(run)))

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Make a running node, or return the live one with this name. Idempotent."""
        self._count("create_node")
        with self._lock:
            self.creates_in_flight += 1
            self.peak_creates_in_flight = max(self.peak_creates_in_flight, self.creates_in_flight)
        try:
            if self.create_hook is not None:
                self.create_hook()
            return self._create(run, request)
        finally:
            with self._lock:
                self.creates_in_flight -= 1

    def zones(self) -> list[str]:
        """The scripted zones of the region."""
        return list(self.zone_names)

    def _refuse(self, run: RunInfo, request: NodeRequest) -> None:
        """Raise as the scripted account says, else take one node of capacity. Locked."""
        zone = request.zone or run.zone or ""
        live = sum(1 for n in self.nodes.values() if n.alive)
        if self.quota is not None and live + 1 > self.quota:
            raise QuotaError(f"quota of {self.quota} nodes in {self.region} reached")
        for left in (self.capacity, self.spot_capacity if request.spot else {}):
            if zone in left and left[zone] <= 0:
                raise NoCapacityError(f"no capacity in {zone}", zone=zone)
        for left in (self.capacity, self.spot_capacity if request.spot else {}):
            if zone in left:
                left[zone] -= 1

    def _create(self, run: RunInfo, request: NodeRequest) -> Node:
        node = self._make(run, request)
        if self.on_create is not None:
            self.on_create(run, node)
        return node

    def _make(self, run: RunInfo, request: NodeRequest) -> Node:
        with self._lock:
            existing = self.nodes.get(request.name)
            if existing is not None and existing.alive:
                return existing
            self._refuse(run, request)
            self._next_ip += 1
            node = Node(
                name=request.name,
                run_id=request.run_id,
                role=request.role,
                index=request.index,
                state="running",
                private_ip=f"10.0.{self._next_ip // 250}.{self._next_ip % 250 + 2}",
                spot=request.spot,
                zone=request.zone or run.zone,
                instance_type=request.instance_type,
                cloud_id=f"mem-{request.name}",
            )
            self.nodes[node.name] = node
            self.born[node.name] = self.clock()
            self.creations[node.name] += 1
            return node

    def list_nodes(self, run_id: str) -> list[Node]:
        """The run's nodes, sorted by name."""
        self._count("list_nodes")
        with self._lock:
            nodes = [n for n in self.nodes.values() if n.run_id == run_id]
        return sorted(nodes, key=lambda n: n.name)

    def delete_node(self, node: Node) -> None:
        """Forget the node. Idempotent."""
        self._count("delete_node")
        with self._lock:
            self.nodes.pop(node.name, None)

    def list_resources(self, run_id: str) -> list[Resource]:
        """The run's firewall, if made."""
        self._count("list_resources")
        with self._lock:
            return list(self.networks.get(run_id, []))

    def delete_resources(self, resources: list[Resource]) -> None:
        """Forget the runs' network resources. Idempotent."""
        self._count("delete_resources")
        with self._lock:
            for r in resources:
                self.networks.pop(r.run_id, None)
                self.born.pop(f"net:{r.run_id}", None)

    def inventory(self) -> list[Tagged]:
        """Every node and network resource of every run, with when it was made."""
        self._count("inventory")
        region = self.region
        with self._lock:
            out = [
                Tagged(n.run_id, "node", n.name, self.born.get(n.name), n.instance_type, region)
                for n in self.nodes.values()
            ]
            for run_id, resources in self.networks.items():
                born = self.born.get(f"net:{run_id}")
                out += [
                    Tagged(run_id, r.kind, r.id, born, None, r.region or region) for r in resources
                ]
        return sorted(out, key=lambda t: (t.run_id, t.kind, t.id))


def _bounded(data: bytes, max_bytes: int | None, what: str) -> bytes:
    if max_bytes is not None and len(data) > max_bytes:
        raise TooLarge(f"{what}: more than {max_bytes} bytes, not read")
    return data


class MemoryStore:
    """An ObjectStore over a dict shared by every store with the same URI. Thread-safe."""

    def __init__(self, uri: str, objects: Objects, lock: threading.Lock) -> None:
        self.uri = uri
        self.objects = objects
        self._lock = lock

    def ensure_bucket(self) -> Resource:
        """Nothing to create. Idempotent."""
        return Resource("memory", "bucket", self.uri, None, "")

    def put(self, key: str, data: bytes) -> None:
        """Store a copy of `data`. Idempotent."""
        with self._lock:
            self.objects[key] = (bytes(data), time.time(), _new_tag())

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """The object's bytes. Raises NotFound, and TooLarge past `max_bytes`."""
        with self._lock:
            if key not in self.objects:
                raise NotFound(f"{self.uri}/{key} does not exist")
            return _bounded(self.objects[key][0], max_bytes, f"{self.uri}/{key}")

    def put_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """Store a file's bytes, then `progress(size)`. Idempotent."""
        data = Path(path).read_bytes()
        self.put(key, data)
        if progress is not None and data:
            progress(len(data))

    def get_file(self, key: str, path: str, progress: Callable[[int], None] | None = None) -> None:
        """Write the object to `path`, then `progress(size)`. Raises NotFound."""
        data = self.get(key)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
        if progress is not None and data:
            progress(len(data))

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects under `prefix`, sorted by key."""
        with self._lock:
            items = sorted((k, v) for k, v in self.objects.items() if k.startswith(prefix))
        return [ObjectInfo(k, len(data), updated) for k, (data, updated, _tag) in items]

    def delete(self, key: str) -> None:
        """Idempotent."""
        with self._lock:
            self.objects.pop(key, None)

    def delete_prefix(self, prefix: str) -> int:
        """Idempotent; returns how many were deleted."""
        with self._lock:
            keys = [k for k in self.objects if k.startswith(prefix)]
            for k in keys:
                del self.objects[k]
        return len(keys)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object's bytes and tag (new on every write), or None; TooLarge past
        `max_bytes`."""
        with self._lock:
            found = self.objects.get(key)
            if found is None:
                return None
            try:
                return _bounded(found[0], max_bytes, f"{self.uri}/{key}"), found[2]
            except TooLarge as exc:  # with its tag, as every store's (a put_if can replace it)
                exc.tag = found[2]
                raise

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write only if the object's tag is `tag` (None: only if absent), atomically; the new
        tag. Raises PreconditionFailed."""
        with self._lock:
            found = self.objects.get(key)
            current = None if found is None else found[2]
            if current != tag:
                raise PreconditionFailed(f"{self.uri}/{key}: tag is {current}, not {tag}")
            new = _new_tag()
            self.objects[key] = (bytes(data), time.time(), new)
            return new

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A fake URL."""
        return f"{self.uri}/{key}?op=get&ttl={ttl_s}"

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A fake URL."""
        return f"{self.uri}/{key}?op=put&ttl={ttl_s}"


class MemoryProvider(Provider):
    """A provider whose compute and stores live in this object. URIs look like `mem://bucket`."""

    name = "memory"

    def __init__(
        self,
        config: ProviderConfig | None = None,
        buckets: dict[str, Objects] | None = None,
        compute: MemoryCompute | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        super().__init__(config or ProviderConfig("memory", region="mem-1", zone="mem-1a"))
        self.name = self.config.name  # "memory", or the cloud a MemoryClouds poses as
        self._compute = compute or MemoryCompute(self.config.region or "mem-1")
        self.buckets: dict[str, Objects] = {} if buckets is None else buckets
        self._lock = lock or threading.Lock()  # one per set of buckets (MemoryClouds: a cloud's)

    @property
    def compute(self) -> MemoryCompute:
        """The one MemoryCompute."""
        return self._compute

    def store(self, uri: str) -> MemoryStore:
        """A store over the objects kept for `uri`. Creates nothing."""
        with self._lock:
            return MemoryStore(uri, self.buckets.setdefault(uri.rstrip("/"), {}), self._lock)

    def default_store_uri(self, run_id: str) -> str:
        """`mem://ct-<run_id>`."""
        return f"mem://ct-{run_id}"

    def owns_bucket(self, uri: str) -> bool:
        """Only the auto buckets."""
        return uri.startswith("mem://ct-")


class MemoryClouds:
    """Memory providers posing as clouds: one compute per (cloud, region), kept across the
    providers built for it, and one set of buckets per cloud (a cloud's store is reached from
    every region of it, never from another cloud). Thread-safe."""

    def __init__(self) -> None:
        self.computes: dict[tuple[str, str], MemoryCompute] = {}
        self.buckets: dict[str, dict[str, Objects]] = {}
        self.locks: dict[str, threading.Lock] = {}  # a cloud's buckets'
        self._lock = threading.Lock()

    def compute(self, cloud: str, region: str, zones: list[str] | None = None) -> MemoryCompute:
        """The region's compute (made on first use, with `zones`), to script or inspect."""
        with self._lock:
            found = self.computes.get((cloud, region))
            if found is None:
                found = self.computes[(cloud, region)] = MemoryCompute(region, zones)
                found.provider_name = cloud
            return found

    def provider(self, cloud: str, region: str, zone: str | None = None) -> MemoryProvider:
        """A provider of `cloud` in `region` over the kept compute and the cloud's buckets."""
        compute = self.compute(cloud, region)
        with self._lock:
            buckets = self.buckets.setdefault(cloud, {})
            lock = self.locks.setdefault(cloud, threading.Lock())
        config = ProviderConfig(cloud, region=region, zone=zone, account=f"{cloud}-account")
        return MemoryProvider(config, buckets=buckets, compute=compute, lock=lock)

    def objects(self, cloud: str, uri: str) -> Objects:
        """What the cloud's bucket at `uri` holds (an empty dict when never written)."""
        with self._lock:
            return self.buckets.setdefault(cloud, {}).setdefault(uri.rstrip("/"), {})
