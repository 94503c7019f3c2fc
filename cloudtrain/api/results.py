"""The typed results of `cloudtrain.api`: what a run's status, logs, teardown and listing are.

Pure data plus the API's silent observer. Imports no rich, no typer, no TensorFlow and no cloud
SDK (the CLI renders these; a notebook reads them).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.insight.cost_report import RunCost

if TYPE_CHECKING:
    from cloudtrain.core.procid import Controller
    from cloudtrain.insight.throughput import Throughput
    from cloudtrain.jobspec.job import JobSpec
    from cloudtrain.plan.planner import Plan
    from cloudtrain.run.resume import ResumeSource
    from cloudtrain.run.view import RunView
    from cloudtrain.state.failures import NodeFailure
    from cloudtrain.state.ledger import RunRecord

LOG = logging.getLogger("cloudtrain.api")
CostLine = RunCost  # one run's line of `cloudtrain cost` (compute and kept storage)


@dataclass(frozen=True)
class LogLine:
    """One line a node printed: the node's short name ('worker-1') and the line."""

    node: str
    line: str

    def __str__(self) -> str:
        return f"[{self.node}] {self.line}"


@dataclass(frozen=True)
class LogEnd:
    """Why a log stream ended. `reason`: "read" (no follow: what there was is read), "done"
    (the run is over), "gone" (its controller is gone and no node of it is alive: nobody will
    finish it) or "forgotten" (the run left the ledger). `code` is what `cloudtrain logs`
    exits with; `message` says the reason to a person ("" when the run simply ended)."""

    reason: str
    code: int
    outcome: str | None = None
    detail: str | None = None
    message: str = ""


@dataclass(frozen=True)
class RunStatus:
    """A run as `cloudtrain status` shows it: the ledger's record, what its bucket says (node
    statuses, heartbeats, bootstrap phases, failures of the newest attempt), the cloud's node
    list, the ledger's live resources and billed cost, and whether its controller runs."""

    record: RunRecord
    cost_usd: float
    controller: Controller
    statuses: dict[str, Mapping[str, Any]]  # jobs.protocol documents, read as Mappings
    heartbeats: dict[str, Mapping[str, Any]]
    bootstrap: dict[str, dict[str, Any]]
    failures: dict[str, NodeFailure]
    cloud_nodes: dict[str, str]
    live_resources: list[str]
    store_error: str | None = None
    # control/lease as the bucket holds it (jobs.protocol.LeaseDoc), None for a run without one
    lease: Mapping[str, Any] | None = None
    read_at: float = 0.0  # when the lease was read (epoch seconds)
    hourly_usd: float = 0.0  # what its nodes (and controller node) cost an hour together
    # where its time went: trace_view.to_json of the controller's and the nodes' spans
    trace: Mapping[str, Any] | None = None

    @property
    def throughput(self) -> Throughput:
        """The newest attempt's figures from its nodes' heartbeats
        (cloudtrain/insight/throughput.py)."""
        from cloudtrain.insight.throughput import of_attempt

        attempt = max((int(s.get("attempt", 0)) for s in self.statuses.values()), default=0)
        return of_attempt(self.heartbeats, attempt, self.hourly_usd)

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def status(self) -> str:
        """The ledger's status: planned, provisioning, running, tearing_down, done."""
        return self.record.status

    @property
    def outcome(self) -> str | None:
        """The ledger's outcome (an `Outcome` value, or "crashed"); None while it runs."""
        return self.record.outcome

    @property
    def done(self) -> bool:
        return self.record.status == "done"

    @property
    def orphaned(self) -> bool:
        """Not done, and nobody controls it: its lease expired (a controller node died, or a
        detach without one) or is held by the recorded controller process, which is gone; or,
        for a run without a lease, that process is not running. Nothing will finish it until
        `attach` (or `down`)."""
        if self.done:
            return False
        ctl = self.controller
        if self.lease is not None:
            if float(self.lease.get("expires", 0.0)) < self.read_at:
                return True
            # held by the recorded process (an attached run), which is gone: nobody renews it
            mine = self.lease.get("owner") == f"run:{ctl.host}:{ctl.pid}"
            return mine and ctl.state == "gone"
        return ctl.state != "alive" and ctl.pid is not None

    def to_dict(self) -> dict[str, Any]:
        """What `cloudtrain status --json` prints. Pure."""
        rec = self.record
        return {
            "run_id": rec.run_id,
            "name": rec.name,
            "provider": rec.provider,
            "status": rec.status,
            "outcome": rec.outcome,
            "detail": rec.detail,
            "store": rec.store_uri,
            "store_error": self.store_error,
            "created_at": rec.created_at,
            "ended_at": rec.ended_at,
            "cost_usd": self.cost_usd,
            "controller": {
                "pid": self.controller.pid,
                "host": self.controller.host,
                "state": self.controller.state,
            },
            "nodes": {
                k: {"status": _plain(v), "heartbeat": _plain(self.heartbeats.get(k))}
                for k, v in self.statuses.items()
            },
            "bootstrap": self.bootstrap,
            "trace": _plain(self.trace),
            "lease": _plain(self.lease),
            "orphaned": self.orphaned,
            "failures": {
                k: {"reason": f.reason, "tail": list(f.tail)}
                for k, f in sorted(self.failures.items())
            },
            "cloud_nodes": dict(self.cloud_nodes),
            "live_resources": list(self.live_resources),
            "throughput": self.throughput.to_dict(),
        }


