"""A node's log stream rolled into segments (jobs/logpump.py) and read back by seq
(cloudtrain/state/log_reader.py), never by listing logs/.

The stream is written by a real LogPump and read by the real read_new, on the real S3Store
against moto's S3 server where the calls are counted (a subclass of S3Store that counts each
ObjectStore call before making it), and on a LocalStore where only the content matters.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import NotFound, TransientError
from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.log_chunks import PARALLEL_GETS
from cloudtrain.jobs.logpump import LogPump
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.log_reader import CATCH_UP, UNKNOWN, NodeCursor, read_new
from tests.fakes.moto_server import moto_server, moto_server_session

__all__ = ["moto_server", "moto_server_session"]  # fixtures used by this module

RUN, NODE = "r-logs", "worker-0"
BUCKET = "ct-log-segments"
# lines a training prints, each as the pump gets it (a line from a pipe may keep its "\n")
SPECIAL = ["progress 1/3\rprogress 3/3", "", "with newline\n", "crlf\r", "ünïcode ✓", "  "]


class CountingS3:
    """Opens the real S3Store, subclassed to count every ObjectStore call it makes."""

    @staticmethod
    def open(uri: str) -> Any:
        from cloudtrain.providers.aws.storage import S3Store

        class Counting(S3Store):
            def __init__(self) -> None:
                super().__init__(uri, "us-east-1")
                self.calls: Counter[str] = Counter()
                self._count_lock = threading.Lock()

            def _count(self, method: str) -> None:
                with self._count_lock:
                    self.calls[method] += 1

            def get(self, key: str, max_bytes: int | None = None) -> bytes:
                self._count("get")
                return super().get(key, max_bytes)  # type: ignore[no-any-return]

            def put(self, key: str, data: bytes) -> None:
                self._count("put")
                super().put(key, data)

            def list(self, prefix: str) -> Any:
                self._count("list")
                return super().list(prefix)

        store = Counting()
        store.ensure_bucket()
        return store


@pytest.fixture
def s3(moto_server: Any) -> Any:
    return CountingS3.open(f"s3://{BUCKET}/team")


def write_chunks(pump: LogPump, first: int, count: int, written: list[str]) -> None:
    """`count` chunks: chunk i holds 'chunk i' and one of SPECIAL (appended to `written`)."""
    for i in range(first, first + count):
        for line in (f"chunk {i}", SPECIAL[i % len(SPECIAL)]):
            pump.add(line)
            written.append(line)
        pump.flush()


def stream_lines(written: list[str]) -> list[str]:
    """The lines a reader of the stream sees: the text the pump uploads, as protocol counts."""
    return proto.log_lines("".join(line.removesuffix("\n") + "\n" for line in written))


def index_of(store: Any, node: str = NODE) -> proto.LogIndex:
    return proto.LogIndex.from_json(store.get(proto.log_index_key(RUN, node)))


def check_index(store: Any, last_seq: int, node: str = NODE) -> proto.LogIndex:
    """The index is contiguous from seq 0 to `last_seq`, and each segment is its chunks."""
    index = index_of(store, node)
    seq = line = 0
    for seg in index.segments:
        assert (seg["first_seq"], seg["first_line"]) == (seq, line)
        assert seg["key"] == proto.log_segment_key(RUN, node, seq, seg["last_seq"])
        body = store.get(seg["key"])
        chunks = [
            store.get(proto.log_chunk_key(RUN, node, s)) for s in range(seq, seg["last_seq"] + 1)
        ]
        assert body == b"".join(chunks)
        assert seg["bytes"] == len(body)
        assert seg["lines"] == sum(len(proto.log_lines(c.decode())) for c in chunks)
        seq, line = seg["last_seq"] + 1, line + seg["lines"]
    assert seq == last_seq + 1
    return index


def test_a_stream_rolls_into_segments_and_reads_back_exactly(s3: Any) -> None:
    pump = LogPump.resume(s3, RUN, NODE)
    pump.segment_bytes = 64
    written: list[str] = []
    write_chunks(pump, 0, 30, written)
    pump.add("last words")  # the agent's last line, in its final flush
    written.append("last words")
    pump.flush(final=True)
    assert pump.last_seq == 30
    index = check_index(s3, 30)
    assert len(index.segments) >= 5
    expected = stream_lines(written)
    first = ["chunk 0", "progress 1/3", "progress 3/3", "chunk 1", "", "chunk 2", "with newline"]
    assert expected[:7] == first
    assert index.next_line == len(expected)

    cursor = NodeCursor(NODE)  # `logs RUN`: nothing announced, from the start
    assert read_new(s3, RUN, cursor, None) == expected
    assert (cursor.next_seq, cursor.lines) == (31, len(expected))
    assert read_new(s3, RUN, cursor, None) == []

    live, seen = NodeCursor(NODE), []  # the watch loop: one announced chunk at a time
    for seq in range(31):
        seen += read_new(s3, RUN, live, seq)
    assert seen == expected and live.lines == len(expected)
    assert s3.calls["list"] == 0


def test_a_read_from_any_point_of_the_stream_returns_the_rest(tmp_path: Path) -> None:
    store = LocalStore((tmp_path / "bucket").as_uri())
    pump = LogPump.resume(store, RUN, NODE)
    pump.segment_bytes = 100
    written: list[str] = []
    write_chunks(pump, 0, 40, written)  # no final flush: chunks after the last segment too
    index = check_index(store, index_of(store).next_seq - 1)
    assert len(index.segments) >= 5 and index.next_seq < 40
    expected = stream_lines(written)
    before = [0]  # lines of the stream before chunk k
    for seq in range(40):
        chunk = store.get(proto.log_chunk_key(RUN, NODE, seq)).decode()
        before.append(before[-1] + len(proto.log_lines(chunk)))
    for k in range(41):
        # `logs`, and a far-behind watch (from segments or chunks); a cursor that knows how many
        # lines came before it, and one started at the tail, which does not
        for announced, lines in itertools.product((None, 39), (before[k], UNKNOWN)):
            cursor = NodeCursor(NODE, k, lines)
            assert read_new(store, RUN, cursor, announced) == expected[before[k] :], (k, lines)
            via_segments = k < index.next_seq and (announced is None or 40 - k > CATCH_UP)
            known = lines != UNKNOWN or via_segments  # a segment boundary gives the count
            assert (cursor.next_seq, cursor.lines) == (40, len(expected) if known else UNKNOWN)
    # a chunk missing below the announced seq ends the read there; the next call goes on
    missing = store.get(proto.log_chunk_key(RUN, NODE, 35))
    store.delete(proto.log_chunk_key(RUN, NODE, 35))
    cursor = NodeCursor(NODE, 30, before[30])
    assert read_new(store, RUN, cursor, 39) == expected[before[30] : before[35]]
    assert cursor.next_seq == 35
    store.put(proto.log_chunk_key(RUN, NODE, 35), missing)
    assert read_new(store, RUN, cursor, 39) == expected[before[35] :]


def test_resume_continues_a_crashed_pumps_stream(s3: Any) -> None:
    crashed = LogPump.resume(s3, RUN, NODE)
    crashed.segment_bytes = 64
    written: list[str] = []
    write_chunks(crashed, 0, 12, written)  # then the agent dies: no final flush
    closed = index_of(s3).next_seq
    assert 0 < closed < 12 and crashed.last_seq == 11
    # a chunk that does not end with a newline (not one this pump writes; an old writer's)
    s3.put(proto.log_chunk_key(RUN, NODE, 12), b"no newline at the end")
    written.append("no newline at the end")

    s3.calls.clear()
    pump = LogPump.resume(s3, RUN, NODE)
    assert s3.calls["list"] == 0
    assert s3.calls["get"] == 1 + PARALLEL_GETS  # the index, one round of probes
    assert (pump.seq, pump.last_seq) == (13, 12)
    pump.segment_bytes = 1 << 20
    pump.add("after the restart")
    written.append("after the restart")
    pump.flush(final=True)
    index = check_index(s3, 13)
    recovered = [s for s in index.segments if s["first_seq"] >= closed]
    # the recovered chunks make the next segment; the line without a newline closes it
    assert [(s["first_seq"], s["last_seq"]) for s in recovered] == [(closed, 12), (13, 13)]
    cursor = NodeCursor(NODE)
    assert read_new(s3, RUN, cursor, None) == stream_lines(written)
    assert read_new(s3, RUN, cursor, None) == []
    assert s3.calls["list"] == 0


def test_store_calls_do_not_grow_with_the_chunks_a_node_already_wrote(s3: Any) -> None:
    calls: dict[str, dict[str, int]] = {}
    for node, history in (("worker-0", 10), ("worker-1", 120)):
        pump = LogPump(s3, proto.logs_prefix(RUN, node), 0)  # the agent's constructor
        pump.segment_bytes = 200
        written: list[str] = []
        write_chunks(pump, 0, history, written)
        pump.flush(final=True)
        write_chunks(pump, history, 5, written)  # the open segment: 5 chunks
        last = history + 4
        tail_lines = stream_lines(written[-6:])  # the last 3 chunks' lines
        seen = calls[node] = {}

        s3.calls.clear()
        pump = LogPump.resume(s3, RUN, node)
        assert pump.last_seq == last
        seen["resume"] = s3.calls["get"]

        s3.calls.clear()
        tail = NodeCursor(node, last - 2)  # a watch that began at the tail: 3 chunks behind
        assert read_new(s3, RUN, tail, last) == tail_lines
        assert read_new(s3, RUN, tail, last) == []  # caught up: nothing to GET
        seen["tail"] = s3.calls["get"]

        s3.calls.clear()
        pump.add("one more")
        written.append("one more")
        pump.flush()
        assert read_new(s3, RUN, tail, pump.last_seq) == ["one more"]
        seen["poll"] = s3.calls["get"]

        segments = len(index_of(s3, node).segments)
        s3.calls.clear()
        assert read_new(s3, RUN, NodeCursor(node), None) == stream_lines(written)  # `logs RUN`
        # the index, the segments, the open segment's upload (none yet: snapshot_s is a
        # minute), and one round of probes: the open segment's 6 chunks and the misses after
        assert s3.calls["get"] == 1 + segments + 1 + PARALLEL_GETS
        assert s3.calls["list"] == 0

    assert calls["worker-0"] == calls["worker-1"]
    assert 2 + segments + PARALLEL_GETS < 120 / 3  # `logs` of worker-1: GETs < its chunks / 3
    assert calls["worker-0"] == {"resume": 1 + PARALLEL_GETS, "tail": 3, "poll": 1}
    s3.calls.clear()  # far behind an announced seq: the segments, then the few chunks after
    read_new(s3, RUN, NodeCursor("worker-1"), 124)
    assert CATCH_UP < 124 and s3.calls["get"] == 2 + segments + 5  # chunks 120-124


def test_the_open_segment_uploaded_whole_spares_a_reader_its_chunks(s3: Any) -> None:
    """Every snapshot_s the pump uploads its open segment whole (if it grew); a reader far
    behind takes it in one GET instead of a GET per chunk, with exactly the same lines, and a
    closed segment's upload is deleted (it is the segment now)."""
    pump = LogPump.resume(s3, RUN, NODE)
    pump.snapshot_s = 0.0  # every flush that grew it
    written: list[str] = []
    write_chunks(pump, 0, 40, written)
    open_key = proto.log_open_segment_key(RUN, NODE, 0)
    body = proto.read_open_segment(s3.get(open_key))
    assert body is not None and body[0] == pump.last_seq == 39
    s3.calls.clear()
    cursor = NodeCursor(NODE)
    assert read_new(s3, RUN, cursor, None) == stream_lines(written)
    # the index (none yet), the open segment, one round of probes past its last chunk
    assert s3.calls["get"] == 1 + 1 + PARALLEL_GETS and cursor.next_seq == 40
    pump.add("closing line")
    written.append("closing line")
    pump.flush(final=True)
    assert read_new(s3, RUN, cursor, None) == ["closing line"]
    assert read_new(s3, RUN, NodeCursor(NODE), None) == stream_lines(written)
    with pytest.raises(NotFound):
        s3.get(open_key)


