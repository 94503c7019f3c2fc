"""The node's log stream: output lines, secrets redacted, uploaded to the bucket as ordered chunks
(`logs/<role>-<index>/<seq>.log`, see jobs/protocol.py), with the epoch reached and the last lines
kept for the heartbeat and for a failure report. The chunks are also rolled up into closed
segments named by the node's LogIndex (protocol.LogIndex), so a reader of a long run GETs a few
large objects instead of every chunk. Standard library only (node-side: Python 3.10+).
"""

from __future__ import annotations

import collections
import contextlib
import re
import sys
import threading
import time
from typing import Any

from cloudtrain.core.redact import Redactor
from cloudtrain.jobs.bucket_reads import read_document
from cloudtrain.jobs.log_chunks import SKIPS, get_chunks
from cloudtrain.jobs.protocol import (
    LogIndex,
    log_chunk_name,
    log_index_key,
    log_lines,
    log_open_segment_key,
    log_segment_key,
    logs_prefix,
    open_segment_body,
)

# the output is untrusted: an epoch number longer than 9 digits is no epoch (int() of a 5000-digit
# string raises ValueError on 3.11+), so the patterns take none
_NUM = r"(\d{1,9})(?!\d)"
_EPOCH_RES = (
    re.compile(rf"cloudtrain: epoch {_NUM}/{_NUM} done"),
    re.compile(rf"^(?:\[rank \d{{1,6}}\] )?Epoch {_NUM}/{_NUM}"),
)
LOG_CHUNK_BYTES = 256 * 1024
MAX_LINE_BYTES = 64 * 1024  # a longer output line is cut (jobs/pipe_pump.py)
TAIL_LINES = 20  # the last lines a failed status carries (the controller prints them)

# Key names inside a node's logs/ folder, taken from the protocol's key functions (which need a
# run and a node), so a pump built from a bare prefix names them exactly as protocol does.
_R, _N = "r", "n"


def _index_name() -> str:
    return log_index_key(_R, _N)[len(logs_prefix(_R, _N)) :]


def _segment_name(first_seq: int, last_seq: int) -> str:
    return log_segment_key(_R, _N, first_seq, last_seq)[len(logs_prefix(_R, _N)) :]


def _open_name(first_seq: int) -> str:
    return log_open_segment_key(_R, _N, first_seq)[len(logs_prefix(_R, _N)) :]


