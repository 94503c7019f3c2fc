"""A local node's cgroup (cgroup v2): the one way to find every process a node started, even one
that left the node's session and cleared its environment. Made when this machine lets us (root,
or a systemd-delegated user cgroup); a laptop user often cannot, and then the node goes without
one (providers/local_sessions.py's environment marker and session scan find the rest).

A node's cgroup is `cloudtrain-<node name>-<digest of its folder and token>` below the cgroup of
the process that creates the node; node.json records its path relative to the cgroup2 mount, and
a recorded path counts only when it ends in the name this node's folder and token give (a
node.json copied into another folder names no cgroup there). Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUP = Path("/proc/self/cgroup")
TOKEN_RE = re.compile(r"[0-9a-f]{16,64}")


def mount_point() -> Path | None:
    """Where the cgroup2 hierarchy is mounted read-write (the first such mount), or None.
    Pure read of /proc."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        writable = len(fields) > 5 and "rw" in fields[5].split(",")
        if sep and tail and tail[0] == "cgroup2" and writable:
            return Path(fields[4].encode().decode("unicode_escape"))
    return None


def _own_path() -> str | None:
    """This process's cgroup v2 path ("/..."), from /proc/self/cgroup's `0::` line, or None."""
    try:
        lines = OWN_CGROUP.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def name_for(node_dir: Path, token: object) -> str | None:
    """The cgroup folder name of the node whose folder is `node_dir` and whose token (node.json)
    is `token`: `cloudtrain-<node name>-<digest>`, or None for a token that is not one. Pure."""
    if not isinstance(token, str) or TOKEN_RE.fullmatch(token) is None:
        return None
    digest = hashlib.blake2b(f"{node_dir}\0{token}".encode(), digest_size=8).hexdigest()
    return f"cloudtrain-{node_dir.name}-{digest}"


def create(name: str) -> str | None:
    """Make the cgroup `name` (see `name_for`) below this process's own; returns its path
    relative to the cgroup2 mount ("/.../<name>"), or None when this machine does not let us
    (no cgroup2, no rights). Idempotent (an existing one is reused)."""
    mount, own = mount_point(), _own_path()
    if mount is None or own is None:
        return None
    rel = f"{own.rstrip('/')}/{name}"
    try:
        (mount / rel.lstrip("/")).mkdir(exist_ok=True)
    except OSError:
        return None
    if not os.access(mount / rel.lstrip("/") / "cgroup.procs", os.W_OK):
        remove(rel, name)
        return None
    return rel


def _folder(rel: object, name: str | None) -> Path | None:
    """The folder of a recorded cgroup path, only if it is one `create` made under the name
    `name`: under the cgroup2 mount, no '..', and its last part is `name`. Else None (a planted
    record never names another cgroup to kill)."""
    mount = mount_point()
    if mount is None or name is None or not isinstance(rel, str):
        return None
    parts = rel.split("/")
    if not rel.startswith("/") or ".." in parts or "." in parts or "\x00" in rel:
        return None
    return mount / rel.lstrip("/") if parts[-1] == name else None


def procs_file(rel: str) -> Path | None:
    """The cgroup.procs file a new process writes its pid to, or None without cgroup2."""
    mount = mount_point()
    return None if mount is None else mount / rel.lstrip("/") / "cgroup.procs"


def pids(rel: object, name: str | None) -> list[int]:
    """The processes in the node's cgroup ([] when there is none, or the record is not one
    `create` made for this node). Non-blocking."""
    folder = _folder(rel, name)
    if folder is None:
        return []
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill(rel: object, name: str | None) -> bool:
    """SIGKILL every process in the node's cgroup at once (cgroup.kill, Linux 5.14+; a forking
    process cannot slip out). Returns False where there is no cgroup.kill (the caller signals
    the pids). Non-blocking."""
    folder = _folder(rel, name)
    if folder is None or not (folder / "cgroup.kill").exists():
        return False
    try:
        (folder / "cgroup.kill").write_text("1")
    except OSError:
        return False
    return True


def remove(rel: object, name: str | None) -> None:
    """Remove the node's cgroup once it is empty. Idempotent; best effort (a cgroup that still
    holds a process stays, and the next delete tries again)."""
    folder = _folder(rel, name)
    if folder is not None:
        with contextlib.suppress(OSError):
            folder.rmdir()
