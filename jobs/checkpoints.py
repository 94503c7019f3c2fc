"""The node agent's checkpoints (a mixin of `jobs.agent.Agent`): the chief mirrors its checkpoint
folder to the run's `checkpoints/` and its TensorBoard folder to `tensorboard/` as they change,
every node restores the checkpoints at the start of an attempt (after the chief's
`checkpoints-ready` barrier), and the chief uploads `model/` on success.
Keys: jobs/protocol.py. Standard library only (node-side: Python 3.10+).

Transfers run up to MAX_TRANSFERS files at a time (a thread pool per call; every ObjectStore is
thread-safe). A small file is read and written in one request (`store.put`/`store.get`: no
transfer machinery, one round trip); a larger one goes through `put_file`/`get_file`, which on
S3 and Azure also sends its parts in parallel. A mirror uploads the files named `checkpoint`
(TensorFlow's pointer to the latest checkpoint) after every other changed file, and deletes what
is gone after that, so the bucket never names a checkpoint whose files are not there yet.

While files move, the agent's `activity` says how far ("restoring 3.1/5.0 GB", "uploading
checkpoints 0.4/2.0 GB", "uploading the model 12.0/80.5 MB"; "" when done): its heartbeat thread
carries it to the controller's live view. Mirrors skip the hidden sidecars in which downloads
collect their bytes (`providers/transfer.py`: `is_sidecar`), and a restore keeps the sidecars of
the files it fetches, so a restore cut short resumes where it was (a new agent process too).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

from cloudtrain.core.errors import TooLarge
from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.protocol import ClusterDoc
from cloudtrain.providers.change_wait import ChangeWaiter
from cloudtrain.providers.transfer import is_sidecar, sidecar_path

MAX_TRANSFERS = 8  # files in flight at once
SMALL_FILE = 8 * 1024 * 1024  # up to this size a file travels in one put/get request
POINTER = "checkpoint"  # tf.train.CheckpointManager's "latest checkpoint" file: uploaded last
SHOW_AFTER_S = 1.0  # a transfer shows in the agent's `activity` once it lasts this long

T = TypeVar("T")
Signature = tuple[int, int]  # (size, mtime_ns): a file whose signature changed is uploaded again


def run_parallel(
    fn: Callable[[T], bool], items: Sequence[T]
) -> tuple[list[T], BaseException | None]:
    """Call `fn(item)` for every item, up to MAX_TRANSFERS at a time (inline for one item).

    Returns the items whose call returned True and the first error raised, if any; after an
    error, calls not yet started are cancelled and the running ones finish. An interruption of
    the waiting thread (e.g. the agent's SIGTERM handler raising) cancels what has not started
    and propagates at once. Blocks."""
    if len(items) <= 1:
        try:
            return [item for item in items if fn(item)], None
        except Exception as exc:  # returned to the caller, which raises it
            return [], exc
    pool = ThreadPoolExecutor(min(MAX_TRANSFERS, len(items)), thread_name_prefix="ct-transfer")
    try:
        futures: list[tuple[T, Future[bool]]] = [(item, pool.submit(fn, item)) for item in items]
        wait([f for _, f in futures], return_when=FIRST_EXCEPTION)
        pool.shutdown(wait=True, cancel_futures=True)  # after an error: start nothing more
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    done: list[T] = []
    error: BaseException | None = None
    for item, future in futures:
        if future.cancelled():
            continue
        exc = future.exception()
        if exc is not None:
            error = error or exc
        elif future.result():
            done.append(item)
    return done, error


def inside_folder(rel: str) -> bool:
    """Whether `rel` (a listed key less the checkpoints prefix) names a file inside the folder
    it is restored to: relative, without an empty, '.' or '..' part (a node can write a key
    that leads out of it on a cloud's store). Pure."""
    return bool(rel) and all(part not in ("", ".", "..") for part in rel.split("/"))


def fmt_progress(done: int, total: int) -> str:
    """'3.1/5.0 GB': `done` of `total` bytes in the unit of the total (KB, MB or GB: powers of
    1000), one decimal. Pure."""
    unit, scale = "KB", 1e3
    for name, size in (("MB", 1e6), ("GB", 1e9)):
        if total >= size:
            unit, scale = name, size
    return f"{done / scale:.1f}/{total / scale:.1f} {unit}"


class Progress:
    """Bytes moved of a known total, counted from any thread (`add`); `text()` says how far.
    Thread-safe."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total = what, total
        self.moved = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        """`n` more bytes moved (counted up to the total: a retried part may come twice)."""
        with self._lock:
            self.moved = min(self.total, self.moved + max(0, n))

    def text(self) -> str:
        """ "<what> 3.1/5.0 GB", or "" while the transfer is younger than SHOW_AFTER_S (a quick
        one would only flicker in the live view). Pure but for the clock."""
        if time.monotonic() - self.started < SHOW_AFTER_S:
            return ""
        with self._lock:
            return f"{self.what} {fmt_progress(self.moved, self.total)}"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write `path` whole: a temporary file in the same folder, renamed when complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _clear_folder(root: Path, keep: set[Path]) -> None:
    """Delete everything under `root` (the folder stays) but the files in `keep` (and the
    folders holding them). Blocks; a file that vanishes meanwhile is fine."""
    for dirpath, dirs, files in os.walk(root, topdown=False):
        folder = Path(dirpath)
        for fname in files:
            path = folder / fname
            if path not in keep:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        for dname in dirs:
            sub = folder / dname
            if sub.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    sub.unlink()
            else:
                with contextlib.suppress(OSError):  # not empty: it holds a kept sidecar
                    sub.rmdir()


class Checkpoints:
    """Checkpoint and TensorBoard sync, restore, the restore barrier and the model upload. The
    agent owns the state these read (store, folders, attempt, cluster) and `tick()`; every
    method blocks on the store. Not to be called from two threads at once."""

    store: Any
    run_id: str
    me: str
    attempt: int
    cluster: ClusterDoc
    ckpt_dir: Path
    model_dir: Path
    tb_dir: Path
    _synced: dict[str, Signature]
    _progress: Progress | None = None  # the transfer under way (one at a time)
    say: Callable[[str], None]  # a line into the node's log stream

    @property
    def is_chief(self) -> bool:
        raise NotImplementedError

    def tick(self, now: float | None = None) -> None:
        raise NotImplementedError

    def _read(self, kind: Any, key: str) -> Any:
        raise NotImplementedError

    @property
    def activity(self) -> str:
        """What the agent is busy with besides the training, for its heartbeat: the transfer
        under way once it lasts SHOW_AFTER_S ("restoring 3.1/5.0 GB"), else "". Thread-safe."""
        progress = self._progress
        return progress.text() if progress is not None else ""

    @contextlib.contextmanager
    def _transfer(self, what: str, total: int) -> Iterator[Progress]:
        """The transfer of `total` bytes the block makes, shown in `activity` until it ends."""
        progress = self._progress = Progress(what, total)
        try:
            yield progress
        finally:
            self._progress = None

    def _local_files(self, root: Path) -> dict[str, Signature]:
        """Every file under `root` (none if it does not exist) but downloads' sidecars:
        relative path -> signature."""
        out: dict[str, Signature] = {}
        for dirpath, _dirs, files in os.walk(root):
            for fname in files:
                if is_sidecar(fname):
                    continue
                path = Path(dirpath) / fname
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
        return out

    def _upload(self, key: str, path: Path, size: int, progress: Progress) -> bool:
        """Upload one file, counting its bytes in `progress`: True, or False if it is gone
        (deleted since it was listed)."""
        try:
            if size <= SMALL_FILE:
                data = path.read_bytes()
                self.store.put(key, data)
                progress.add(len(data))
            else:
                self.store.put_file(key, str(path), progress=progress.add)
        except FileNotFoundError:
            return False
        return True

    def _upload_files(
        self,
        root: Path,
        prefix: str,
        files: dict[str, Signature],
        synced: dict[str, Signature],
        what: str,
    ) -> int:
        """Upload `files` (relative path -> signature) under `prefix`, in parallel: the largest
        first, the `checkpoint` pointers after all the others; `activity` says "<what> 1.2/3.4
        GB" meanwhile. Records each uploaded file's signature in `synced` (even when another
        upload failed, then re-raises the first error; the pointers are then not uploaded).
        Returns the number of files uploaded."""
        if not files:
            return 0
        pointers = sorted(rel for rel in files if rel.rsplit("/", 1)[-1] == POINTER)
        rest = sorted(set(files) - set(pointers), key=lambda rel: (-files[rel][0], rel))
        uploaded = 0
        with self._transfer(what, sum(sig[0] for sig in files.values())) as progress:
            for batch in (rest, pointers):
                done, error = run_parallel(
                    lambda rel: self._upload(f"{prefix}{rel}", root / rel, files[rel][0], progress),
                    batch,
                )
                for rel in done:
                    synced[rel] = files[rel]
                uploaded += len(done)
                if error is not None:
                    raise error
        return uploaded

    def _mirror(self, root: Path, prefix: str, synced: dict[str, Signature], what: str) -> int:
        """Make `prefix` a copy of the folder `root`: upload the files whose signature differs
        from `synced` (new, changed, grown: the whole file again; `what` names them in
        `activity`), then delete the objects of the files that are gone. `synced` records what
        the bucket has. Returns the number of files uploaded; a file that vanishes mid-sync is
        skipped. Idempotent; blocks."""
        files = self._local_files(root)
        changed = {rel: sig for rel, sig in files.items() if synced.get(rel) != sig}
        uploaded = self._upload_files(root, prefix, changed, synced, what)
        gone = sorted(set(synced) - set(files))

        def delete(rel: str) -> bool:
            self.store.delete(f"{prefix}{rel}")
            return True

        deleted, error = run_parallel(delete, gone)
        for rel in deleted:
            del synced[rel]
        if error is not None:
            raise error
        return uploaded

    def sync_checkpoints(self) -> int:
        """Mirror the chief's checkpoint folder to `checkpoints/` (uploads and deletions).
        Returns the number of files uploaded. Files that vanish mid-sync are skipped."""
        prefix = proto.checkpoints_prefix(self.run_id)
        return self._mirror(self.ckpt_dir, prefix, self._synced, "uploading checkpoints")

    def superseded(self) -> int | None:
        """The run's attempt when the controller has begun one after this node's (cluster.json
        says so), else None. A stopping chief of an attempt that is over sends nothing more: the
        next attempt's nodes restore the bucket's checkpoints, and one that landed in between
        would give them different ones (a Slurm allocation's processes outlive its end by
        KillWait). Blocks for one GET; None when cluster.json cannot be read."""
        cluster = self._read(ClusterDoc, proto.cluster_key(self.run_id))
        return cluster.attempt if cluster and cluster.attempt > self.attempt else None

    def sync_tensorboard(self) -> int:
        """Mirror the chief's TensorBoard folder (`tb_dir`; none yet: 0) to `tensorboard/`. An
        event file that grew is uploaded whole again. Returns the number of files uploaded.
        Idempotent; blocks."""
        synced: dict[str, Signature] | None = getattr(self, "_tb_synced", None)
        if synced is None:
            synced = self._tb_synced = {}
        prefix = proto.tensorboard_prefix(self.run_id)
        return self._mirror(self.tb_dir, prefix, synced, "uploading TensorBoard files")

    def restore_checkpoints(self) -> int:
        """Replace the local checkpoint folder with the bucket's copy (downloads in parallel;
        each file appears whole; `activity` says "restoring 1.2/3.4 GB" meanwhile). What was
        there goes, but the sidecars of the large files being fetched (get_file's): a restore
        cut short resumes them. A file is read into memory only up to SMALL_FILE: one that
        grew past it since the listing (a node rewrote it) goes to disk like a large one; a
        key that leads out of the folder (`inside_folder`) is skipped, said in the logs.
        Returns files restored. Blocks."""
        base = proto.checkpoints_prefix(self.run_id)
        objects = []
        for obj in self.store.list(base):
            if inside_folder(obj.key[len(base) :]):
                objects.append(obj)
            else:
                self.say(f"skipped {obj.key} in the bucket: it leads out of the checkpoint folder")
        dests = [self.ckpt_dir / obj.key[len(base) :] for obj in objects]
        resumable = {
            sidecar_path(dest)
            for obj, dest in zip(objects, dests, strict=True)
            if obj.size > SMALL_FILE
        }
        _clear_folder(self.ckpt_dir, keep=resumable)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        total = sum(obj.size for obj in objects)
        with self._transfer("restoring", total) as progress:

            def fetch(index: int) -> bool:
                obj, dest = objects[index], dests[index]
                if obj.size <= SMALL_FILE:
                    with contextlib.suppress(TooLarge):  # grown since the listing: to disk
                        data = self.store.get(obj.key, max_bytes=SMALL_FILE)
                        _write_atomically(dest, data)
                        progress.add(len(data))
                        return True
                self.store.get_file(obj.key, str(dest), progress=progress.add)
                return True

            _done, error = run_parallel(fetch, range(len(objects)))
        if error is not None:
            raise error
        self._synced = self._local_files(self.ckpt_dir)
        return len(objects)

    def upload_model(self) -> int:
        """Upload the chief's model folder to `model/` (in parallel; `activity` says "uploading
        the model 1.2/3.4 GB" meanwhile). Returns the number of files. Idempotent; blocks."""
        files = self._local_files(self.model_dir)
        prefix = proto.model_prefix(self.run_id)
        return self._upload_files(self.model_dir, prefix, files, {}, "uploading the model")

    def checkpoint_barrier(self) -> None:
        """Every node restores the same checkpoint: the chief flushes what it has and writes
        `attempt-<n>/checkpoints-ready`; the others wait for that marker before restoring.
        Raises StopRequested, NewAttempt or TimeoutError."""
        marker = proto.checkpoints_ready_key(self.run_id, self.attempt)
        if self.is_chief:
            self.sync_checkpoints()
            self.store.put(marker, proto.CheckpointsReady(time=time.time(), by=self.me).to_json())
            return
        deadline = time.time() + self.cluster.rendezvous_timeout_s
        # on local, up as soon as the marker lands (providers/change_wait.py)
        waiter = ChangeWaiter(self.store.uri, [proto.attempt_prefix(self.run_id, self.attempt)])
        while not self.store.list(marker):
            if time.time() > deadline:
                raise TimeoutError("rendezvous timed out waiting for the chief's checkpoints")
            self.tick()
            waiter.wait(self.cluster.poll_s)
