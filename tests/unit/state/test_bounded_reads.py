"""The controller's readers of the bucket (the watch's poll, `status`, `logs`, `report`) take
what a node wrote as untrusted input (issue 29): every GET is bounded (a document never pulls
more than its cap into memory), a document too large, too deep or ill-typed is skipped with ONE
warning naming its key (not one per poll), and nothing a node writes crashes a reader."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cloudtrain.jobs import protocol
from cloudtrain.jobs.bucket_reads import LOG_CHUNK_MAX_BYTES
from cloudtrain.state.log_reader import NodeCursor, read_new
from cloudtrain.state.runstate import RunReader
from tests.fakes.memory_provider import MemoryProvider, MemoryStore
from tests.unit.insight.test_report import RUN_ID as REPORT_RUN
from tests.unit.insight.test_report import collect_run, write_run

RUN = "hostile-abc123"
NODES = ("chief-0", "worker-0", "worker-1", "worker-2")
DEEP = b"[" * 100_000 + b"]" * 100_000


class Recording(MemoryStore):
    """The test fake's store, noting the bound of every GET."""

    bounds: list[tuple[str, int | None]]

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self.bounds.append((key, max_bytes))
        return super().get(key, max_bytes)


def _store() -> Recording:
    inner = MemoryProvider().store("mem://ct-hostile")
    store = Recording(inner.uri, inner.objects, inner._lock)
    store.bounds = []
    return store


def _hostile(store: Recording) -> None:
    good = protocol.NodeStatus(state="running", attempt=1, time=1.0)
    store.put(protocol.status_key(RUN, "chief-0"), good.to_json())
    store.put(protocol.heartbeat_key(RUN, "worker-0"), DEEP)
    store.put(protocol.status_key(RUN, "worker-1"), b'{"state": "failed", "exit_code": "x"}')
    big = json.dumps({"state": "running", "reason": "x" * (8 * 1024 * 1024)}).encode()
    store.put(protocol.status_key(RUN, "worker-2"), big)
    store.put(protocol.heartbeat_key(RUN, "worker-2"), b'{"time": 1, "epoch": [1, 2]}')
    store.put(protocol.notice_key(RUN, "worker-1"), b'{"time": NaN}')


def test_a_poll_skips_hostile_documents_with_one_warning_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _store()
    _hostile(store)
    reader = RunReader(store, RUN, nodes=NODES)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            snap = reader.poll()
    reader.close()
    assert set(snap.statuses) == {"chief-0"}
    assert snap.heartbeats == {} and snap.notices == {}
    bad = [
        protocol.heartbeat_key(RUN, "worker-0"),
        protocol.status_key(RUN, "worker-1"),
        protocol.status_key(RUN, "worker-2"),
        protocol.heartbeat_key(RUN, "worker-2"),
        protocol.notice_key(RUN, "worker-1"),
    ]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key in bad:
        assert sum(key in message for message in warned) == 1, (key, warned)
    assert [key for key, bound in store.bounds if bound is None] == []
    documents = [bound for key, bound in store.bounds if key.endswith(".json")]
    assert documents and max(b or 0 for b in documents) <= protocol.LARGE_DOCUMENT_BYTES


def test_a_log_chunk_over_its_cap_is_a_note_and_the_stream_goes_on() -> None:
    store = _store()
    prefix = protocol.logs_prefix(RUN, "chief-0")
    store.put(prefix + protocol.log_chunk_name(0), b"first\n")
    store.put(prefix + protocol.log_chunk_name(1), b"y" * (LOG_CHUNK_MAX_BYTES + 1))
    store.put(prefix + protocol.log_chunk_name(2), b"third\n")
    cursor = NodeCursor("chief-0")
    lines = read_new(store, RUN, cursor, 2)
    assert lines[0] == "first" and lines[2] == "third" and len(lines) == 3
    assert "skipped" in lines[1] and len(lines[1]) < 200
    assert cursor.next_seq == 3
    assert all(bound is not None for _key, bound in store.bounds)


def test_a_log_index_that_is_not_an_index_is_not_a_crash() -> None:
    store = _store()
    prefix = protocol.logs_prefix(RUN, "chief-0")
    store.put(prefix + protocol.log_chunk_name(0), b"only\n")
    for body in (DEEP, b'{"segments": "abc"}', b'{"segments": [{"first_seq": 0}]}'):
        store.put(protocol.log_index_key(RUN, "chief-0"), body)
        assert read_new(store, RUN, NodeCursor("chief-0"), None) == ["only"]


