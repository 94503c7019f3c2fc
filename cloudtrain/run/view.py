"""The value types of a run as it goes: how it ended (`Outcome`), the live view (`RunView`,
`NodeView`), the observer protocol and the result (`RunResult`).

Shared by the orchestrator (which fills them), the UI (which draws them) and the CLI (which
prints the result). Pure data: no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cloudtrain.insight.throughput import Throughput


class Outcome(str, Enum):
    """How a run ended, and the exit code `cloudtrain run` ends with for it. A `str` enum:
    `Outcome.SUCCEEDED == "succeeded"`, which is also how the ledger stores it."""

    SUCCEEDED = "succeeded"
    DETACHED = "detached"
    FAILED = "failed"
    BUDGET_EXCEEDED = "budget_exceeded"
    DEADLINE = "deadline"
    INTERRUPTED = "interrupted"
    LEASE_LOST = "lease_lost"  # another process controls the run now (cloudtrain/state/lease.py)

    @property
    def exit_code(self) -> int:
        """0 for succeeded/detached; 3 failed, 4 budget, 5 deadline, 6 lease lost (another
        process controls the run), 130 interrupted."""
        return _EXIT_CODES[self]

    @property
    def ok(self) -> bool:
        """Whether the run did what was asked (succeeded, or left running on purpose)."""
        return self in (Outcome.SUCCEEDED, Outcome.DETACHED)

    def __str__(self) -> str:
        return self.value


_EXIT_CODES = {
    Outcome.SUCCEEDED: 0,
    Outcome.DETACHED: 0,
    Outcome.FAILED: 3,
    Outcome.BUDGET_EXCEEDED: 4,
    Outcome.DEADLINE: 5,
    Outcome.LEASE_LOST: 6,
    Outcome.INTERRUPTED: 130,
}


@dataclass
class NodeView:
    """One node as the live view shows it."""

    name: str
    role: str
    index: int
    cloud_state: str = "pending"
    agent_state: str = "booting"
    attempt: int = 0
    epoch: int | None = None
    epochs: int | None = None
    last_line: str = ""
    activity: str = ""  # what the agent is busy with besides the training (its heartbeat's)


@dataclass
class RunView:
    """The whole run as the live view shows it."""

    run_id: str
    phase: str
    attempt: int
    nodes: list[NodeView]
    started: float
    hourly_usd: float
    cost_usd: float = 0.0
    # the nodes' figures from their latest heartbeats of this attempt (None before any)
    throughput: Throughput | None = None

    @property
    def elapsed_s(self) -> float:
        return time.time() - self.started


class Observer(Protocol):
    """What the orchestrator reports to (the rich UI, or a plain printer)."""

    def event(self, message: str) -> None: ...
    def log_line(self, node: str, line: str) -> None: ...
    def update(self, view: RunView) -> None: ...


@dataclass
class RunResult:
    """How a run ended; the summary is printed from this."""

    run_id: str
    outcome: Outcome
    detail: str = ""
    model_uri: str = ""
    checkpoints_uri: str = ""
    wall_s: float = 0.0
    cost_usd: float = 0.0
    cost_by_node: dict[str, float] = field(default_factory=dict)
    attempts: int = 1
    teardown_s: float = 0.0
    teardown_lag_s: float | None = None
    # per node: seconds billed after the job ended (job end -> node deleted)
    billed_idle_s: dict[str, float] = field(default_factory=dict)
    # how fast it trained, from the nodes' last heartbeats (None: nothing was measured)
    throughput: Throughput | None = None
    # where the time went: trace_view.to_json of every span (None: not traced)
    trace: dict[str, Any] | None = None
    # the places failover tried and where the run landed (cloudtrain/run/failover.py); "" if none
    route: str = ""

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)  # a plain string from older callers still works

    @property
    def ok(self) -> bool:
        """Whether the run did what was asked (see Outcome.ok)."""
        return self.outcome.ok
