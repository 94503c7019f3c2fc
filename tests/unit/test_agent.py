"""Unit tests of the node agent (`cloudtrain.jobs.agent`) against a real `LocalStore`.

The bucket is a folder under `tmp_path`, the entrypoints are tiny bash commands (no TensorFlow)
and every interval is a few hundredths of a second, so the whole module runs in seconds. The
node's work folder holds a real bundle, built by the real bundler and unpacked by the bootstrap's
own commands (tests/unit/bundle_node.py).

No assertion depends on how fast a loaded machine is: what must happen before something else is
asserted as an order (signals sent, markers written), and the upper bounds are HANG_S, which only
a hang or a broken path (one that waits out a 300 s sleep, linger or grace) can pass.

Every process group the agent starts is recorded and SIGKILLed at teardown. Meanwhile the test
process is a child subreaper (Linux `prctl`), so the grandchildren orphaned by a kill are
reparented to it and can be reaped: some sandboxes' PID 1 never reaps, and a group of zombies
would still answer `os.killpg(pgid, 0)`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.bundle import Bundle, build_bundle
from cloudtrain.jobs.agent import (
    FINAL_STATES,
    Agent,
    LogPump,
    NewAttempt,
    StopRequested,
    main,
)
from cloudtrain.providers.local import LocalStore
from tests.unit.bundle_node import unpack_like_the_node

RUN_ID = "run-test"
PREFIX = f"cloudtrain/runs/{RUN_ID}/"
PR_SET_CHILD_SUBREAPER = 36
HOST = "127.0.0.1"
HANG_S = 30.0  # no step here takes this long, even on a loaded 2-core machine; a hang does
BROKEN_S = 300  # the sleeps, lingers and graces that only a broken path waits out


# --- helpers ---------------------------------------------------------------------------------
def base_cluster(**overrides: Any) -> dict[str, Any]:
    """A cluster.json like the controller's, with tiny intervals and timeouts."""
    cluster: dict[str, Any] = {
        "run_id": RUN_ID,
        "strategy": "one_device",
        "roles": {"chief": 1},
        "port": 2222,
        "attempt": 1,
        "deadline": time.time() + 600,
        "entrypoint": "true",
        "setup": "",
        "env": {},
        "heartbeat_s": 0.05,
        "log_flush_s": 0.05,
        "sync_s": 0.05,
        "control_s": 0.05,
        "poll_s": 0.05,
        "rendezvous_timeout_s": 2.0,
        "stop_grace_s": 0.5,
        "linger_s": 0.5,
    }
    cluster.update(overrides)
    return cluster


def make_agent(
    store: LocalStore, work: Path, role: str = "chief", index: int = 0, **overrides: Any
) -> Agent:
    """An agent whose cluster and attempt are set as run() would set them."""
    agent = Agent(RUN_ID, role, index, store, work)
    agent.cluster = base_cluster(**overrides)
    agent.attempt = int(agent.cluster["attempt"])
    return agent


def put_json(store: LocalStore, key: str, value: dict[str, Any]) -> None:
    store.put(PREFIX + key, json.dumps(value).encode())


def get_json(store: LocalStore, key: str) -> dict[str, Any] | None:
    if not store.list(PREFIX + key):
        return None
    return json.loads(store.get(PREFIX + key))  # type: ignore[no-any-return]


def status_of(store: LocalStore, node: str) -> dict[str, Any]:
    return get_json(store, f"status/{node}.json") or {}


def read_logs(store: LocalStore, node: str) -> str:
    """Every log chunk of `node`, concatenated in key (= sequence) order."""
    return "".join(store.get(o.key).decode() for o in store.list(f"{PREFIX}logs/{node}/"))


def bucket_files(store: LocalStore, sub: str) -> dict[str, bytes]:
    base = PREFIX + sub
    return {o.key[len(base) :]: store.get(o.key) for o in store.list(base)}


def local_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def wait_for(
    predicate: Callable[[], bool], timeout: float = HANG_S, interval: float = 0.02
) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _proc_stats() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgid) of every process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        yield int(entry), fields[0], int(fields[1]), int(fields[2])


def live_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    return [pid for pid, state, _pp, pg in _proc_stats() if pg == pgid and state != "Z"]


