"""The local provider's nodes as process sessions: start one, list its processes (shared scans
of /proc), end them (SIGTERM, a grace, SIGKILL), and the free loopback port each node gets.

A node's processes are found three ways (issue 29): its session; the marker every process of it
inherits in its environment (`NODE_ENV`, with the node's folder in `CT_WORK`), found by reading
/proc/PID/environ of this user's processes, which finds a daemon that left the session
(`setsid`, a double fork); and its cgroup where one could be made (providers/local_cgroups.py).
A process that both left the session AND cleared its environment (`setsid env -i ...`) can be
found only through a cgroup: where none can be made (a laptop user without root or a delegated
systemd cgroup), such a process outlives its node. Standard library only (and
cloudtrain.core.errors).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cloudtrain.core.env import LOCAL_NODE, LOCAL_PORTS
from cloudtrain.core.errors import UsageError

# how often a kill looks whether the session is empty: an idle agent ends ~40 ms after SIGTERM,
# which a 50 ms look rounded up to 50-100 ms per node (issue 20's teardown)
POLL_S = 0.01

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOW_PORT = 20000  # node ports are drawn from here up to the kernel's ephemeral range
# "LO-HI": the slice of ports this process draws node ports from, so that local runs side by side
# (the test suite's workers) never draw the same port between its choice and TensorFlow's bind
PORTS_ENV = LOCAL_PORTS.name
# `<run>/<node>/<token>` in the environment of every process a node starts (the token is new
# with each node made): how a process that left the node's session is still found
NODE_ENV = LOCAL_NODE.name
# the node's own folder, in the environment of every process it starts: what makes a process
# provably the node's (a pid read back from node.json proves nothing by itself)
WORK_ENV = "CT_WORK"
_NODE_PREFIX = NODE_ENV.encode() + b"="
# bash for the node itself (its dead-man switch, its power-off): `ct_end_node SIGNAL` signals
# every process of this user that carries the node's marker, then the node's session, as a VM's
# shutdown ends all it runs; never the shell that asks (pure bash: no process per /proc entry)
END_NODE_SH = r"""ct_end_node() {
  local f p kv
  for f in /proc/[0-9]*/environ; do
    p=${f#/proc/}; p=${p%/environ}
    { [ -z "${MARK:-}" ] || [ "$p" = "$$" ] || [ "$p" = "$BASHPID" ]; } && continue
    [ -O "$f" ] || continue
    while IFS= read -r -d '' kv; do
      if [ "$kv" = "MARK=$MARK" ]; then kill "-$1" "$p" || true; break; fi
    done 2>/dev/null <"$f"
  done
  pkill "-$1" -s "$$" || true
}""".replace("MARK", NODE_ENV)
# (its subshell drops the bootstrap's ERR trap, which `set -E` hands it: killed at power-off,
# its `sleep` would otherwise write FAILED into the node's log after the agent's own verdict)
DEADMAN_SH = """( trap - ERR
  sleep "$(( DEADLINE_EPOCH > $(date +%s) ? DEADLINE_EPOCH - $(date +%s) : 0 ))"
  echo "cloudtrain: node deadline reached, shutting down"; trap "" TERM
  ct_end_node TERM; sleep 5; ct_end_node KILL ) </dev/null >/dev/null 2>&1 &"""
POWER_OFF_SH = "ct_end_node KILL  # the node is its session and its marked processes: end all"

_handed_out: set[int] = set()  # never the same port twice in one process: not yet bound is free
_handed_lock = threading.Lock()


def _port_range() -> tuple[int, int]:
    """The inclusive range node ports are drawn from: $CLOUDTRAIN_LOCAL_PORTS or LOW_PORT up to
    the kernel's ephemeral range (ip_local_port_range, 32768 by default). Raises UsageError
    naming the variable for a malformed value."""
    raw = LOCAL_PORTS.raw()
    if raw is None:
        try:
            top = int(EPHEMERAL_RANGE.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            top = 32768
        return LOW_PORT, max(top, LOW_PORT + 1000) - 1
    lo_s, sep, hi_s = raw.strip().partition("-")
    if not (sep and lo_s.isdigit() and hi_s.isdigit()):
        raise UsageError(f"{PORTS_ENV}={raw!r}: expected two port numbers as LOW-HIGH")
    lo, hi = int(lo_s), int(hi_s)
    if not 1024 <= lo <= hi <= 65535:
        raise UsageError(f"{PORTS_ENV}={raw!r}: expected 1024 <= LOW <= HIGH <= 65535")
    return lo, hi


def _bindable(port: int) -> bool:
    """Whether `port` is free on every address now (TensorFlow's server binds 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port free now, drawn at random from $CLOUDTRAIN_LOCAL_PORTS or below the kernel's
    ephemeral range: a port the kernel hands out (bind to 0) is also what any outgoing
    connection may take before the node's TensorFlow binds it ("Could not start gRPC server"
    under load). Never one this process handed out before (a port drawn but not yet bound looks
    free), until the whole range has been handed out. Non-blocking, thread-safe."""
    lo, hi = _port_range()
    rng = random.SystemRandom()
    with _handed_lock:
        if all(p in _handed_out for p in range(lo, hi + 1)):
            _handed_out.difference_update(range(lo, hi + 1))  # all of it handed out: start over
        for _ in range(200):
            port = rng.randint(lo, hi)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
        for port in range(lo, hi + 1):  # crowded: look at every port once
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all taken: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_free_port = free_port


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def node_marker(node_dir: Path, token: str) -> str:
    """NODE_ENV's value for the node in `node_dir`: `<run>/<node>/<token>`. Pure."""
    return f"{node_dir.parent.parent.name}/{node_dir.name}/{token}"


def _marks(pid: int, work_env: str) -> tuple[str, str] | None:
    """(NODE_ENV value, `work_env` value) of a process of this user that carries the marker in
    the environment it was exec'd with, or None."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return None
    if _NODE_PREFIX not in raw:
        return None
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
    except OSError:
        return None
    found: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (NODE_ENV.encode(), work_env.encode()):
            found[key] = value
    node = found.get(NODE_ENV.encode())
    if node is None:
        return None
    work = found.get(work_env.encode(), b"")
    return node.decode(errors="replace"), work.decode(errors="replace")


class _SessionTable:
    """Scans of /proc shared by every thread: 64 threads each scanning /proc while deleting in
    parallel made deletion grow with N (they queue on the GIL). A caller only reuses a scan that
    started after it asked, so a process that existed when it asked is never missed. A scan
    notes each live process's session and, for this user's processes that carry the node
    marker, the marker and node folder they started with."""

    def __init__(self, work_env: str = WORK_ENV) -> None:
        self._lock = threading.Lock()
        self._started = -1.0
        self._table: dict[int, list[int]] = {}
        self._marked: dict[tuple[str, str], list[int]] = {}
        self._work_env = work_env

    def _scan(self, asked: float) -> None:
        if self._started >= asked:
            return
        started = time.monotonic()
        table: dict[int, list[int]] = {}
        marked: dict[tuple[str, str], list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = _proc_stat(int(entry))
                if st and st[0] != "Z":
                    table.setdefault(st[1], []).append(int(entry))
                    mark = _marks(int(entry), self._work_env)
                    if mark:
                        marked.setdefault(mark, []).append(int(entry))
        self._table, self._marked, self._started = table, marked, started

    def get(self, sid: int) -> list[int]:
        asked = time.monotonic()
        with self._lock:
            self._scan(asked)
            return list(self._table.get(sid, []))

    def marked(self, marker: str, work: str) -> list[int]:
        asked = time.monotonic()
        with self._lock:
            self._scan(asked)
            return list(self._marked.get((marker, work), []))


_SESSIONS = _SessionTable()


def session_pids(sid: int) -> list[int]:
    """Every live (non-zombie) process whose session id is `sid`, as of a /proc scan that began
    after this call (scans are shared between threads that ask at the same time)."""
    return _SESSIONS.get(sid)


def marked_pids(marker: str, work: str) -> list[int]:
    """Every live process of this user that started with `NODE_ENV=marker` and `CT_WORK=work`
    in its environment, in any session, as of a /proc scan that began after this call."""
    return _SESSIONS.marked(marker, work)


def start_session(
    script: Path, work: Path, env: dict[str, str], cgroup_procs: Path | None = None
) -> subprocess.Popen[bytes]:
    """Boot a node: run its startup script with bash in a new session (the node's identity for
    listing and deletion) in `work`, appending its output to `work/console.log`. With
    `cgroup_procs`, the process first writes its pid there (joins the node's cgroup, before it
    starts anything) and then execs the script; a write refused only costs the cgroup. No wait."""
    args = ["bash", str(script)]
    if cgroup_procs is not None:
        join = 'echo "$$" 2>/dev/null >"$1" || true; exec bash "$2"'
        args = ["bash", "-c", join, "cloudtrain-node", str(cgroup_procs), str(script)]
    with open(work / "console.log", "ab") as console:
        return subprocess.Popen(
            args,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_session(sid: int, grace_s: float = 0.0) -> bool:
    """End every process of session `sid`: SIGTERM and up to `grace_s` to exit, then SIGKILL.
    Blocks; returns whether none is left. Idempotent."""
    return kill_members(lambda: session_pids(sid), grace_s)


def kill_members(
    members: Callable[[], list[int]],
    grace_s: float = 0.0,
    kill_all: Callable[[], object] | None = None,
) -> bool:
    """End every process `members()` lists (asked again on each look, so a process forked
    meanwhile is found too): SIGTERM and up to `grace_s` for them to exit, then SIGKILL (and
    `kill_all()`, a cgroup's kill, first) until none is left. Blocks; returns whether none is
    left. Idempotent."""
    if grace_s > 0:
        for pid in members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while members() and time.monotonic() < deadline:
            time.sleep(POLL_S)
    for _ in range(50):
        left = members()
        if not left:
            return True
        if kill_all is not None:
            kill_all()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return not members()
