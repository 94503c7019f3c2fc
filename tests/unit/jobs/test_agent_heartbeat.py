"""The agent's heartbeat thread (jobs/beats.py) against a store that delivers slowly: a real
LocalStore behind the faults wrapper's bandwidth limit (`FaultPlan.store_bytes_per_s`). A long
restore must not silence the node (issue 19: a node restoring a large checkpoint is never
reported lost): heartbeats keep coming, saying "restoring x/y MB" with x rising; every heartbeat
and status announces the last log chunk uploaded before it (`log_seq`). Also the activity's
text, and the downloads' sidecars, which restores keep and mirrors skip. No TensorFlow here.

Nothing here depends on how fast the machine is: the restore is paced to about 3 s, heartbeats
come every 0.1 s, and the checks are about what the heartbeats said, in order.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.agent import Agent
from cloudtrain.jobs.checkpoints import fmt_progress
from cloudtrain.jobs.protocol import ClusterDoc
from cloudtrain.providers.base import ProviderConfig
from cloudtrain.providers.faults import FaultPlan, wrap
from cloudtrain.providers.local import LocalProvider, LocalStore
from cloudtrain.providers.transfer import sidecar_path
from tests.unit.agent_kit import HANG_S, PREFIX, RUN_ID, base_cluster, wait_for

MiB = 1024 * 1024
BIG = 24 * MiB  # larger than checkpoints.SMALL_FILE: a get_file, reporting every 4 MiB
RATE = 8 * MiB  # bytes/s: the restore takes about 3 s
NODE = "worker-1"


def _bucket(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'bucket'}"


def _agent(tmp_path: Path, store: object, **overrides: object) -> Agent:
    agent = Agent(RUN_ID, "worker", 1, store, tmp_path / "work")
    agent.cluster = ClusterDoc.from_dict(base_cluster(**{"roles": {"worker": 2}, **overrides}))
    agent.attempt = agent.cluster.attempt
    return agent


def _chunks(store: LocalStore) -> list[int]:
    """The seqs of the node's log chunks in the bucket, in order."""
    seqs = (proto.log_seq(o.key) for o in store.list(proto.logs_prefix(RUN_ID, NODE)))
    return sorted(s for s in seqs if s >= 0)


def _doc(store: LocalStore, key: str) -> dict[str, object] | None:
    try:
        return proto.Heartbeat.from_json(store.get(key)).to_dict()
    except Exception:  # not there yet, or caught mid-write by a LocalStore replace: try again
        return None


@pytest.mark.parametrize(
    ("done", "total", "text"),
    [
        (0, 5_000_000_000, "0.0/5.0 GB"),
        (3_100_000_000, 5_000_000_000, "3.1/5.0 GB"),
        (400_000, 25_200_000, "0.4/25.2 MB"),
        (512, 2048, "0.5/2.0 KB"),
        (0, 0, "0.0/0.0 KB"),
    ],
)
def test_progress_text_is_in_the_unit_of_the_total(done: int, total: int, text: str) -> None:
    assert fmt_progress(done, total) == text


