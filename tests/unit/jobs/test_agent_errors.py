"""The agent reports how a node failed, into the bucket: the training's exit with the last lines
of its output, and the agent's own errors with their traceback (in the attempt loop, and the last
resort in `main()`). A real `Agent` on a real `LocalStore`; entrypoints are tiny bash commands."""

# ruff: noqa: F811 - the fixtures `store` and `work` are agent_kit's, taken by name

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.jobs.agent import main
from cloudtrain.providers.local import LocalStore
from cloudtrain.run.bundle import Bundle
from tests.unit.agent_kit import (  # noqa: F401 - the agent tests' fixtures, shared
    HANG_S,
    PREFIX,
    RUN_ID,
    base_cluster,
    child_groups,
    make_agent,
    node_bundle,
    node_env,
    put_json,
    read_logs,
    status_of,
    store,
    work,
)
from tests.unit.bundle_node import unpack_like_the_node


def test_a_failed_training_reports_its_exit_and_last_lines(store: LocalStore, work: Path) -> None:
    command = "for i in 1 2 3; do echo line $i; done; echo 'ValueError: lr < 0' >&2; exit 7"
    agent = make_agent(store, work, entrypoint=command, roles={"chief": 1})
    put_json(store, "cluster.json", agent.cluster)
    assert agent.run() == 0  # it lingers after the failure, then stops
    status = status_of(store, "chief-0")
    assert status["state"] == "failed" and status["exit_code"] == 7 and status["attempt"] == 1
    assert status["tail"][-4:] == ["line 1", "line 2", "line 3", "ValueError: lr < 0"]


def test_an_agent_error_is_reported_with_its_traceback(store: LocalStore, work: Path) -> None:
    # a node whose workdir is gone: the bundler refuses to build a bundle without one
    # (test_bundle_hostile), so this one lost it on the node
    shutil.rmtree(work / "bundle" / "workdir")
    agent = make_agent(store, work, entrypoint="true")
    put_json(store, "cluster.json", agent.cluster)
    started = time.monotonic()
    assert agent.run() == 0  # the work stays up (idle) for a retry or the teardown
    assert time.monotonic() - started >= float(agent.cluster["linger_s"])
    status = status_of(store, "chief-0")
    assert status["state"] == "failed" and status["attempt"] == 1
    assert status["reason"].startswith("agent error: FileNotFoundError: ")
    assert "bundle/workdir" in status["reason"]
    assert status["tail"][0] == "Traceback (most recent call last):"
    assert status["tail"][-1].startswith("FileNotFoundError:")
    logs = read_logs(store, "chief-0")
    assert "cloudtrain-agent[chief-0]: agent error: FileNotFoundError" in logs
    assert "Traceback (most recent call last):" in logs


def test_an_agent_error_then_a_new_attempt_runs_again(
    store: LocalStore, work: Path, node_bundle: Bundle
) -> None:
    """max_restarts_on_errors: the agent that reported an error follows the next attempt."""
    shutil.rmtree(work / "bundle" / "workdir")
    agent = make_agent(store, work, entrypoint="echo ran", linger_s=30.0)
    put_json(store, "cluster.json", agent.cluster)
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    deadline = time.monotonic() + HANG_S
    while status_of(store, "chief-0").get("state") != "failed":
        assert time.monotonic() < deadline, "no failed status"
        time.sleep(0.05)
    unpack_like_the_node(node_bundle, work)  # the retry finds what was missing
    put_json(store, "cluster.json", {**agent.cluster, "attempt": 2})
    while status_of(store, "chief-0").get("state") != "succeeded":
        assert time.monotonic() < deadline, status_of(store, "chief-0")
        time.sleep(0.05)
    assert status_of(store, "chief-0")["attempt"] == 2
    store.put(PREFIX + "control/stop", b"test over")
    runner.join(HANG_S)
    assert not runner.is_alive()


def test_main_reports_an_error_outside_the_attempt_loop(
    store: LocalStore, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a cluster.json the agent cannot use: no attempt number
    cluster = base_cluster()
    del cluster["attempt"]
    put_json(store, "cluster.json", cluster)
    argv = ["--run-id", RUN_ID, "--role", "worker", "--index", "1"]
    argv += ["--store-uri", store.uri, "--work", str(work)]
    with pytest.raises(KeyError):  # re-raised: its traceback goes to the bootstrap log too
        main(argv)
    status = status_of(store, "worker-1")
    assert status["state"] == "failed" and status["reason"] == "agent error: KeyError: 'attempt'"
    assert status["tail"][-1] == "KeyError: 'attempt'"
    assert "Traceback (most recent call last):" in read_logs(store, "worker-1")
