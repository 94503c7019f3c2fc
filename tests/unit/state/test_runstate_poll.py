"""RunReader's poll reads a bounded set of things: each node's small documents, one listing of
bootstrap/ and the log chunks the nodes announced (`log_seq`), never a listing of logs/; and it
returns every line the agents' log pumps wrote, in order, once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloudtrain.jobs import protocol
from cloudtrain.jobs.logpump import LogPump
from cloudtrain.providers.base import ObjectInfo
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.runstate import RunReader

RUN = "longrun-abc123"


class Recording(LocalStore):
    """A real folder store that notes which prefixes were listed and which keys were read."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.listed: list[str] = []
        self.got: list[str] = []

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.listed.append(prefix)
        return super().list(prefix)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self.got.append(key)
        return super().get(key, max_bytes)


@pytest.fixture
def store(tmp_path: Path) -> Recording:
    s = Recording((tmp_path / "bucket").as_uri())
    s.ensure_bucket()
    return s


NODES = ("chief-0", "worker-0", "worker-1")  # the controller's plan names them


def _beat(store: LocalStore, node: str, pump: LogPump) -> None:
    """What the agent's heartbeat says about its logs: the last chunk uploaded."""
    doc = protocol.Heartbeat(time=time.time(), state="running", log_seq=pump.last_seq)
    store.put(protocol.heartbeat_key(RUN, node), doc.to_json())


def _say(pump: LogPump, *lines: str) -> None:
    for line in lines:
        pump.add(line)
    pump.flush()


def test_poll_reads_announced_chunks_in_order_and_never_lists_logs(store: Recording) -> None:
    pumps = {n: LogPump.resume(store, RUN, n) for n in ("worker-0", "worker-1")}
    for node, pump in pumps.items():
        _say(pump, f"{node} one", f"{node} two")
        _say(pump, f"{node} three\rstill three", "")
        _beat(store, node, pump)
    reader = RunReader(store, RUN, nodes=NODES)
    first = reader.poll().new_lines
    assert first == [
        (n, line)
        for n in ("worker-0", "worker-1")
        for line in (f"{n} one", f"{n} two", f"{n} three", "still three", "")
    ]
    # a chunk uploaded but not yet announced is not looked for: the poll stays bounded
    _say(pumps["worker-0"], "worker-0 four")
    assert reader.poll().new_lines == []
    _beat(store, "worker-0", pumps["worker-0"])
    assert reader.poll().new_lines == [("worker-0", "worker-0 four")]
    assert reader.poll().new_lines == []
    assert set(store.listed) == {protocol.bootstrap_prefix(RUN)}


def test_a_steady_poll_reads_only_what_changed(store: Recording) -> None:
    pump = LogPump.resume(store, RUN, "chief-0")
    _say(pump, "hello")
    _beat(store, "chief-0", pump)
    reader = RunReader(store, RUN, nodes=NODES)
    reader.poll()
    store.got.clear()
    assert reader.poll().new_lines == []
    # each node's three documents and the stop key, whatever the run holds: no log chunk
    docs = [f(RUN, n) for n in NODES for f in (protocol.status_key, protocol.heartbeat_key)]
    docs += [protocol.notice_key(RUN, n) for n in NODES] + [protocol.stop_key(RUN)]
    assert sorted(store.got) == sorted(docs)
    store.got.clear()
    _say(pump, "again")
    _beat(store, "chief-0", pump)
    assert reader.poll().new_lines == [("chief-0", "again")]
    chunk = protocol.log_chunk_key(RUN, "chief-0", pump.last_seq or 0)
    assert sorted(store.got) == sorted([*docs, chunk])


def test_status_reads_no_log_lines(store: Recording) -> None:
    pump = LogPump.resume(store, RUN, "worker-0")
    _say(pump, "a line")
    _beat(store, "worker-0", pump)
    store.got.clear()
    snap = RunReader(store, RUN, logs=False).poll()  # `status` without nodes from a ledger
    assert "worker-0" in snap.heartbeats and snap.new_lines == []
    assert not [key for key in store.got if "/logs/" in key]
    assert protocol.cluster_key(RUN) not in store.got  # it holds the secrets
