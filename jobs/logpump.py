"""The node's log stream: output lines, secrets redacted, uploaded to the bucket as ordered chunks
(`logs/<role>-<index>/<seq>.log`, see jobs/protocol.py), with the epoch reached and the last lines
kept for the heartbeat and for a failure report. Standard library only (node-side: Python 3.10+).
"""

from __future__ import annotations

import collections
import re
import sys
import threading
from typing import Any

from cloudtrain.jobs.protocol import log_chunk_name
from cloudtrain.redact import Redactor

_EPOCH_RES = (
    re.compile(r"cloudtrain: epoch (\d+)/(\d+) done"),
    re.compile(r"^(?:\[rank \d+\] )?Epoch (\d+)/(\d+)"),
)
LOG_CHUNK_BYTES = 256 * 1024
TAIL_LINES = 20  # the last lines a failed status carries (the controller prints them)


class LogPump:
    """Collects the node's output lines and uploads them as ordered chunks under `prefix` (the
    node's `protocol.logs_prefix`), numbered from `start_seq`. Thread-safe.

    Every line goes through `redactor` (the run's secret env values become `***`) before it is
    echoed, buffered, uploaded or kept as `last_line` for the heartbeat. `redactor` may be
    replaced later (the agent knows the secrets only once it has read cluster.json)."""

    def __init__(
        self, store: Any, prefix: str, start_seq: int, redactor: Redactor | None = None
    ) -> None:
        self.store, self.prefix, self.seq = store, prefix, start_seq
        self.redactor = redactor or Redactor()
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_line = ""
        self.epoch: tuple[int, int] | None = None

    def add(self, line: str) -> None:
        """Buffer one line, secrets redacted (echoed to this process's stdout, the node's
        console)."""
        line = self.redactor.redact(line.rstrip("\n"))
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

    def flush(self) -> None:
        """Upload what was buffered as the next chunk. Safe to call often."""
        with self._lock:
            if not self._lines:
                return
            lines, self._lines = self._lines, []
            seq = self.seq
            self.seq += 1
        data = ("\n".join(lines) + "\n").encode(errors="replace")
        self.store.put(self.prefix + log_chunk_name(seq), data)
