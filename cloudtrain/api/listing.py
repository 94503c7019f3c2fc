"""`list_runs`: the newest runs of the ledger with their live resources and cost, optionally
brought up to date with their journals first, within one deadline (what `cloudtrain ls`
shows)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cloudtrain.api.results import RunListing
from cloudtrain.run.build import ledger
from cloudtrain.run.journal_refresh import REFRESH_S

if TYPE_CHECKING:
    from cloudtrain.state.ledger import RunRecord


@dataclass(frozen=True)
class ListedRun(RunListing):
    """A `RunListing` that says whether its row is up to date with the run's journal:
    `refreshed` is False for a run not done, with a bucket, whose journal was not read (not
    asked, failed, or not read by the deadline): the row is what this ledger last saw."""

    refreshed: bool = True

    def to_dict(self) -> dict[str, Any]:
        """`RunListing.to_dict`, then `refreshed`. Pure."""
        return {**super().to_dict(), "refreshed": self.refreshed}


def list_runs(
    limit: int = 20,
    *,
    sync: bool = False,
    warn: Callable[[str], None] | None = None,
    deadline_s: float = REFRESH_S,
) -> list[RunListing]:
    """The newest `limit` runs of the ledger, with their live resources and cost (each a
    `ListedRun`). Read-only without `sync`.

    With `sync`, each listed run that is not `done` and has a bucket first takes in the new
    entries of its journal, so a run controlled elsewhere (a detached run's controller node)
    shows what its controller last wrote, not what this machine last saw. The journals are
    read in parallel, and the reads are waited for at most `deadline_s` in all
    (`journal_refresh.refresh_runs`); the ledger is written in this thread, after them. A run
    whose bucket or provider failed is one warning to `warn`; the runs not read by the
    deadline are one warning in all; both are listed as the ledger has them, `refreshed`
    False. Blocks at most about `deadline_s` then; idempotent."""
    from cloudtrain.run.journal_refresh import refresh_runs

    the_ledger = ledger()
    records = the_ledger.list_runs(limit=limit)
    due = {rec.run_id for rec in records if _due(rec)}
    fresh: dict[str, RunRecord] = {}
    unread: set[str] = set()
    if sync and due:
        done = refresh_runs(
            the_ledger, [r for r in records if r.run_id in due], deadline_s=deadline_s, warn=warn
        )
        fresh, unread = done.records, set(done.failed)
        _say_unread(list(done.failed.values()), done.late, deadline_s, warn)
    out: list[RunListing] = []
    for rec in records:
        rec = fresh.get(rec.run_id, rec)
        live = [x for x in the_ledger.resources(rec.run_id, live_only=True) if x.kind != "bucket"]
        refreshed = rec.run_id not in due or (rec.run_id in fresh and rec.run_id not in unread)
        out.append(ListedRun(rec, len(live), the_ledger.billed_cost(rec.run_id), refreshed))
    return out


def _due(rec: RunRecord) -> bool:
    """Whether the run's row may lag its journal: not done, and it has a bucket. Pure."""
    return rec.status != "done" and bool(rec.store_uri)


def _say_unread(
    failed: list[str],
    late: list[str],
    deadline_s: float,
    warn: Callable[[str], None] | None,
) -> None:
    """One warning per run whose journal could not be read, and one for all the runs whose
    read did not end by the deadline."""
    if warn is None:
        return
    for line in failed:
        warn(line)
    if late:
        warn(
            f"{len(late)} run(s) not refreshed: their journals were not read within "
            f"{deadline_s:g}s (a cloud that does not answer?); listed as this ledger last saw "
            "them"
        )
