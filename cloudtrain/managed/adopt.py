"""Adopt a run someone else started: rebuild its Orchestrator from the bucket (issue 17).

The controller node and `cloudtrain attach` both take over a run that exists already. With the
run's journal imported into their ledger (cloudtrain/state/journal.py) and its launch document
(cloudtrain/state/launch_doc.py), they rebuild the same Orchestrator the laptop ran, at the same
attempt, deadline and restart counts, and watch it with the same code (`Orchestrator.follow`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cloudtrain import __version__
from cloudtrain.core.errors import NotFound, TooLarge, UsageError
from cloudtrain.jobs import protocol
from cloudtrain.jobs.protocol import ClusterDoc
from cloudtrain.plan.planner import Plan
from cloudtrain.providers.base import ObjectStore, Provider
from cloudtrain.run.bundle import Bundle
from cloudtrain.run.orchestrator import Orchestrator
from cloudtrain.run.view import Observer
from cloudtrain.state import launch_doc
from cloudtrain.state.lease import Lease
from cloudtrain.state.ledger import Ledger


def adopt(
    provider: Provider,
    ledger: Ledger,
    observer: Observer,
    lease: Lease,
    run_id: str,
    store_uri: str,
    spare: str = "",
) -> Orchestrator:
    """The run's Orchestrator, acting under `lease` (held: acquired by the caller), ready to
    `follow()`. `spare`: the caller's own node (the controller node), left for it to delete
    last. The ledger must hold the run (its journal imported). UsageError when the run cannot
    be adopted (no record, no launch document). Blocks (bucket reads)."""
    rec = ledger.get_run(run_id)
    if rec is None or not rec.plan_json:
        raise UsageError(f"run {run_id}: no record of it in the ledger or its journal")
    store = provider.store(store_uri)
    doc = launch_doc.read(store, run_id, ledger.run_key(run_id))  # this ledger's key first
    cluster = read_cluster(store, run_id)
    spec = doc.job_spec(cluster)
    plan = Plan.from_dict(rec.plan)
    options = dataclasses.replace(doc.run_options(), detach=False)
    orch = Orchestrator(
        spec, plan, provider, ledger, observer, options, run_id=run_id, store_uri=store_uri
    )
    orch.started = doc.started
    orch.deadline = cluster.deadline
    orch.zone = rec.zone
    orch.info = dataclasses.replace(
        orch.info, zone=rec.zone, store_uri=store_uri, deadline=cluster.deadline
    )
    orch.view.started = doc.started
    orch.attempt = cluster.attempt
    orch.cluster = cluster
    events = ledger.events(run_id)
    orch.restarts = sum(1 for e in events if e.kind == "restart")
    orch.error_retries = sum(1 for e in events if e.kind == "retry")
    # the bundle is in the bucket already: the nodes made from here fetch it by its sha256
    orch.bundle = Bundle(Path(), doc.bundle_sha256, 0, "", __version__, 0)
    orch.extra_hourly_usd = doc.controller_hourly_usd
    orch.spare = spare
    orch.take_lease(lease)
    return orch


def read_cluster(store: ObjectStore, run_id: str) -> ClusterDoc:
    """The run's cluster.json, read bounded (at most ClusterDoc.MAX_BYTES + 1). UsageError
    naming the key when there is none or it cannot be read (over its cap, too deep, ill-typed:
    a node may have rewritten it): a run is not adopted from a document it cannot trust to
    parse. Blocks for one GET; the store's other errors propagate."""
    key = protocol.cluster_key(run_id)
    where = f"{key} in {store.uri}"
    hint = f"`cloudtrain down {run_id}` still tears the run down"
    try:
        return ClusterDoc.from_json(store.get(key, max_bytes=ClusterDoc.MAX_BYTES))
    except NotFound:
        raise UsageError(f"run {run_id} has no {where}", hint=hint) from None
    except TooLarge:
        why = f"more than {ClusterDoc.MAX_BYTES} bytes"
    except protocol.ProtocolError as exc:
        why = str(exc)
    raise UsageError(f"run {run_id}: {where} cannot be read: {why}; not adopting it", hint=hint)
