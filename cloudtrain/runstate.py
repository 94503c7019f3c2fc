"""Read a run's state from its bucket prefix: statuses, heartbeats and new log chunks.

One `poll()` is one prefix listing plus reads of only the objects that changed since the last
poll, so watching costs the same whether the job has printed ten lines or ten million. Used by the
orchestrator's watch loop and by `cloudtrain status` / `cloudtrain logs`. Not thread-safe.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from cloudtrain import bootlog
from cloudtrain.errors import NotFound
from cloudtrain.providers.base import ObjectStore


def run_prefix(run_id: str) -> str:
    """The run's folder in its bucket."""
    return f"cloudtrain/runs/{run_id}/"


@dataclass
class Snapshot:
    """What one poll found: statuses and heartbeats by node ('worker-1'), and new log lines."""

    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    heartbeats: dict[str, dict[str, Any]] = field(default_factory=dict)
    notices: dict[str, dict[str, Any]] = field(default_factory=dict)  # preemption notices
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
        self.store = store
        self.prefix = run_prefix(run_id)
        self.snapshot = Snapshot()
        self._seen: dict[str, tuple[int, float]] = {}
        self._log_done: set[str] = set()

    def _read_json(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.store.get(key))  # type: ignore[no-any-return]
        except (NotFound, ValueError):
            return None

    def poll(self) -> Snapshot:
        """List the prefix once and read what changed. Returns the updated snapshot whose
        `new_lines` holds only lines not returned before, in chunk order per node."""
        snap = self.snapshot
        snap.new_lines = []
        listed_at = time.time()
        objects = self.store.list(self.prefix)
        keys = {o.key for o in objects}
        snap.stop_requested = f"{self.prefix}control/stop" in keys
        self._forget_vanished_bootstrap_logs(keys)
        for obj in objects:
            rel = obj.key[len(self.prefix) :]
            sig = (obj.size, obj.updated)
            if rel.startswith(("status/", "heartbeat/", "notice/")) and rel.endswith(".json"):
                if self._seen.get(obj.key) == sig:
                    continue
                self._seen[obj.key] = sig
                body = self._read_json(obj.key)
                if body is None:
                    continue
                kind, _, name = rel.partition("/")
                by_kind = {"status": snap.statuses, "heartbeat": snap.heartbeats}
                by_kind["notice"] = snap.notices
                by_kind[kind][name.removesuffix(".json")] = body
                if kind == "heartbeat":
                    snap.heartbeat_seen[name.removesuffix(".json")] = listed_at
            elif rel.startswith("bootstrap/") and rel.endswith(".log"):
                if self._seen.get(obj.key) == sig:
                    continue
                self._seen[obj.key] = sig
                node = rel.split("/", 1)[1].removesuffix(".log")
                boot = bootlog.parse(self.bootstrap_log(node))
                if boot.failed is not None:
                    snap.bootstrap_failures[node] = boot.failed
                else:
                    snap.bootstrap_failures.pop(node, None)
                if boot.phase:
                    snap.bootstrap_phases[node] = boot.phase
                if boot.durations:
                    snap.bootstrap_durations[node] = boot.durations
                if boot.agent_exit is not None:
                    snap.agent_exits[node] = boot.agent_exit
                else:
                    snap.agent_exits.pop(node, None)
                snap.bootstrap_tails[node] = boot.tail
            elif rel.startswith("logs/") and rel.endswith(".log") and obj.key not in self._log_done:
                parts = rel.split("/")
                if len(parts) != 3:
                    continue
                try:
                    text = self.store.get(obj.key).decode(errors="replace")
                except NotFound:
                    continue
                self._log_done.add(obj.key)
                snap.new_lines.extend((parts[1], line) for line in text.splitlines())
        return snap

    def _forget_vanished_bootstrap_logs(self, keys: set[str]) -> None:
        """A bootstrap log archived for a re-created node (`archive_bootstrap_log`) no longer
        speaks for the node: drop what it said."""
        snap = self.snapshot
        for node in list(snap.bootstrap_tails):
            key = f"{self.prefix}bootstrap/{node}.log"
            if key not in keys:
                self._seen.pop(key, None)
                for found in (snap.bootstrap_failures, snap.bootstrap_phases, snap.agent_exits):
                    found.pop(node, None)
                snap.bootstrap_durations.pop(node, None)
                snap.bootstrap_tails.pop(node, None)

    def bootstrap_nodes(self) -> list[str]:
        """The nodes that uploaded a bootstrap log, sorted."""
        base = f"{self.prefix}bootstrap/"
        return sorted(o.key[len(base) :].removesuffix(".log") for o in self.store.list(base))

    def bootstrap_log(self, node: str) -> str:
        """The node's bootstrap log, uploaded by its startup script ('' if none yet)."""
        try:
            return self.store.get(f"{self.prefix}bootstrap/{node}.log").decode(errors="replace")
        except NotFound:
            return ""


def archive_bootstrap_log(store: ObjectStore, run_id: str, node: str, attempt: int) -> None:
    """Move a node's bootstrap log to `attempt-<n>/bootstrap/<node>.log` before the node is
    created again: until the new node uploads its own, the old log (an agent that exited, a
    FAILED line) would speak for it. Idempotent; blocks on the store."""
    prefix = run_prefix(run_id)
    key = f"{prefix}bootstrap/{node}.log"
    try:
        body = store.get(key)
    except NotFound:
        return
    store.put(f"{prefix}attempt-{attempt}/bootstrap/{node}.log", body)
    store.delete(key)
