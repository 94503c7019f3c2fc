"""The node agent's checkpoints (a mixin of `jobs.agent.Agent`): the chief mirrors its checkpoint
folder to the run's `checkpoints/` as it changes, every node restores it at the start of an
attempt (after the chief's `checkpoints-ready` barrier), and the chief uploads `model/` on success.
Keys: jobs/protocol.py. Standard library only (node-side: Python 3.10+).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.protocol import ClusterDoc


class Checkpoints:
    """Checkpoint sync, restore, the restore barrier and the model upload. The agent owns the
    state these read (store, folders, attempt, cluster) and `tick()`; every method blocks on
    the store."""

    store: Any
    run_id: str
    me: str
    attempt: int
    cluster: ClusterDoc
    ckpt_dir: Path
    model_dir: Path
    _synced: dict[str, tuple[int, int]]

    @property
    def is_chief(self) -> bool:
        raise NotImplementedError

    def tick(self, now: float | None = None) -> None:
        raise NotImplementedError

    def _local_files(self, root: Path) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for dirpath, _dirs, files in os.walk(root):
            for fname in files:
                path = Path(dirpath) / fname
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
        return out

    def sync_checkpoints(self) -> int:
        """Mirror the chief's checkpoint folder to `checkpoints/` (uploads and deletions).
        Returns the number of files uploaded. Files that vanish mid-sync are skipped."""
        files = self._local_files(self.ckpt_dir)
        base, uploaded = proto.checkpoints_prefix(self.run_id), 0
        for rel, sig in sorted(files.items()):
            if self._synced.get(rel) == sig:
                continue
            try:
                self.store.put_file(f"{base}{rel}", str(self.ckpt_dir / rel))
            except FileNotFoundError:
                continue
            self._synced[rel] = sig
            uploaded += 1
        for rel in set(self._synced) - set(files):
            self.store.delete(f"{base}{rel}")
            del self._synced[rel]
        return uploaded

    def restore_checkpoints(self) -> int:
        """Replace the local checkpoint folder with the bucket's copy. Returns files restored."""
        shutil.rmtree(self.ckpt_dir, ignore_errors=True)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        base = proto.checkpoints_prefix(self.run_id)
        objects = self.store.list(base)
        for obj in objects:
            self.store.get_file(obj.key, str(self.ckpt_dir / obj.key[len(base) :]))
        self._synced = self._local_files(self.ckpt_dir)
        return len(objects)

    def upload_model(self) -> int:
        """Upload the chief's model folder to `model/`. Returns the number of files."""
        files, base = self._local_files(self.model_dir), proto.model_prefix(self.run_id)
        for rel in files:
            self.store.put_file(f"{base}{rel}", str(self.model_dir / rel))
        return len(files)

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
        while not self.store.list(marker):
            if time.time() > deadline:
                raise TimeoutError("rendezvous timed out waiting for the chief's checkpoints")
            self.tick()
            time.sleep(self.cluster.poll_s)
