"""The `local` provider: nodes are process sessions on this machine and the bucket is a folder.

A node is the rendered startup script run by bash in its own session (`setsid`) and working folder,
under `$CLOUDTRAIN_HOME/local/runs/<run_id>/nodes/<name>/`. `node.json` there plays the role of the
cloud's tags: `list_nodes` reads it, so a new process (`cloudtrain down` after a crash) sees the
same nodes. Deleting a node kills every process of it, checks that none is left, and deletes what
it wrote there (its VM's disk) but node.json and its console log. A node's processes are its
session, every process of this user that carries its marker (`NODE_ENV`) in its environment, and
its cgroup where one could be made: a daemon that left the session is found too, as a VM's
processes end with the VM (providers/local_sessions.py says what only a cgroup finds).
Each node gets its own loopback port, passed like instance metadata through its environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from cloudtrain.crashpoints import crash_point
from cloudtrain.errors import NotFound, PreconditionFailed, ProviderError, TooLarge
from cloudtrain.paths import cloudtrain_home
from cloudtrain.procid import environ_has, same_process, start_stamp
from cloudtrain.providers import local_cgroups
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
    ObjectInfo,
    Provider,
    ProviderConfig,
    Resource,
    RunInfo,
    StartupBlocks,
    Tagged,
    run_labels,
)
from cloudtrain.providers.local_sessions import (  # noqa: F401 - the local provider's API
    DEADMAN_SH,
    END_NODE_SH,
    EPHEMERAL_RANGE,
    LOW_PORT,
    NODE_ENV,
    POWER_OFF_SH,
    WORK_ENV,
    _free_port,
    _port_range,
    free_port,
    kill_members,
    kill_session,
    marked_pids,
    node_marker,
    session_pids,
    start_session,
)
from cloudtrain.providers.transfer import COPY_CHUNK, Progress, copy_file, report, sidecar_path
from cloudtrain.providers.uri_rules import split_uri, uri_problem

KILL_GRACE_S = 3.0
# One folder name under the local root: a run id ("r1", "digits-3fa9c2") or a node name
# ("ct-digits-3fa9c2-worker-0"). No '/', no '.', so it can never climb out of the root.
_COMPONENT_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")
# what a deleted node's folder keeps: its record (the provider's tags) and its console log; the
# rest was its VM's disk, which goes with the VM (and a node made again boots on an empty one)
KEPT_AFTER_DELETE = ("node.json", "console.log")


def wipe_disk(node_dir: Path) -> None:
    """Delete what a node wrote in its folder but KEPT_AFTER_DELETE; a link is removed, never
    followed. Idempotent; best effort (a file that cannot go stays)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in node_dir.iterdir():
            if entry.name in KEPT_AFTER_DELETE:
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()


def _uri_to_path(uri: str) -> Path:
    """The folder of a file:// URI, by the rule the spec applies too (providers/uri_rules.py).
    Raises ProviderError."""
    problem = uri_problem(uri, "file")
    if problem:
        raise ProviderError(f"the local provider takes file:///PATH URIs, not {uri!r}: {problem}")
    return Path(split_uri(uri)[2])


def _path_to_uri(path: Path) -> str:
    return "file://" + urllib.parse.quote(str(path.resolve()))


