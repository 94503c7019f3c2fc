"""Read a run's state from its bucket prefix: statuses, heartbeats and new log chunks.

One `poll()` is one prefix listing plus reads of only the objects that changed since the last
poll, so watching costs the same whether the job has printed ten lines or ten million. Used by the
orchestrator's watch loop and by `cloudtrain status` / `cloudtrain logs`. Not thread-safe. The keys
and the documents are jobs/protocol.py's; a document that does not parse (yet) is skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cloudtrain import bootlog
from cloudtrain.errors import NotFound
from cloudtrain.jobs import protocol
from cloudtrain.jobs.protocol import D, Document, Heartbeat, NodeStatus, NoticeDoc, run_prefix
from cloudtrain.providers.base import ObjectStore

__all__ = ["RunReader", "Snapshot", "archive_bootstrap_log"]
_DOCUMENTS: dict[str, type[Document]] = {
    protocol.STATUS: NodeStatus,
    protocol.HEARTBEAT: Heartbeat,
    protocol.NOTICE: NoticeDoc,
}


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


class RunReader:
    """Incremental reader of one run's prefix."""

    def __init__(self, store: ObjectStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.snapshot = Snapshot()
        self._seen: dict[str, tuple[int, float]] = {}
        self._log_done: set[str] = set()

    def _read(self, kind: type[D], key: str) -> D | None:
        """The document at `key`; None while it is missing, half-written or unreadable."""
        try:
            return kind.from_json(self.store.get(key))
        except (NotFound, protocol.ProtocolError):
            return None

    def poll(self) -> Snapshot:
        """List the prefix once and read what changed. Returns the updated snapshot whose
        `new_lines` holds only lines not returned before, in chunk order per node."""
        snap = self.snapshot
        snap.new_lines = []
        listed_at = time.time()
        objects = self.store.list(run_prefix(self.run_id))
        keys = {o.key for o in objects}
        snap.stop_requested = protocol.stop_key(self.run_id) in keys
        self._forget_vanished_bootstrap_logs(keys)
        for obj in objects:
            found = protocol.classify(self.run_id, obj.key)
            if found is None:
                continue
            kind, node = found
            sig = (obj.size, obj.updated)
            if kind in _DOCUMENTS:
                if not self._changed(obj.key, sig):
                    continue
                doc = self._read(_DOCUMENTS[kind], obj.key)
                if doc is None:  # half-written: read again when it changes
                    continue
                by_kind = {protocol.STATUS: snap.statuses, protocol.HEARTBEAT: snap.heartbeats}
                by_kind[protocol.NOTICE] = snap.notices
                by_kind[kind][node] = doc  # type: ignore[index]
                if kind == protocol.HEARTBEAT:
                    snap.heartbeat_seen[node] = listed_at
            elif kind == protocol.BOOTSTRAP:
                if not self._changed(obj.key, sig):
                    continue
                boot = bootlog.parse(self.bootstrap_log(node))
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
            elif kind == protocol.LOG and obj.key not in self._log_done:
                try:
                    text = self.store.get(obj.key).decode(errors="replace")
                except NotFound:
                    continue
                self._log_done.add(obj.key)
                snap.new_lines.extend((node, line) for line in text.splitlines())
        return snap

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
        try:
            key = protocol.bootstrap_log_key(self.run_id, node)
            return self.store.get(key).decode(errors="replace")
        except NotFound:
            return ""


def archive_bootstrap_log(store: ObjectStore, run_id: str, node: str, attempt: int) -> None:
    """Move a node's bootstrap log to `attempt-<n>/bootstrap/<node>.log` before the node is
    created again: until the new node uploads its own, the old log (an agent that exited, a
    FAILED line) would speak for it. Idempotent; blocks on the store."""
    key = protocol.bootstrap_log_key(run_id, node)
    try:
        body = store.get(key)
    except NotFound:
        return
    store.put(protocol.archived_bootstrap_log_key(run_id, attempt, node), body)
    store.delete(key)
