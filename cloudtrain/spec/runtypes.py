"""The value types of a run: its options, the live view, the observer protocol and the result.

Shared by the orchestrator (which fills them), the UI (which draws them) and the CLI (which
prints the result). Pure data: no I/O (`env_overrides` reads environment variables only).
"""

from __future__ import annotations

import os
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


@dataclass(frozen=True)
class RunOptions:
    """Knobs of one run. Defaults suit the clouds; `for_provider('local')` tightens them."""

    detach: bool = False
    # with detach on a cloud: a controller node watches the run (False: `--no-controller`)
    controller: bool = True
    poll_s: float = 2.0
    list_nodes_s: float = 15.0
    heartbeat_timeout_s: float = 180.0
    boot_timeout_s: float = 1200.0
    rendezvous_timeout_s: float = 600.0
    stop_grace_s: float = 30.0
    failure_grace_s: float = 5.0
    settle_s: float = 10.0
    linger_s: float = 600.0  # agents end this long after the job's end if nobody tears down
    # the budget stop comes `stop_grace_s` plus this many seconds of the cluster's $/h early,
    # so the graceful stop and the teardown are paid for within max_cost_usd
    teardown_margin_s: float = 300.0

    @classmethod
    def for_provider(cls, name: str, **overrides: Any) -> RunOptions:
        """Defaults for a provider (local nodes boot in seconds, so it is watched more closely),
        then the environment's knobs (`env_overrides`), then `overrides`. Raises UsageError
        for a bad knob in the environment."""
        base: dict[str, Any] = {}
        if name == "local":
            base = dict(
                poll_s=0.2,
                list_nodes_s=2.0,
                heartbeat_timeout_s=60.0,
                boot_timeout_s=120.0,
                rendezvous_timeout_s=120.0,
                stop_grace_s=20.0,
                failure_grace_s=3.0,
                settle_s=3.0,
                teardown_margin_s=10.0,
            )
        base.update(env_overrides())
        base.update(overrides)
        if base.get("detach") and not base.get("controller", True) and "linger_s" not in overrides:
            base["linger_s"] = 120.0  # nobody will tear down: end soon after the job
        return cls(**base)


HEARTBEAT_TIMEOUT_ENV = "CLOUDTRAIN_HEARTBEAT_TIMEOUT_S"
# at least five of the agent's beats (jobs/protocol.py: ClusterConfig.heartbeat_s = 2 s), so a
# node that is only slow to write is never taken for lost
MIN_HEARTBEAT_TIMEOUT_S = 10.0


def env_overrides() -> dict[str, Any]:
    """The run knobs set in the environment: $CLOUDTRAIN_HEARTBEAT_TIMEOUT_S, the seconds a
    node the cloud still lists may go without a heartbeat before it counts as lost (a VM cut
    off from the network; default 180, local 60). Reads os.environ only. Raises UsageError
    when it is set but not a number of seconds >= MIN_HEARTBEAT_TIMEOUT_S."""
    value = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "").strip()
    if not value:
        return {}
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not MIN_HEARTBEAT_TIMEOUT_S <= seconds < float("inf"):
        from cloudtrain.core.errors import UsageError

        raise UsageError(
            f"{HEARTBEAT_TIMEOUT_ENV}={value!r} is not a heartbeat timeout",
            hint=f"set it to a number of seconds >= {MIN_HEARTBEAT_TIMEOUT_S:g}, or unset it",
        )
    return {"heartbeat_timeout_s": seconds}


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
