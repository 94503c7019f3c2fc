"""What the node agent keeps in the bucket while it runs: the log chunks (LogPump), the
heartbeat at its pace, the checkpoints (sync, restore, the barrier between attempts) and the
model. A real `Agent` on a real `LocalStore`; shared helpers and fixtures are in agent_kit.py."""

# ruff: noqa: F811 - the fixtures (`store`, `work`...) are agent_kit's, taken by name

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.jobs.agent import Agent, LogPump, StopRequested
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (
    HANG_S,
    PREFIX,
    RUN_ID,
    bucket_files,
    child_groups,  # noqa: F401 - an autouse fixture: imported, it applies here
    get_json,
    local_files,
    make_agent,
    node_env,  # noqa: F401 - an autouse fixture: imported, it applies here
    put_json,
    read_logs,
    store,  # noqa: F401 - a fixture, taken by name
    work,  # noqa: F401 - a fixture, taken by name
)


# --- LogPump ---------------------------------------------------------------------------------
def test_logpump_uploads_lines_as_ordered_chunks(store: LocalStore) -> None:
    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)
    pump.add("first\n")
    pump.add("second")
    pump.flush()
    pump.flush()  # nothing buffered: no empty chunk
    pump.add("third")
    pump.flush()
    keys = [o.key for o in store.list(PREFIX + "logs/chief-0/")]
    assert keys == [PREFIX + "logs/chief-0/00000000.log", PREFIX + "logs/chief-0/00000001.log"]
    assert store.get(keys[0]) == b"first\nsecond\n"
    assert store.get(keys[1]) == b"third\n"
    assert pump.seq == 2


def test_logpump_keeps_every_chunk_within_its_size(store: LocalStore) -> None:
    """A job that prints megabytes between two flushes: the readers cap a chunk
    (jobs/bucket_reads.py: LOG_CHUNK_MAX_BYTES), so the writer cuts its chunks at
    LOG_CHUNK_BYTES, in order, and loses no line (issue 29)."""
    from cloudtrain.jobs.logpump import LOG_CHUNK_BYTES

    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)
    lines = [f"line {i} of a chatty job" for i in range(200_000)]  # ~5 MB
    for line in lines:
        pump.add(line)
    pump.flush()
    keys = sorted(o.key for o in store.list(PREFIX + "logs/chief-0/0"))
    chunks = [store.get(key) for key in keys]
    assert len(chunks) > 1 and max(len(c) for c in chunks) <= LOG_CHUNK_BYTES
    assert b"".join(chunks).decode().splitlines() == lines
    assert pump.seq == len(chunks)