class LogPump:
    """Collects the node's output lines and uploads them as ordered chunks under `prefix` (the
    node's `protocol.logs_prefix`), numbered from `start_seq`. Thread-safe; flushes are
    serialized, so chunk k is in the bucket before chunk k + 1 is written.

    Every line goes through `redactor` (the run's secret env values become `***`) before it is
    echoed, buffered, uploaded or kept as `last_line` for the heartbeat. `redactor` may be
    replaced later (the agent knows the secrets only once it has read cluster.json).

    Segments: each uploaded chunk is also appended to the open segment (held in memory: at most
    `segment_bytes` plus one chunk). When it reaches `segment_bytes` or is `segment_s` old (the
    agent sets both from cluster.json), on `flush(final=True)`, or after a chunk that does not end
    with a newline (its last line would run into the next chunk's first in a concatenation), the
    segment is uploaded and the LogIndex rewritten whole with it. Segments start at seq 0 and are
    contiguous: `index` is the node's LogIndex when the stream continues after it (`resume`
    passes it); without one, a pump starting at seq 0 starts an empty index, and a pump started
    mid-stream from a bare seq (an old caller) writes chunks only."""

    def __init__(
        self,
        store: Any,
        prefix: str,
        start_seq: int,
        redactor: Redactor | None = None,
        *,
        index: LogIndex | None = None,
    ) -> None:
        self.store, self.prefix, self.seq = store, prefix, start_seq
        self.redactor = redactor or Redactor()
        self._lines: list[str] = []
        self._lock = threading.Lock()  # the buffer, the tail, last_line, epoch, seq
        self._flush_lock = threading.Lock()  # one flush at a time: chunks go up in order
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_line = ""
        self.epoch: tuple[int, int] | None = None
        self._last_seq: int | None = start_seq - 1 if start_seq > 0 else None
        self._pending: tuple[int, bytes] | None = None  # a chunk whose upload failed: retried
        # the agent sets these from cluster.json (ClusterDoc.log_segment_bytes/_s)
        self.segment_bytes = 8 * 1024 * 1024
        self.segment_s = 3600.0
        self.snapshot_s = 60.0  # ClusterDoc.log_snapshot_s: the open segment's upload pace
        self._snapshot_at = time.monotonic()  # when the open segment was last uploaded
        self._snapshot_last = -1  # the last chunk that upload held
        if index is None and start_seq == 0:
            index = LogIndex(node=prefix.rstrip("/").rsplit("/", 1)[-1])
        self._index = index  # None: no segments (the stream before start_seq is unknown)
        self._open: list[bytes] = []  # the open segment's chunks, from seq _open_first
        self._open_first = self._open_bytes = self._open_lines = 0
        self._opened = 0.0  # time.monotonic() of the open segment's first chunk

    @classmethod
    def resume(
        cls, store: Any, run_id: str, node: str, redactor: Redactor | None = None
    ) -> LogPump:
        """The node's pump, continuing the stream where an earlier agent of the node left it,
        without listing logs/: reads the node's LogIndex, then GETs the chunks after its last
        segment until one is missing (log_chunks.get_chunks: 16 at a time); they become the open
        segment (rolled up on the way when it reaches segment_bytes) and the pump's chunks follow.
        An index that cannot be read (none, or over its cap, too deep, ill-typed: warned about
        once) is rebuilt from chunk 0; a chunk over its cap becomes one line saying so. Every
        GET is bounded (jobs/bucket_reads.py). Blocks on the store; idempotent (two resumes of
        the same stream see the same chunks)."""
        prefix = logs_prefix(run_id, node)
        index = read_document(store, log_index_key(run_id, node), LogIndex, SKIPS)
        index = index or LogIndex(node=node)
        pump = cls(store, prefix, index.next_seq, redactor, index=index)
        for seq, data in get_chunks(store, prefix, index.next_seq):
            with pump._flush_lock:
                pump.seq, pump._last_seq = seq + 1, seq
                pump._append(seq, data)
                if pump._must_close(final=False):
                    pump._close()
        return pump

    @property
    def last_seq(self) -> int | None:
        """The highest chunk seq such that it and every chunk before it are in the bucket; None
        before any. Pure."""
        return self._last_seq

    def add(self, line: str) -> None:
        """Buffer one line, secrets redacted (echoed to this process's stdout, the node's
        console, best effort). Never raises for the line's content."""
        line = self.redactor.redact(line.rstrip("\n"))
        # a console that cannot take the line (closed, or an encoding without U+FFFD) loses it;
        # the stream does not
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        with self._lock:
            self._lines.append(line)
            self._tail.append(line[-500:])
            if line.strip():
                self.last_line = line[-300:]
            for pattern in _EPOCH_RES:
                m = pattern.search(line)
                if m:
                    self.epoch = (int(m[1]), int(m[2]))

    def tail(self) -> list[str]:
        """The last TAIL_LINES lines added (each cut to 500 characters), oldest first. Pure."""
        with self._lock:
            return list(self._tail)

    def flush(self, final: bool = False) -> None:
        """Upload what was buffered as the next chunk (first a chunk whose upload failed before,
        the same bytes under the same seq), then close the open segment if it is due, or with
        `final` (the agent's last flush) whatever it holds. Blocks on the store; safe to call
        often and from several threads (serialized). A store error propagates and loses
        nothing: the next flush retries the chunk, and the segment and index."""
        with self._flush_lock:
            if self._pending is not None:  # an earlier flush's chunk, not uploaded
                self._upload_pending()
            while self._take_lines():  # a chunk at most LOG_CHUNK_BYTES: readers cap them
                self._upload_pending()
            if self._must_close(final):
                self._close()
            self._snapshot()

    # --- chunks and segments (the caller holds _flush_lock) -------------------------------
    def _take_lines(self) -> bool:
        """Make the next chunk of the buffered lines, up to LOG_CHUNK_BYTES (one line at the
        least: a line is at most MAX_LINE_BYTES). Returns whether it made one."""
        with self._lock:
            if not self._lines:
                return False
            size, count = 0, 0
            for line in self._lines:
                size += len(line.encode(errors="replace")) + 1
                if count and size > LOG_CHUNK_BYTES:
                    break
                count += 1
            lines, self._lines = self._lines[:count], self._lines[count:]
            self._pending = (self.seq, ("\n".join(lines) + "\n").encode(errors="replace"))
            self.seq += 1
            return True

    def _upload_pending(self) -> None:
        assert self._pending is not None
        seq, data = self._pending
        self.store.put(self.prefix + log_chunk_name(seq), data)
        self._pending = None
        self._last_seq = seq
        self._append(seq, data)
        if self._must_close(final=False):  # keeps the open segment within its size
            self._close()

    def _append(self, seq: int, data: bytes) -> None:
        if self._index is None:
            return
        if not self._open:
            self._open_first, self._opened = seq, time.monotonic()
        self._open.append(data)
        self._open_bytes += len(data)
        # counted per chunk, as a reader of the chunks counts (equal to the segment's count:
        # every chunk but a segment's last ends with a newline)
        self._open_lines += len(log_lines(data.decode(errors="replace")))

    def _must_close(self, final: bool) -> bool:
        if not self._open:
            return False
        return (
            final
            or self._open_bytes >= self.segment_bytes
            or time.monotonic() - self._opened >= self.segment_s
            or not self._open[-1].endswith(b"\n")
        )

    def _close(self) -> None:
        """Upload the open segment, then the index naming it (the segment exists before the
        index does). On an error the segment stays open, to be retried whole."""
        assert self._index is not None
        first, last = self._open_first, self._open_first + len(self._open) - 1
        if first != self._index.next_seq:  # never: segments are contiguous by construction
            raise AssertionError(f"log segment {first}-{last} after {self._index.next_seq - 1}")
        entry = {
            "key": self.prefix + _segment_name(first, last),
            "first_seq": first,
            "last_seq": last,
            "first_line": self._index.next_line,
            "lines": self._open_lines,
            "bytes": self._open_bytes,
            "time": time.time(),
        }
        index = LogIndex(node=self._index.node, segments=[*self._index.segments, entry])
        self.store.put(entry["key"], b"".join(self._open))
        self.store.put(self.prefix + _index_name(), index.to_json())
        self._index = index
        self._open, self._open_bytes, self._open_lines = [], 0, 0
        if self._snapshot_last >= first:  # its open snapshot is this segment now: gone
            with contextlib.suppress(Exception):  # best effort: readers look for the next one
                self.store.delete(self.prefix + _open_name(first))
        self._snapshot_last, self._snapshot_at = -1, time.monotonic()

    def _snapshot(self) -> None:
        """Every `snapshot_s` while the open segment grew, upload it whole (protocol's
        log_open_segment_key): a reader of the stream then GETs one object for the open segment
        instead of a chunk per flush since it opened. Best effort: the chunks hold it all."""
        last = self._open_first + len(self._open) - 1
        if len(self._open) < 2 or last == self._snapshot_last:
            return
        if time.monotonic() - self._snapshot_at < self.snapshot_s:
            return
        body = open_segment_body(last, self._open_lines, b"".join(self._open))
        self._snapshot_at = time.monotonic()
        with contextlib.suppress(Exception):  # a failed upload: the next one is due in time
            self.store.put(self.prefix + _open_name(self._open_first), body)
            self._snapshot_last = last
