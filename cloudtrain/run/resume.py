"""Resuming a run: a new run that starts from an earlier run's checkpoints.

`resume_source(ledger, run_id)` checks, before anything is created, that the earlier run is over
and left checkpoints; `copy_checkpoints()` copies them into the new run's `checkpoints/` before
its nodes start, where every agent restores from (the training's BackupAndRestore then carries
on at the next epoch). The copy goes through this machine, file by file, in parallel; the stores
retry each call themselves (the registry wraps them once).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.core.errors import UsageError
from cloudtrain.jobs.protocol import checkpoints_prefix
from cloudtrain.providers.base import ObjectStore
from cloudtrain.providers.parallel import parallel_map
from cloudtrain.state.ledger import Ledger, RunRecord

COPY_PARALLEL = 8


@dataclass(frozen=True)
class ResumeSource:
    """Where the checkpoints of the run being resumed are."""

    run_id: str
    store_uri: str
    files: int


def resume_source(
    ledger: Ledger, run_id: str, store: ObjectStore
) -> tuple[RunRecord, ResumeSource]:
    """The earlier run (a unique prefix of its id) and its checkpoints in `store` (the run's
    own store). Raises UsageError while the run still runs or when it left no checkpoints.
    Read-only; blocks for one listing."""
    rec = ledger.find_run(run_id)
    if rec.status != "done":
        raise UsageError(
            f"run {rec.run_id} is still {rec.status}",
            hint=f"wait for it, or stop it with `cloudtrain down {rec.run_id}` first",
        )
    found = store.list(checkpoints_prefix(rec.run_id))
    if not found:
        raise UsageError(
            f"run {rec.run_id} left no checkpoints in {rec.store_uri} to resume from",
            hint="only a run whose training saved checkpoints can be resumed",
        )
    return rec, ResumeSource(rec.run_id, str(rec.store_uri), len(found))


def copy_checkpoints(
    source: ObjectStore, source_run: str, target: ObjectStore, target_run: str
) -> int:
    """Copy `checkpoints/` of one run into another run's prefix (another store is fine), each
    call retried on transient errors by the stores. Idempotent (files are replaced whole);
    blocks. Returns how many files were copied."""
    src, dst = checkpoints_prefix(source_run), checkpoints_prefix(target_run)
    keys = [info.key for info in source.list(src)]
    with tempfile.TemporaryDirectory(prefix="cloudtrain-resume-") as tmp:

        def copy(key: str) -> None:
            local = Path(tmp) / key
            source.get_file(key, str(local))
            target.put_file(dst + key[len(src) :], str(local))
            local.unlink()

        errors = [r for r in parallel_map(copy, keys, COPY_PARALLEL) if isinstance(r, Exception)]
    if errors:
        raise errors[0]
    return len(keys)