def test_logpump_is_thread_safe(store: LocalStore) -> None:
    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)

    def writer(name: str) -> None:
        for i in range(100):
            pump.add(f"{name} {i}")
            if i % 10 == 0:
                pump.flush()

    threads = [threading.Thread(target=writer, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pump.flush()
    keys = [o.key for o in store.list(PREFIX + "logs/chief-0/")]
    assert keys == [f"{PREFIX}logs/chief-0/{seq:08d}.log" for seq in range(len(keys))]
    lines = read_logs(store, "chief-0").splitlines()
    assert sorted(lines) == sorted(f"t{n} {i}" for n in range(4) for i in range(100))
    for n in range(4):  # each writer's lines keep their order across chunks
        mine = [line for line in lines if line.startswith(f"t{n} ")]
        assert mine == [f"t{n} {i}" for i in range(100)]


def test_restarted_agent_continues_after_the_existing_chunks(store: LocalStore, work: Path) -> None:
    for seq in range(3):
        store.put(f"{PREFIX}logs/chief-0/{seq:08d}.log", f"old {seq}\n".encode())
    for seq in range(5):  # another node's chunks do not count
        store.put(f"{PREFIX}logs/worker-0/{seq:08d}.log", b"other\n")
    agent = Agent(RUN_ID, "chief", 0, store, work)
    assert agent.logs.seq == 3
    agent.say("back")
    agent.logs.flush()
    keys = [o.key for o in store.list(PREFIX + "logs/chief-0/")]
    assert keys[-1] == PREFIX + "logs/chief-0/00000003.log"
    assert read_logs(store, "chief-0") == "old 0\nold 1\nold 2\ncloudtrain-agent[chief-0]: back\n"


@pytest.mark.parametrize(
    ("line", "epoch"),
    [
        ("Epoch 3/10", (3, 10)),
        ("cloudtrain: epoch 3/10 done", (3, 10)),
        ("[worker 0] cloudtrain: epoch 7/12 done, loss 0.1", (7, 12)),
        ("[rank 3] Epoch 4/9", (4, 9)),  # a horovod rank's Keras line
        ("[rank x] Epoch 4/9", None),
        ("Epoch 11/200\n", (11, 200)),
        ("loss 0.2 - Epoch 3/10", None),  # Keras' "Epoch" is at the start of a line
        ("epoch 3/10", None),
        ("", None),
    ],
)
def test_logpump_parses_epochs(store: LocalStore, line: str, epoch: tuple[int, int] | None) -> None:
    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)
    pump.add(line)
    assert pump.epoch == epoch


def test_logpump_keeps_the_latest_epoch_and_last_nonblank_line(store: LocalStore) -> None:
    pump = LogPump(store, PREFIX + "logs/chief-0/", 0)
    pump.add("Epoch 1/3")
    pump.add("cloudtrain: epoch 1/3 done")
    pump.add("Epoch 2/3")
    pump.add("step 5 loss 0.5\n")
    pump.add("   ")
    pump.add("")
    assert pump.epoch == (2, 3)
    assert pump.last_line == "step 5 loss 0.5"
    pump.add("x" * 500 + "END")
    assert len(pump.last_line) == 300
    assert pump.last_line.endswith("END")


# --- heartbeat and pacing --------------------------------------------------------------------
def test_tick_beats_flushes_syncs_and_checks_control_each_at_its_pace(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(store, work, heartbeat_s=1.0, log_flush_s=1.0, sync_s=1.0, control_s=1.0)
    put_json(store, "cluster.json", agent.cluster)
    agent.ckpt_dir.mkdir(parents=True)
    (agent.ckpt_dir / "ckpt-1").write_text("one")
    agent.logs.add("Epoch 2/5")
    t0 = time.time()
    agent.tick(t0)
    beat = get_json(store, "heartbeat/chief-0.json")
    assert beat is not None
    assert beat["attempt"] == 1
    assert beat["state"] == "bootstrapped"
    assert (beat["epoch"], beat["epochs"]) == (2, 5)
    assert beat["last_line"] == "Epoch 2/5"
    assert beat["pid"] is None
    assert read_logs(store, "chief-0") == "Epoch 2/5\n"
    assert bucket_files(store, "checkpoints/") == {"ckpt-1": b"one"}

    agent.logs.add("Epoch 3/5")
    (agent.ckpt_dir / "ckpt-2").write_text("two")
    store.put(PREFIX + "control/stop", b"")
    agent.tick(t0 + 0.5)  # nothing is due yet
    assert read_logs(store, "chief-0") == "Epoch 2/5\n"
    assert get_json(store, "heartbeat/chief-0.json") == beat
    assert set(bucket_files(store, "checkpoints/")) == {"ckpt-1"}

    with pytest.raises(StopRequested):
        agent.tick(t0 + 1.5)  # everything is due: flush, beat, sync, then the stop
    assert read_logs(store, "chief-0") == "Epoch 2/5\nEpoch 3/5\n"
    assert (get_json(store, "heartbeat/chief-0.json") or {})["epoch"] == 3
    assert set(bucket_files(store, "checkpoints/")) == {"ckpt-1", "ckpt-2"}


# --- checkpoints -----------------------------------------------------------------------------
def test_sync_checkpoints_uploads_new_and_changed_skips_unchanged_mirrors_deletions(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(store, work)
    assert agent.sync_checkpoints() == 0  # no folder yet
    ckpt = agent.ckpt_dir
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "checkpoint").write_text("v1")
    (ckpt / "sub" / "ckpt-1.index").write_text("index-1")
    assert agent.sync_checkpoints() == 2
    assert bucket_files(store, "checkpoints/") == {
        "checkpoint": b"v1",
        "sub/ckpt-1.index": b"index-1",
    }
    assert agent.sync_checkpoints() == 0  # unchanged: nothing uploaded

    (ckpt / "checkpoint").write_text("v2 longer")  # changed size
    (ckpt / "sub" / "ckpt-2.index").write_text("index-2")  # new
    assert agent.sync_checkpoints() == 2
    assert agent.sync_checkpoints() == 0

    st = (ckpt / "checkpoint").stat()
    (ckpt / "checkpoint").write_text("v3 same!!")  # same size, newer mtime
    os.utime(ckpt / "checkpoint", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert agent.sync_checkpoints() == 1
    assert store.get(PREFIX + "checkpoints/checkpoint") == b"v3 same!!"

    (ckpt / "sub" / "ckpt-1.index").unlink()
    assert agent.sync_checkpoints() == 0
    assert bucket_files(store, "checkpoints/") == {
        "checkpoint": b"v3 same!!",
        "sub/ckpt-2.index": b"index-2",
    }


def test_restore_checkpoints_replaces_the_local_folder(store: LocalStore, work: Path) -> None:
    store.put(PREFIX + "checkpoints/checkpoint", b"from the bucket")
    store.put(PREFIX + "checkpoints/sub/ckpt-5.data", b"data")
    agent = make_agent(store, work, "worker", 1, roles={"worker": 2})
    agent.ckpt_dir.mkdir(parents=True)
    (agent.ckpt_dir / "checkpoint").write_text("local")
    (agent.ckpt_dir / "stale.txt").write_text("old")
    assert agent.restore_checkpoints() == 2
    assert local_files(agent.ckpt_dir) == {
        "checkpoint": b"from the bucket",
        "sub/ckpt-5.data": b"data",
    }
    assert agent.sync_checkpoints() == 0  # what was restored counts as synced


def test_restore_checkpoints_from_an_empty_bucket_leaves_an_empty_folder(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(store, work)
    agent.ckpt_dir.mkdir(parents=True)
    (agent.ckpt_dir / "stale.txt").write_text("old")
    assert agent.restore_checkpoints() == 0
    assert agent.ckpt_dir.is_dir()
    assert local_files(agent.ckpt_dir) == {}


def test_upload_model(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    assert agent.upload_model() == 0
    (agent.model_dir / "variables").mkdir(parents=True)
    (agent.model_dir / "saved_model.pb").write_bytes(b"pb")
    (agent.model_dir / "variables" / "variables.index").write_bytes(b"idx")
    assert agent.upload_model() == 2
    assert bucket_files(store, "model/") == {
        "saved_model.pb": b"pb",
        "variables/variables.index": b"idx",
    }


# --- checkpoint barrier ----------------------------------------------------------------------
def test_checkpoint_barrier_chief_flushes_then_writes_the_marker(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(store, work, attempt=4)
    agent.ckpt_dir.mkdir(parents=True)
    (agent.ckpt_dir / "ckpt-9").write_text("latest")
    agent.checkpoint_barrier()
    marker = get_json(store, "attempt-4/checkpoints-ready")
    assert marker is not None
    assert marker["by"] == "chief-0"
    assert bucket_files(store, "checkpoints/") == {"ckpt-9": b"latest"}


def test_checkpoint_barrier_non_chief_waits_for_the_chiefs_marker(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(
        store, work, "worker", 0, roles={"chief": 1, "worker": 1}, strategy="multi_worker_mirrored"
    )
    put_json(store, "cluster.json", agent.cluster)
    agent.ckpt_dir.mkdir(parents=True)
    (agent.ckpt_dir / "mine").write_text("a non-chief never uploads")
    agent.cluster = dataclasses.replace(agent.cluster, rendezvous_timeout_s=HANG_S)
    chief_writes = threading.Event()

    def chief() -> None:
        chief_writes.set()  # before the marker exists: the barrier cannot return before this
        put_json(store, "attempt-1/checkpoints-ready", {"by": "chief-0"})

    timer = threading.Timer(0.3, chief)
    timer.start()
    try:
        agent.checkpoint_barrier()
        waited_for_the_chief = chief_writes.is_set()
    finally:
        timer.cancel()
    assert waited_for_the_chief
    assert not store.list(PREFIX + "checkpoints/")
    assert get_json(store, "heartbeat/worker-0.json") is not None  # it kept beating


def test_checkpoint_barrier_non_chief_times_out(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, "worker", 0, roles={"chief": 1, "worker": 1})
    agent.cluster = dataclasses.replace(agent.cluster, rendezvous_timeout_s=0.3)
    put_json(store, "attempt-0/checkpoints-ready", {"by": "chief-0"})  # an older attempt's
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="chief's checkpoints"):
        agent.checkpoint_barrier()
    assert 0.3 <= time.monotonic() - start < HANG_S  # not before the timeout
