"""Every process a local node started is found and ended when the node is deleted, as a cloud
VM's processes end with the VM (issue 29): also a daemon the job put in a session of its own
(`setsid`, a double fork), which a kill of the node's session alone leaves running. A node is
alive while any of its processes lives, so list_nodes counts those processes too."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core.procid import environ_has, stat_fields
from cloudtrain.providers import local_cgroups
from cloudtrain.providers.base import NodeRequest, RunInfo
from cloudtrain.providers.local import WORK_ENV, LocalCompute

# a shell daemon in its own session, then a Python one by double fork + setsid; each writes its
# pid; the script then runs on or ends
SETSID_DAEMON = (
    "setsid sh -c 'echo $$ > sh-daemon.pid; exec sleep 600' </dev/null >/dev/null 2>&1 &"
)
FORK_DAEMON = """python3 - <<'EOF'
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("py-daemon.pid.tmp", "w").write(str(os.getpid()))
        os.rename("py-daemon.pid.tmp", "py-daemon.pid")
        time.sleep(600)
    os._exit(0)
os.wait()
EOF
"""
# a daemon that also clears its environment: only a cgroup can find it
CLEARED_DAEMON = (
    "setsid env -i sh -c 'echo $$ > bare-daemon.pid; exec sleep 600' </dev/null >/dev/null 2>&1 &"
)
PID_FILES = ("sh-daemon.pid", "py-daemon.pid")


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _wait_for(check, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class DaemonNode:
    """A local node whose startup script leaves daemons in sessions of their own."""

    def __init__(self, root: Path, run_id: str, script: str) -> None:
        self.compute = LocalCompute(root)
        self.run = RunInfo(run_id, "local", None, (2222, 2232))
        request = NodeRequest(run_id, "worker", 0, "local", script)
        self.folder = root / "runs" / run_id / "nodes" / request.name
        self.pids: list[int] = []
        self.node = self.compute.create_node(self.run, request)

    def wait_for_daemons(self, pid_files: tuple[str, ...]) -> None:
        """Wait until each daemon wrote its pid file, and note the pids."""
        for name in pid_files:
            path = self.folder / name
            _wait_for(lambda p=path: p.exists() and p.read_text().strip(), f"{name} written")
            self.pids.append(int(path.read_text()))

    def clean_up(self) -> None:
        """Whatever the test's outcome: no daemon of this node is left (the suite's check)."""
        with contextlib.suppress(Exception):
            self.compute.delete_node(self.node)
        strays = [p for p in self.pids if _alive(p) and "sleep" in _cmdline(p)]
        for pid in strays + _node_processes(self.folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _node_processes(folder: Path) -> list[int]:
    """Every live process that started in the node's folder's environment (the test's own
    safety net, whatever the code under test found)."""
    pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    return [p for p in pids if _alive(p) and environ_has(p, WORK_ENV, str(folder))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def daemon_node(
    root: Path, run_id: str, script: str, pid_files: tuple[str, ...] = PID_FILES
) -> Iterator[DaemonNode]:
    node: DaemonNode | None = None
    try:
        node = DaemonNode(root, run_id, script)
        node.wait_for_daemons(pid_files)
        yield node
    finally:
        if node is not None:
            node.clean_up()


@pytest.fixture(params=["cgroup", "no-cgroup"])
def cgroups(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of finding a node's processes: with a cgroup when this machine lets us make
    one, and the fallback a laptop without cgroup rights gets (no cgroup2 mount to be found)."""
    if request.param == "cgroup" and local_cgroups.mount_point() is None:
        pytest.skip("no writable cgroup2 here")
    if request.param == "no-cgroup":
        monkeypatch.setattr(local_cgroups, "MOUNTINFO", Path("/nonexistent/mountinfo"))
    return str(request.param)


def test_delete_ends_daemons_that_left_the_session(tmp_path: Path, cgroups: str) -> None:
    script = f"{SETSID_DAEMON}\n{FORK_DAEMON}\nsleep 600\n"
    with daemon_node(tmp_path / "local", "escape-abcdef", script) as node:
        assert all(map(_alive, node.pids)), node.pids
        node.compute.delete_node(node.node)
        left = [pid for pid in node.pids if _alive(pid)]
        assert left == [], f"daemons {left} survived delete_node ({cgroups})"
        assert node.compute.list_nodes(node.run.run_id) == []


def test_a_node_lives_while_a_daemon_does(tmp_path: Path, cgroups: str) -> None:
    """The startup script is gone but its daemons run: the node is running, as a VM whose
    boot script ended is; deleting it ends them."""
    script = f"{SETSID_DAEMON}\n{FORK_DAEMON}\nexit 0\n"
    with daemon_node(tmp_path / "local", "linger-abcdef", script) as node:
        leader = int(node.node.cloud_id or 0)
        _wait_for(lambda: not _alive(leader), "the startup script to end")
        assert [n.state for n in node.compute.list_nodes(node.run.run_id)] == ["running"]
        node.compute.delete_node(node.node)
        assert [pid for pid in node.pids if _alive(pid)] == []
        assert node.compute.list_nodes(node.run.run_id) == []


def test_a_cgroup_finds_even_a_daemon_with_a_cleared_environment(tmp_path: Path) -> None:
    if local_cgroups.mount_point() is None:
        pytest.skip("no writable cgroup2 here: such a process cannot be found (see the README)")
    script = f"{CLEARED_DAEMON}\nsleep 600\n"
    root = tmp_path / "local"
    with daemon_node(root, "bare-abcdef", script, ("bare-daemon.pid",)) as node:
        node.compute.delete_node(node.node)
        assert [pid for pid in node.pids if _alive(pid)] == []


def test_a_planted_record_does_not_reach_other_processes(tmp_path: Path) -> None:
    """node.json is only a file: one that names another node's token and cgroup (copied from
    it) under another folder makes `delete_node` signal nothing of that node."""
    script = f"{SETSID_DAEMON}\nsleep 600\n"
    with daemon_node(tmp_path / "a", "victim-abcdef", script, ("sh-daemon.pid",)) as victim:
        thief = LocalCompute(tmp_path / "b")
        planted = tmp_path / "b" / "runs" / "victim-abcdef" / "nodes" / victim.folder.name
        planted.mkdir(parents=True)
        (planted / "node.json").write_text((victim.folder / "node.json").read_text())
        thief.delete_node(victim.node)
        assert all(map(_alive, victim.pids))
        assert [n.state for n in victim.compute.list_nodes("victim-abcdef")] == ["running"]


def test_a_node_powering_itself_off_ends_its_daemons(tmp_path: Path) -> None:
    """The node's own power-off (the startup script's last line; the dead-man switch uses the
    same function) ends what left its session too, as a VM's shutdown does."""
    compute = LocalCompute(tmp_path / "local")
    request = NodeRequest("off-abcdef", "worker", 0, "local", "")
    blocks = compute.startup_blocks(RunInfo("off-abcdef", "local", None, (1, 2)), request)
    wait = "while [ ! -s py-daemon.pid ]; do sleep 0.05; done"
    deadline = "DEADLINE_EPOCH=$(( $(date +%s) + 600 ))"
    parts = [deadline, blocks.self_shutdown, SETSID_DAEMON, FORK_DAEMON, wait, blocks.power_off]
    script = "\n".join([*parts, "sleep 600"])
    with daemon_node(tmp_path / "local", "off-abcdef", script) as node:
        _wait_for(
            lambda: [n.state for n in node.compute.list_nodes("off-abcdef")] == ["terminated"],
            "the node to power itself off",
        )
        assert [pid for pid in node.pids if _alive(pid)] == []