def _stamp(st: os.stat_result, data: bytes) -> str:
    """The tag of a file as written by LocalStore: its inode, mtime (ns), size and a digest of
    its bytes. Every write is a new file (temp + rename), and `put_if` also moves mtime past the
    file it replaces, so a write changes the stamp even when the bytes are the same. Pure."""
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}-{digest}"


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on `folder` (made if missing) for the block. flock, not fcntl's
    record locks: those are per process, and would not keep this process's threads apart; a
    fresh descriptor per call makes flock exclude threads and processes alike. Blocks."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# how a store opens an object to read it: never through a symlink, never blocking on a FIFO
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _open_object(path: Path, what: str) -> tuple[int, os.stat_result] | None:
    """A descriptor of the regular file at `path` and its stat, or None when there is none (or a
    folder is there). The last component is opened without following a symlink and without
    blocking, so a FIFO, a device or a symlink at the key raises ProviderError instead of being
    read. The caller closes the descriptor."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:  # ELOOP: a symlink at the key (O_NOFOLLOW); ENXIO, EACCES, ...
        raise ProviderError(f"{what}: not a readable regular file ({exc.strerror})") from None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        os.set_blocking(fd, True)
        return fd, st
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        return None
    raise ProviderError(f"{what}: not a regular file (mode {stat.filemode(st.st_mode)})")


def _read_fd(fd: int, max_bytes: int | None, what: str) -> bytes:
    """The bytes of the open file `fd` from its start: all of them, or with `max_bytes` at most
    max_bytes + 1 read before raising TooLarge. Blocks on the read."""
    limit = None if max_bytes is None else max_bytes + 1
    parts: list[bytes] = []
    got = 0
    while limit is None or got < limit:
        chunk = os.read(fd, COPY_CHUNK if limit is None else min(COPY_CHUNK, limit - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if max_bytes is not None and got > max_bytes:
        raise TooLarge(f"{what}: more than {max_bytes} bytes, not read")
    return b"".join(parts)


class LocalStore:
    """An ObjectStore that is a folder. Writes are atomic (temp file + rename); thread-safe.

    Every write of a key (put, put_file, put_if, delete) holds an flock on the key's folder, so a
    conditional write's compare and rename are atomic against all of them, in any process.
    The folder is writable by the run's nodes, so it is untrusted: only regular files are
    objects; a read never follows a symlink at the key, never blocks on a FIFO, and no key leads
    out of the folder through a symlinked folder."""

    def __init__(self, uri: str) -> None:
        self.root = _uri_to_path(uri)
        self.uri = _path_to_uri(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ProviderError(f"invalid object key {key!r}")
        path = self.root / key
        if not self._inside(path.parent):
            raise ProviderError(f"object key {key!r} leads out of {self.uri} (a symlink)")
        return path

    def _inside(self, folder: Path) -> bool:
        """Whether `folder`, its symlinks resolved, is the bucket's folder or inside it."""
        root = os.path.realpath(self.root)
        real = os.path.realpath(folder)
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    def ensure_bucket(self) -> Resource:
        """Create the folder, private to this user. Idempotent; a folder that already exists
        keeps its mode (a checkpoint URI may name any folder, even /etc)."""
        if not self.root.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            crash_point("bucket")
            self.root.chmod(0o700)
        return Resource("local", "bucket", self.uri, "local", "")

    def put(self, key: str, data: bytes) -> None:
        """Write atomically. Idempotent."""
        path = self._path(key)
        with _folder_lock(path.parent):
            self._write(path, data)

    def _write(self, path: Path, data: bytes, after_ns: int = 0) -> os.stat_result:
        """Write `data` to a temp file in `path`'s folder (its mtime set past `after_ns` when it
        is not already), rename it over `path`; returns the new file's stat. The caller holds
        the folder's lock."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            st = os.stat(tmp)
            if st.st_mtime_ns <= after_ns:  # a coarse clock: same mtime as the file replaced
                os.utime(tmp, ns=(st.st_atime_ns, after_ns + 1))
                st = os.stat(tmp)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return st

    def _read(
        self, path: Path, max_bytes: int | None = None
    ) -> tuple[bytes, os.stat_result] | None:
        """The bytes of the regular file `path` and the stat of that very file (one
        descriptor), or None when there is none. Raises ProviderError for anything else at the
        key (a FIFO, a symlink) and TooLarge past `max_bytes`."""
        what = f"get {path.relative_to(self.root).as_posix()} in {self.uri}"
        opened = _open_object(path, what)
        if opened is None:
            return None
        fd, st = opened
        try:
            return _read_fd(fd, max_bytes, what), st
        finally:
            os.close(fd)

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object and its stamp (inode, mtime, size, digest: see `_stamp`), or None when
        there is none; TooLarge when it holds more than `max_bytes` (at most max_bytes + 1
        read). Reads one file through one descriptor, so bytes and stamp belong together.
        Blocks briefly; takes no lock (writes are renames)."""
        found = self._read(self._path(key), max_bytes)
        return None if found is None else (found[0], _stamp(found[1], found[0]))

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Write the object only if its stamp is `tag` (None: only if there is no object);
        returns the new stamp. The compare and the rename happen under the folder's flock, which
        every writer of this store takes, in any process. Raises PreconditionFailed when the
        condition does not hold. Not idempotent. Blocks while another write holds the lock."""
        path = self._path(key)
        with _folder_lock(path.parent):
            found = self._read(path)
            current = None if found is None else _stamp(found[1], found[0])
            if current != tag:
                state = "no object" if current is None else f"stamp {current}"
                raise PreconditionFailed(
                    f"put {key!r} in {self.uri} if its stamp is {tag}: it has {state}"
                )
            st = self._write(path, data, after_ns=0 if found is None else found[1].st_mtime_ns)
        return _stamp(st, data)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """Read an object; NotFound if missing, TooLarge when it holds more than `max_bytes`
        (at most max_bytes + 1 read), ProviderError for what is not a regular file. Blocks
        briefly."""
        found = self._read(self._path(key), max_bytes)
        if found is None:
            raise NotFound(f"no object {key!r} in {self.uri}")
        return found[0]

    def put_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Copy a file in atomically, calling `progress` per 4 MiB copied. Idempotent."""
        dest = self._path(key)
        with _folder_lock(dest.parent):
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
            os.close(fd)
            try:
                copy_file(path, tmp, progress)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def get_file(self, key: str, path: str, progress: Progress = None) -> None:
        """Copy an object out to `path` atomically (through the sidecar, renamed when
        complete), calling `progress` per 4 MiB copied; NotFound if missing. A local copy: a
        failed one starts over."""
        opened = _open_object(self._path(key), f"get {key} in {self.uri}")
        if opened is None:
            raise NotFound(f"no object {key!r} in {self.uri}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        side = sidecar_path(path)
        try:
            with os.fdopen(opened[0], "rb") as fin, open(side, "wb") as fout:
                while chunk := fin.read(COPY_CHUNK):
                    fout.write(chunk)
                    report(progress, len(chunk))
            os.replace(side, path)
        except BaseException:
            with contextlib.suppress(OSError):
                side.unlink()
            raise

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects under `prefix` (a key prefix, not only a folder), sorted by key."""
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(base) if base else self.root
        out: list[ObjectInfo] = []
        if not start.is_dir() or not self._inside(start):
            return out
        for dirpath, _dirs, files in os.walk(start):  # never into a symlinked folder
            for fname in files:
                if fname.startswith(".tmp-"):
                    continue
                full = Path(dirpath) / fname
                key = full.relative_to(self.root).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):  # no symlink, FIFO, socket or device
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        """Delete one object. Idempotent."""
        path = self._path(key)
        if not path.parent.is_dir():
            return
        with _folder_lock(path.parent), contextlib.suppress(FileNotFoundError):
            path.unlink()

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`. Idempotent."""
        objs = self.list(prefix)
        for obj in objs:
            self.delete(obj.key)
        return len(objs)

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """A file:// URL (a folder needs no signature; curl reads it)."""
        return _path_to_uri(self._path(key))

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """A file:// URL that `curl -T` can write to; its folder is created now."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return _path_to_uri(path)


class LocalCompute(Compute):
    """Nodes as process sessions. Thread-safe; node creation is idempotent per name."""

    provider_name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._popen: dict[str, subprocess.Popen[bytes]] = {}

    def _run_dir(self, run_id: str) -> Path:
        """`root/runs/<run_id>`; ProviderError for a run id that is not one folder name."""
        if not isinstance(run_id, str) or _COMPONENT_RE.fullmatch(run_id) is None:
            raise ProviderError(f"the local provider refuses the run id {run_id!r}")
        return self.root / "runs" / run_id

    def _node_dir(self, run_id: str, name: str) -> Path:
        """`root/runs/<run_id>/nodes/<name>`, never outside the root (ProviderError)."""
        if not isinstance(name, str) or _COMPONENT_RE.fullmatch(name) is None:
            raise ProviderError(f"the local provider refuses the node name {name!r}")
        path = self._run_dir(run_id) / "nodes" / name
        if not path.resolve().is_relative_to(self.root.resolve()):  # a symlinked folder
            raise ProviderError(f"node folder {path} leads out of {self.root}")
        return path

    def _write_meta(self, path: Path, meta: dict[str, object]) -> None:
        """Replace node.json atomically (a temp file unique to this process, then rename):
        another cloudtrain process reading it sees the old or the new file, never half."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".node.json-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(meta))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _members(self, meta: dict[str, object], node_dir: Path) -> list[int]:
        """Every live process of the node: its session's (`_session_members`), the processes
        of this user that carry its marker and folder in their environment, and its cgroup's.
        A record planted in another folder reaches none of another node's (the marker's folder,
        the cgroup's name from the folder)."""
        found = set(self._session_members(meta, node_dir))
        token = meta.get("token")
        if isinstance(token, str) and local_cgroups.TOKEN_RE.fullmatch(token):
            found.update(marked_pids(node_marker(node_dir, token), str(node_dir)))
            name = local_cgroups.name_for(node_dir, token)
            found.update(local_cgroups.pids(meta.get("cgroup"), name))
        return sorted(found)

    def _session_members(self, meta: dict[str, object], node_dir: Path) -> list[int]:
        """The live processes of the node's session, if the session is provably the node's:
        one of them carries the node's folder in the environment it started with, and the
        session's leader, while alive, is the process recorded at create (its start stamp).
        Otherwise [] (a planted or stale node.json, or a pid the kernel handed on): such pids
        are never signalled."""
        try:
            sid = int(meta.get("pid", 0))  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return []
        if sid <= 1:
            return []
        members = session_pids(sid)
        if not members:
            return []
        stamp = meta.get("start")
        if sid in members and isinstance(stamp, str) and not same_process(sid, stamp):
            return []  # the session id was reused by an unrelated new session
        popen = self._popen.get(str(meta.get("name")))
        if popen is not None and popen.pid == sid and popen.returncode is None:
            return members  # this process started it (and has not reaped it): it is the node
        # a process caught mid-exec shows an empty environment for an instant: ask again
        for attempt in range(3):
            if any(environ_has(pid, WORK_ENV, str(node_dir)) for pid in members):
                return members
            if attempt < 2:
                time.sleep(0.02)
        return []

    def planned_network(self, run: RunInfo) -> list[Resource]:
        """Local nodes share loopback: there is no network resource."""
        return []

    def ensure_network(self, run: RunInfo) -> list[Resource]:
        """Nothing to create on loopback. Idempotent."""
        return []

    def list_resources(self, run_id: str) -> list[Resource]:
        """Local runs own no network resources."""
        return []

    def delete_resources(self, resources: list[Resource]) -> None:
        """Nothing to delete. Idempotent."""

    def startup_blocks(self, run: RunInfo, request: NodeRequest) -> StartupBlocks:
        """This machine's Python runs the agent; the dead-man switch and the power-off end the
        node's session and every process that carries its marker (local_sessions)."""
        metadata = (
            'export CLOUDTRAIN_NODE_HOST="${CLOUDTRAIN_NODE_HOST:-127.0.0.1}"\n'
            'export CLOUDTRAIN_NODE_PORT="${CLOUDTRAIN_NODE_PORT:-}"'
        )
        return StartupBlocks(
            python=sys.executable,
            metadata=metadata,
            self_shutdown=f"{END_NODE_SH}\n{DEADMAN_SH}",
            install_stack=False,
            power_off=POWER_OFF_SH,
        )

    def _read_meta(self, path: Path) -> dict[str, object] | None:
        try:
            meta = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        return meta if isinstance(meta, dict) else None

    def _alive(self, meta: dict[str, object], node_dir: Path) -> bool:
        """A node is alive while any process of its session is (zombies do not count), and
        only a session that is provably the node's counts (`_members`)."""
        popen = self._popen.get(str(meta["name"]))
        if popen is not None:
            popen.poll()  # reap our own child so it does not linger as a zombie
        return bool(self._members(meta, node_dir))

    def _to_node(self, meta: dict[str, object], state: str) -> Node:
        return Node(
            name=str(meta["name"]),
            run_id=str(meta["run_id"]),
            role=str(meta["role"]),
            index=int(meta["index"]),  # type: ignore[call-overload]
            state=state,  # type: ignore[arg-type]
            private_ip="127.0.0.1",
            spot=bool(meta.get("spot")),
            zone="local",
            instance_type=str(meta.get("instance_type", "local")),
            cloud_id=str(meta.get("pid")),
        )

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """Start the node's startup script in a new session. Idempotent: a live node is returned."""
        node_dir = self._node_dir(run.run_id, request.name)
        meta_path = node_dir / "node.json"
        with self._lock:
            meta = self._read_meta(meta_path)
            if meta and not meta.get("deleted") and self._alive(meta, node_dir):
                return self._to_node(meta, "running")
            node_dir.mkdir(parents=True, exist_ok=True)
            if meta:  # the predecessor's cgroup, empty now (nothing of it is alive)
                old = local_cgroups.name_for(node_dir, meta.get("token"))
                local_cgroups.remove(meta.get("cgroup"), old)
            # a node created again is a new machine on an empty disk: its predecessor's boot
            # claim and markers (jobs/startup.sh.j2's state folder) must not make the new boot
            # step aside, nor its checkpoints, model or partial downloads be found there
            wipe_disk(node_dir)
            script = node_dir / "startup.sh"
            script.write_text(request.startup_script)
            script.chmod(0o700)
            port = int(meta["port"]) if meta and meta.get("port") else _free_port()  # type: ignore[call-overload]
            env = dict(os.environ)
            env.update(
                CLOUDTRAIN_NODE_HOST="127.0.0.1",
                CLOUDTRAIN_NODE_PORT=str(port),
                CLOUDTRAIN_NODE_NAME=request.name,
            )
            env[WORK_ENV] = str(node_dir)
            token = secrets.token_hex(8)  # new with each node made: its processes' marker
            env[NODE_ENV] = node_marker(node_dir, token)
            cgroup = local_cgroups.create(str(local_cgroups.name_for(node_dir, token)))
            procs = local_cgroups.procs_file(cgroup) if cgroup else None
            proc = start_session(script, node_dir, env, procs)
            self._popen[request.name] = proc
            meta = {
                "name": request.name,
                "run_id": run.run_id,
                "role": request.role,
                "index": request.index,
                "pid": proc.pid,
                "start": start_stamp(proc.pid),
                "port": port,
                "token": token,
                "cgroup": cgroup,
                "spot": request.spot,
                "instance_type": request.instance_type,
                "labels": {**run_labels(run.run_id, request.role, request.index), **request.labels},
                "created_at": time.time(),
                "deleted": False,
            }
            self._write_meta(meta_path, meta)
            return self._to_node(meta, "running")

    def list_nodes(self, run_id: str) -> list[Node]:
        """Nodes from their node.json files; a node whose session is gone is 'terminated', and
        one marked deleted is listed only while a process of it still runs."""
        nodes_dir = self._run_dir(run_id) / "nodes"
        out: list[Node] = []
        if not nodes_dir.is_dir():
            return out
        for meta_path in sorted(nodes_dir.glob("*/node.json")):
            meta = self._read_meta(meta_path)
            if not meta:
                continue
            if meta.get("name") != meta_path.parent.name or meta.get("run_id") != run_id:
                continue  # not what create_node wrote for this folder: no node of this run
            alive = self._alive(meta, meta_path.parent)
            if meta.get("deleted") and not alive:  # a node marked deleted that still runs
                continue  # is listed: only its processes say it is gone
            out.append(self._to_node(meta, "running" if alive else "terminated"))
        return out

    def inventory(self) -> list[Tagged]:
        """Every node of every run under this root that is not deleted (live or not: a node
        whose session ended still has its folder), from its node.json. Read-only; blocks
        only on the disk."""
        out: list[Tagged] = []
        for meta_path in sorted(self.root.glob("runs/*/nodes/*/node.json")):
            meta = self._read_meta(meta_path)
            if not meta or meta.get("deleted") or "run_id" not in meta or "name" not in meta:
                continue
            created = meta.get("created_at")
            out.append(
                Tagged(
                    run_id=str(meta["run_id"]),
                    kind="node",
                    id=str(meta["name"]),
                    created=float(created) if isinstance(created, int | float) else None,
                    instance_type=str(meta.get("instance_type", "local")),
                    region="local",
                )
            )
        return out

    def delete_node(self, node: Node) -> None:
        """Kill every process of the node (`_members`: TERM, then KILL) and verify none is
        left. Idempotent; blocks until none is left."""
        node_dir = self._node_dir(node.run_id, node.name)
        meta_path = node_dir / "node.json"
        meta = self._read_meta(meta_path)
        if not meta:
            return
        # marked first: a node deleting itself (the controller node, last) dies in the kill;
        # a marked node is still listed while any process of it runs (list_nodes)
        meta["deleted"] = True
        meta["deleted_at"] = time.time()
        self._write_meta(meta_path, meta)
        if self._members(meta, node_dir):  # only processes that are provably this node's
            self._kill(meta, node_dir, node.name)
        popen = self._popen.pop(node.name, None)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=1)
        if not self._members(meta, node_dir):  # its disk goes with it (nothing runs there)
            wipe_disk(node_dir)
            cgroup_name = local_cgroups.name_for(node_dir, meta.get("token"))
            local_cgroups.remove(meta.get("cgroup"), cgroup_name)

    def _kill(self, meta: dict[str, object], node_dir: Path, name: str) -> None:
        """End every process of the node: TERM, KILL_GRACE_S, then KILL (its cgroup's
        cgroup.kill first, where it has one). Raises ProviderError if any survives."""
        cgroup = meta.get("cgroup")
        cgroup_name = local_cgroups.name_for(node_dir, meta.get("token"))

        def members() -> list[int]:
            return self._members(meta, node_dir)

        def kill_all() -> bool:
            return local_cgroups.kill(cgroup, cgroup_name)

        if not kill_members(members, KILL_GRACE_S, kill_all):
            raise ProviderError(
                f"node {name}: processes {members()} survived SIGKILL",
                hint="check them with `ps -o pid,sid,cmd -p PID`",
            )

    def console_output(self, node: Node) -> str:
        """The node's console log (stdout and stderr of its startup script)."""
        path = self._node_dir(node.run_id, node.name) / "console.log"
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class LocalProvider(Provider):
    """This machine as a cloud: `options['root']` overrides where node folders go."""

    name = "local"

    def __init__(self, config: ProviderConfig | None = None) -> None:
        """Creates nothing. Raises UsageError for a malformed $CLOUDTRAIN_LOCAL_PORTS, so a run
        is refused before its bucket exists rather than at its first node."""
        super().__init__(config or ProviderConfig(name="local"))
        _port_range()
        root = self.config.options.get("root")
        self.root = Path(root) if root else cloudtrain_home() / "local"
        self._compute = LocalCompute(self.root)

    @property
    def compute(self) -> LocalCompute:
        return self._compute

    def store(self, uri: str) -> LocalStore:
        """A folder store for a file:// URI."""
        return LocalStore(uri)

    def default_store_uri(self, run_id: str) -> str:
        """One folder bucket for all local runs: `$CLOUDTRAIN_HOME/buckets/local`."""
        return _path_to_uri(cloudtrain_home() / "buckets" / "local")
