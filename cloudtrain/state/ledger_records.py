"""The ledger's rows as records, its vocabularies, and what a journal of its writes must offer
(cloudtrain/state/ledger.py re-exports all of it; cloudtrain/state/journal.py implements
`JournalSink`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from cloudtrain.providers.base import ObjectStore, Resource

RUN_STATUSES: tuple[str, ...] = (
    "planned",
    "provisioning",
    "running",
    "stopping",
    "tearing_down",
    "done",
)
OUTCOMES: tuple[str, ...] = (
    "succeeded",
    "failed",
    "interrupted",
    "budget_exceeded",
    "deadline",
    "crashed",
)
RESOURCE_STATES: tuple[str, ...] = ("intent", "created", "deleting", "deleted", "failed")
MAX_LASTED_S = 10 * 366 * 24 * 3600.0  # a resource's life as a provider accounts it, at most


def lasted_seconds(value: object) -> float:
    """`value` as a resource's life in seconds (a provider's accounting, or a journal entry's
    field: untrusted): a number in 0..MAX_LASTED_S. ValueError otherwise. Pure."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"lasted_s is not a number: {str(value)[:40]!r}")
    if not 0 <= value <= MAX_LASTED_S:  # NaN fails this too
        raise ValueError(f"lasted_s {value!r} is not in 0..{MAX_LASTED_S:.0f} seconds")
    return float(value)

# the writes a journal carries (`Ledger._op_<name>`), in the order of the table they change
JOURNAL_OPS: frozenset[str] = frozenset(
    {
        "create_run",
        "set_status",
        "move_run",
        "finish_run",
        "record_intent",
        "mark_created",
        "mark_failed",
        "mark_deleting",
        "mark_deleted",
        "event",
    }
)


class JournalSink(Protocol):
    """Where a `Ledger` mirrors a run's writes (`cloudtrain.state.journal.Journal`)."""

    store: ObjectStore  # the run's bucket (where its key is too: cloudtrain/state/run_key.py)

    def sign_with(self, key: bytes) -> None:
        """Sign every entry appended from now on with the run's `key`. Non-blocking."""
        ...

    def reserve(self) -> str:
        """A new entry key, later than every key this sink gave before. Non-blocking."""
        ...

    def append(self, entry: dict[str, Any], *, key: str, wait: bool = False) -> str:
        """Queue `entry` under `key`; with `wait`, block until it is written. Returns `key`."""
        ...


@dataclass(frozen=True)
class RunRecord:
    """One row of `runs`."""

    run_id: str
    name: str
    provider: str
    region: str | None
    zone: str | None
    account: str | None  # the GCP project / Azure subscription the run was made in
    spec_path: str | None
    store_uri: str | None
    plan_json: str | None
    status: str
    outcome: str | None
    created_at: float
    ended_at: float | None
    detail: str | None
    # the process that created the run row (the run's controller): pid, host, procid stamp
    controller_pid: int | None = None
    controller_host: str | None = None
    controller_start: str | None = None

    @property
    def plan(self) -> Any:
        """`plan_json` parsed (None when absent)."""
        return json.loads(self.plan_json) if self.plan_json else None


@dataclass(frozen=True)
class ResourceRecord:
    """One row of `resources`."""

    run_id: str
    provider: str
    kind: str
    resource_id: str
    region: str | None
    cloud_id: str | None
    state: str
    price_hourly: float
    created_at: float
    deleted_at: float | None

    @property
    def live(self) -> bool:
        """Whether the resource may still exist in the cloud (anything not `deleted`)."""
        return self.state != "deleted"

    def to_resource(self) -> Resource:
        """The provider-level `Resource` this row describes (what teardown hands the adapter)."""
        return Resource(
            provider=self.provider,
            kind=self.kind,
            id=self.resource_id,
            region=self.region,
            run_id=self.run_id,
            cloud_id=self.cloud_id,
        )


@dataclass(frozen=True)
class EventRecord:
    """One row of `events`."""

    id: int
    run_id: str
    ts: float
    kind: str
    message: str


def state_entries(
    run: RunRecord, resources: list[ResourceRecord], events: list[EventRecord]
) -> list[dict[str, Any]]:
    """Journal entries that, replayed in order into a ledger without the run, rebuild it as
    these records say: its row (status, outcome, detail, `ended_at`), each resource's state,
    `created_at`, `deleted_at` and price (so its bill), and its events. For a journal started
    after the run's first writes (`Ledger.journal_to(..., backfill=True)`). Pure."""
    rid = run.run_id
    out: list[dict[str, Any]] = [
        {
            "op": "create_run",
            "at": run.created_at,
            **{k: getattr(run, k) for k in _RUN_FIELDS},
        }
    ]
    if run.status != "planned" or run.outcome or run.detail:
        at = run.ended_at if run.status == "done" and run.ended_at is not None else run.created_at
        out.append(
            {
                "op": "set_status",
                "at": at,
                "run_id": rid,
                "status": run.status,
                "outcome": run.outcome,
                "detail": run.detail,
            }
        )
    for r in resources:
        key = {"run_id": rid, "kind": r.kind, "resource_id": r.resource_id}
        out.append(
            {
                "op": "record_intent",
                "at": r.created_at,
                **key,
                "provider": r.provider,
                "region": r.region,
                "cloud_id": r.cloud_id,
                "price_hourly": r.price_hourly,
            }
        )
        ended = r.deleted_at if r.deleted_at is not None else r.created_at
        if r.state == "failed" or (r.state == "deleting" and r.deleted_at is not None):
            out.append({"op": "mark_failed", "at": ended, **key})  # billed until it failed
        elif r.state in ("created", "deleting", "deleted"):
            out.append({"op": "mark_created", "at": r.created_at, **key, "cloud_id": r.cloud_id})
        if r.state == "deleting":
            out.append({"op": "mark_deleting", "at": ended, **key})
        if r.state == "deleted":
            out.append({"op": "mark_deleted", "at": ended, **key})
    for e in events:
        out.append({"op": "event", "at": e.ts, "run_id": rid, "kind": e.kind, "message": e.message})
    return out


# the run row's fields a create_run entry carries (Ledger.create_run's, and who controls it)
_RUN_FIELDS = (
    "run_id",
    "name",
    "provider",
    "region",
    "zone",
    "account",
    "spec_path",
    "store_uri",
    "plan_json",
    "controller_pid",
    "controller_host",
    "controller_start",
)
