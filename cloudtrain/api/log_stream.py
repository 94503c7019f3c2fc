"""A run's logs as an iterator (`api.logs`), and the one bucket poll `status` and `logs` share.

`LogStream` yields each new line of the run's nodes, in order per node. Without `follow` it ends
once what the bucket holds is read; with `follow` it polls until the run is over: the ledger
says done, every node reported a final state, or its controller is gone and the cloud lists no
live node of it (nobody will write again). While it waits it tells `on_wait` what it waits for,
once per change. `end` says why it ended. Imports no SDK at module level.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.api.results import LOG, LogEnd, LogLine

if TYPE_CHECKING:
    from cloudtrain.providers.base import Provider
    from cloudtrain.state.ledger import Ledger, RunRecord
    from cloudtrain.state.runstate import RunReader, Snapshot

CLOUD_CHECK_S = 10.0  # how often a follow lists the cloud once the controller is gone
JOURNAL_CHECK_S = 10.0  # how often a follow reads new entries of the run's journal
GONE_EXIT = 1  # `logs --follow` of a run nobody will finish: its controller died mid-run


def poll(reader: RunReader) -> tuple[Snapshot, str | None]:
    """One poll of the run's bucket, or the snapshot so far and why it cannot be read (a bucket
    that was never made, or is gone). Blocks for one listing."""
    from cloudtrain.core.errors import CloudtrainError

    try:
        return reader.poll(), None
    except CloudtrainError as exc:
        return reader.snapshot, str(exc)


def job_over(statuses: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether every node reported a final state in the newest attempt (a detached run's end).
    Pure."""
    if not statuses:
        return False
    attempt = max(int(s.get("attempt", 0)) for s in statuses.values())
    latest = [s for s in statuses.values() if int(s.get("attempt", 0)) == attempt]
    from cloudtrain.jobs.protocol import FINAL_STATES

    final = {str(state) for state in FINAL_STATES}  # by value: a status may hold a plain str
    return all(str(s.get("state")) in final for s in latest)


def _log_wait(text: str) -> None:
    LOG.info("%s", text)


@dataclass
class LogStream:
    """An iterator of `LogLine`s of one run (see the module docstring). Blocks while it waits
    (one poll every `poll_s`); not thread-safe; iterate it once, by line or by `batches()`."""

    rec: RunRecord
    prov: Provider
    reader: RunReader
    ledger: Ledger
    node: str | None = None
    follow: bool = False
    poll_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    on_wait: Callable[[str], None] = _log_wait
    end: LogEnd | None = None
    _said: str = ""
    _listed_at: float | None = None
    _journal_at: float | None = None
    _alive_nodes: int | None = None
    _batches: Iterator[list[LogLine]] | None = field(default=None, repr=False)
    _batch: Iterator[LogLine] = field(default_factory=lambda: iter(()), repr=False)

    def __iter__(self) -> LogStream:
        return self

    def __next__(self) -> LogLine:
        while True:
            line = next(self._batch, None)
            if line is not None:
                return line
            self._batch = iter(next(self.batches()))  # StopIteration ends the stream

    def batches(self) -> Iterator[list[LogLine]]:
        """The stream a poll's lines at a time (a printer of millions writes them at once).
        The same iterator however often it is called."""
        if self._batches is None:
            self._batches = self._read()
        return self._batches

    def _read(self) -> Iterator[list[LogLine]]:
        run_id = self.rec.run_id
        while True:
            snap, unreadable = poll(self.reader)
            lines = snap.new_lines
            yield [LogLine(n, line) for n, line in lines if self.node is None or n == self.node]
            if snap.logs_behind:
                continue  # a poll reads a bounded part of a stream: read on before deciding
            if self.follow:
                self._import_journal()
            current = self.ledger.get_run(run_id)
            if current is None:  # the ledger file was replaced under us
                message = f"run {run_id} is no longer in the ledger; stopping"
                self._stop("forgotten", GONE_EXIT, None, message)
                return
            if not self.follow or current.status == "done" or job_over(snap.statuses):
                reason = "done" if self.follow else "read"
                self.end = LogEnd(reason, 0, current.outcome, current.detail)
                return
            waiting = self._waiting(current, snap, unreadable)
            if waiting is None:
                self._stop(
                    "gone",
                    GONE_EXIT,
                    current,
                    f"run {run_id}'s controller is gone and none of its nodes is alive; "
                    f"`cloudtrain down {run_id}` cleans up",
                )
                return
            if waiting != self._said:
                self._said = waiting
                self.on_wait(waiting)
            time.sleep(self.poll_s)

    def _import_journal(self) -> None:
        """Take in the run's new journal entries (its outcome, when a controller elsewhere
        ends it), at most every JOURNAL_CHECK_S. Blocks for one listing; never raises for
        an unreadable bucket."""
        now = self.clock()
        if self._journal_at is not None and now - self._journal_at < JOURNAL_CHECK_S:
            return
        self._journal_at = now
        if self.rec.store_uri:
            from cloudtrain.state.journal import try_import

            store = self.prov.store(self.rec.store_uri)
            try_import(self.ledger, store, self.rec.run_id, warn=_log_wait)

    def _stop(self, reason: str, code: int, current: RunRecord | None, message: str) -> None:
        outcome = current.outcome if current else None
        detail = current.detail if current else None
        self.end = LogEnd(reason, code, outcome, detail, message)
        LOG.info("%s", message)  # not WARNING: logging's last resort would print it

    def _waiting(self, current: RunRecord, snap: Snapshot, unreadable: str | None) -> str | None:
        """What the stream waits for, or None when nothing will ever change: the controller is
        gone (or was never recorded) and the cloud lists no live node of the run."""
        from cloudtrain.core.procid import controller

        ctl = controller(current)
        run_id = current.run_id
        bucket = f"; bucket not readable: {unreadable}" if unreadable else ""
        if ctl.state == "alive" or (ctl.state == "unknown" and ctl.pid is not None):
            return f"waiting for run {run_id} ({current.status}; {ctl.describe()}){bucket}"
        now = self.clock()
        if self._listed_at is None or now - self._listed_at >= CLOUD_CHECK_S:
            self._listed_at = now
            nodes = self.prov.compute.list_nodes(run_id)
            self._alive_nodes = sum(1 for n in nodes if n.alive)
        if not self._alive_nodes:
            return None
        reported = len(snap.statuses)
        return (
            f"waiting for {self._alive_nodes} live node(s) of run {run_id} to report a final "
            f"state ({reported} reported so far; {ctl.describe()}){bucket}"
        )
