"""Bring this machine's ledger up to date with a run's journal in its bucket
(cloudtrain/state/journal.py), so `status`, `logs`, `cost`, `down` and `attach` work from any
machine given the run id and its provider. Imports no SDK at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cloudtrain.core.errors import UsageError

if TYPE_CHECKING:
    from cloudtrain.jobspec.run_ids import RunRef
    from cloudtrain.state.ledger import Ledger, RunRecord


def sync_run(
    run_id: RunRef,
    *,
    provider: str | None = None,
    region: str | None = None,
    account: str | None = None,
    store_uri: str | None = None,
    ledger: Ledger | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunRecord:
    """The ledger's record of the run after importing the run's journal entries it lacks.
    `run_id` was parsed at the edge (`cli.common.run_ref`, `cloudtrain.api`): trusted here.

    - The ledger has the run (`run_id` may then be a unique prefix): import what is new
      (`import_journal(incremental=True)`) from the bucket the run records; a bucket that
      cannot be read is a warning to `warn` and the ledger's record is returned as it is.
    - It has not, and `provider` is given (`region`, `account`: the GCP project / Azure
      subscription, as for `down`): import the whole journal from `store_uri` (default: the
      provider's bucket for the run, `default_store_uri`); `run_id` must be a whole run id
      (`parse_run_id` narrows the reference: its UsageError for a prefix). UsageError when
      the bucket holds no journal of the run; the store's errors propagate.
    - Neither: the ledger's "no run" UsageError (`Ledger.find_run`).

    Idempotent; blocks for one listing of the journal and one read per new entry. `ledger`:
    default $CLOUDTRAIN_HOME's."""
    from cloudtrain.jobspec.run_ids import parse_run_id
    from cloudtrain.run import build as api_build
    from cloudtrain.state.journal import import_journal, try_import

    the_ledger = ledger or api_build.ledger()
    rec = the_ledger.get_run(run_id)
    if rec is None and provider is None:
        rec = the_ledger.find_run(run_id)  # a unique prefix, or a clear "no run" error
    if rec is not None:
        if rec.store_uri:
            store = api_build.record_provider(rec).store(rec.store_uri)
            if try_import(the_ledger, store, rec.run_id, warn=warn):
                rec = the_ledger.get_run(rec.run_id) or rec
        return rec
    assert provider is not None
    # no record: the journal's keys are matched exactly, so only a whole run id will do
    rid = parse_run_id(run_id)
    prov = api_build.provider(provider, region, None, account)
    store = prov.store(store_uri or prov.default_store_uri(rid))
    import_journal(the_ledger, store, rid, warn=warn)
    found = the_ledger.get_run(rid)
    if found is None:
        raise UsageError(
            f"no run {rid!r} in the ledger at {the_ledger.path}, and no journal of it in "
            f"{store.uri}",
            hint="check the run id, --provider and --region (a run started with "
            "--detach --no-controller or before cloudtrain kept journals has none)",
        )
    return found
