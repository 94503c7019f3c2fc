"""Read a node's log stream from the bucket by sequence number, never by listing `logs/`.

A node's stream is its chunks `logs/<node>/<seq>.log` (jobs/logpump.py), rolled by its agent
into closed segments named by `logs/<node>/index.json` (protocol.LogIndex). A reader keeps a
`NodeCursor` per node and asks for what follows it: up to the sequence the node announced in its
heartbeat or status (`Heartbeat.log_seq`), or, when nothing was announced, until the first chunk
that is not there. Far behind (a `logs` of a day-3 run), it reads the segments instead of the
chunks, in parallel. Used by runstate.RunReader (the watch loop, `logs --follow`) and `logs RUN`.
A run written before segments existed has no index: its chunks are read from seq 0.

What a node wrote is untrusted: every GET is bounded (jobs/bucket_reads.py). A chunk over
LOG_CHUNK_MAX_BYTES reads as one line saying it was skipped; a segment over its cap, or an index
that does not parse, is read by chunks instead; each is warned about once per key.

The calls one read makes depend on how far behind the cursor is, never on how many objects the
bucket holds: up to the announced chunk, one GET per new chunk; further behind, one GET of the
index, one per segment needed and one per chunk after them (plus one round of PARALLEL_GETS
probes past the end when nothing was announced).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cloudtrain.jobs.bucket_reads import (
    LOG_SEGMENT_MAX_BYTES,
    Skips,
    get_bounded,
    read_document,
)
from cloudtrain.jobs.log_chunks import PARALLEL_GETS, get_chunks
from cloudtrain.jobs.protocol import (
    LogIndex,
    log_index_key,
    log_lines,
    log_open_segment_key,
    log_segment_key,
    logs_prefix,
    read_open_segment,
)
from cloudtrain.providers.base import ObjectStore

__all__ = ["CATCH_UP", "UNKNOWN", "NodeCursor", "read_new"]

CATCH_UP = 16  # further behind than this many chunks, a read starts with the closed segments


@dataclass
class NodeCursor:
    """Where a reader is in one node's stream: the next chunk to read and the lines of the
    stream before it (read_new keeps both). A cursor that starts anywhere but seq 0 without
    knowing the count (a `logs --follow` that starts at the tail) says UNKNOWN: then the part
    of a closed segment it is inside is read by chunks, and the count is known from the next
    segment on."""

    node: str
    next_seq: int = 0
    lines: int = 0


UNKNOWN = -1  # NodeCursor.lines when the caller does not know it
SKIPS = Skips()  # what the log readers of this process skipped: one warning per key


def read_new(
    store: ObjectStore,
    run_id: str,
    cursor: NodeCursor,
    announced: int | None,
    max_bytes: int | None = None,
) -> list[str]:
    """The node's lines after `cursor`, in order, up to chunk `announced` (inclusive); with
    `announced` None, up to the first chunk not in the bucket. Advances `cursor` past what it
    returns; a chunk not there yet ends the read early (the next call tries it again). Blocks
    for parallel GETs; never lists.

    More than CATCH_UP chunks behind, or with `announced` None, it first reads the node's
    LogIndex and takes whole segments for the part they cover (skipping the first one's
    `cursor.lines - first_line` lines when the cursor is inside it), which may return lines
    past `announced` when a segment reaches past it. With `max_bytes` (a poll's budget) it
    stops once it took that many bytes of the stream (the chunk or segment that crossed it
    included): the next call goes on from there. A store error other than NotFound
    propagates and leaves `cursor` as it was."""
    if announced is not None and announced < cursor.next_seq:
        return []
    next_seq, count = cursor.next_seq, cursor.lines
    prefix = logs_prefix(run_id, cursor.node)
    out: list[str] = []
    budget = _Budget(max_bytes)
    if announced is None or announced - next_seq + 1 > CATCH_UP:
        wanted = _covering(store, run_id, cursor, announced)
        if wanted and count < 0 and wanted[0]["first_seq"] < next_seq:
            inside = wanted.pop(0)  # no count to skip by: its chunks from the cursor on
            for seq, data in get_chunks(store, prefix, next_seq, inside["last_seq"], skips=SKIPS):
                out += log_lines(data.decode(errors="replace"))
                next_seq = seq + 1
                if budget.take(len(data)):
                    break
            if next_seq <= inside["last_seq"]:
                wanted = []  # a chunk is missing (or the budget is spent): the read ends there
            else:
                count = int(inside["first_line"]) + int(inside["lines"])
        for segment, text in _texts(store, run_id, cursor.node, budget.segments(wanted)):
            budget.take(len(text))
            lines = log_lines(text)
            first_line = int(segment["first_line"])
            skip = count - first_line if next_seq > segment["first_seq"] else 0
            out += lines[max(0, skip) :]
            next_seq = segment["last_seq"] + 1
            count = first_line + int(segment["lines"])
        found = None if budget.spent else _open_segment(store, run_id, cursor.node, next_seq)
        if found is not None:  # one GET for what would be a chunk per flush since it opened
            last_seq, lines = found
            budget.take(sum(map(len, lines)))
            out += lines
            next_seq, count = last_seq + 1, count + len(lines) if count >= 0 else UNKNOWN
    if not budget.spent:
        for seq, data in get_chunks(store, prefix, next_seq, announced, skips=SKIPS):
            lines = log_lines(data.decode(errors="replace"))
            out += lines
            next_seq, count = seq + 1, count + len(lines) if count >= 0 else UNKNOWN
            if budget.take(len(data)):
                break
    cursor.next_seq, cursor.lines = next_seq, count
    return out


class _Budget:
    """How many bytes of a stream one read may still take (None: no limit)."""

    def __init__(self, max_bytes: int | None) -> None:
        self.left = max_bytes

    @property
    def spent(self) -> bool:
        """Whether the read took its budget. Pure."""
        return self.left is not None and self.left <= 0

    def take(self, n: int) -> bool:
        """Count `n` bytes taken; whether the budget is now spent."""
        if self.left is not None:
            self.left -= n
        return self.spent

    def segments(self, wanted: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The first of `wanted` whose sizes (their index's `bytes`) fit what is left, at least
        one while anything is. Pure."""
        if self.left is None:
            return wanted
        out, left = [], self.left
        for segment in wanted:
            if left <= 0:
                break
            out.append(segment)
            left -= int(segment.get("bytes") or LOG_SEGMENT_MAX_BYTES)
        return out


def _open_segment(
    store: ObjectStore, run_id: str, node: str, first_seq: int
) -> tuple[int, list[str]] | None:
    """(last_seq, lines) of the open segment starting at `first_seq` as its agent last uploaded
    it (protocol.log_open_segment_key), or None when there is none. One that outlived its
    closing holds the same chunks' bytes, so it is as good. One GET, bounded (one too large
    is None: its chunks are read instead)."""
    key = log_open_segment_key(run_id, node, first_seq)
    body = get_bounded(store, key, LOG_SEGMENT_MAX_BYTES, SKIPS)
    found = None if body is None else read_open_segment(body)
    if found is None or found[0] < first_seq:
        return None
    return found[0], log_lines(found[2])


def _covering(
    store: ObjectStore, run_id: str, cursor: NodeCursor, announced: int | None
) -> list[dict[str, Any]]:
    """The closed segments holding chunk cursor.next_seq and on (up to the one holding
    `announced`), in order, as far as they are contiguous; [] without an index (a run from
    before segments, or a node with none closed yet, or one that does not parse). One GET."""
    index = read_document(store, log_index_key(run_id, cursor.node), LogIndex, SKIPS)
    if index is None:
        return []
    wanted: list[dict[str, Any]] = []
    expect = cursor.next_seq
    for segment in index.segments:
        first, last = int(segment["first_seq"]), int(segment["last_seq"])
        segment = {**segment, "first_seq": first, "last_seq": last}
        if last < cursor.next_seq:
            continue
        if announced is not None and first > announced:
            break
        if first > expect or (wanted and first != expect):
            break
        wanted.append(segment)
        expect = last + 1
    return wanted


def _texts(
    store: ObjectStore, run_id: str, node: str, wanted: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], str]]:
    """The segments' texts, GET in parallel, in order, up to the first not in the bucket (or
    over LOG_SEGMENT_MAX_BYTES: its chunks are read instead)."""
    if not wanted:
        return []

    def text(segment: dict[str, Any]) -> str | None:
        # the key as protocol names it, not the index's `key`: a reader GETs only log segments
        key = log_segment_key(run_id, node, segment["first_seq"], segment["last_seq"])
        body = get_bounded(store, key, LOG_SEGMENT_MAX_BYTES, SKIPS)
        return None if body is None else body.decode(errors="replace")

    with ThreadPoolExecutor(min(PARALLEL_GETS, len(wanted)), thread_name_prefix="log-seg") as pool:
        texts = list(pool.map(text, wanted))
    found: list[tuple[dict[str, Any], str]] = []
    for segment, body in zip(wanted, texts, strict=True):
        if body is None:
            break
        found.append((segment, body))
    return found
