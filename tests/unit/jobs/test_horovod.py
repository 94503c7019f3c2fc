"""Tests of `strategy: horovod`'s launcher, `cloudtrain.jobs.horovod`, without the agent: the
slot plans and process environments, the rendezvous server, and `ProcessGroup` and `launch_node`.
The agent's launch of the ranks is in test_horovod_agent.py; `FakeServers` is horovod_kit.py's.

These run on every node Python (tests/node-side-tests.txt), where Horovod is not installed:
the slot plans and environments are checked as pure functions; the rendezvous server is checked
against a stub of `horovod.runner.http.http_server`; the process groups are real bash processes.
Horovod itself (0.28.1 on tensorflow 2.15.1, built by the box) against this launcher, with a
real Gloo allreduce, is test_horovod_real_stack.py's.

The agent tests' autouse fixtures (the node's environment, process-group cleanup) are those of
agent_kit.py, and apply here too.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import types
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from cloudtrain.jobs import horovod as hvd
from tests.unit import agent_kit as agent_tests
from tests.unit.agent_kit import HOST, group_gone, wait_for
from tests.unit.horovod_kit import FakeServers, hosts_of

# the agent tests' autouse fixtures: the node's environment, process-group cleanup
node_env = agent_tests.node_env
child_groups = agent_tests.child_groups


def all_envs(nodes: int, gpus: int, rendezvous: tuple[str, int]) -> list[list[dict[str, str]]]:
    """Every node's process environments, as each node computes them on its own."""
    hosts = hosts_of(nodes, gpus)
    return [hvd.process_envs(hosts, i, rendezvous) for i in range(nodes)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    # (checked against horovod 0.28.1's: test_horovod_real_stack.py)
    assert hvd.slot_plan([("a", 2), ("b", 2)]) == [
        hvd.Slot("a", 0, 0, 0, 4, 2, 2),
        hvd.Slot("a", 1, 1, 0, 4, 2, 2),
        hvd.Slot("b", 2, 0, 1, 4, 2, 2),
        hvd.Slot("b", 3, 1, 1, 4, 2, 2),
    ]


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
    assert "rendezvous host" in message and "image whose python3 ships Horovod" in message
    assert "the bootstrap installs it (tensorflow 2.15.1, horovod 0.28.1)" in message
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


# --- the interface Gloo binds -------------------------------------------------------------------
def test_interface_of_finds_the_interface_holding_an_address() -> None:
    assert hvd.interface_of("127.0.0.1") == "lo"
    assert hvd.interface_of("203.0.113.77") is None  # TEST-NET-3: on no interface here
    assert hvd.interface_of("worker-0") is None  # not an IPv4 address
    assert hvd.interface_of("::1") is None


def _launched_envs(base_env: dict[str, str]) -> list[dict[str, str]]:
    envs: list[dict[str, str]] = []

    def start(command: str, env: dict[str, str], **kwargs: Any) -> subprocess.Popen[bytes]:
        envs.append(env)
        return _bash(command, kwargs["process_group"])

    group = hvd.launch_node(
        "exit 0", base_env, [f"{HOST}:2222", "203.0.113.8:2222"], [{"slots": 2}] * 2, 0,
        start=start, start_server=FakeServers(),
    )  # fmt: skip
    assert group.wait(timeout=10) == 0
    return envs


def test_launch_node_has_gloo_bind_the_interface_of_the_nodes_address() -> None:
    # the node registered 127.0.0.1: Gloo binds lo, whatever the host name resolves to
    envs = _launched_envs({"CT_GPU_COUNT": "2"})
    assert [env[hvd.GLOO_IFACE] for env in envs] == ["lo", "lo"]


def test_launch_node_keeps_the_interface_the_job_names() -> None:
    envs = _launched_envs({"CT_GPU_COUNT": "2", hvd.GLOO_IFACE: "eth7"})
    assert [env[hvd.GLOO_IFACE] for env in envs] == ["eth7", "eth7"]


def test_launch_node_gives_gloo_minutes_for_the_slowest_node_to_connect() -> None:
    # Horovod's default is 30 s (gloo_context.cc). A node whose ranks import TensorFlow from a
    # cold disk, or a replacement still loading, is later than that: CI saw the survivor's ranks
    # abort "Wait timeout after 30 seconds for key(s): 4" while the replacement's were importing
    envs = _launched_envs({"CT_GPU_COUNT": "2"})
    assert [env[hvd.GLOO_TIMEOUT] for env in envs] == [str(hvd.GLOO_TIMEOUT_S)] * 2
    assert hvd.GLOO_TIMEOUT_S >= 240


def test_launch_node_keeps_the_gloo_timeout_the_job_names() -> None:
    envs = _launched_envs({"CT_GPU_COUNT": "2", hvd.GLOO_TIMEOUT: "900"})
    assert [env[hvd.GLOO_TIMEOUT] for env in envs] == ["900", "900"]


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
