"""A synthetic run's bucket: what an 8-node, three-day run leaves, written directly (issue 19).

`generate(sink, run_id, shape)` writes every object a run of `shape` leaves under its prefix, in
the formats jobs/protocol.py defines and the agent writes:

- logs/<node>/<seq>.log: Keras-like chunks (progress bars, epoch lines, TF warnings; a few
  hundred bytes to a few KB), deterministic per (node, seq) so a reader's output can be checked
  (`chunk_text`, `expected_lines`);
- logs/<node>/segments/<a>-<b>.log and logs/<node>/index.json: the chunks rolled into segments as
  jobs/logpump.py rolls them (closed at `segment_bytes` or `segment_s` of the run's clock,
  whichever first), with a LogIndex naming them, and the open segment as its agent last uploaded
  it whole (logs/<node>/segments/open-<a>.log, every snapshot_s);
- metrics/<node>/<seq>.jsonl (one chunk per metrics FLUSH_S of the run's life), checkpoints/
  (sharded TF checkpoints), model/, tensorboard/, bundle/, the journal (ledger/), cluster.json,
  control/lease and control/launch.json, attempt-1/ registrations and the restore barrier;
- per node: status/<node>.json, heartbeat/<node>.json (`log_seq` = its last chunk) and
  bootstrap/<node>.log.

A `Sink` takes (key, bytes): `MotoSink` writes into an in-process moto server's S3 backend and
`GcsSink` into an in-process gcp-storage-emulator's storage (each what the SDKs then read back
through the server), `StoreSink` through any ObjectStore with parallel PUTs (slow for 400,000
objects, but any store). `advance(store, run)` is a live run's next beat through the real store:
one new chunk and one heartbeat per node.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.protocol import ClusterDoc, Heartbeat, LogIndex, NodeState, NodeStatus

MiB = 1024 * 1024
METRICS_FLUSH_S = 10.0  # jobs/metrics.FLUSH_S: one metrics chunk per node per 10 s at most
EPOCH_STEPS = 1875


@dataclass(frozen=True)
class Shape:
    """How big a synthetic run is. `hours` is the run's age: chunks are spread evenly over it,
    and segments close at `segment_bytes` or every `segment_s` of it."""

    nodes: int = 8
    hours: float = 72.0
    chunks_per_node: int = 25_000  # x 8 = 200,000 log chunks
    checkpoint_objects: int = 5_004  # sharded checkpoints: 8 data shards + an index, x 556
    metrics_per_node: int = int(72 * 3600 / METRICS_FLUSH_S)  # the agent's pace: 25,920
    model_files: int = 12
    tensorboard_files: int = 24
    segment_bytes: int = 8 * MiB  # ClusterDoc.log_segment_bytes
    segment_s: float = 3600.0  # ClusterDoc.log_segment_s
    snapshot_s: float = 60.0  # ClusterDoc.log_snapshot_s
    epochs: int = 300

    def node_names(self) -> list[str]:
        """'worker-0'...: the run's nodes, sorted as `logs` prints them."""
        return sorted(proto.node_id("worker", i) for i in range(self.nodes))


OLD = Shape()
# a run ten minutes old: ~1,000 objects, no segment closed yet
YOUNG = Shape(
    hours=1 / 6,
    chunks_per_node=60,
    checkpoint_objects=19,
    metrics_per_node=int(600 / METRICS_FLUSH_S),
    tensorboard_files=2,
)


class Sink(Protocol):
    """Where the generator writes: objects by their full key inside the store's root."""

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Write every (key, body); returns how many. Blocks until written."""


@dataclass
class SyntheticRun:
    """What `generate` wrote: enough to advance the run and to check a reader's output."""

    run_id: str
    shape: Shape
    last_seq: dict[str, int]  # node -> its last chunk
    objects: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # "logs" -> objects written
    beat: int = 0  # beats advanced since generate
    started: float = 0.0
    written_at: float = 0.0  # when the heartbeats were last written


# --- content -------------------------------------------------------------------------------------
_WARNINGS = (
    "W tensorflow/core/framework/local_rendezvous.cc:404] Local rendezvous is aborting with "
    "status: OUT_OF_RANGE: End of sequence",
    "I tensorflow/core/grappler/optimizers/data/replicate_on_split.cc:32] Running "
    "replicate on split optimization",
    "W tensorflow/core/kernels/data/cache_dataset_ops.cc:914] The calling iterator did not "
    "fully read the dataset being cached.",
    "I tensorflow/core/common_runtime/executor.cc:1197] [/device:CPU:0] (DEBUG INFO) Executor "
    "start aborting (this does not indicate an error and you can ignore this message)",
)


