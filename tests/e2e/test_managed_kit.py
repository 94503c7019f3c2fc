"""The managed-run tests' own observer of local nodes (managed_kit.node_sessions) sees what the
machine runs, not what it runs for an instant: a process the controller forks for a new node's
session is, between its setsid() and its exec(), a copy of the controller (same environment, same
command line) in a session of its own. Polled every 0.2 s over a run, that window was once seen
as a second session of the controller's node (CI at stop 38)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.managed_kit import WORK_ENV, node_sessions, proc_stat

# the parent stays; its child leaves the session and waits, as a child between setsid and exec
FORKS_AND_WAITS = """
import os, signal
if os.fork() == 0:
    os.setsid()
    signal.pause()
    os._exit(0)
print("forked", flush=True)
signal.pause()
"""

# a node started anew under the same name: its own command line, the node's own folder
SECOND_NODE = "import signal; print('up', flush=True); signal.pause()"


def _start(nodes: Path, name: str, code: str) -> subprocess.Popen[str]:
    env = {**os.environ, WORK_ENV: f"{nodes}{os.sep}{name}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() in ("forked", "up")
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, 9)
    proc.wait()


def test_a_child_between_setsid_and_exec_is_not_a_second_session_of_its_node(
    tmp_path: Path,
) -> None:
    parent = _start(tmp_path, "ct-x-controller-0", FORKS_AND_WAITS)
    try:
        deadline = time.monotonic() + 10
        children: list[str] = []
        while not children and time.monotonic() < deadline:  # the child has left the session
            children = [
                p
                for p in os.listdir("/proc")
                if p.isdigit() and _ppid(p) == parent.pid and _sid(p) != parent.pid
            ]
        assert children, "the child never left its parent's session"
        assert node_sessions(tmp_path) == [("ct-x-controller-0", str(parent.pid))]
    finally:
        for child in children:
            os.kill(int(child), 9)
        _end(parent)


def test_two_sessions_of_one_node_are_both_seen(tmp_path: Path) -> None:
    first = _start(tmp_path, "ct-x-worker-1", SECOND_NODE)
    second = _start(tmp_path, "ct-x-worker-1", SECOND_NODE)
    try:
        assert node_sessions(tmp_path) == sorted(
            [("ct-x-worker-1", str(first.pid)), ("ct-x-worker-1", str(second.pid))]
        )
    finally:
        _end(first)
        _end(second)


def _ppid(pid: str) -> int:
    try:
        return proc_stat(pid)[1]
    except OSError:  # gone meanwhile
        return -1


def _sid(pid: str) -> int:
    try:
        return os.getsid(int(pid))
    except OSError:
        return -1