def test_the_report_skips_hostile_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = write_run(tmp_path, monkeypatch)
    before = collect_run(tmp_path, ledger).skipped
    prefix = tmp_path / "bucket" / protocol.run_prefix(REPORT_RUN)
    (prefix / "trace").mkdir(parents=True, exist_ok=True)
    (prefix / "trace" / "worker-0.json").write_bytes(DEEP)
    (prefix / "trace" / "worker-1.json").write_bytes(b'{"spans": [{"name": {"a": 1}}]}')
    chunk = prefix / "metrics" / "worker-0" / "00000002.jsonl"
    chunk.write_bytes(b"[" * 5000 + b"]" * 5000 + b'\n{"kind": "epoch", "time": NaN}\n')
    data = collect_run(tmp_path, ledger)
    assert data.skipped == before + 4
    assert [s for s in data.trace if s.node] == []


def test_a_poll_takes_at_most_its_log_budget_per_node_and_the_next_goes_on() -> None:
    """A node that announces 40 chunks of 400 KiB (16 MB) is read over several polls, each
    taking at most POLL_LOG_BYTES of its stream (plus the chunk that crossed it), in order."""
    from cloudtrain.state.runstate import POLL_LOG_BYTES

    store = _store()
    prefix = protocol.logs_prefix(RUN, "chief-0")
    body = (b"z" * 1023 + b"\n") * 400
    for seq in range(40):
        store.put(prefix + protocol.log_chunk_name(seq), body)
    beat = protocol.Heartbeat(time=1.0, state="running", log_seq=39)
    store.put(protocol.heartbeat_key(RUN, "chief-0"), beat.to_json())
    reader = RunReader(store, RUN, nodes=["chief-0"])
    polls = []
    for _ in range(40):
        lines = reader.poll().new_lines
        if not lines:
            break
        polls.append(len(lines))
    reader.close()
    assert sum(polls) == 40 * 400
    assert len(polls) > 1 and max(polls) * 1024 <= POLL_LOG_BYTES + len(body)


def test_logs_of_a_run_reads_the_whole_stream_past_the_poll_budget(tmp_path: Path) -> None:
    """`cloudtrain logs RUN` (no --follow) polls until the stream is read, not once: each poll
    takes at most POLL_LOG_BYTES of a node's stream."""
    from cloudtrain.api.log_stream import LogStream
    from cloudtrain.state.ledger import Ledger

    provider = MemoryProvider()
    store = provider.store("mem://ct-logs")
    prefix = protocol.logs_prefix(RUN, "chief-0")
    body = (b"z" * 1023 + b"\n") * 400
    for seq in range(40):
        store.put(prefix + protocol.log_chunk_name(seq), body)
    beat = protocol.Heartbeat(time=1.0, state="running", log_seq=39)
    store.put(protocol.heartbeat_key(RUN, "chief-0"), beat.to_json())
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.create_run(RUN, "hostile", "memory", None, None, None, store.uri, "{}")
    rec = ledger.get_run(RUN)
    assert rec is not None
    reader = RunReader(store, RUN, nodes=["chief-0"])
    stream = LogStream(rec, provider, reader, ledger)
    assert sum(1 for _ in stream) == 40 * 400
    reader.close()


def test_status_reads_a_node_trace_bounded() -> None:
    """`status` and the summary read each node's trace (run_trace.read_node_traces): one over
    TRACE_MAX_BYTES is not pulled into memory, and is no spans."""
    from cloudtrain.insight.run_trace import read_node_traces
    from cloudtrain.jobs.bucket_reads import TRACE_MAX_BYTES

    store = _store()
    store.put(protocol.trace_key(RUN, "chief-0"), b" " * (TRACE_MAX_BYTES + 1))
    store.put(protocol.trace_key(RUN, "worker-0"), DEEP)
    assert read_node_traces(store, RUN, ["chief-0", "worker-0"]) == []
    assert sorted(bound or 0 for _key, bound in store.bounds) == [TRACE_MAX_BYTES] * 2
