"""Tests of `strategy: horovod` through the node agent (`cloudtrain.jobs.agent`): the slot count
in the registration, the rendezvous host starting the server and one process per GPU, the other
nodes taking the next ranks, two agents launching four consistent ranks, a failing rank, a stop,
a node without GPUs, a missing horovod and unequal GPU counts. The launcher's pure functions,
rendezvous server and process groups are in test_horovod.py.

The agent's launch path runs real processes (a Python one-liner that prints its HOROVOD_*
environment) with an injected rendezvous server (horovod_kit.py's `FakeServers`). The agent
fixtures (bucket, work folder, process-group cleanup) are those of agent_kit.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
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
from tests.unit.horovod_kit import FakeServers

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


def rank_envs(logs: str) -> dict[int, dict[str, str]]:
    """{rank: printed environment} from the `[rank R] {...}` lines of DUMP_ENV."""
    found: dict[int, dict[str, str]] = {}
    for line in logs.splitlines():
        m = RANK_LINE.match(line)
        if m:
            found[int(m[1])] = json.loads(m[2])
    return found


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
            "HOROVOD_GLOO_IFACE": "lo",  # the interface of its registered address, 127.0.0.1
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "300",  # Horovod's own 30 s is too short
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
