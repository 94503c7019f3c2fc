"""Tear a run down: nodes first (in parallel), then network and identity; the ledger follows.

Used at the end of every `cloudtrain run` and by `cloudtrain down RUN`. Idempotent: it asks the
cloud's tags what exists (`list_nodes`, `list_resources`) as well as the ledger, so it works after
a controller crash and even with the ledger file gone. Blocks until everything is confirmed gone.
Every cloud and bucket call is retried by the provider itself (the registry wraps it once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from cloudtrain.core.crashpoints import crash_point
from cloudtrain.core.errors import CloudtrainError, NotTheRuns, ProviderError
from cloudtrain.core.redact import MASK
from cloudtrain.jobs.bucket_reads import Skips, read_document
from cloudtrain.jobs.protocol import ClusterDoc, cluster_key, stop_key
from cloudtrain.jobs.trace import TEARDOWN, Tracer
from cloudtrain.jobspec.run_ids import RunRef
from cloudtrain.providers.base import Compute, Provider, Resource
from cloudtrain.state.ledger import ALLOCATION, BILLED_KINDS, Ledger

CONTROLLER_KIND_PREFIX = "controller-"  # the controller node's identity (Compute docs)


def spared_kind(compute: Compute, kind: str) -> bool:
    """Whether the controller node tearing its own run down leaves a resource of `kind` for
    its very end: its identity, and what holds its own VM (Compute.holds_nodes_kinds). Pure."""
    return kind.startswith(CONTROLLER_KIND_PREFIX) or kind in compute.holds_nodes_kinds


@dataclass(frozen=True)
class TeardownReport:
    """What teardown removed and how long it took."""

    nodes_deleted: list[str]
    resources_deleted: list[str]
    seconds: float


def request_stop(
    provider: Provider, store_uri: str | None, run_id: RunRef, reason: str
) -> bool:
    """Write `control/stop` so agents flush a checkpoint and stop. Best effort; idempotent.
    `run_id` was parsed at the edge (run_ids), or comes from the ledger (which holds only
    made or parsed ids): its shape is not checked again."""
    if not store_uri:
        return False
    with contextlib.suppress(CloudtrainError, OSError):
        provider.store(store_uri).put(stop_key(run_id), reason.encode())
        return True
    return False


SKIPS = Skips()  # the cluster.json documents the scrub could not read: one warning per key


def scrub_secrets(provider: Provider, store_uri: str | None, run_id: RunRef) -> bool:
    """Blank the secret env values in the run's `cluster.json` once no node needs them (after
    teardown): the bucket keeps the outputs, not the secrets. Best effort; idempotent. Returns
    whether a value was blanked. A document a node rewrote (over its cap, too deep, ill-typed)
    is left as it is, with one warning naming its key; at most its cap is read. `run_id`: as
    for `request_stop`."""
    if not store_uri:
        return False
    key = cluster_key(run_id)
    with contextlib.suppress(CloudtrainError, OSError, ValueError):
        store = provider.store(store_uri)
        doc = read_document(store, key, ClusterDoc, SKIPS)
        if doc is None:
            return False
        env = doc.env
        names = [n for n in doc.secrets if env.get(n) not in (None, MASK)]
        if names:
            env = {k: (MASK if k in names else v) for k, v in env.items()}
            store.put(key, dataclasses.replace(doc, env=env).to_json())
            return True
    return False


class _Steps:
    """Back-to-back spans of the teardown's steps, when traced."""

    def __init__(self, trace: Tracer | None) -> None:
        self.trace, self.at = trace, time.time()

    def done(self, name: str, detail: str = "") -> None:
        now = time.time()
        if self.trace is not None:
            self.trace.add(name, self.at, now, parent=TEARDOWN, detail=detail)
        self.at = now


REFUSED_EVENT = "refused"  # the ledger event of a delete refused: not the run's resource


def _delete_runs_own(
    compute: Compute,
    resources: list[Resource],
    ledger: Ledger | None,
    run_id: str,
    say: Callable[[str], None],
) -> set[tuple[str, str]]:
    """`compute.delete_resources`, where the adapter's refusal of a name that is not the run's
    (NotTheRuns: a forged or stale record; the others are deleted) is said, recorded as a
    `refused` event and the row dropped from the run's record (marked deleted: the run never
    made it), so a later `down` neither retries nor fails on it. Returns the refused (kind, id)
    pairs. Blocks; the adapter's other errors propagate."""
    try:
        compute.delete_resources(resources)
    except NotTheRuns as exc:
        say(f"warning: {exc.message}")
        if ledger is not None:
            ledger.event(run_id, REFUSED_EVENT, exc.message)
            for kind, rid in exc.refused:
                ledger.mark_deleted(run_id, kind, rid)
        return set(exc.refused)
    return set()