def test_a_slow_restore_keeps_the_heartbeat_beating_with_its_progress(tmp_path: Path) -> None:
    local = LocalStore(_bucket(tmp_path))
    local.ensure_bucket()
    provider = LocalProvider(ProviderConfig(name="local", options={"root": str(tmp_path)}))
    slow = wrap(provider, FaultPlan(store_bytes_per_s=RATE)).store(_bucket(tmp_path))
    big, small = os.urandom(BIG), b"index"
    local.put(PREFIX + "checkpoints/ckpt-1.data", big)
    local.put(PREFIX + "checkpoints/ckpt-1.index", small)
    # equal paces: every beat flushes, then beats, so the last heartbeat announces the last chunk
    agent = _agent(tmp_path, slow, heartbeat_s=0.1, log_flush_s=0.1)
    beat_key = proto.heartbeat_key(RUN_ID, NODE)
    seen: list[dict[str, object]] = []
    unannounced: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # what the controller would read, as often as it can
        while not stop.is_set():
            doc = _doc(local, beat_key)
            if doc is not None and (not seen or doc != seen[-1]):
                seen.append(doc)
                seq = doc["log_seq"]
                if seq is not None and not local.list(proto.log_chunk_key(RUN_ID, NODE, seq)):
                    unannounced.append(f"heartbeat announces chunk {seq}, not in the bucket")
            stop.wait(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    agent.say("before the restore")
    agent.start_beating()
    try:
        assert agent.restore_checkpoints() == 2
        restoring = [str(d["activity"]) for d in seen if str(d["activity"]).startswith("rest")]
        moved = [float(a.split()[1].split("/")[0]) for a in restoring]
        assert len(moved) >= 2 and moved == sorted(moved) and moved[0] < moved[-1], restoring
        assert all(a.endswith(f"/{(BIG + len(small)) / 1e6:.1f} MB") for a in restoring)
        before = (_chunks(local) or [-1])[-1]
        agent.say("after the restore")
        assert wait_for(
            lambda: (
                bool(seen)
                and seen[-1]["activity"] == ""
                and seen[-1]["log_seq"] == (_chunks(local) or [-1])[-1] > before
            )
        ), "no heartbeat announced the line said after the restore"
    finally:
        agent.stop_beating()
        stop.set()
        watcher.join(HANG_S)
    assert not unannounced, unannounced
    last = _doc(local, beat_key)
    assert last is not None and last["log_seq"] == _chunks(local)[-1]
    assert (agent.ckpt_dir / "ckpt-1.data").read_bytes() == big
    assert sorted(p.name for p in agent.ckpt_dir.iterdir()) == ["ckpt-1.data", "ckpt-1.index"]


def test_a_beat_and_a_status_announce_the_chunk_flushed_before_them(tmp_path: Path) -> None:
    store = LocalStore(_bucket(tmp_path))
    store.ensure_bucket()
    agent = _agent(tmp_path, store, heartbeat_s=5.0, log_flush_s=1.0)
    beat_key, status_key = proto.heartbeat_key(RUN_ID, NODE), proto.status_key(RUN_ID, NODE)
    agent.write_status(proto.NodeState.BOOTSTRAPPED)
    assert proto.NodeStatus.from_json(store.get(status_key)).log_seq is None  # nothing yet
    agent.say("one")
    agent.beat(now=100.0)  # everything due: the flush, then the heartbeat
    assert _chunks(store) == [0]
    assert proto.Heartbeat.from_json(store.get(beat_key)).log_seq == 0
    agent.say("two")
    agent.beat(now=101.5)  # only the flush is due
    assert _chunks(store) == [0, 1]
    assert proto.Heartbeat.from_json(store.get(beat_key)).log_seq == 0
    agent.say("three")
    agent.beat(now=105.5)  # both again
    assert proto.Heartbeat.from_json(store.get(beat_key)).log_seq == 2
    agent.write_status(proto.NodeState.RUNNING)
    assert proto.NodeStatus.from_json(store.get(status_key)).log_seq == 2


def test_restore_clears_the_folder_and_mirrors_skip_download_sidecars(tmp_path: Path) -> None:
    store = LocalStore(_bucket(tmp_path))
    store.ensure_bucket()
    agent = _agent(tmp_path, store)
    store.put(PREFIX + "checkpoints/sub/ckpt-2.data", b"data")
    ckpt = agent.ckpt_dir
    (ckpt / "old").mkdir(parents=True)
    (ckpt / "old" / "ckpt-1.data").write_bytes(b"an older attempt's")
    sidecar_path(ckpt / "old" / "ckpt-1.data").write_bytes(b"a dead download's")
    assert agent.restore_checkpoints() == 1
    assert not (ckpt / "old").exists()
    assert list(agent._local_files(ckpt)) == ["sub/ckpt-2.data"]
    sidecar_path(ckpt / "sub" / "ckpt-3.data").write_bytes(b"half")  # a download under way
    assert agent.sync_checkpoints() == 0  # a mirror never uploads a sidecar
    assert [o.key for o in store.list(PREFIX + "checkpoints/")] == [
        PREFIX + "checkpoints/sub/ckpt-2.data"
    ]
