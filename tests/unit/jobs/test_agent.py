"""Unit tests of the node agent (`cloudtrain.jobs.agent`) against a real `LocalStore`: the
rendezvous, the control files, the child's environment, whole runs, attempts and serving roles.
Stopping and killing are in test_agent_stop.py, logs, checkpoints and the model in
test_agent_sync.py; the helpers and fixtures they share (and why no assertion depends on a loaded
machine's speed) are in agent_kit.py."""

# ruff: noqa: F811 - the fixtures (`store`, `work`...) are agent_kit's, taken by name

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs.agent import Agent, LogPump, NewAttempt, StopRequested, main
from cloudtrain.jobs.protocol import FINAL_STATES
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (
    BROKEN_S,
    HANG_S,
    HOST,
    PREFIX,
    RUN_ID,
    AgentThread,
    base_cluster,
    child_groups,  # noqa: F401 - an autouse fixture: imported, it applies here
    get_json,
    group_gone,
    make_agent,
    node_env,  # noqa: F401 - an autouse fixture: imported, it applies here
    put_json,
    read_logs,
    run_in_thread,  # noqa: F401 - a fixture, taken by name
    status_of,
    store,  # noqa: F401 - a fixture, taken by name
    wait_for,
    work,  # noqa: F401 - a fixture, taken by name
)


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
    before = (agent.attempt, dict(agent.cluster))
    agent.check_control()  # no cluster.json at all
    put_json(store, "cluster.json", agent.cluster)
    agent.check_control()
    store.put(PREFIX + "cluster.json", b'{"attempt": ')  # half-written: ignored
    agent.check_control()
    assert (agent.attempt, agent.cluster) == before  # no stop, no new attempt, nothing taken


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
