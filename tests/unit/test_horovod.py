"""Tests of `strategy: horovod`: `cloudtrain.jobs.horovod` and the agent's launch of the ranks.

Horovod itself cannot be installed here (0.28.1 does not build against TensorFlow 2.21), so:
the slot plans and environments are checked as pure functions; the rendezvous server is checked
against a stub of `horovod.runner.http.http_server` (and against the real one when horovod is
importable: skipped otherwise); the agent's launch path runs real processes (a Python one-liner
that prints its HOROVOD_* environment) with an injected rendezvous server. No Gloo collective
runs anywhere in these tests.

The agent fixtures (bucket, work folder, process-group cleanup) are those of agent_kit.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs import horovod as hvd
from cloudtrain.jobs.agent import Agent
from cloudtrain.providers.local import LocalStore
from tests.unit import agent_kit as agent_tests
from tests.unit.agent_kit import (
    HOST,
    PREFIX,
    AgentThread,
    group_gone,
    live_group,
    make_agent,
    put_json,
    read_logs,
    status_of,
    wait_for,
)

# the agent tests' fixtures: the node's environment, process-group cleanup, bucket, work folder
node_env = agent_tests.node_env
child_groups = agent_tests.child_groups
store = agent_tests.store
work = agent_tests.work
run_in_thread = agent_tests.run_in_thread

# The fake entrypoint: prints the variables a Horovod process reads, as one JSON line.
_PRINT_ENV = (
    "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("
    "('HOROVOD_', 'CUDA_VISIBLE_DEVICES', 'CLOUDTRAIN_IS_CHIEF', 'TF_CONFIG'))}))"
)
DUMP_ENV = f"{shlex.quote(sys.executable)} -c {shlex.quote(_PRINT_ENV)}"
RANK_LINE = re.compile(r"^\[rank (\d+)\] (\{.*\})$")


def hosts_of(nodes: int, gpus: int) -> list[tuple[str, int]]:
    return [(f"worker-{i}", gpus) for i in range(nodes)]


def all_envs(nodes: int, gpus: int, rendezvous: tuple[str, int]) -> list[list[dict[str, str]]]:
    """Every node's process environments, as each node computes them on its own."""
    hosts = hosts_of(nodes, gpus)
    return [hvd.process_envs(hosts, i, rendezvous) for i in range(nodes)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_envs(logs: str) -> dict[int, dict[str, str]]:
    """{rank: printed environment} from the `[rank R] {...}` lines of DUMP_ENV."""
    found: dict[int, dict[str, str]] = {}
    for line in logs.splitlines():
        m = RANK_LINE.match(line)
        if m:
            found[int(m[1])] = json.loads(m[2])
    return found


class FakeServers:
    """An injected `start_server`: records each start (port, plan) and each stop."""

    def __init__(self) -> None:
        self.started: list[tuple[int, list[hvd.Slot]]] = []
        self.stopped = 0

    def __call__(self, port: int, plan: Sequence[hvd.Slot]) -> FakeServers:
        self.started.append((port, list(plan)))
        return self

    def stop(self) -> None:
        self.stopped += 1


def horovod_agent(
    store: LocalStore, work: Path, index: int, nodes: int = 2, **overrides: Any
) -> tuple[Agent, FakeServers]:
    """A worker agent of a horovod job, with an injected rendezvous server."""
    overrides.setdefault("entrypoint", DUMP_ENV)
    roles = {"worker": nodes}
    agent = make_agent(store, work, "worker", index, roles=roles, strategy="horovod", **overrides)
    put_json(store, "cluster.json", agent.cluster)
    servers = FakeServers()
    agent.start_horovod_server = servers
    return agent, servers


def register(store: LocalStore, node: str, port: int, slots: int | None) -> None:
    body: dict[str, Any] = {"address": f"{HOST}:{port}"}
    if slots is not None:
        body["slots"] = slots
    put_json(store, f"attempt-1/nodes/{node}.json", body)


# --- environments: pure functions --------------------------------------------------------------
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_process_envs_on_one_node(gpus: int) -> None:
    (envs,) = all_envs(1, gpus, ("10.0.0.5", 2222))
    assert len(envs) == gpus
    for local, env in enumerate(envs):
        assert env == {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.5",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": "2222",
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": "worker-0",
            "HOROVOD_RANK": str(local),
            "HOROVOD_SIZE": str(gpus),
            "HOROVOD_LOCAL_RANK": str(local),
            "HOROVOD_LOCAL_SIZE": str(gpus),
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
            "CUDA_VISIBLE_DEVICES": str(local),
        }


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_process_envs_on_many_nodes(nodes: int, gpus: int) -> None:
    per_node = all_envs(nodes, gpus, ("10.0.0.5", 2230))
    flat = [env for envs in per_node for env in envs]
    size = nodes * gpus
    assert sorted(int(env["HOROVOD_RANK"]) for env in flat) == list(range(size))
    assert {env["HOROVOD_SIZE"] for env in flat} == {str(size)}
    rendezvous = {
        (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) for env in flat
    }
    assert rendezvous == {("10.0.0.5", "2230")}  # the same server for every process
    assert {(env["HOROVOD_CONTROLLER"], env["HOROVOD_CPU_OPERATIONS"]) for env in flat} == {
        ("gloo", "gloo")
    }
    for node, envs in enumerate(per_node):
        assert [int(env["HOROVOD_LOCAL_RANK"]) for env in envs] == list(range(gpus))
        assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == [str(r) for r in range(gpus)]
        for local, env in enumerate(envs):
            assert int(env["HOROVOD_RANK"]) == node * gpus + local  # earlier nodes' slots first
            assert env["HOROVOD_LOCAL_SIZE"] == str(gpus)
            assert env["HOROVOD_CROSS_RANK"] == str(node)
            assert env["HOROVOD_CROSS_SIZE"] == str(nodes)
            assert env["HOROVOD_HOSTNAME"] == f"worker-{node}"
            assert "TF_CONFIG" not in env


def test_process_envs_on_a_node_without_gpus_pins_no_device() -> None:
    envs = hvd.process_envs(hosts_of(2, 1), 1, ("127.0.0.1", 2222), pin_gpus=False)
    assert len(envs) == 1
    assert "CUDA_VISIBLE_DEVICES" not in envs[0]
    assert (envs[0]["HOROVOD_RANK"], envs[0]["HOROVOD_SIZE"]) == ("1", "2")


def test_slot_plan_is_horovods_assignment_for_two_nodes_of_two() -> None:
    # what horovod.runner.common.util.hosts.get_host_assignments gives for "a:2,b:2"
    # (checked against horovod 0.28.1's code; see the importorskip test below)
    assert hvd.slot_plan([("a", 2), ("b", 2)]) == [
        hvd.Slot("a", 0, 0, 0, 4, 2, 2),
        hvd.Slot("a", 1, 1, 0, 4, 2, 2),
        hvd.Slot("b", 2, 0, 1, 4, 2, 2),
        hvd.Slot("b", 3, 1, 1, 4, 2, 2),
    ]


@pytest.mark.parametrize("hosts", [[("a", 1)], [("a", 4)], [("a", 2), ("b", 2), ("c", 2)]])
def test_slot_plan_equals_get_host_assignments(hosts: list[tuple[str, int]]) -> None:
    util = pytest.importorskip("horovod.runner.common.util.hosts")
    infos = [util.HostInfo(name, slots) for name, slots in hosts]
    expected = util.get_host_assignments(infos, sum(slots for _, slots in hosts))
    assert [vars(s) for s in hvd.slot_plan(hosts)] == [vars(s) for s in expected]


@pytest.mark.parametrize(
    ("hosts", "phrase"),
    [
        ([("worker-0", 2), ("worker-1", 4)], "same number of GPUs on every node"),
        ([], "at least one node"),
        ([("a", 1), ("a", 1)], "must be unique"),
        ([("a", 0)], "at least 1 process"),
        ([("a", True)], "at least 1 process"),
    ],
)
def test_slot_plan_refuses_bad_hosts(hosts: list[tuple[str, int]], phrase: str) -> None:
    with pytest.raises(hvd.HorovodError, match=phrase):
        hvd.slot_plan(hosts)


@pytest.mark.parametrize(
    ("index", "rendezvous", "phrase"),
    [(2, ("h", 1), "out of range"), (-1, ("h", 1), "out of range"), (0, ("", 1), "bad horovod")],
)
def test_process_envs_refuses_bad_arguments(
    index: int, rendezvous: tuple[str, int], phrase: str
) -> None:
    with pytest.raises(hvd.HorovodError, match=phrase):
        hvd.process_envs(hosts_of(2, 1), index, rendezvous)


@pytest.mark.parametrize(
    ("value", "count", "slots"), [(None, 0, 1), ("", 0, 1), ("0", 0, 1), ("2", 2, 2), (" 8 ", 8, 8)]
)
def test_gpu_count_and_local_slots(value: str | None, count: int, slots: int) -> None:
    environ = {} if value is None else {"CT_GPU_COUNT": value}
    assert (hvd.gpu_count(environ), hvd.local_slots(environ)) == (count, slots)


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_gpu_count_refuses_nonsense(value: str) -> None:
    with pytest.raises(hvd.HorovodError, match="CT_GPU_COUNT"):
        hvd.gpu_count({"CT_GPU_COUNT": value})


def test_node_hosts_and_split_address() -> None:
    regs = [{"address": "10.0.0.1:2222", "slots": 2}, {"address": "10.0.0.2:2222", "slots": 2}]
    assert hvd.node_hosts(regs) == [("worker-0", 2), ("worker-1", 2)]
    with pytest.raises(hvd.HorovodError, match="worker-1 registered no horovod slot count"):
        hvd.node_hosts([regs[0], {"address": "10.0.0.2:2222"}])
    with pytest.raises(hvd.HorovodError, match="worker-0"):
        hvd.node_hosts([None])
    assert hvd.split_address("10.0.0.1:2222") == ("10.0.0.1", 2222)
    with pytest.raises(hvd.HorovodError, match="not 'host:port'"):
        hvd.split_address("10.0.0.1")


# --- the rendezvous server ---------------------------------------------------------------------
def test_missing_horovod_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("horovod", "horovod.runner.common.util.hosts", "horovod.runner.http.http_server"):
        monkeypatch.setitem(sys.modules, name, None)  # import -> ImportError, installed or not
    with pytest.raises(hvd.HorovodUnavailable) as info:
        hvd.start_rendezvous_server(free_port(), hvd.slot_plan(hosts_of(2, 1)))
    message = str(info.value)
    assert "strategy 'horovod' needs the horovod package on worker-0" in message
    assert "rendezvous host" in message and "image that ships Horovod" in message
    assert isinstance(info.value, RuntimeError)  # the agent reports it as a failed node


class _StubHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


class _StubServer(HTTPServer):
    """Stands in for horovod's RendezvousHTTPServer: same constructor, records init()."""

    instances: list[_StubServer] = []

    def __init__(self, addr: tuple[str, int], handler: Any, verbose: int) -> None:
        super().__init__(addr, handler)
        self.plan: list[Any] | None = None
        _StubServer.instances.append(self)

    def init(self, host_alloc_plan: list[Any]) -> None:
        self.plan = host_alloc_plan


def test_rendezvous_server_serves_on_the_given_port_until_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    http_mod = types.ModuleType("horovod.runner.http.http_server")  # stubs of the two modules
    http_mod.RendezvousHTTPServer = _StubServer  # type: ignore[attr-defined]
    http_mod.RendezvousHandler = _StubHandler  # type: ignore[attr-defined]
    hosts_mod = types.ModuleType("horovod.runner.common.util.hosts")
    hosts_mod.SlotInfo = hvd.Slot  # type: ignore[attr-defined]  # the same fields
    monkeypatch.setitem(sys.modules, "horovod.runner.http.http_server", http_mod)
    monkeypatch.setitem(sys.modules, "horovod.runner.common.util.hosts", hosts_mod)
    monkeypatch.setattr(_StubServer, "instances", [])
    port, plan = free_port(), hvd.slot_plan(hosts_of(2, 2))
    server = hvd.start_rendezvous_server(port, plan)
    try:
        (httpd,) = _StubServer.instances
        assert httpd.plan == plan  # init(plan) was called
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/global/x")
        assert conn.getresponse().read() == b"ok"
        conn.close()
        with pytest.raises(hvd.HorovodError, match=f"on port {port}"):
            hvd.start_rendezvous_server(port, plan)  # the port is taken
    finally:
        server.stop()
    server.stop()  # idempotent
    hvd.start_rendezvous_server(port, plan).stop()  # released: the next attempt can bind it


def test_rendezvous_server_with_real_horovod() -> None:
    pytest.importorskip("horovod.runner.http.http_server")
    port = free_port()
    server = hvd.start_rendezvous_server(port, hvd.slot_plan(hosts_of(1, 2)))
    try:  # what Gloo's HTTPStore does: PUT then GET a key of a scope
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("PUT", "/global/rank_0", body=b"addr")
        assert conn.getresponse().read() == b""
        conn.request("GET", "/global/rank_0")
        assert conn.getresponse().read() == b"addr"
        conn.close()
    finally:
        server.stop()


# --- ProcessGroup and launch_node without the agent --------------------------------------------
def _bash(command: str, group: int = 0) -> subprocess.Popen[bytes]:
    # Popen(process_group=) is 3.11+; these tests also run on the nodes' 3.10
    return subprocess.Popen(["bash", "-c", command], preexec_fn=lambda: os.setpgid(0, group))


def test_process_group_fails_as_soon_as_one_rank_fails_and_waits_for_all() -> None:
    first = _bash("sleep 30")
    second = _bash("exit 4", group=first.pid)
    servers, said = FakeServers(), []
    group = hvd.ProcessGroup([first, second], [0, 1], servers, said.append)
    try:
        assert group.pid == first.pid
        assert wait_for(lambda: group.poll() is not None)
        assert (group.poll(), group.returncode, group.failed_rank) == (4, 4, 1)
        assert first.poll() is None  # rank 0 still runs: poll decided, wait() waits for it
        assert said == ["horovod rank 1 exited with code 4 (1 still running)"]
        with pytest.raises(subprocess.TimeoutExpired):
            group.wait(timeout=0.05)
        assert servers.stopped == 0
        os.killpg(group.pid, signal.SIGKILL)  # what the agent's kill_child does next
        assert group.wait(timeout=5) == 4  # still rank 1's failure
        assert servers.stopped == 1
        group.wait()
        assert servers.stopped == 1  # stopped once
    finally:
        group_gone(first.pid)


def test_process_group_succeeds_when_every_rank_exits_0() -> None:
    first = _bash("exit 0")
    second = _bash("sleep 0.2", group=first.pid)
    group = hvd.ProcessGroup([first, second], [2, 3])
    assert group.poll() in (None, 0)
    assert group.wait(timeout=5) == 0
    assert (group.poll(), group.failed_rank) == (0, None)


def test_launch_node_cleans_up_when_a_rank_cannot_start() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start(command: str, env: dict[str, str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if started:
            raise OSError("no more processes")
        started.append(_bash(command, kwargs["process_group"]))
        return started[0]

    servers = FakeServers()
    with pytest.raises(OSError, match="no more processes"):
        hvd.launch_node(
            "sleep 30",
            {"CT_GPU_COUNT": "2"},
            [f"{HOST}:2222"],
            [{"slots": 2}],
            0,
            start=start,
            start_server=servers,
        )
    assert started and started[0].poll() is not None  # killed and reaped
    assert (len(servers.started), servers.stopped) == (1, 1)


# --- through the agent -------------------------------------------------------------------------
def test_registration_carries_the_slot_count(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "4")
    agent, _ = horovod_agent(store, work, 0, nodes=1)
    agent.rendezvous()
    reg = json.loads(store.get(PREFIX + "attempt-1/nodes/worker-0.json"))
    assert (reg["address"], reg["slots"]) == (f"{HOST}:2222", 4)
    other = make_agent(store, work, "chief", 0, strategy="mirrored", attempt=2)
    other.rendezvous()
    assert "slots" not in json.loads(store.get(PREFIX + "attempt-2/nodes/chief-0.json"))


def test_child_env_of_a_horovod_job_has_no_tf_config(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"stale": true}')
    agent, _ = horovod_agent(store, work, 1)
    env = agent.child_env({"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]})
    assert "TF_CONFIG" not in env
    assert env["CLOUDTRAIN_STRATEGY"] == "horovod"


def test_rendezvous_host_starts_the_server_then_one_process_per_gpu(
    store: LocalStore,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    child_groups: list[subprocess.Popen[bytes]],
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "2")
    monkeypatch.setenv("TF_CONFIG", '{"stale": true}')
    agent, servers = horovod_agent(store, work, 0)
    register(store, "worker-1", 2223, slots=2)
    agent.train_once()
    assert status_of(store, "worker-0")["state"] == "succeeded"
    assert len(child_groups) == 2  # one process per GPU
    envs = rank_envs(read_logs(store, "worker-0"))
    assert sorted(envs) == [0, 1]
    for rank, env in envs.items():
        assert {k: v for k, v in env.items() if k.startswith("HOROVOD_")} == {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": HOST,  # worker 0's registered address
            "HOROVOD_GLOO_RENDEZVOUS_PORT": "2222",
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": "worker-0",
            "HOROVOD_RANK": str(rank),
            "HOROVOD_SIZE": "4",
            "HOROVOD_LOCAL_RANK": str(rank),
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "2",
        }
        assert env["CUDA_VISIBLE_DEVICES"] == str(rank)
        assert env["CLOUDTRAIN_IS_CHIEF"] == ("1" if rank == 0 else "0")
        assert "TF_CONFIG" not in env
    ((port, plan),) = servers.started  # started once, before the processes, and stopped
    assert (port, [s.rank for s in plan], servers.stopped) == (2222, [0, 1, 2, 3], 1)
    assert [(s.hostname, s.local_rank) for s in plan] == [
        ("worker-0", 0),
        ("worker-0", 1),
        ("worker-1", 0),
        ("worker-1", 1),
    ]
    logs = read_logs(store, "worker-0")
    assert "horovod: rendezvous server on port 2222 for 4 processes" in logs
    assert "horovod: starting 2 process(es), ranks 0-1 of 4, rendezvous 127.0.0.1:2222" in logs


def test_other_nodes_start_no_server_and_take_the_next_ranks(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "2")
    monkeypatch.setenv("CLOUDTRAIN_NODE_PORT", "2223")
    agent, servers = horovod_agent(store, work, 1)
    register(store, "worker-0", 2222, slots=2)
    put_json(store, "attempt-1/checkpoints-ready", {"by": "worker-0"})
    agent.train_once()
    assert status_of(store, "worker-1")["state"] == "succeeded"
    envs = rank_envs(read_logs(store, "worker-1"))
    assert sorted(envs) == [2, 3]
    for rank, env in envs.items():
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == HOST
        assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "2222"  # worker 0's port, not its own
        assert (env["HOROVOD_LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == (str(rank - 2),) * 2
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_HOSTNAME"]) == ("1", "worker-1")
        assert env["CLOUDTRAIN_IS_CHIEF"] == "0"
    assert servers.started == []


def test_two_agents_launch_four_consistent_ranks(
    store: LocalStore,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_in_thread: Callable[[Agent], AgentThread],
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "2")
    runners, servers = [], []
    for index in range(2):
        agent, fake = horovod_agent(store, work.parent / f"w{index}", index, linger_s=30.0)
        (agent.workdir).mkdir(parents=True)
        monkeypatch.setattr(agent, "address", lambda i=index: f"{HOST}:{2222 + i}")
        servers.append(fake)
        runners.append(run_in_thread(agent))
    done = ("succeeded", "failed")
    assert wait_for(
        lambda: all(status_of(store, f"worker-{i}").get("state") in done for i in (0, 1))
    )
    assert [status_of(store, f"worker-{i}")["state"] for i in (0, 1)] == ["succeeded"] * 2
    envs = {**rank_envs(read_logs(store, "worker-0")), **rank_envs(read_logs(store, "worker-1"))}
    assert sorted(envs) == [0, 1, 2, 3]
    assert {
        (e["HOROVOD_GLOO_RENDEZVOUS_ADDR"], e["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        for e in envs.values()
    } == {(HOST, "2222")}
    assert {e["HOROVOD_SIZE"] for e in envs.values()} == {"4"}
    assert [len(s.started) for s in servers] == [1, 0]
    store.put(PREFIX + "control/stop", b"")
    for runner in runners:
        assert runner.join(5.0)
        assert runner.error is None


def test_a_failing_rank_fails_the_node_and_ends_the_others(
    store: LocalStore,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    child_groups: list[subprocess.Popen[bytes]],
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "2")
    entrypoint = (
        'if [ "$HOROVOD_LOCAL_RANK" = 1 ]; then sleep 0.3; echo boom; exit 3; fi;'
        " echo waiting; sleep 30"
    )
    agent, servers = horovod_agent(store, work, 0, nodes=1, entrypoint=entrypoint)
    start = time.monotonic()
    agent.train_once()
    assert time.monotonic() - start < 20.0  # rank 0 did not get its 30 s (no load takes 20)
    status = status_of(store, "worker-0")
    assert (status["state"], status["exit_code"]) == ("failed", 3)
    assert group_gone(child_groups[0].pid)  # rank 0 and its sleep went with the group
    logs = read_logs(store, "worker-0").splitlines()
    assert "[rank 0] waiting" in logs and "[rank 1] boom" in logs
    assert "cloudtrain-agent[worker-0]: horovod rank 1 exited with code 3 (1 still running)" in logs
    assert servers.stopped == 1


def test_stop_ends_every_rank_and_the_server(
    store: LocalStore,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_in_thread: Callable[[Agent], AgentThread],
    child_groups: list[subprocess.Popen[bytes]],
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "2")
    entrypoint = 'echo "up $HOROVOD_RANK"; sleep 30'
    agent, servers = horovod_agent(store, work, 0, nodes=1, entrypoint=entrypoint, linger_s=30)
    runner = run_in_thread(agent)
    assert wait_for(lambda: status_of(store, "worker-0").get("state") == "running")
    pgid = int(status_of(store, "worker-0")["pid"])
    lines = lambda: read_logs(store, "worker-0").splitlines()  # noqa: E731
    assert wait_for(lambda: {"[rank 0] up 0", "[rank 1] up 1"} <= set(lines()))
    assert pgid == child_groups[0].pid
    assert {os.getpgid(proc.pid) for proc in child_groups} == {pgid}  # both ranks: one group
    assert len(live_group(pgid)) >= 2
    store.put(PREFIX + "control/stop", b"")
    assert runner.join(5.0)
    assert runner.result == 0
    assert status_of(store, "worker-0")["state"] == "stopped"
    assert group_gone(pgid)
    assert servers.stopped == 1


def test_a_node_without_gpus_runs_one_process(store: LocalStore, work: Path) -> None:
    agent, _ = horovod_agent(store, work, 0)
    register(store, "worker-1", 2223, slots=1)
    agent.train_once()
    envs = rank_envs(read_logs(store, "worker-0"))
    assert list(envs) == [0]
    assert "CUDA_VISIBLE_DEVICES" not in envs[0]
    assert (envs[0]["HOROVOD_SIZE"], envs[0]["HOROVOD_LOCAL_SIZE"]) == ("2", "1")


def test_missing_horovod_on_the_rendezvous_host_fails_the_node(
    store: LocalStore,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    child_groups: list[subprocess.Popen[bytes]],
) -> None:
    for name in ("horovod", "horovod.runner.common.util.hosts", "horovod.runner.http.http_server"):
        monkeypatch.setitem(sys.modules, name, None)
    agent, _ = horovod_agent(store, work, 0, nodes=1)
    agent.start_horovod_server = hvd.start_rendezvous_server  # the real one
    assert agent.run() == 0  # fails the node, lingers, then stops
    status = status_of(store, "worker-0")
    assert status["state"] == "failed"
    assert "needs the horovod package on worker-0 (the rendezvous host)" in status["reason"]
    assert "needs the horovod package on worker-0" in read_logs(store, "worker-0")
    assert child_groups == []  # no rank was started


def test_nodes_with_different_gpu_counts_fail_clearly(
    store: LocalStore, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CT_GPU_COUNT", "2")
    agent, servers = horovod_agent(store, work, 0)
    register(store, "worker-1", 2223, slots=4)
    assert agent.run() == 0
    status = status_of(store, "worker-0")
    assert status["state"] == "failed"
    assert "same number of GPUs on every node (worker-0 has 2, worker-1 has 4)" in status["reason"]
    assert servers.started == []
