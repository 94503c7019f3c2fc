"""Bounded, typed reads of what a run's bucket holds: what every reader of it shares (the
controller's watch, `status`, `logs`, `report`; the agent may use it too).

Everything in a run's prefix is writable by a node that runs user code, so nothing read from it
is trusted. A read here GETs at most an object's cap (`ObjectStore.get(key, max_bytes=...)`;
TooLarge past it), parses a document by the protocol's one rule (`Document.from_json`), and
turns what cannot be read into None: skipped, with ONE warning per key and reader (`Skips`), so
a bad document seen by every poll is not a warning per poll. Standard library, the core and the
protocol only (node-side: Python 3.10+).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cloudtrain.core.errors import NotFound, TooLarge
from cloudtrain.jobs.protocol_base import D, ProtocolError

__all__ = [
    "BOOT_LOG_MAX_BYTES",
    "JOURNAL_ENTRY_MAX_BYTES",
    "LAUNCH_MAX_BYTES",
    "LOG_CHUNK_MAX_BYTES",
    "LOG_ROUND_MAX_BYTES",
    "LOG_SEGMENT_MAX_BYTES",
    "METRICS_CHUNK_MAX_BYTES",
    "RUN_KEY_MAX_BYTES",
    "STOP_MAX_BYTES",
    "TRACE_MAX_BYTES",
    "WHEELHOUSE_MANIFEST_MAX_BYTES",
    "YIELD_MAX_BYTES",
    "Skips",
    "get_bounded",
    "read_document",
]

LOG = logging.getLogger("cloudtrain.bucket")

# the caps of what is not a Document (a Document's own is its MAX_BYTES); each is far above what
# a well-behaved writer writes: a chunk is at most logpump's LOG_CHUNK_BYTES (256 KiB), a
# closed segment about ClusterDoc.log_segment_bytes (8 MiB) plus a chunk
LOG_CHUNK_MAX_BYTES = 1024 * 1024
LOG_SEGMENT_MAX_BYTES = 64 * 1024 * 1024  # a closed or open segment; past it: read by chunks
BOOT_LOG_MAX_BYTES = 8 * 1024 * 1024
METRICS_CHUNK_MAX_BYTES = 4 * 1024 * 1024
TRACE_MAX_BYTES = 16 * 1024 * 1024
STOP_MAX_BYTES = 4096  # control/stop: any body; only its presence counts
# what one round of parallel chunk GETs may hold (log_chunks.get_chunks): 16 chunks at their cap
LOG_ROUND_MAX_BYTES = 16 * LOG_CHUNK_MAX_BYTES
# the controllers' own documents in the bucket, which a node can overwrite all the same
JOURNAL_ENTRY_MAX_BYTES = 1024 * 1024  # ledger/<entry>.json: one ledger write (journal.py)
LAUNCH_MAX_BYTES = 4 * 1024 * 1024  # control/launch.json: the spec without env (launch_doc.py)
RUN_KEY_MAX_BYTES = 4096  # control/key: 64 hex digits (run_key.py)
YIELD_MAX_BYTES = 64 * 1024  # control/yield: an owner id, a term and a MAC (run_key.py)
WHEELHOUSE_MANIFEST_MAX_BYTES = 1024 * 1024  # cloudtrain/wheelhouse/<tag>/manifest.json


class Skips:
    """What a reader skipped, by key: the first skip of a key logs one warning naming it and
    why (to `logger`, or to `warn` when given: the agent's own log stream); later ones only
    count. Thread-safe (a poll reads in parallel)."""

    def __init__(
        self, logger: logging.Logger = LOG, warn: Callable[[str], None] | None = None
    ) -> None:
        self._logger = logger
        self._warn = warn
        self._lock = threading.Lock()
        self.reasons: dict[str, str] = {}  # key -> why it was first skipped
        self.count = 0  # skips, repeats included

    def skip(self, key: str, why: str) -> None:
        """Note that `key` was skipped because of `why`; warn the first time only."""
        with self._lock:
            self.count += 1
            first = key not in self.reasons
            if first:
                self.reasons[key] = why
        if first and self._warn is not None:
            self._warn(f"skipped {key} in the bucket: {why}")
        elif first:
            self._logger.warning("skipped %s in the bucket: %s", key, why)


def get_bounded(store: Any, key: str, max_bytes: int, skips: Skips) -> bytes | None:
    """The object at `key` if it holds at most `max_bytes` (at most max_bytes + 1 of it is
    read); None when there is none, or when it is larger (skipped: `skips` warns once). Other
    store errors propagate. Blocks for one GET."""
    try:
        return store.get(key, max_bytes=max_bytes)  # type: ignore[no-any-return]
    except NotFound:
        return None
    except TooLarge:
        skips.skip(key, f"more than {max_bytes} bytes")
        return None


def read_document(store: Any, key: str, kind: type[D], skips: Skips) -> D | None:
    """The `kind` document at `key` (GET bounded by kind.MAX_BYTES, parsed by the protocol's
    rule), or None when there is none or it cannot be read (skipped: `skips` warns once).
    Blocks for one GET."""
    body = get_bounded(store, key, kind.MAX_BYTES, skips)
    return None if body is None else parse_document(kind, body, key, skips)


def parse_document(kind: type[D], body: bytes, key: str, skips: Skips) -> D | None:
    """The `kind` document in `body` (read from `key`), or None when it does not parse: too
    large, too deep, ill-typed, not JSON (`skips` warns once). Pure but for the warning."""
    try:
        return kind.from_json(body)
    except ProtocolError as exc:
        skips.skip(key, str(exc))
        return None
