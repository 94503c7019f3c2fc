"""The ledger's rows as records, its vocabularies, and what a journal of its writes must offer
(cloudtrain/ledger.py re-exports all of it; cloudtrain/journal.py implements `JournalSink`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from cloudtrain.providers.base import Resource

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

# the writes a journal carries (`Ledger._op_<name>`), in the order of the table they change
JOURNAL_OPS: frozenset[str] = frozenset(
    {
        "create_run",
        "set_status",
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
    """Where a `Ledger` mirrors a run's writes (`cloudtrain.journal.Journal`)."""

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
