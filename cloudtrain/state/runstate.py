"""Read a run's state from its bucket prefix: statuses, heartbeats and new log lines.

One `poll()` costs the same on day 3 of a run as in its first minute. It GETs each node's small
documents (status, heartbeat, notice: the caller names the nodes) and the stop key, lists
only `bootstrap/` (one object per node), and reads each node's new log chunks by sequence number
up to the one its heartbeat or status announces (cloudtrain/state/log_reader.py). It never lists
logs/, checkpoints/, model/ or metrics/, which grow with the run: calls per poll are 1 LIST + 3 GETs
per node + 1 + the new chunks, whatever the bucket holds. A poll takes at most POLL_LOG_BYTES of
a node's stream (`Snapshot.logs_behind` says when more is waiting). GETs rather than listings
also mean a changed document is seen by its bytes, not by a listing's one-second timestamps. Used
by the orchestrator's watch loop and by `cloudtrain status` / `cloudtrain logs`. Not
thread-safe. The keys and the documents are jobs/protocol.py's. What a node wrote is untrusted:
every GET is bounded (jobs/bucket_reads.py), and a document too large, too deep or ill-typed (or
not parsed yet) is skipped, with one warning per key for the reader's life (`skips`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cloudtrain.core.errors import NotFound, TooLarge
from cloudtrain.jobs import protocol
from cloudtrain.jobs.bucket_reads import (
    BOOT_LOG_MAX_BYTES,
    STOP_MAX_BYTES,
    Skips,
    get_bounded,
    parse_document,
)
from cloudtrain.jobs.protocol import Document, Heartbeat, NodeStatus, NoticeDoc
from cloudtrain.providers.base import ObjectInfo, ObjectStore
from cloudtrain.state import bootlog
from cloudtrain.state.log_reader import NodeCursor, read_new

__all__ = ["RunReader", "Snapshot", "archive_bootstrap_log"]
_DOCUMENTS: dict[str, type[Document]] = {
    protocol.STATUS: NodeStatus,
    protocol.HEARTBEAT: Heartbeat,
    protocol.NOTICE: NoticeDoc,
}
# a node's documents one poll GETs, by kind
_NODE_KEYS = {
    protocol.STATUS: protocol.status_key,
    protocol.HEARTBEAT: protocol.heartbeat_key,
    protocol.NOTICE: protocol.notice_key,
}
POOL_SIZE = 16  # a poll's parallel reads (one long-lived pool: a GCS client per thread)
# a poll takes at most this much of one node's log stream (the chunk that crosses it included);
# the next poll goes on from there: a node far ahead is caught up over several polls
POLL_LOG_BYTES = 8 * 1024 * 1024


@dataclass
class Snapshot:
    """What one poll found: statuses and heartbeats by node ('worker-1'), and new log lines.
    The documents are typed (and are read-only dicts too: `status["state"]`)."""

    statuses: dict[str, NodeStatus] = field(default_factory=dict)
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    notices: dict[str, NoticeDoc] = field(default_factory=dict)  # preemption notices
    new_lines: list[tuple[str, str]] = field(default_factory=list)
    stop_requested: bool = False
    bootstrap_failures: dict[str, str] = field(default_factory=dict)  # node -> the FAILED reason
    bootstrap_phases: dict[str, str] = field(default_factory=dict)  # node -> "python: installing"
    bootstrap_durations: dict[str, dict[str, float]] = field(default_factory=dict)
    agent_exits: dict[str, int] = field(default_factory=dict)  # node -> the agent's exit code
    bootstrap_tails: dict[str, list[str]] = field(default_factory=dict)  # node -> last lines
    # node -> when (this machine's clock) a poll last read a new heartbeat of it
    heartbeat_seen: dict[str, float] = field(default_factory=dict)
    # a node's stream had more than POLL_LOG_BYTES to read: the next poll reads on at once
    logs_behind: bool = False


class RunReader:
    """Incremental reader of one run's prefix. With `logs` False (`cloudtrain status`) it reads
    no log lines at all; with `log_node` ('worker-1') only that node's. A node's lines are read
    from the start of its stream the first time the node is seen (up to the first chunk not
    there), then up to what it announces."""

    def __init__(
        self,
        store: ObjectStore,
        run_id: str,
        *,
        logs: bool = True,
        log_node: str | None = None,
        nodes: Sequence[str] | None = None,
    ) -> None:
        self.store, self.run_id, self.logs, self.log_node = store, run_id, logs, log_node
        self.snapshot = Snapshot()
        self._seen: dict[str, tuple[int, float]] = {}  # bootstrap logs: (size, time) read
        self._bodies: dict[str, bytes] = {}  # a node document's bytes, as last taken
        self._nodes: list[str] | None = sorted(nodes) if nodes else None  # the caller's
        self.cursors: dict[str, NodeCursor] = {}  # node -> how far its stream was read
        self._pool: ThreadPoolExecutor | None = None
        self.skips = Skips()  # what could not be read, by key: one warning each

    def _executor(self) -> ThreadPoolExecutor:
        """The reader's pool, made once (threads live as long as the reader: a store that keeps
        an SDK client per thread builds it once, not every poll)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="poll")
            weakref.finalize(self, self._pool.shutdown, wait=False)
        return self._pool

    def close(self) -> None:
        """End the reader's threads. Idempotent; the reader may poll again afterwards."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def nodes(self) -> list[str]:
        """The run's nodes ('worker-1'), sorted: the ones the reader was given (the controller
        knows its plan's; `status` and `logs` take the ledger's), else the nodes that wrote a
        status, heartbeat or notice (three small listings, each at most a document per node).
        Never from cluster.json, which holds the run's secrets. Blocks."""
        if self._nodes is not None:
            return self._nodes
        base = protocol.run_prefix(self.run_id)
        folders = [f"{base}{kind}/" for kind in _NODE_KEYS]
        listed = self._executor().map(self.store.list, folders)
        found = (protocol.classify(self.run_id, o.key) for objs in listed for o in objs)
        return sorted({f[1] for f in found if f is not None and f[0] in _NODE_KEYS})

    def poll(self) -> Snapshot:
        """Read the run's small documents and what is new. Returns the updated snapshot whose
        `new_lines` holds only lines not returned before, in order per node (nodes sorted).
        Blocks for a bounded number of calls, in parallel: one listing of bootstrap/, three
        GETs per node and the stop key's, GETs of changed bootstrap logs, new log chunks."""
        snap = self.snapshot
        snap.new_lines, snap.logs_behind = [], False
        read_at = time.time()
        pool = self._executor()
        listing = pool.submit(self.store.list, protocol.bootstrap_prefix(self.run_id))
        wanted = [(kind, node) for node in self.nodes() for kind in _NODE_KEYS]
        keys = [_NODE_KEYS[kind](self.run_id, node) for kind, node in wanted]
        stop = pool.submit(self._stop_requested)
        bodies = list(pool.map(self._get_document, [_DOCUMENTS[k] for k, _n in wanted], keys))
        snap.stop_requested = stop.result()
        by_kind = {protocol.STATUS: snap.statuses, protocol.HEARTBEAT: snap.heartbeats}
        by_kind[protocol.NOTICE] = snap.notices
        for (kind, node), key, body in zip(wanted, keys, bodies, strict=True):
            if body is None or self._bodies.get(key) == body:
                continue  # not there (yet), too large, or as last read
            doc = parse_document(_DOCUMENTS[kind], body, key, self.skips)
            if doc is None:  # half-written or hostile: read again next poll (warned once)
                continue
            self._bodies[key] = body
            by_kind[kind][node] = doc  # type: ignore[index]
            if kind == protocol.HEARTBEAT:
                snap.heartbeat_seen[node] = read_at
        self._read_bootstrap(listing.result(), pool)
        if self.logs:
            snap.new_lines = self._new_lines(pool)
        return snap

    def _get_document(self, kind: type[Document], key: str) -> bytes | None:
        """The bytes at `key` if there are at most kind.MAX_BYTES of them (else skipped)."""
        return get_bounded(self.store, key, kind.MAX_BYTES, self.skips)

    def _stop_requested(self) -> bool:
        """Whether control/stop exists (its body, of any size, does not count)."""
        try:
            self.store.get(protocol.stop_key(self.run_id), max_bytes=STOP_MAX_BYTES)
        except NotFound:
            return False
        except TooLarge:
            return True
        return True

    def _get_log(self, key: str) -> bytes | None:
        """A bootstrap log's bytes, if at most BOOT_LOG_MAX_BYTES (else skipped)."""
        return get_bounded(self.store, key, BOOT_LOG_MAX_BYTES, self.skips)

    def _read_bootstrap(self, objects: list[ObjectInfo], pool: ThreadPoolExecutor) -> None:
        """Take in the bootstrap logs that changed since the last poll (by the listing's size
        and time), and forget those that vanished."""
        keys = {o.key for o in objects}
        self._forget_vanished_bootstrap_logs(keys)
        changed: list[tuple[str, str]] = []
        for obj in objects:
            found = protocol.classify(self.run_id, obj.key)
            if found is None or found[0] != protocol.BOOTSTRAP:
                continue
            if self._changed(obj.key, (obj.size, obj.updated)):
                changed.append((found[1], obj.key))
        bodies = list(pool.map(self._get_log, [key for _node, key in changed]))
        for (node, _key), body in zip(changed, bodies, strict=True):
            self._take_bootstrap(node, body)

    def _take_bootstrap(self, node: str, body: bytes | None) -> None:
        snap = self.snapshot
        boot = bootlog.parse((body or b"").decode(errors="replace"))
        if boot.failed is not None:
            snap.bootstrap_failures[node] = boot.failed
        else:
            snap.bootstrap_failures.pop(node, None)
        if boot.phase:
            snap.bootstrap_phases[node] = boot.phase
        if boot.durations:  # with a bare image's python steps ("python.pip", ...)
            snap.bootstrap_durations[node] = {**boot.durations, **boot.step_durations()}
        if boot.agent_exit is not None:
            snap.agent_exits[node] = boot.agent_exit
        else:
            snap.agent_exits.pop(node, None)
        snap.bootstrap_tails[node] = boot.tail

    def announced(self, node: str) -> int | None:
        """The last log chunk the node said it uploaded (its heartbeat's or status's log_seq,
        the larger), or None when neither says. Pure."""
        snap = self.snapshot
        docs = (snap.heartbeats.get(node), snap.statuses.get(node))
        known = [doc.log_seq for doc in docs if doc is not None and doc.log_seq is not None]
        return max(known) if known else None

    def _new_lines(self, pool: ThreadPoolExecutor) -> list[tuple[str, str]]:
        """Each node's lines after its cursor, in parallel over nodes. A node seen for the first
        time is read up to its first missing chunk (its whole stream so far: a run written
        before log_seq existed, or chunks uploaded after the last announcement); later, up to
        what it announces. Blocks; never lists."""
        snap = self.snapshot
        todo: list[tuple[NodeCursor, int | None, bool]] = []  # (cursor, up to, probe after)
        for node in sorted(set(snap.statuses) | set(snap.heartbeats)):
            if self.log_node is not None and node != self.log_node:
                continue
            cursor = self.cursors.get(node)
            upto = self.announced(node)
            if cursor is None:  # its whole stream: up to what it announced (in large parallel
                cursor = self.cursors[node] = NodeCursor(node)  # batches), then the rest
                todo.append((cursor, upto, True))
            elif upto is not None and upto >= cursor.next_seq:
                todo.append((cursor, upto, False))

        def read(item: tuple[NodeCursor, int | None, bool]) -> list[str]:
            cursor, upto, probe = item
            lines = read_new(self.store, self.run_id, cursor, upto, POLL_LOG_BYTES)
            if probe and upto is not None and cursor.next_seq > upto:
                left = POLL_LOG_BYTES - sum(len(line) + 1 for line in lines)
                if left > 0:
                    lines += read_new(self.store, self.run_id, cursor, None, left)
            return lines

        found = list(pool.map(read, todo))
        taken = (sum(len(line) + 1 for line in lines) for lines in found)
        snap.logs_behind = any(n >= POLL_LOG_BYTES for n in taken)
        return [(t[0].node, line) for t, lines in zip(todo, found, strict=True) for line in lines]

    def _changed(self, key: str, sig: tuple[int, float]) -> bool:
        """Whether the object at `key` changed since it was last read (and note it read)."""
        if self._seen.get(key) == sig:
            return False
        self._seen[key] = sig
        return True

    def _forget_vanished_bootstrap_logs(self, keys: set[str]) -> None:
        """A bootstrap log archived for a re-created node (`archive_bootstrap_log`) no longer
        speaks for the node: drop what it said."""
        snap = self.snapshot
        for node in list(snap.bootstrap_tails):
            key = protocol.bootstrap_log_key(self.run_id, node)
            if key not in keys:
                self._seen.pop(key, None)
                for found in (snap.bootstrap_failures, snap.bootstrap_phases, snap.agent_exits):
                    found.pop(node, None)
                snap.bootstrap_durations.pop(node, None)
                snap.bootstrap_tails.pop(node, None)

    def bootstrap_nodes(self) -> list[str]:
        """The nodes that uploaded a bootstrap log, sorted."""
        base = protocol.bootstrap_prefix(self.run_id)
        return sorted(o.key[len(base) :].removesuffix(".log") for o in self.store.list(base))

    def bootstrap_log(self, node: str) -> str:
        """The node's bootstrap log, uploaded by its startup script ('' if none yet)."""
        body = self._get_log(protocol.bootstrap_log_key(self.run_id, node))
        return "" if body is None else body.decode(errors="replace")


def archive_bootstrap_log(store: ObjectStore, run_id: str, node: str, attempt: int) -> None:
    """Move a node's bootstrap log to `attempt-<n>/bootstrap/<node>.log` before the node is
    created again: until the new node uploads its own, the old log (an agent that exited, a
    FAILED line) would speak for it. A log over BOOT_LOG_MAX_BYTES is not copied (a line says
    so in its place). Idempotent; blocks on the store."""
    key = protocol.bootstrap_log_key(run_id, node)
    try:
        body = store.get(key, max_bytes=BOOT_LOG_MAX_BYTES)
    except NotFound:
        return
    except TooLarge:
        body = f"[cloudtrain: not archived: more than {BOOT_LOG_MAX_BYTES} bytes]\n".encode()
    store.put(protocol.archived_bootstrap_log_key(run_id, attempt, node), body)
    store.delete(key)
