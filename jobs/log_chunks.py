"""Read a node's log chunks by sequence number, in parallel rounds, never by listing logs/: what
the node's agent (jobs/logpump.py, resuming a stream) and the controller's reader
(cloudtrain/log_reader.py) share. Standard library only (node-side: Python 3.10+).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cloudtrain.errors import NotFound
from cloudtrain.jobs.protocol import log_chunk_name

__all__ = ["PARALLEL_GETS", "get_chunks"]

PARALLEL_GETS = 16  # chunks read at once when probing a stream
_BOUNDED_BATCH = 8 * PARALLEL_GETS  # chunks asked for per round when the last seq is known


def get_chunks(
    store: Any, prefix: str, start: int, stop: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """(seq, bytes) of the chunks `prefix + log_chunk_name(seq)` for seq = start, start + 1, ...
    in order: up to `stop` (inclusive), or with `stop` None up to the first chunk that is not in
    the bucket; either way it ends at the first missing chunk. GETs PARALLEL_GETS at a time, in
    rounds (a round that asks for one chunk uses no thread). Blocks; never lists; read-only.
    Store errors other than NotFound propagate."""

    def one(seq: int) -> bytes | None:
        try:
            return store.get(prefix + log_chunk_name(seq))  # type: ignore[no-any-return]
        except NotFound:
            return None

    pool: ThreadPoolExecutor | None = None
    seq = start
    try:
        while stop is None or seq <= stop:
            count = PARALLEL_GETS if stop is None else min(_BOUNDED_BATCH, stop - seq + 1)
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
