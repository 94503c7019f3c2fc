"""The node agent's child process and how it ends: its own process group, SIGTERM then SIGKILL
after the grace, and the stops (control/stop, the deadline) with their final checkpoint and
status. A real `Agent` on a real `LocalStore`; shared helpers and fixtures are in agent_kit.py."""

# ruff: noqa: F811 - the fixtures (`store`, `work`...) are agent_kit's, taken by name

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.jobs.agent import Agent
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (
    BROKEN_S,
    HANG_S,
    PREFIX,
    RUN_ID,
    AgentThread,
    base_cluster,
    bucket_files,
    child_groups,  # noqa: F401 - an autouse fixture: imported, it applies here
    group_gone,
    live_group,
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


def test_a_stopping_chief_sends_no_checkpoint_once_a_new_attempt_began(
    store: LocalStore, work: Path, run_in_thread: Callable[[Agent], AgentThread]
) -> None:
    # Slurm's DOWN node (CI26): the old allocation's chief got SIGTERM and flushed its last
    # checkpoint in Slurm's KillWait, after the next attempt's chief had restored the bucket's
    # and before its other worker did: the two resumed at epochs 4 and 14
    go = work.parent / "go"
    entrypoint = (
        'mkdir -p "$CLOUDTRAIN_CHECKPOINT_DIR"; echo 1 > "$CLOUDTRAIN_CHECKPOINT_DIR/ckpt-1"; '
        f"trap 'while [ ! -e {go} ]; do sleep 0.05; done; "
        'echo 2 > "$CLOUDTRAIN_CHECKPOINT_DIR/ckpt-final"; exit 0\' TERM; '
        f"echo started; sleep {BROKEN_S} & wait"
    )
    cluster = base_cluster(entrypoint=entrypoint, stop_grace_s=BROKEN_S, linger_s=BROKEN_S)
    put_json(store, "cluster.json", cluster)
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))
    assert wait_for(lambda: "started" in read_logs(store, "chief-0").splitlines())
    store.put(PREFIX + "control/stop", b"interrupted")
    assert wait_for(lambda: "stop requested (control/stop)" in read_logs(store, "chief-0"))
    put_json(store, "cluster.json", {**cluster, "attempt": 2})  # the controller moved on
    go.touch()  # only now does the training write its last checkpoint
    assert runner.join(HANG_S)
    assert runner.error is None
    assert status_of(store, "chief-0")["state"] == "stopped"
    assert bucket_files(store, "checkpoints/") == {"ckpt-1": b"1\n"}, "attempt 2 owns them"
    assert "attempt 2 has begun: this node's last checkpoint stays here" in read_logs(
        store, "chief-0"
    )


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