def settle_allocations(
    compute: Compute, ledger: Ledger, run_id: str, say: Callable[[str], None]
) -> None:
    """A gang compute's bill, once the run's allocations have ended: each one's ledger row
    lasts as long as the compute's own accounting says it ran (Slurm's sacct), a job that
    started and ended between two listings, never seen running, added at the run's price.
    Best effort: without the accounting (a cluster that will not answer), a warning, and the
    ledger's own times stay the bill. Idempotent; blocks (one call)."""
    try:
        accounted = compute.allocation_seconds(run_id)
    except CloudtrainError as exc:
        say(f"warning: the bill stays the controller's own count: {exc.message}")
        return
    rows = {r.cloud_id: r for r in ledger.resources(run_id) if r.kind == ALLOCATION}
    priced = next((r for r in rows.values() if r.price_hourly), None)
    for job, seconds in sorted(accounted.items()):
        row = rows.get(job)
        if row is None and (priced is None or not seconds):
            continue  # never ran (queued, then cancelled), or no price to bill it at
        rid = row.resource_id if row is not None else f"job-{job}"
        if row is None and priced is not None:
            res = dataclasses.replace(priced.to_resource(), id=rid, cloud_id=job)
            ledger.record_intent(res, priced.price_hourly)
            ledger.mark_created(run_id, ALLOCATION, rid, job)
        with contextlib.suppress(ValueError):  # a run time out of bounds: the ledger's stays
            ledger.mark_deleted(run_id, ALLOCATION, rid, lasted_s=seconds)


def teardown(
    provider: Provider,
    ledger: Ledger | None,
    run_id: RunRef,
    say: Callable[[str], None] = lambda _m: None,
    spare: str = "",
    trace: Tracer | None = None,
) -> TeardownReport:
    """Delete every node of the run, then its network/identity resources; mark the ledger.
    `spare`: a node name left alone with every resource `spared_kind` names (the controller
    node tearing a run down deletes those itself, last: cloudtrain/managed/controller_node.py).
    Idempotent; blocks until the cloud confirms the nodes are gone. `run_id` was parsed at the
    edge (run_ids.parse_run_ref, a cloud's tag by run_ids.read_run_ref) or comes from the
    ledger: the cloud's filters are built from it without a second check.
    `trace`: records a span per step (list, delete nodes, confirm, delete resources) under the
    run's "teardown" phase. A network/identity name the adapter finds is not the run's (its
    tag or name pattern, read from the cloud) is never deleted: a `refused` event, and the
    row leaves the run's record."""
    started = time.monotonic()
    compute = provider.compute
    steps = _Steps(trace)
    nodes = [n for n in compute.list_nodes(run_id) if n.name != spare]
    steps.done("list nodes")
    names = [n.name for n in nodes]
    if ledger is not None:
        for rec in ledger.resources(run_id, live_only=True):
            if rec.kind in BILLED_KINDS and rec.resource_id != spare:
                ledger.mark_deleting(run_id, rec.kind, rec.resource_id)
    if names:
        say(f"deleting {len(names)} node(s)")
        compute.delete_listed(nodes)
        steps.done("delete nodes", ", ".join(names))
    listed = compute.list_nodes(run_id)
    left = [n.name for n in listed if n.alive and n.name != spare]
    if left:
        raise ProviderError(
            f"run {run_id}: nodes {', '.join(left)} still exist after delete",
            hint=f"run `cloudtrain down {run_id}` again",
        )
    if ledger is not None:
        for rec in ledger.resources(run_id, live_only=True):
            if rec.kind in BILLED_KINDS and rec.resource_id != spare:
                ledger.mark_deleted(run_id, rec.kind, rec.resource_id)
        if compute.gang:
            settle_allocations(compute, ledger, run_id, say)
    steps.done("confirm nodes gone")
    crash_point("nodes-deleted")
    # network and identity: the ledger's record and the cloud's tags, deduplicated
    found: dict[tuple[str, str], Resource] = {}
    if ledger is not None:
        for rec in ledger.resources(run_id, live_only=True):
            if rec.kind not in (*BILLED_KINDS, "bucket"):
                found[(rec.kind, rec.resource_id)] = rec.to_resource()
    tagged = compute.list_resources(run_id)
    for res in tagged:
        found.setdefault((res.kind, res.id), res)
    resources = [r for r in found.values() if not (spare and spared_kind(compute, r.kind))]
    if resources:
        say(f"deleting {len(resources)} network/identity resource(s)")
        steps.done("list resources")
        refused = _delete_runs_own(compute, resources, ledger, run_id, say)
        resources = [r for r in resources if (r.kind, r.id) not in refused]
        steps.done("delete resources", ", ".join(f"{r.kind}/{r.id}" for r in resources))
        crash_point("network-deleted")
        if ledger is not None:
            for res in resources:
                ledger.mark_deleted(run_id, res.kind, res.id)
    return TeardownReport(
        names, [f"{r.kind}/{r.id}" for r in resources], time.monotonic() - started
    )