class FlakyStore(LocalStore):
    """A LocalStore whose puts of the keys in `fail` raise TransientError once each; it records
    the pump's last_seq at each chunk's put."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.fail: set[str] = set()
        self.pump: LogPump | None = None
        self.seen: list[tuple[int, int | None]] = []

    def put(self, key: str, data: bytes) -> None:
        if key in self.fail:
            self.fail.discard(key)
            raise TransientError(f"injected: {key}")
        if self.pump is not None and proto.log_seq(key) >= 0 and "/segments/" not in key:
            self.seen.append((proto.log_seq(key), self.pump.last_seq))
        super().put(key, data)


def test_a_failed_upload_loses_nothing_and_last_seq_waits_for_it(tmp_path: Path) -> None:
    store = FlakyStore((tmp_path / "bucket").as_uri())
    pump = store.pump = LogPump.resume(store, RUN, NODE)
    pump.add("zero")
    pump.flush()
    store.fail.add(proto.log_chunk_key(RUN, NODE, 1))
    pump.add("one")
    with pytest.raises(TransientError):
        pump.flush()
    assert pump.last_seq == 0  # chunk 1 is not in the bucket
    pump.add("two")
    store.fail.add(proto.log_segment_key(RUN, NODE, 0, 2))
    with pytest.raises(TransientError):
        pump.flush(final=True)  # chunk 1, then chunk 2, then the segment fails
    assert pump.last_seq == 2
    with pytest.raises(NotFound):  # no index names a segment that is not there
        store.get(proto.log_index_key(RUN, NODE))
    pump.flush(final=True)  # the segment again, then its index
    assert store.seen == [(0, None), (1, 0), (2, 1)]  # each chunk's put before last_seq moves
    assert store.get(proto.log_chunk_key(RUN, NODE, 1)) == b"one\n"
    assert [(s["first_seq"], s["last_seq"]) for s in check_index(store, 2).segments] == [(0, 2)]
    assert read_new(store, RUN, NodeCursor(NODE), None) == ["zero", "one", "two"]
