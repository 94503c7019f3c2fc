"""Read a node's log chunks by sequence number, in parallel rounds, never by listing logs/: what
the node's agent (jobs/logpump.py, resuming a stream) and the controller's reader
(cloudtrain/state/log_reader.py) share. Standard library only (node-side: Python 3.10+).

A node's stream is writable by any node of the run, so every GET is bounded: a chunk over its
cap reads as one line saying it was skipped (warned about once per key), and a round asks for
no more chunks than LOG_ROUND_MAX_BYTES holds at that cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cloudtrain.core.errors import NotFound, TooLarge
from cloudtrain.jobs.bucket_reads import LOG_CHUNK_MAX_BYTES, LOG_ROUND_MAX_BYTES, Skips
from cloudtrain.jobs.protocol import log_chunk_name

__all__ = ["PARALLEL_GETS", "SKIPS", "get_chunks", "skipped_chunk"]

PARALLEL_GETS = 16  # chunks read at once when probing a stream
SKIPS = Skips()  # the chunks this process skipped: one warning per key


def skipped_chunk(key: str) -> bytes:
    """The one line that stands for the chunk at `key` when it is over its cap. Pure."""
    return f"[cloudtrain: log chunk {key.rsplit('/', 1)[-1]} skipped: over its cap]\n".encode()


def get_chunks(
    store: Any,
    prefix: str,
    start: int,
    stop: int | None = None,
    *,
    max_chunk_bytes: int = LOG_CHUNK_MAX_BYTES,
    skips: Skips = SKIPS,
) -> Iterator[tuple[int, bytes]]:
    """(seq, bytes) of the chunks `prefix + log_chunk_name(seq)` for seq = start, start + 1, ...
    in order: up to `stop` (inclusive), or with `stop` None up to the first chunk that is not in
    the bucket; either way it ends at the first missing chunk. Each GET is bounded by
    `max_chunk_bytes`: a larger chunk yields `skipped_chunk(key)` instead (`skips` warns once).
    GETs PARALLEL_GETS at a time, in rounds of at most LOG_ROUND_MAX_BYTES // max_chunk_bytes
    chunks, so a round never holds more than LOG_ROUND_MAX_BYTES (a round that asks for one
    chunk uses no thread). Blocks; never lists; read-only. Store errors other than NotFound
    propagate."""

    def one(seq: int) -> bytes | None:
        key = prefix + log_chunk_name(seq)
        try:
            return store.get(key, max_bytes=max_chunk_bytes)  # type: ignore[no-any-return]
        except NotFound:
            return None
        except TooLarge:
            skips.skip(key, f"more than {max_chunk_bytes} bytes")
            return skipped_chunk(key)

    most = max(1, min(8 * PARALLEL_GETS, LOG_ROUND_MAX_BYTES // max(1, max_chunk_bytes)))
    pool: ThreadPoolExecutor | None = None
    seq = start
    try:
        while stop is None or seq <= stop:
            count = PARALLEL_GETS if stop is None else stop - seq + 1
            count = min(count, most)
            if count == 1:
                found = [one(seq)]
            else:
                pool = pool or ThreadPoolExecutor(PARALLEL_GETS, thread_name_prefix="log-get")
                found = list(pool.map(one, range(seq, seq + count)))
            for data in found:
                if data is None:
                    return
                yield seq, data
                seq += 1
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