def _plain(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A bucket document as its JSON object (a protocol Document's `to_dict`). Pure."""
    if doc is None:
        return None
    to_dict = getattr(doc, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(doc)


@dataclass(frozen=True)
class DownReport:
    """What `down` removed: node names, other resources ('network/x'), and how long it took."""

    run_id: str
    nodes_deleted: list[str]
    resources_deleted: list[str]
    seconds: float


@dataclass(frozen=True)
class RunListing:
    """One row of `cloudtrain ls`: the ledger's record, its live non-bucket resources, and
    its billed cost so far."""

    record: RunRecord
    live: int
    cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        """What `cloudtrain ls --json` prints of the run: the ledger's row with its plan as a
        JSON object (`plan`; the text as it is where it does not parse), then `live` and
        `cost_usd`. Pure."""
        row = dict(vars(self.record))
        text = row.pop("plan_json")
        try:
            row["plan"] = json.loads(text) if text else None
        except ValueError:
            row["plan"] = text
        return {**row, "live": self.live, "cost_usd": self.cost_usd}


@dataclass(frozen=True)
class Launch:
    """A run ready to start: the validated spec, its plan, and (for a resume) the checkpoints
    it starts from. `api.prepare` / `api.prepare_resume` make one; `api.launch` runs it."""

    spec: JobSpec
    plan: Plan
    resume_from: ResumeSource | None = None
    # (name, start, end) of what `prepare` did, for the run's trace: "spec", "plan"
    timings: tuple[tuple[str, float, float], ...] = ()


@dataclass
class SilentObserver:
    """The API's default observer: prints nothing. Keeps the lifecycle events, the last
    `keep_lines` log lines and the last live view in memory, and passes events to the
    `cloudtrain.api` logger (INFO; log lines at DEBUG). Thread-safe enough for one run
    (deque and list appends are atomic)."""

    keep_lines: int = 1000
    events: list[str] = field(default_factory=list)
    lines: deque[LogLine] = field(init=False)
    view: RunView | None = None

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=self.keep_lines)

    def event(self, message: str) -> None:
        self.events.append(message)
        LOG.info("%s", message)

    def log_line(self, node: str, line: str) -> None:
        self.lines.append(LogLine(node, line))
        LOG.debug("[%s] %s", node, line)

    def update(self, view: RunView) -> None:
        self.view = view
