"""A run's TensorBoard event files on this machine: an incremental mirror of its bucket's
tensorboard/ prefix (jobs/protocol.py `tensorboard_prefix`, written by the chief's agent) into a
local cache, and the TensorBoard process that serves that cache (`cloudtrain tensorboard`).

TensorBoard never reads the bucket itself (slow, and costly on GCS): `TbMirror.sync` lists the
prefix once per round and downloads only the objects whose (size, updated) changed since the
last round, in parallel, each to a temporary file renamed into place, so TensorBoard never reads
half a file. What it downloaded is kept in a small JSON state file in the cache, so the next
`cloudtrain tensorboard` of the run is incremental too. Local files whose object is gone are
deleted: the cache (`cache_dir`, under the run's folder in $CLOUDTRAIN_HOME) is cloudtrain's.

Keys are untrusted (anyone who can write the bucket writes them): a key that would leave the
cache (`..`, an absolute path, a drive, a backslash) or name the mirror's own files is refused,
never written.

`Board` runs TensorBoard as a child process on 127.0.0.1 and always ends it. TensorBoard is an
extra (`pip install 'cloudtrain[tensorboard]'`; TensorFlow 2.21 no longer brings it): nothing here
imports it; `require_tensorboard` checks it is there.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from cloudtrain.core.errors import CloudtrainError, UsageError
from cloudtrain.core.paths import runs_dir
from cloudtrain.jobs.protocol import tensorboard_prefix

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectInfo, ObjectStore

OWN_PREFIX = ".cloudtrain-"  # the mirror's own files in the cache; no key may name one
STATE_NAME = f"{OWN_PREFIX}sync.json"  # rel -> [size, updated] of each object downloaded
LOCK_NAME = f"{OWN_PREFIX}sync.lock"  # one sync round of a cache at a time, across processes
TMP_PREFIX = f"{OWN_PREFIX}tmp-"  # a download in progress (no "tfevents": TensorBoard skips it)
STATE_VERSION = 1
WORKERS = 4  # parallel downloads
EVENTS_MARK = "tfevents"  # what TensorBoard looks for in an event file's name
INSTALL_HINT = "pip install 'cloudtrain[tensorboard]'"
HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0  # TensorBoard imports TensorFlow when it is installed: seconds
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def cache_dir(run_id: str) -> Path:
    """The run's local TensorBoard cache: `runs_dir()/<run id>/tensorboard`. Pure (creates
    nothing); `run_id` must already be a checked run id (run_ids.check_run_ref)."""
    return runs_dir() / run_id / "tensorboard"


def safe_rel(rel: str) -> bool:
    """Whether `rel` (a key below the prefix) is a relative path that stays inside a folder and
    names none of the mirror's own files: no empty, `.` or `..` part, no leading `/`, no
    backslash, drive letter or control character (which a terminal would act on). Pure."""
    if not rel or "\\" in rel or _DRIVE.match(rel) or _CONTROL.search(rel):
        return False
    parts = rel.split("/")
    return not any(p in ("", ".", "..") or p.startswith(OWN_PREFIX) for p in parts)


@dataclass(frozen=True)
class SyncCounts:
    """What one round did. `refused`: keys that would leave the cache (never written);
    `failed`: "key: why" of downloads that failed (retried next round)."""

    listed: int  # objects under the prefix
    downloaded: int
    unchanged: int
    deleted: int  # local files whose object is gone
    refused: tuple[str, ...]
    failed: tuple[str, ...]
    event_files: int  # files named like TensorBoard event files in the cache after the round
    bytes: int  # downloaded

    def describe(self) -> str:
        """One line for people. Pure."""
        text = (
            f"{self.downloaded} downloaded ({self.bytes} bytes), {self.unchanged} unchanged, "
            f"{self.deleted} deleted; {self.event_files} event file(s)"
        )
        if self.refused:
            text += f"; refused {len(self.refused)} unsafe key(s): " + ", ".join(
                repr(k) for k in self.refused[:3]
            )
        if self.failed:
            text += f"; {len(self.failed)} failed: " + "; ".join(self.failed[:3])
        return text


class TbMirror:
    """Mirrors `store`'s tensorboard/ prefix of `run_id` into `cache` (default `cache_dir`).
    One round at a time per cache (an flock, across processes); the store must be thread-safe
    (every provider's is)."""

    def __init__(
        self,
        store: ObjectStore,
        run_id: str,
        cache: Path | None = None,
        workers: int = WORKERS,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.prefix = tensorboard_prefix(run_id)
        self.cache = cache if cache is not None else cache_dir(run_id)
        self.workers = max(1, workers)

    @property
    def where(self) -> str:
        """The mirrored prefix as a URI, for messages. Pure."""
        return f"{self.store.uri.rstrip('/')}/{self.prefix}"

    def sync(self) -> SyncCounts:
        """One round: list the prefix, download what changed (in parallel, temp file + rename),
        delete local files whose object is gone, save the state. Idempotent (a second round
        with nothing new downloads nothing); blocks for one listing and the downloads, and while
        another process syncs the same cache. A failed listing raises the store's error and
        changes nothing; a failed download is counted in `failed` and retried next round."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with self._locked():
            objects = self.store.list(self.prefix)
            wanted, refused = self._accepted(objects)
            state = self._load_state()
            todo = [rel for rel, obj in wanted.items() if self._stale(rel, obj, state)]
            got, failed = self._download(todo, wanted)
            keep = {rel: [o.size, o.updated] for rel, o in wanted.items() if rel not in failed}
            self._save_state(keep)
            deleted = self._delete_others(set(wanted))
            events = sum(1 for rel in wanted if EVENTS_MARK in rel.rsplit("/", 1)[-1])
        return SyncCounts(
            listed=len(objects),
            downloaded=len(got),
            unchanged=len(wanted) - len(todo),
            deleted=deleted,
            refused=tuple(refused),
            failed=tuple(f"{self.prefix}{rel}: {why}" for rel, why in failed.items()),
            event_files=events,
            bytes=sum(got.values()),
        )

    # --- one round's parts -----------------------------------------------------------------

    def _accepted(self, objects: list[ObjectInfo]) -> tuple[dict[str, ObjectInfo], list[str]]:
        """The objects to mirror by their path below the prefix, and the refused keys. Folder
        markers (a key ending in '/') are neither."""
        wanted: dict[str, ObjectInfo] = {}
        refused: list[str] = []
        root = self.cache.resolve()
        for obj in objects:
            rel = obj.key[len(self.prefix) :] if obj.key.startswith(self.prefix) else ""
            if obj.key.startswith(self.prefix) and (rel == "" or rel.endswith("/")):
                continue  # a folder marker (a console's "create folder")
            if not safe_rel(rel) or not (self.cache / rel).resolve().is_relative_to(root):
                refused.append(obj.key)
                continue
            wanted[rel] = obj
        return wanted, refused

    def _stale(self, rel: str, obj: ObjectInfo, state: dict[str, Any]) -> bool:
        """Whether `rel` must be downloaded: the object changed since the state's round, or the
        local copy is missing or not its size."""
        if state.get(rel) != [obj.size, obj.updated]:
            return True
        try:
            return (self.cache / rel).stat().st_size != obj.size
        except OSError:
            return True

    def _download(
        self, todo: list[str], wanted: dict[str, ObjectInfo]
    ) -> tuple[dict[str, int], dict[str, str]]:
        """Download `todo` in parallel: (rel -> bytes) of the ones done, (rel -> why) of the
        ones that failed."""
        got: dict[str, int] = {}
        failed: dict[str, str] = {}
        if not todo:
            return got, failed
        with ThreadPoolExecutor(min(self.workers, len(todo)), "tb-sync") as pool:
            futures = {rel: pool.submit(self._fetch, rel, wanted[rel]) for rel in todo}
            for rel, future in futures.items():
                try:
                    got[rel] = future.result()
                except (CloudtrainError, OSError) as exc:
                    failed[rel] = str(exc) or type(exc).__name__
        return got, failed

    def _fetch(self, rel: str, obj: ObjectInfo) -> int:
        """Download one object to a temp file beside its place, then rename it there."""
        dest = self.cache / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=TMP_PREFIX)
        os.close(fd)
        try:
            self.store.get_file(obj.key, tmp)
            size = os.stat(tmp).st_size
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return size

    def _delete_others(self, wanted: set[str]) -> int:
        """Delete every file of the cache that is not a wanted object (its object is gone) and
        every leftover temp file (a round killed mid-download: no round runs now), then the
        folders left empty. Returns how many objects' files were deleted."""
        deleted = 0
        for dirpath, _dirs, files in os.walk(self.cache, topdown=False):
            folder = Path(dirpath)
            for name in files:
                path = folder / name
                rel = path.relative_to(self.cache).as_posix()
                if name.startswith(OWN_PREFIX):
                    if name.startswith(TMP_PREFIX):
                        path.unlink(missing_ok=True)
                    continue
                if rel not in wanted:
                    path.unlink(missing_ok=True)
                    deleted += 1
            if folder != self.cache:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
        return deleted

    # --- the state and the lock ------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        """rel -> [size, updated] of the last round; {} when missing, unreadable or another
        prefix's (everything is then checked again)."""
        try:
            doc = json.loads((self.cache / STATE_NAME).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("prefix") != self.prefix:
            return {}
        objects = doc.get("objects")
        return objects if isinstance(objects, dict) else {}

    def _save_state(self, objects: dict[str, list[Any]]) -> None:
        doc = {"version": STATE_VERSION, "prefix": self.prefix, "objects": objects}
        fd, tmp = tempfile.mkstemp(dir=self.cache, prefix=TMP_PREFIX)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh, sort_keys=True)
            os.replace(tmp, self.cache / STATE_NAME)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the cache's lock file (flock; blocks while another process holds it)."""
        import fcntl

        with open(self.cache / LOCK_NAME, "a") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --- serving ---------------------------------------------------------------------------------


def require_tensorboard() -> None:
    """UsageError naming the extra when this Python cannot import tensorboard (it runs the
    server). Imports the tensorboard package (light: its modules load lazily)."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise UsageError(
            f"TensorBoard is not installed in this Python ({sys.executable})",
            hint=f"{INSTALL_HINT}; TensorFlow 2.21 no longer brings it",
        ) from None


# Run in the child: ask the kernel to SIGTERM it when the process that started it dies (Linux;
# a SIGKILLed `cloudtrain tensorboard` leaks no server); have TensorBoard read event files with
# its own pure-Python reader rather than TensorFlow's, as where TensorFlow is not installed (its
# `tensorboard.compat.notf` switch; without it TensorBoard imports TensorFlow, which works too):
# it starts in half the time, and reading each file by name it follows a file that a round
# renamed into place; then run TensorBoard's own main.
_CHILD = """\
import os, runpy, signal, sys, types
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
sys.argv = ["tensorboard"] + sys.argv[2:]
runpy.run_module("tensorboard.main", run_name="__main__", alter_sys=True)
"""


def _reserve(port: int) -> socket.socket:
    """A socket bound (not listening) to 127.0.0.1:`port` (0: one the kernel picks) with
    SO_REUSEPORT, which TensorBoard (`--reuse_port=true`) binds too: the port is ours until
    TensorBoard listens on it. UsageError when the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((HOST, port))
        # another server with SO_REUSEPORT (another `cloudtrain tensorboard`'s) would share the
        # port, each answering half the requests: a port someone listens on is taken too
        try:
            socket.create_connection(sock.getsockname(), 1).close()
        except OSError:
            pass  # nobody listens: it is ours
        else:
            raise OSError(errno.EADDRINUSE, "another server listens on it")
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"port {port} on {HOST} is not free: {exc.strerror or exc}",
            hint="--port 0 picks a free one",
        ) from None
    return sock


class Board:
    """One TensorBoard process serving `logdir` on 127.0.0.1: `start()`, then `wait_ready()`
    for its URL. As a context manager, leaving it always ends the process (`stop`). Its output
    goes to `log_path`. `reload_s`: how often it rereads the folder. Not thread-safe."""

    def __init__(self, logdir: Path, port: int, log_path: Path, reload_s: float = 5.0) -> None:
        self.logdir = logdir
        self.port = port
        self.log_path = log_path
        self.reload_s = reload_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._reserved: socket.socket | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Board:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def start(self) -> None:
        """Start TensorBoard (UsageError without the package or when the port is taken).
        Returns at once; `port` is the real port from here on. Not idempotent."""
        require_tensorboard()
        self._reserved = _reserve(self.port)
        self.port = int(self._reserved.getsockname()[1])
        if not hasattr(socket, "SO_REUSEPORT"):  # TensorBoard could not share it: let go
            self._release()
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        flags = [
            f"--logdir={self.logdir}",
            f"--host={HOST}",
            f"--port={self.port}",
            "--reuse_port=true",
            "--load_fast=false",  # the Python loader (the Rust one has no file replacement)
            # a round renames a grown file into place: TensorFlow's reader (when TensorBoard
            # uses it after all) must reopen it; the pure-Python one reads by name anyway
            "--detect_file_replacement=true",
            f"--reload_interval={self.reload_s:g}",
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(os.getpid()), *flags],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us; we end it (stop)
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Block until TensorBoard answers HTTP; returns its URL. CloudtrainError (with the
        end of its log) when it exits first or does not answer within `timeout_s`."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        probe = f"{self.url}data/environment"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        while True:
            self.check()
            try:
                with opener.open(probe, timeout=2) as resp:
                    if resp.status == 200:
                        self._release()
                        return self.url
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise CloudtrainError(
                    f"TensorBoard did not answer on {self.url} within {timeout_s:.0f} s",
                    hint=f"its log: {self.log_path}",
                )
            time.sleep(0.2)

    def check(self) -> None:
        """CloudtrainError (with the end of its log) when the process has exited. Non-blocking."""
        assert self.proc is not None, "start() first"
        code = self.proc.poll()
        if code is not None:
            raise CloudtrainError(
                f"TensorBoard exited (code {code}): {self.log_tail()}",
                hint=f"its log: {self.log_path}",
            )

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Block until the process exits (its code) or `timeout_s` passes (None)."""
        assert self.proc is not None, "start() first"
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 3) -> str:
        """The last lines of its log, joined with ' | '. Reads the file."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())

    def stop(self) -> None:
        """End the process (SIGTERM to its process group, SIGKILL after STOP_TIMEOUT_S) and
        wait for it. Idempotent; blocks up to that long."""
        self._release()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _release(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
