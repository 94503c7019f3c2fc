"""The node agent's heartbeat (a mixin of `jobs.agent.Agent`): the log flush, the metrics flush
and `heartbeat/<me>.json`, each at its pace, from a background thread of their own, so a long
restore or upload, or a training stuck in a TF collective, never silences the node; and the
node's status documents. Standard library only (node-side: Python 3.10+).

Every Heartbeat and NodeStatus announces `log_seq`, the last log chunk uploaded when it was
written, read after the flush that precedes it; a heartbeat also says what the agent is busy with
besides the training (`activity`: "restoring 3.1/5.0 GB", "" when nothing). Heartbeats and
statuses are written one at a time, each reading `log_seq` under the same lock as its write, so
no document written after another announces an older chunk.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.metrics import FLUSH_S

MAX_WAKE_S = 1.0  # the thread looks at the paces at least this often (a new cluster.json's)
ERROR_EVERY_S = 60.0  # a failing background write is said in the log at most this often


class Beats:
    """The heartbeat thread, the heartbeat and the status writes. The agent owns the state these
    read (store, logs, metrics, cluster, attempt, state, child, activity). Thread-safe: the
    background thread and the agent's main loop both call these."""

    store: Any
    run_id: str
    me: str
    attempt: int
    cluster: proto.ClusterDoc
    logs: Any  # jobs.logpump.LogPump
    metrics: Any  # jobs.metrics.MetricsPump
    state: str
    child: Any  # the training (a Popen or a horovod.ProcessGroup), None when there is none
    activity: str

    def say(self, message: str) -> None:
        raise NotImplementedError

    def _init_beats(self) -> None:
        self._beat_lock = threading.RLock()  # one heartbeat or status at a time
        self._beat_last = dict.fromkeys(("flush", "metrics", "heartbeat"), 0.0)
        self._beat_thread: threading.Thread | None = None
        self._beat_stop = threading.Event()
        self._beat_error_said = float("-inf")

    # --- the documents ----------------------------------------------------------------------
    def write_status(self, state: str, **extra: Any) -> None:
        """status/<me>.json: the controller's view of this node's progress, with the last log
        chunk uploaded so far (the caller flushes the logs first when the status must announce
        them). Blocks on the store; thread-safe."""
        with self._beat_lock:
            self.state = state
            doc = proto.NodeStatus(
                state=state,
                attempt=self.attempt,
                time=time.time(),
                log_seq=self.logs.last_seq,
                **extra,
            )
            self.store.put(proto.status_key(self.run_id, self.me), doc.to_json())

    def heartbeat(self) -> None:
        """heartbeat/<me>.json: alive, the epoch reached, the last line of output, the last log
        chunk uploaded, what the agent is busy with, the node's latest figures (after sampling
        the training's processes and GPUs: jobs/metrics.py). Blocks on the store (and
        nvidia-smi, at most metrics.NVIDIA_SMI_TIMEOUT_S); thread-safe."""
        with self._beat_lock:
            child = self.child  # the main loop may replace it meanwhile
            pid = child.pid if child is not None else None
            epoch = self.logs.epoch
            self.metrics.sample(pid)
            self.metrics.refresh()
            doc = proto.Heartbeat(
                time=time.time(),
                attempt=self.attempt,
                state=self.state,
                epoch=epoch[0] if epoch else None,
                epochs=epoch[1] if epoch else None,
                last_line=self.logs.last_line,
                pid=pid,
                metrics=self.metrics.summary() or None,
                log_seq=self.logs.last_seq,
                activity=self.activity,
            )
            self.store.put(proto.heartbeat_key(self.run_id, self.me), doc.to_json())

    # --- the paces ----------------------------------------------------------------------------
    def beat(self, now: float | None = None) -> float:
        """The log flush, the metrics flush and the heartbeat, each when its pace is due (in that
        order: a heartbeat announces the chunk flushed just before it). Returns the seconds until
        the next one is due. Blocks on the store; thread-safe (the background thread calls it;
        the main loop only while that thread is not running)."""
        now = now or time.time()
        cluster, last = self.cluster, self._beat_last
        paces = {"flush": cluster.log_flush_s, "metrics": FLUSH_S, "heartbeat": cluster.heartbeat_s}
        if now - last["flush"] >= paces["flush"]:
            last["flush"] = now
            self.logs.flush()
        if now - last["metrics"] >= paces["metrics"]:
            last["metrics"] = now
            self.metrics.flush()
        if now - last["heartbeat"] >= paces["heartbeat"]:
            last["heartbeat"] = now
            self.heartbeat()
        return max(0.0, min(last[k] + paces[k] for k in paces) - time.time())

    @property
    def beating(self) -> bool:
        """Whether the background thread runs."""
        thread = self._beat_thread
        return thread is not None and thread.is_alive()

    def start_beating(self) -> None:
        """Start the background thread (a daemon) that calls `beat` at its paces until
        `stop_beating`. Idempotent; returns at once."""
        if self.beating:
            return
        self._beat_stop.clear()
        self._beat_thread = threading.Thread(
            target=self._beat_loop, daemon=True, name=f"heartbeat-{self.me}"
        )
        self._beat_thread.start()

    def stop_beating(self, timeout_s: float = 10.0) -> None:
        """Stop the background thread: it ends after the write it may be in (waited for up to
        `timeout_s`; a thread stuck on the store is left, as a daemon, and whatever it writes
        later is not older than what the caller writes next). Idempotent; blocks."""
        self._beat_stop.set()
        thread, self._beat_thread = self._beat_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _beat_loop(self) -> None:
        wait = 0.0
        while not self._beat_stop.wait(min(wait, MAX_WAKE_S)):
            try:
                wait = self.beat()
            except Exception as exc:  # a bucket that fails past the retries: try again later
                wait = min(self.cluster.heartbeat_s, MAX_WAKE_S)
                now = time.monotonic()
                if now - self._beat_error_said >= ERROR_EVERY_S:
                    self._beat_error_said = now
                    self.say(f"heartbeat failed: {type(exc).__name__}: {str(exc)[:300]}")
