"""The shared kit of the node agent's unit tests (`cloudtrain.jobs.agent` against a real
`LocalStore`): constants, helpers and pytest fixtures. Not itself a test module: test_agent.py,
test_agent_stop.py, test_agent_sync.py and the other agent tests import what they use by name,
fixtures included (the autouse `node_env` and `child_groups` too, so they apply there).

The bucket is a folder under `tmp_path`, the entrypoints are tiny bash commands (no TensorFlow)
and every interval is a few hundredths of a second, so the agent tests run in seconds. The
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
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs.agent import Agent
from cloudtrain.jobs.protocol import ClusterDoc, run_prefix
from cloudtrain.providers.local import LocalStore
from cloudtrain.run.bundle import Bundle, build_bundle
from tests.unit.bundle_node import unpack_like_the_node

RUN_ID = "run-test"
PREFIX = run_prefix(RUN_ID)
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
    agent.cluster = ClusterDoc.from_dict(base_cluster(**overrides))
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