def _rng(run_id: str, node: str, seq: int) -> random.Random:
    digest = hashlib.blake2b(f"{run_id}/{node}/{seq}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _bar(step: int) -> str:
    done = 30 * step // EPOCH_STEPS
    return "=" * max(done - 1, 0) + (">" if done else "") + "." * (30 - max(done, 1))


def chunk_text(run_id: str, node: str, seq: int, shape: Shape) -> str:
    """Chunk `seq` of `node`'s stream: 2 to 24 Keras-like lines, each ending in a newline (as
    LogPump.flush writes them). Deterministic; pure."""
    rng = _rng(run_id, node, seq)
    epoch = 1 + seq * shape.epochs // max(shape.chunks_per_node, 1)
    step = rng.randrange(1, EPOCH_STEPS)
    loss = 2.3 / (1 + epoch * 0.05) + rng.random() * 0.01
    lines = []
    for _ in range(rng.randint(2, 24)):
        roll = rng.random()
        step = min(step + rng.randint(10, 60), EPOCH_STEPS)
        if roll < 0.80:
            eta = (EPOCH_STEPS - step) * 6 // 1000
            lines.append(
                f"{step:>5d}/{EPOCH_STEPS} [{_bar(step)}] - ETA: {eta // 60}:{eta % 60:02d} - "
                f"loss: {loss:.4f} - accuracy: {1 - loss / 3:.4f}"
            )
        elif roll < 0.88:
            lines.append(f"Epoch {epoch}/{shape.epochs}")
        elif roll < 0.94:
            lines.append(
                f"{EPOCH_STEPS}/{EPOCH_STEPS} - 12s - loss: {loss:.4f} - accuracy: "
                f"{1 - loss / 3:.4f} - val_loss: {loss * 1.1:.4f} - val_accuracy: "
                f"{1 - loss / 2.8:.4f} - 6ms/step"
            )
        elif roll < 0.97:
            lines.append(f"cloudtrain: epoch {epoch}/{shape.epochs} done")
        else:
            lines.append(
                f"2026-01-0{1 + seq % 3} 12:00:00.{rng.randrange(10**6):06d}: "
                f"{rng.choice(_WARNINGS)}"
            )
    return "\n".join(lines) + "\n"


def expected_lines(run_id: str, shape: Shape, last_seq: dict[str, int]) -> Iterator[str]:
    """Every log line of the run, node by node in sorted node order, chunk order within a node:
    what `cloudtrain logs RUN` prints (without node prefixes). Pure."""
    for node in sorted(last_seq):
        for seq in range(last_seq[node] + 1):
            yield from proto.log_lines(chunk_text(run_id, node, seq, shape))


def _metrics_chunk(rng: random.Random, t: float) -> bytes:
    records = [
        {
            "time": t,
            "kind": "window",
            "epoch": rng.randint(1, 300),
            "step": rng.randint(1, 1875),
            "examples_per_s": round(rng.uniform(900, 1100), 1),
            "steps_per_s": 31.2,
            "step_p50_s": 0.031,
            "step_p95_s": 0.044,
        },
        {
            "time": t,
            "kind": "process",
            "cpu_percent": round(rng.uniform(150, 190), 1),
            "rss_bytes": 3_100_000_000,
            "processes": 3,
        },
        {
            "time": t,
            "kind": "gpu",
            "gpus": [
                {"index": 0, "util_percent": 93, "mem_used_mib": 14_000, "mem_total_mib": 16_384}
            ],
        },
    ]
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def _bootstrap_log(node: str) -> bytes:
    lines = [
        f"2026-01-01T00:00:0{i}Z cloudtrain-bootstrap[{node}]: {text}"
        for i, text in enumerate(
            (
                "phase python: checking",
                "phase python: ok (3.11.7)",
                "phase bundle: fetching",
                "phase bundle: ok",
                "phase agent: starting",
            )
        )
    ]
    return ("\n".join(lines) + "\n").encode()


# --- the run --------------------------------------------------------------------------------------
def _node_logs(run_id: str, node: str, shape: Shape, t0: float) -> Iterator[tuple[str, bytes]]:
    """A node's chunks, then its closed segments and their index (as LogPump rolls them)."""
    period = shape.hours * 3600 / max(shape.chunks_per_node, 1)
    segments: list[dict[str, Any]] = []
    opened_at, first_seq, lines_before = t0, 0, 0
    parts: list[bytes] = []
    size = 0
    for seq in range(shape.chunks_per_node):
        body = chunk_text(run_id, node, seq, shape).encode()
        yield proto.log_chunk_key(run_id, node, seq), body
        parts.append(body)
        size += len(body)
        now = t0 + (seq + 1) * period
        last = seq == shape.chunks_per_node - 1
        if (size >= shape.segment_bytes or now - opened_at >= shape.segment_s) and not last:
            data = b"".join(parts)
            key = proto.log_segment_key(run_id, node, first_seq, seq)
            lines = len(proto.log_lines(data.decode()))
            yield key, data
            segments.append(
                {
                    "key": key,
                    "first_seq": first_seq,
                    "last_seq": seq,
                    "first_line": lines_before,
                    "lines": lines,
                    "bytes": len(data),
                    "time": now,
                }
            )
            opened_at, first_seq, lines_before = now, seq + 1, lines_before + lines
            parts, size = [], 0
    if segments:  # the index exists once a first segment closed (LogPump writes it then)
        yield proto.log_index_key(run_id, node), LogIndex(node=node, segments=segments).to_json()
    # the open segment as its agent last uploaded it (every snapshot_s while it grew): all of
    # its chunks but those of the last snapshot_s
    held = len(parts) - 1 - int(shape.snapshot_s // period)
    if held >= 1:
        data = b"".join(parts[: held + 1])
        lines = len(proto.log_lines(data.decode()))
        body = proto.open_segment_body(first_seq + held, lines, data)
        yield proto.log_open_segment_key(run_id, node, first_seq), body


def _node_docs(
    run_id: str, node: str, shape: Shape, now: float, beat: int
) -> list[tuple[str, bytes]]:
    """The node's heartbeat and status, both announcing its last chunk."""
    last = shape.chunks_per_node - 1 + beat
    epoch = min(1 + last * shape.epochs // max(shape.chunks_per_node, 1), shape.epochs)
    beat_doc = Heartbeat(
        time=now,
        attempt=1,
        state=NodeState.RUNNING,
        epoch=epoch,
        epochs=shape.epochs,
        last_line=f"  900/{EPOCH_STEPS} [===>...] - loss: 0.1234",
        pid=4242,
        metrics={"examples_per_s": 1010.5, "steps_per_s": 31.2, "loss": 0.1234},
        log_seq=last,
    )
    status = NodeStatus(state=NodeState.RUNNING, attempt=1, time=now - 60, pid=4242, log_seq=last)
    return [
        (proto.heartbeat_key(run_id, node), beat_doc.to_json()),
        (proto.status_key(run_id, node), status.to_json()),
    ]


def _objects(run_id: str, shape: Shape, t0: float) -> Iterator[tuple[str, str, bytes]]:
    """(kind, key, body) of every object of the run."""
    base = proto.run_prefix(run_id)
    nodes = shape.node_names()
    now = t0 + shape.hours * 3600
    cluster = ClusterDoc(
        run_id=run_id,
        strategy="multi_worker_mirrored",
        roles={"worker": shape.nodes},
        port=2222,
        attempt=1,
        entrypoint="python train.py --epochs 300",
    )
    yield "docs", proto.cluster_key(run_id), cluster.to_json()
    lease = proto.LeaseDoc(owner="controller@host", term=1, expires=now + 60, time=now)
    yield "docs", proto.lease_key(run_id), lease.to_json()
    yield "docs", proto.launch_key(run_id), json.dumps({"run_id": run_id}).encode()
    yield "docs", proto.bundle_key(run_id, "ab" * 32), b"\x1f\x8b" + bytes(4096)
    for i in range(8):
        yield "docs", f"{proto.journal_prefix(run_id)}{i:08d}.json", b'{"op": "set_status"}'
    yield "docs", proto.checkpoints_ready_key(run_id, 1), b'{"time": 0, "by": "worker-0"}'
    for node in nodes:
        reg = proto.Registration(address=f"10.0.0.{nodes.index(node) + 2}:2222", time=t0)
        yield "docs", proto.registration_key(run_id, 1, node), reg.to_json()
        yield "docs", proto.bootstrap_log_key(run_id, node), _bootstrap_log(node)
        for key, body in _node_docs(run_id, node, shape, now, 0):
            yield "docs", key, body
        for key, body in _node_logs(run_id, node, shape, t0):
            yield "logs", key, body
        rng = random.Random(node)
        for seq in range(shape.metrics_per_node):
            t = t0 + seq * METRICS_FLUSH_S
            yield "metrics", proto.metrics_chunk_key(run_id, node, seq), _metrics_chunk(rng, t)
    ckpt = proto.checkpoints_prefix(run_id)
    yield "checkpoints", f"{ckpt}checkpoint", b'model_checkpoint_path: "ckpt-556"\n'
    for n in range((shape.checkpoint_objects - 1) // 9 + 1):
        yield "checkpoints", f"{ckpt}ckpt-{n + 1}.index", bytes(2048)
        for shard in range(8):
            yield "checkpoints", f"{ckpt}ckpt-{n + 1}.data-{shard:05d}-of-00008", bytes(4096)
    model = proto.model_prefix(run_id)
    for i in range(shape.model_files):
        yield (
            "model",
            f"{model}variables/variables.data-{i:05d}-of-{shape.model_files:05d}",
            bytes(4096),
        )
    tb = proto.tensorboard_prefix(run_id)
    for i in range(shape.tensorboard_files):
        yield "tensorboard", f"{tb}train/events.out.tfevents.{i}.worker-0", bytes(1024)
    del base


def generate(sink: Sink, run_id: str, shape: Shape, batch: int = 2000) -> SyntheticRun:
    """Write the whole run through `sink`; returns what was written. Not idempotent in cost
    (rewrites every object), idempotent in content. Blocks."""
    t0 = time.time() - shape.hours * 3600
    run = SyntheticRun(run_id, shape, {n: shape.chunks_per_node - 1 for n in shape.node_names()})
    run.started = t0
    pending: list[tuple[str, bytes]] = []
    for kind, key, body in _objects(run_id, shape, t0):
        run.by_kind[kind] = run.by_kind.get(kind, 0) + 1
        pending.append((key, body))
        if len(pending) >= batch:
            run.objects += sink.put_many(pending)
            pending = []
    run.objects += sink.put_many(pending)
    run.written_at = time.time()
    return run


def advance(store: Any, run: SyntheticRun) -> None:
    """The live run's next beat, through `store` (the real SDK): per node, a new log chunk,
    then a heartbeat announcing it (the agent's order), in parallel over nodes. Waits first for
    the clock's next second after the last beat, as a live agent's beats are apart (heartbeat_s
    2 s): S3 lists LastModified in whole seconds, and a reader that tells a changed document by
    (size, LastModified) cannot see two same-size writes within one second. Blocks."""
    wait = math.floor(run.written_at) + 1 - time.time()
    if wait > 0:
        time.sleep(wait)
    run.beat += 1
    shape = run.shape
    now = time.time()

    def one(node: str) -> None:
        seq = run.last_seq[node] + 1
        store.put(
            proto.log_chunk_key(run.run_id, node, seq),
            chunk_text(run.run_id, node, seq, shape).encode(),
        )
        run.last_seq[node] = seq
        key, body = _node_docs(run.run_id, node, shape, now, run.beat)[0]
        store.put(key, body)

    with ThreadPoolExecutor(max_workers=len(run.last_seq)) as pool:
        list(pool.map(one, sorted(run.last_seq)))
    run.written_at = time.time()


# --- sinks ----------------------------------------------------------------------------------------
class StoreSink:
    """Parallel PUTs through an ObjectStore (keys relative to it). Any store; slow at 400,000."""

    def __init__(self, store: Any, workers: int = 32) -> None:
        self.store, self.workers = store, workers

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> int:
        """See Sink.put_many."""
        items = list(items)
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(lambda kv: self.store.put(*kv), items))
        return len(items)


class MotoSink:
    """Straight into the S3 backend of a moto server running in this process (what its S3 API
    serves: the same FakeKey objects a PutObject makes). `root` is the store's key prefix."""

    def __init__(self, bucket: str, root: str = "") -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        self.backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        self.bucket, self.root = bucket, root

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> int:
        """See Sink.put_many. The bucket must exist (ensure_bucket through the SDK first)."""
        n = 0
        for key, body in items:
            self.backend.put_object(self.bucket, self.root + key, body, disable_notification=True)
            n += 1
        return n


class GcsSink:
    """Straight into the storage of a gcp-storage-emulator running in this process: the object
    resource its media upload makes (`_make_object_resource`, checksums) and the bytes, without
    the emulator's rewrite of its whole metadata file after every object (in memory that file
    is only read back at a restart; at 400,000 objects it costs seconds per write). Call
    `quiet_metadata(storage)` so writes through the API skip it too."""

    def __init__(self, storage: Any, bucket: str, base_url: str, root: str = "") -> None:
        self.storage, self.bucket, self.base_url, self.root = storage, bucket, base_url, root

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> int:
        """See Sink.put_many. The bucket must exist (ensure_bucket through the SDK first)."""
        from gcp_storage_emulator.handlers import objects

        objs = self.storage.objects.setdefault(self.bucket, {})
        n = 0
        for key, body in items:
            name = self.root + key
            obj = objects._make_object_resource(
                self.base_url, self.bucket, name, "application/octet-stream", str(len(body))
            )
            obj = objects._checksums(body, obj)
            self.storage._store.write_bytes(self.storage._object_path(self.bucket, name), body)
            objs[name] = obj
            n += 1
        return n


def quiet_metadata(storage: Any) -> None:
    """Stop an in-memory emulator's Storage from re-serializing every object's metadata after
    each write (see GcsSink). Only for `in_memory` emulators."""
    if storage.get_storage_base() != "memory":
        raise ValueError("only an in-memory emulator keeps no metadata file worth writing")
    storage._write_config_to_file = lambda: None
