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
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cloudtrain.core.env import NODE_HOST, NODE_NAME, NODE_PORT
from cloudtrain.core.errors import ProviderError
from cloudtrain.core.paths import cloudtrain_home
from cloudtrain.core.procid import environ_has, same_process, start_stamp
from cloudtrain.providers import local_cgroups
from cloudtrain.providers.base import (
    Compute,
    Node,
    NodeRequest,
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

# the bucket is a folder (its own module, for its size): part of the local provider's API
from cloudtrain.providers.local_store import LocalStore, _path_to_uri

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
            env.update({NODE_HOST.name: "127.0.0.1", NODE_PORT.name: str(port)})
            env[NODE_NAME.name] = request.name
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
