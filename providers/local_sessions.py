"""The local provider's nodes as process sessions: start one, list its processes (shared scans
of /proc), end it (SIGTERM, a grace, SIGKILL), and the free loopback port each node gets.
Standard library only (and cloudtrain.errors)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from cloudtrain.errors import UsageError

# how often a kill looks whether the session is empty: an idle agent ends ~40 ms after SIGTERM,
# which a 50 ms look rounded up to 50-100 ms per node (issue 20's teardown)
POLL_S = 0.01

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOW_PORT = 20000  # node ports are drawn from here up to the kernel's ephemeral range
# "LO-HI": the slice of ports this process draws node ports from, so that local runs side by side
# (the test suite's workers) never draw the same port between its choice and TensorFlow's bind
PORTS_ENV = "CLOUDTRAIN_LOCAL_PORTS"

_handed_out: set[int] = set()  # never the same port twice in one process: not yet bound is free
_handed_lock = threading.Lock()


def _port_range() -> tuple[int, int]:
    """The inclusive range node ports are drawn from: $CLOUDTRAIN_LOCAL_PORTS or LOW_PORT up to
    the kernel's ephemeral range (ip_local_port_range, 32768 by default). Raises UsageError
    naming the variable for a malformed value."""
    raw = os.environ.get(PORTS_ENV)
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


class _SessionTable:
    """Scans of /proc shared by every thread: 64 threads each scanning /proc while deleting in
    parallel made deletion grow with N (they queue on the GIL). A caller only reuses a scan that
    started after it asked, so a process that existed when it asked is never missed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = -1.0
        self._table: dict[int, list[int]] = {}

    def get(self, sid: int) -> list[int]:
        asked = time.monotonic()
        with self._lock:
            if self._started < asked:
                started = time.monotonic()
                table: dict[int, list[int]] = {}
                for entry in os.listdir("/proc"):
                    if entry.isdigit():
                        st = _proc_stat(int(entry))
                        if st and st[0] != "Z":
                            table.setdefault(st[1], []).append(int(entry))
                self._table, self._started = table, started
            return list(self._table.get(sid, []))


_SESSIONS = _SessionTable()


def session_pids(sid: int) -> list[int]:
    """Every live (non-zombie) process whose session id is `sid`, as of a /proc scan that began
    after this call (scans are shared between threads that ask at the same time)."""
    return _SESSIONS.get(sid)


def start_session(script: Path, work: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Boot a node: run its startup script with bash in a new session (the node's identity for
    listing and deletion) in `work`, appending its output to `work/console.log`. No wait."""
    with open(work / "console.log", "ab") as console:
        return subprocess.Popen(
            ["bash", str(script)],
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
    if grace_s > 0:
        for pid in session_pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    for _ in range(50):
        left = session_pids(sid)
        if not left:
            return True
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return not session_pids(sid)