def _reap_orphans(pgid: int) -> None:
    """Reap the zombies of `pgid` reparented to this (subreaper) process. The group leader is
    left alone: it is the agent's Popen child, which its owner waits for."""
    me = os.getpid()
    for pid, state, ppid, pg in _proc_stats():
        if pg == pgid and pid != pgid and state == "Z" and ppid == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def group_gone(pgid: int, timeout: float = HANG_S) -> bool:
    """Whether the process group disappears (os.killpg(pgid, 0) -> ProcessLookupError)."""
    end = time.monotonic() + timeout
    while True:
        _reap_orphans(pgid)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.02)


class AgentThread:
    """`agent.run()` in a daemon thread; keeps its result or exception."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"agent-{agent.me}")

    def _run(self) -> None:
        try:
            self.result = self.agent.run()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


# --- fixtures --------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def node_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's address comes from the environment (as on the local provider); no stray TF env."""
    monkeypatch.setenv("CLOUDTRAIN_NODE_HOST", HOST)
    monkeypatch.setenv("CLOUDTRAIN_NODE_PORT", "2222")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)


@pytest.fixture(autouse=True)
def child_groups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Records every process the agent starts; kills and reaps their groups at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    original = Agent.start

    def tracked_start(
        self: Agent, command: str, env: dict[str, str], **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        proc = original(self, command, env, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(Agent, "start", tracked_start)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield started
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for proc in started:
            group_gone(proc.pid, timeout=2.0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    bucket = LocalStore(f"file://{tmp_path / 'bucket'}")
    bucket.ensure_bucket()
    return bucket


_BUNDLE: list[Bundle] = []


def job_bundle(factory: pytest.TempPathFactory) -> Bundle:
    """A real bundle of a one-file job, built once per session by the real bundler."""
    if not _BUNDLE:
        root = factory.mktemp("bundle")
        (root / "job").mkdir()
        (root / "job" / "train.py").write_text("print('training')\n")
        _BUNDLE.append(build_bundle(root / "job", root / "bundles"))
    return _BUNDLE[0]


@pytest.fixture
def node_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """The bundle in every `work` folder (see job_bundle)."""
    return job_bundle(tmp_path_factory)


@pytest.fixture
def work(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The node's work folder, with the real bundle verified and unpacked into it by the
    bootstrap's own commands (the agent runs the entrypoint in its `bundle/workdir`). Needs
    only pytest's own fixtures, so other modules can import it alone."""
    folder = tmp_path / "work"
    unpack_like_the_node(job_bundle(tmp_path_factory), folder)
    return folder


@pytest.fixture
def run_in_thread(store: LocalStore) -> Iterator[Callable[[Agent], AgentThread]]:
    """Starts agents in threads; at teardown, asks the stragglers to stop and joins them."""
    threads: list[AgentThread] = []

    def start(agent: Agent) -> AgentThread:
        runner = AgentThread(agent)
        threads.append(runner)
        runner.thread.start()
        return runner

    yield start
    if any(t.thread.is_alive() for t in threads):
        store.put(PREFIX + "control/stop", b"teardown")
    for runner in threads:
        runner.join(10)


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
    agent.cluster["rendezvous_timeout_s"] = HANG_S
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
    agent.cluster["rendezvous_timeout_s"] = 0.3
    put_json(store, "attempt-0/checkpoints-ready", {"by": "chief-0"})  # an older attempt's
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="chief's checkpoints"):
        agent.checkpoint_barrier()
    assert 0.3 <= time.monotonic() - start < HANG_S  # not before the timeout


# --- rendezvous ------------------------------------------------------------------------------
def test_rendezvous_returns_the_cluster_in_index_order(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_NODE_PORT", "2230")
    agent = make_agent(store, work, roles={"chief": 1, "worker": 2, "ps": 1})
    # written out of order: the result follows the indexes, not the registration times
    put_json(store, "attempt-1/nodes/worker-1.json", {"address": "127.0.0.1:2223"})
    put_json(store, "attempt-1/nodes/ps-0.json", {"address": "127.0.0.1:2225"})
    put_json(store, "attempt-1/nodes/worker-0.json", {"address": "127.0.0.1:2224"})
    cluster = agent.rendezvous()
    assert cluster == {
        "chief": ["127.0.0.1:2230"],
        "worker": ["127.0.0.1:2224", "127.0.0.1:2223"],
        "ps": ["127.0.0.1:2225"],
    }
    assert list(cluster) == ["chief", "worker", "ps"]
    mine = get_json(store, "attempt-1/nodes/chief-0.json")
    assert mine is not None
    assert mine["address"] == "127.0.0.1:2230"
    assert "cluster complete" in agent.logs.last_line


def test_rendezvous_waits_for_late_nodes(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, "worker", 1, roles={"worker": 2})
    timer = threading.Timer(
        0.3, lambda: put_json(store, "attempt-1/nodes/worker-0.json", {"address": "10.0.0.9:1"})
    )
    timer.start()
    try:
        cluster = agent.rendezvous()
    finally:
        timer.cancel()
    assert cluster == {"worker": ["10.0.0.9:1", f"{HOST}:2222"]}


def test_address_falls_back_to_the_cluster_port(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_NODE_PORT")
    monkeypatch.setenv("CLOUDTRAIN_NODE_HOST", "10.1.2.3")
    agent = make_agent(store, work, port=4567)
    assert agent.address() == "10.1.2.3:4567"


def test_rendezvous_times_out_naming_the_missing_nodes(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, roles={"chief": 1, "worker": 3}, rendezvous_timeout_s=0.3)
    put_json(store, "attempt-1/nodes/worker-1.json", {"address": "127.0.0.1:2223"})
    put_json(store, "attempt-0/nodes/worker-0.json", {"address": "127.0.0.1:2224"})  # stale
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        agent.rendezvous()
    assert 0.3 <= time.monotonic() - start < HANG_S  # not before the timeout
    message = str(info.value)
    assert "worker-0, worker-2" in message
    assert "worker-1" not in message
    assert "chief-0" not in message


def test_rendezvous_obeys_control_stop(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, roles={"chief": 1, "worker": 1}, rendezvous_timeout_s=5.0)
    store.put(PREFIX + "control/stop", b"")
    with pytest.raises(StopRequested):
        agent.rendezvous()


# --- control ---------------------------------------------------------------------------------
def test_check_control_without_news_does_nothing(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    agent.check_control()  # no cluster.json at all
    put_json(store, "cluster.json", agent.cluster)
    agent.check_control()
    store.put(PREFIX + "cluster.json", b'{"attempt": ')  # half-written: ignored
    agent.check_control()


def test_check_control_stop_file(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    put_json(store, "cluster.json", agent.cluster)
    store.put(PREFIX + "control/stop", b"budget")
    with pytest.raises(StopRequested, match="control/stop"):
        agent.check_control()


def test_check_control_deadline(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, deadline=time.time() - 1)
    with pytest.raises(StopRequested, match="deadline"):
        agent.check_control()


def test_check_control_new_attempt(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    put_json(store, "cluster.json", {**agent.cluster, "attempt": 2, "entrypoint": "echo new"})
    with pytest.raises(NewAttempt, match="2"):
        agent.check_control()
    assert agent.cluster["attempt"] == 2
    assert agent.cluster["entrypoint"] == "echo new"
    assert agent.attempt == 1  # run() moves to it


# --- the child's environment -----------------------------------------------------------------
def test_child_env_two_workers_gets_tf_config(store: LocalStore, work: Path) -> None:
    tf_cluster = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    worker1 = make_agent(store, work, "worker", 1, roles={"worker": 2}, strategy="multi_worker")
    env = worker1.child_env(tf_cluster)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": tf_cluster,
        "task": {"type": "worker", "index": 1},
    }
    assert env["CLOUDTRAIN_ROLE"] == "worker"
    assert env["CLOUDTRAIN_INDEX"] == "1"
    assert env["CLOUDTRAIN_IS_CHIEF"] == "0"
    assert env["CLOUDTRAIN_STRATEGY"] == "multi_worker"
    worker0 = make_agent(store, work, "worker", 0, roles={"worker": 2})
    env0 = worker0.child_env(tf_cluster)
    assert json.loads(env0["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert env0["CLOUDTRAIN_IS_CHIEF"] == "1"  # worker 0 is the chief without a chief


def test_child_env_single_chief_has_no_tf_config(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"stale": true}')  # e.g. inherited from the image
    agent = make_agent(store, work, strategy="mirrored", attempt=3)
    env = agent.child_env({"chief": ["127.0.0.1:2222"]})
    assert "TF_CONFIG" not in env
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["CLOUDTRAIN_RUN_ID"] == RUN_ID
    assert env["CLOUDTRAIN_CHECKPOINT_DIR"] == str(work / "checkpoints")
    assert env["CLOUDTRAIN_MODEL_DIR"] == str(work / "model")
    assert env["CLOUDTRAIN_ROLE"] == "chief"
    assert env["CLOUDTRAIN_INDEX"] == "0"
    assert env["CLOUDTRAIN_IS_CHIEF"] == "1"
    assert env["CLOUDTRAIN_STRATEGY"] == "mirrored"
    assert env["CLOUDTRAIN_ATTEMPT"] == "3"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert env["CLOUDTRAIN_NODE_HOST"] == HOST  # the node's own environment is inherited


def test_child_env_evaluator_is_left_out_of_the_cluster(store: LocalStore, work: Path) -> None:
    tf_cluster = {"chief": ["10.0.0.1:1"], "worker": ["10.0.0.2:1"], "evaluator": ["10.0.0.3:1"]}
    roles = {"chief": 1, "worker": 1, "evaluator": 1}
    evaluator = make_agent(store, work, "evaluator", 0, roles=roles)
    config = json.loads(evaluator.child_env(tf_cluster)["TF_CONFIG"])
    assert config == {
        "cluster": {"chief": ["10.0.0.1:1"], "worker": ["10.0.0.2:1"]},
        "task": {"type": "evaluator", "index": 0},
    }
    assert evaluator.child_env(tf_cluster)["CLOUDTRAIN_IS_CHIEF"] == "0"
    chief = make_agent(store, work, "chief", 0, roles=roles)
    assert "evaluator" not in json.loads(chief.child_env(tf_cluster)["TF_CONFIG"])["cluster"]


def test_child_env_applies_the_job_env(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, env={"FOO": "bar", "BATCH": 64, "TF_CPP_MIN_LOG_LEVEL": "0"})
    env = agent.child_env({"chief": ["127.0.0.1:2222"]})
    assert env["FOO"] == "bar"
    assert env["BATCH"] == "64"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_child_env_keeps_the_nodes_tf_log_level(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    agent = make_agent(store, work)
    assert agent.child_env({"chief": ["127.0.0.1:2222"]})["TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_child_env_puts_this_python_first_on_path(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    env = agent.child_env({"chief": ["127.0.0.1:2222"]})
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_child_env_for_setup_without_a_cluster(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, "worker", 0, roles={"worker": 2})
    env = agent.child_env({})  # what run_setup passes
    assert "TF_CONFIG" not in env
    assert env["CLOUDTRAIN_ROLE"] == "worker"


# --- the child process -----------------------------------------------------------------------
def test_start_runs_in_the_workdir_in_its_own_group_and_pumps_output(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(store, work)
    env = agent.child_env({"chief": ["127.0.0.1:2222"]})
    proc = agent.start('pwd; echo "err" >&2; echo "$CLOUDTRAIN_ROLE"', env)
    assert proc.wait(5) == 0
    assert os.getpgid(0) != proc.pid
    assert wait_for(lambda: agent.logs.last_line == "chief")
    agent.logs.flush()
    assert read_logs(store, "chief-0").splitlines() == [str(agent.workdir), "err", "chief"]


def test_kill_child_kills_a_group_that_ignores_sigterm(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(store, work)
    env = agent.child_env({"chief": ["127.0.0.1:2222"]})
    proc = agent.child = agent.start('trap "" TERM; sleep 300 & echo ready; sleep 300', env)
    pgid = proc.pid
    assert wait_for(lambda: agent.logs.last_line == "ready" and len(live_group(pgid)) >= 2)
    sent: list[tuple[int, float]] = []  # (signal, when) as sent to the group, really sent
    killpg = os.killpg

    def spy(pid: int, sig: int) -> None:
        if pid == pgid and sig:
            sent.append((sig, time.monotonic()))
        killpg(pid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    agent.kill_child(grace_s=0.2)
    assert agent.child is None
    assert [sig for sig, _ in sent] == [signal.SIGTERM, signal.SIGKILL]
    assert sent[1][1] - sent[0][1] >= 0.2  # SIGTERM was ignored: the whole grace, then SIGKILL
    assert proc.returncode == -signal.SIGKILL
    assert group_gone(pgid)


def test_kill_child_does_not_wait_longer_than_needed(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    proc = agent.child = agent.start("sleep 300", agent.child_env({"chief": ["127.0.0.1:2222"]}))
    pgid = proc.pid
    assert wait_for(lambda: bool(live_group(pgid)))
    start = time.monotonic()
    agent.kill_child(grace_s=BROKEN_S)
    assert time.monotonic() - start < HANG_S  # not the whole grace
    assert proc.returncode == -signal.SIGTERM  # it ended on the SIGTERM
    assert group_gone(pgid)


def test_kill_child_ends_the_grandchildren_of_an_exited_child(
    store: LocalStore, work: Path
) -> None:
    agent = make_agent(store, work)
    agent.child = agent.start("sleep 100 & exit 0", agent.child_env({"chief": ["127.0.0.1:2222"]}))
    pgid = agent.child.pid
    child = agent.child
    assert wait_for(lambda: child.poll() is not None)
    assert live_group(pgid)  # the grandchild is still there
    agent.kill_child()
    assert group_gone(pgid)


def test_kill_child_without_a_child(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    agent.kill_child(grace_s=1.0)
    assert agent.child is None


# --- whole runs ------------------------------------------------------------------------------
def test_run_without_cluster_json_returns_2(store: LocalStore, work: Path) -> None:
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 2
    assert get_json(store, "status/chief-0.json") is None


def test_main_opens_the_store_from_its_uri(store: LocalStore, work: Path) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    argv = ["--run-id", RUN_ID, "--role", "chief", "--index", "0"]
    try:
        assert main([*argv, "--store-uri", store.uri, "--work", str(work)]) == 2
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_run_single_chief_succeeds(store: LocalStore, work: Path) -> None:
    entrypoint = (
        'echo hello; mkdir -p "$CLOUDTRAIN_MODEL_DIR" && echo m > "$CLOUDTRAIN_MODEL_DIR/model.txt"'
        '; echo "cloudtrain: epoch 1/1 done"'
    )
    put_json(store, "cluster.json", base_cluster(entrypoint=entrypoint))
    agent = Agent(RUN_ID, "chief", 0, store, work)
    start = time.monotonic()
    assert agent.run() == 0
    assert time.monotonic() - start < HANG_S  # it does not wait for the deadline
    status = status_of(store, "chief-0")
    assert status["state"] == "succeeded"
    assert status["exit_code"] == 0
    assert status["attempt"] == 1
    assert store.get(PREFIX + "model/model.txt") == b"m\n"
    logs = read_logs(store, "chief-0")
    assert "=== cloudtrain attempt 1 (chief-0) ===" in logs
    assert "hello" in logs.splitlines()
    assert "uploaded the model (1 files)" in logs
    assert "after a final state of succeeded" in logs  # the linger ended; status kept
    beat = get_json(store, "heartbeat/chief-0.json")
    assert beat is not None
    assert (beat["epoch"], beat["epochs"]) == (1, 1)
    assert beat["state"] == "succeeded"
    assert (get_json(store, "attempt-1/nodes/chief-0.json") or {})["address"] == f"{HOST}:2222"
    assert store.list(PREFIX + "attempt-1/checkpoints-ready")


def test_run_failure_reports_the_exit_code(store: LocalStore, work: Path) -> None:
    put_json(store, "cluster.json", base_cluster(entrypoint="echo about to fail; exit 3"))
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    status = status_of(store, "chief-0")
    assert status["state"] == "failed"
    assert status["exit_code"] == 3
    assert status["signal"] is None
    assert not store.list(PREFIX + "model/")
    logs = read_logs(store, "chief-0")
    assert "about to fail" in logs
    assert "the training process failed (exit 3)" in logs


def test_run_failure_by_a_signal_reports_it(store: LocalStore, work: Path) -> None:
    put_json(store, "cluster.json", base_cluster(entrypoint="kill -KILL $$"))
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    status = status_of(store, "chief-0")
    assert status["state"] == "failed"
    assert status["exit_code"] == -9
    assert status["signal"] == 9


def test_run_restores_checkpoints_before_the_entrypoint(store: LocalStore, work: Path) -> None:
    store.put(PREFIX + "checkpoints/ckpt-7", b"seven")
    entrypoint = 'cat "$CLOUDTRAIN_CHECKPOINT_DIR/ckpt-7"; echo'
    put_json(store, "cluster.json", base_cluster(entrypoint=entrypoint, linger_s=0.1))
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    logs = read_logs(store, "chief-0")
    assert "restored 1 checkpoint files from the bucket" in logs
    assert "seven" in logs.splitlines()
    assert status_of(store, "chief-0")["state"] == "succeeded"


def test_run_setup_runs_once_before_the_entrypoint(
    store: LocalStore, work: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    cluster = base_cluster(
        setup='echo setup >> "$MARKER"',
        entrypoint='test -f "$MARKER" && echo entry >> "$MARKER"',
        env={"MARKER": str(marker)},
        linger_s=0.2,
    )
    put_json(store, "cluster.json", cluster)
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    assert marker.read_text() == "setup\nentry\n"
    assert (work / ".setup-done").exists()
    assert status_of(store, "chief-0")["state"] == "succeeded"
    # the same node in a later attempt (a new agent process) does not set up again
    put_json(store, "cluster.json", {**cluster, "attempt": 2})
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    assert marker.read_text() == "setup\nentry\nentry\n"
    assert status_of(store, "chief-0")["attempt"] == 2


def test_run_failing_setup_fails_the_node(store: LocalStore, work: Path, tmp_path: Path) -> None:
    marker = tmp_path / "entry-ran"
    cluster = base_cluster(
        setup="echo broken; exit 5",
        entrypoint='touch "$MARKER"',
        env={"MARKER": str(marker)},
        linger_s=0.2,
    )
    put_json(store, "cluster.json", cluster)
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    status = status_of(store, "chief-0")
    assert status["state"] == "failed"
    assert "setup" in status["reason"]
    assert status["exit_code"] == 1
    assert not marker.exists()
    assert not (work / ".setup-done").exists()
    assert "setup failed with exit code 5" in read_logs(store, "chief-0")


def test_bootstrapped_status_carries_the_attempt(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple[str, int]] = []
    original = Agent.write_status

    def record(self: Agent, state: str, **extra: Any) -> None:
        written.append((state, self.attempt))
        original(self, state, **extra)

    monkeypatch.setattr(Agent, "write_status", record)
    put_json(store, "cluster.json", base_cluster(attempt=3, linger_s=0.1))
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    assert written[0] == ("bootstrapped", 3)


def test_final_status_is_written_after_the_last_output_line(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original_add = LogPump.add

    def slow_add(self: LogPump, line: str) -> None:  # a busy node: the pump thread lags
        if line.startswith("last line"):
            time.sleep(1.0)
        original_add(self, line)

    logs_at_final: dict[str, str] = {}
    original_status = Agent.write_status

    def record(self: Agent, state: str, **extra: Any) -> None:
        if state in FINAL_STATES:
            logs_at_final[state] = read_logs(store, self.me)
        original_status(self, state, **extra)

    monkeypatch.setattr(LogPump, "add", slow_add)
    monkeypatch.setattr(Agent, "write_status", record)
    put_json(store, "cluster.json", base_cluster(entrypoint='echo first; echo "last line"'))
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    assert "last line" in logs_at_final["succeeded"]
    assert "last line" in read_logs(store, "chief-0")  # today it is lost altogether


# --- stopping --------------------------------------------------------------------------------
def test_control_stop_flushes_a_checkpoint_and_ends_the_child(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    entrypoint = (  # one command line: the node refuses line breaks in an entrypoint
        'mkdir -p "$CLOUDTRAIN_CHECKPOINT_DIR"; echo 1 > "$CLOUDTRAIN_CHECKPOINT_DIR/ckpt-1"; '
        "trap 'echo 2 > \"$CLOUDTRAIN_CHECKPOINT_DIR/ckpt-final\"; exit 0' TERM; "
        f"echo started; sleep {BROKEN_S} & wait"
    )
    cluster = base_cluster(entrypoint=entrypoint, stop_grace_s=BROKEN_S, linger_s=BROKEN_S)
    put_json(store, "cluster.json", cluster)
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert wait_for(lambda: status_of(store, "chief-0").get("state") == "running")
    pgid = int(status_of(store, "chief-0")["pid"])
    assert wait_for(lambda: "started" in read_logs(store, "chief-0").splitlines())
    start = time.monotonic()
    store.put(PREFIX + "control/stop", b"interrupted")
    assert runner.join(HANG_S)
    assert time.monotonic() - start < HANG_S  # well within the grace: the child obeyed SIGTERM
    assert runner.error is None
    assert runner.result == 0
    status = status_of(store, "chief-0")
    assert status["state"] == "stopped"
    assert status["reason"] == "control/stop"
    assert group_gone(pgid)
    logs = read_logs(store, "chief-0")
    assert "stop requested (control/stop)" in logs
    assert "final checkpoint flushed" in logs
    # the checkpoint written during the grace period reached the bucket
    assert bucket_files(store, "checkpoints/") == {"ckpt-1": b"1\n", "ckpt-final": b"2\n"}


def test_stop_by_the_deadline(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    cluster = base_cluster(
        entrypoint=f"sleep {BROKEN_S}", deadline=time.time() + 1.0, linger_s=BROKEN_S
    )
    put_json(store, "cluster.json", cluster)
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert wait_for(lambda: status_of(store, "chief-0").get("state") == "running")
    pgid = int(status_of(store, "chief-0")["pid"])
    assert runner.join(HANG_S)
    assert runner.result == 0
    status = status_of(store, "chief-0")
    assert (status["state"], status["reason"]) == ("stopped", "deadline")
    assert group_gone(pgid)


def test_stop_after_a_final_state_keeps_it(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    agent.write_status("succeeded", exit_code=0, reason="")
    agent.stop("control/stop")
    assert status_of(store, "chief-0")["state"] == "succeeded"
    assert "after a final state of succeeded" in read_logs(store, "chief-0")


def test_stop_before_a_final_state_reports_stopped(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work)
    agent.write_status("rendezvous")
    agent.stop("control/stop")
    status = status_of(store, "chief-0")
    assert (status["state"], status["reason"]) == ("stopped", "control/stop")


def test_control_stop_while_lingering_keeps_succeeded(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    put_json(store, "cluster.json", base_cluster(entrypoint="echo done", linger_s=BROKEN_S))
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert wait_for(lambda: status_of(store, "chief-0").get("state") == "succeeded")
    store.put(PREFIX + "control/stop", b"teardown")
    assert runner.join(HANG_S)
    assert runner.result == 0
    assert status_of(store, "chief-0")["state"] == "succeeded"


# --- attempts --------------------------------------------------------------------------------
def test_new_attempt_kills_the_child_and_rendezvous_again(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    entrypoint = f'echo "attempt $CLOUDTRAIN_ATTEMPT"; sleep {BROKEN_S}'
    cluster = base_cluster(entrypoint=entrypoint, linger_s=BROKEN_S)
    put_json(store, "cluster.json", cluster)
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert wait_for(lambda: status_of(store, "chief-0").get("state") == "running")
    first_pgid = int(status_of(store, "chief-0")["pid"])
    put_json(store, "cluster.json", {**cluster, "attempt": 2})

    def running_again() -> bool:
        status = status_of(store, "chief-0")
        return status.get("state") == "running" and status.get("attempt") == 2

    assert wait_for(running_again)
    assert group_gone(first_pgid)
    assert int(status_of(store, "chief-0")["pid"]) != first_pgid
    assert store.list(PREFIX + "attempt-2/nodes/chief-0.json")
    assert store.list(PREFIX + "attempt-2/checkpoints-ready")
    assert wait_for(lambda: "attempt 2" in read_logs(store, "chief-0").splitlines())
    assert "moving to attempt 2" in read_logs(store, "chief-0")
    store.put(PREFIX + "control/stop", b"")
    assert runner.join(HANG_S)
    assert runner.result == 0
    assert status_of(store, "chief-0")["state"] == "stopped"


def test_rendezvous_timeout_fails_the_node(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    roles = {"chief": 1, "worker": 1}
    cluster = base_cluster(roles=roles, rendezvous_timeout_s=0.3, linger_s=0.3)
    put_json(store, "cluster.json", cluster)
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert runner.join(HANG_S)
    assert runner.result == 0
    status = status_of(store, "chief-0")
    assert (status["state"], status["reason"]) == ("failed", "rendezvous timeout")
    assert "waiting for worker-0" in read_logs(store, "chief-0")


def test_new_attempt_after_a_rendezvous_timeout_is_followed(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    roles = {"chief": 1, "worker": 1}
    cluster = base_cluster(
        roles=roles,
        strategy="multi_worker_mirrored",
        rendezvous_timeout_s=0.3,
        linger_s=BROKEN_S,
        entrypoint=f"sleep {BROKEN_S}",
    )
    put_json(store, "cluster.json", cluster)
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert wait_for(lambda: status_of(store, "chief-0").get("reason") == "rendezvous timeout")
    # the controller restarts the run: a new attempt, and the worker is there this time
    put_json(store, "attempt-2/nodes/worker-0.json", {"address": "127.0.0.1:2223"})
    put_json(store, "cluster.json", {**cluster, "attempt": 2, "rendezvous_timeout_s": 2.0})

    def running_in_attempt_2() -> bool:
        status = status_of(store, "chief-0")
        return status.get("state") == "running" and status.get("attempt") == 2

    assert wait_for(lambda: running_in_attempt_2() or not runner.thread.is_alive())
    assert runner.error is None
    assert running_in_attempt_2()
    store.put(PREFIX + "control/stop", b"")
    assert runner.join(HANG_S)
    assert runner.result == 0


# --- serving roles ---------------------------------------------------------------------------
def test_chief_final_only_counts_the_current_attempt(store: LocalStore, work: Path) -> None:
    roles = {"chief": 1, "worker": 1, "ps": 1}
    agent = make_agent(store, work, "ps", 0, roles=roles, strategy="parameter_server", attempt=2)
    assert not agent.chief_final()
    put_json(store, "status/chief-0.json", {"state": "succeeded", "attempt": 1})
    assert not agent.chief_final()
    put_json(store, "status/chief-0.json", {"state": "running", "attempt": 2})
    assert not agent.chief_final()
    put_json(store, "status/chief-0.json", {"state": "failed", "attempt": 2})
    assert agent.chief_final()


def test_chief_final_without_a_chief_role_watches_worker_0(store: LocalStore, work: Path) -> None:
    agent = make_agent(store, work, "evaluator", 0, roles={"worker": 2, "evaluator": 1})
    put_json(store, "status/worker-0.json", {"state": "succeeded", "attempt": 1})
    assert agent.chief_final()


@pytest.mark.parametrize(("role", "port"), [("worker", 2223), ("ps", 2224)])
def test_parameter_server_serving_node_ends_when_the_chief_succeeds(
    store: LocalStore,
    work: Path,
    run_in_thread: Callable[[Agent], AgentThread],
    monkeypatch: pytest.MonkeyPatch,
    role: str,
    port: int,
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_NODE_PORT", str(port))
    roles = {"chief": 1, "worker": 1, "ps": 1}
    entrypoint = 'echo "tf_config=$TF_CONFIG"; sleep 1000'
    cluster = base_cluster(strategy="parameter_server", roles=roles, entrypoint=entrypoint)
    put_json(store, "cluster.json", cluster)
    put_json(store, "attempt-1/checkpoints-ready", {"by": "chief-0"})
    addresses = {
        "chief-0": "127.0.0.1:2222",
        "worker-0": "127.0.0.1:2223",
        "ps-0": "127.0.0.1:2224",
    }
    for node, address in addresses.items():
        if node != f"{role}-0":
            put_json(store, f"attempt-1/nodes/{node}.json", {"address": address})
    runner = run_in_thread(Agent(RUN_ID, role, 0, store, work))
    assert wait_for(lambda: status_of(store, f"{role}-0").get("state") == "running")
    pgid = int(status_of(store, f"{role}-0")["pid"])
    time.sleep(0.3)  # it keeps serving while the chief works
    assert status_of(store, f"{role}-0")["state"] == "running"

    put_json(store, "status/chief-0.json", {"state": "succeeded", "attempt": 1, "exit_code": 0})
    assert wait_for(lambda: status_of(store, f"{role}-0").get("state") == "succeeded")
    status = status_of(store, f"{role}-0")
    assert status["reason"] == "chief finished"
    assert status["exit_code"] == 0
    assert group_gone(pgid)
    assert runner.join(HANG_S)
    assert runner.error is None
    assert runner.result == 0
    logs = read_logs(store, f"{role}-0")
    assert "the chief has finished; ending this server" in logs
    line = next(x for x in logs.splitlines() if x.startswith("tf_config="))
    tf_config = json.loads(line.removeprefix("tf_config="))
    assert tf_config["task"] == {"type": role, "index": 0}
    assert tf_config["cluster"] == {r: [a] for r, a in zip(roles, addresses.values(), strict=True)}
    assert not store.list(PREFIX + "model/")  # only the chief uploads
