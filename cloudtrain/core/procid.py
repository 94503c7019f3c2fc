"""Which process is which: a process's identity that survives pid reuse, read from /proc.

A pid alone names a process only while it lives: once it exits, the kernel hands the number to
the next process. So whoever records a pid (the ledger, for a run's controller; the local
provider, for a node's session) records `start_stamp(pid)` with it, and later asks
`same_process(pid, stamp)` before trusting or signalling that pid. Linux only (proc(5)); where
/proc is missing the stamp is None and only the pid's existence can be checked.

Runs on the nodes too (the local provider imports it): Python 3.10 and newer.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def _boot_id() -> str:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 onwards: state, ppid, pgrp,
    session, ... starttime is index 19), or None if the process is gone. Pure read."""
    try:
        raw = (PROC / str(int(pid)) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may itself hold ')' or spaces
    return raw[raw.rindex(")") + 2 :].split()


def start_stamp(pid: int) -> str | None:
    """`<boot id>:<start time in clock ticks since boot>` of a live process (proc(5), field 22
    of /proc/PID/stat), or None if it is gone or /proc is missing. Unique for the machine's
    uptime and across reboots (the boot id changes). Non-blocking."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return f"{_boot_id()}:{fields[19]}"


def pid_exists(pid: int) -> bool:
    """Whether some process has this pid (any owner). Non-blocking."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def same_process(pid: int, stamp: str | None) -> bool:
    """Whether `pid` is still the process that had `stamp` when it was recorded (a zombie
    counts as gone). With no stamp (no /proc where it was recorded), whether the pid exists."""
    if pid <= 0:
        return False
    if not stamp:
        return pid_exists(pid)
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return start_stamp(pid) == stamp


def environ_has(pid: int, name: str, value: str) -> bool:
    """Whether the process started with `name=value` in its environment (/proc/PID/environ:
    the environment it was exec'd with). False if it is gone or not readable (another user's
    process). Non-blocking."""
    try:
        raw = (PROC / str(int(pid)) / "environ").read_bytes()
    except (OSError, ValueError):
        return False
    return f"{name}={value}".encode() in raw.split(b"\0")


@dataclass(frozen=True)
class Controller:
    """What is known of a run's controller process: `state` is "alive", "gone" (it ended: the
    run's row will not change unless `down` or `gc` changes it), or "unknown" (it runs on
    another host, or the row predates the record)."""

    state: str
    pid: int | None
    host: str | None

    def describe(self) -> str:
        """E.g. "controller pid 123 on box1 (alive)". Pure."""
        if self.pid is None:
            return "controller not recorded"
        return f"controller pid {self.pid} on {self.host} ({self.state})"


def controller(rec: Any) -> Controller:
    """Whether a run's controller still runs, from its ledger row (`ledger.RunRecord`): the pid
    recorded at `create_run`, on this host, with the same start stamp (so a pid the kernel
    handed on does not count). Non-blocking."""
    pid, host = rec.controller_pid, rec.controller_host
    if pid is None:
        return Controller("unknown", None, host)
    if host != socket.gethostname():
        return Controller("unknown", pid, host)
    alive = same_process(int(pid), rec.controller_start)
    return Controller("alive" if alive else "gone", pid, host)
