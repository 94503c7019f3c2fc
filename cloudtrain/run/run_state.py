"""The values of one run that several parts of the Orchestrator read and change: where the run
is (plan, provider, store, zone), which attempt it is at, and what the display shows.

The Orchestrator (cloudtrain/run/orchestrator.py) makes one `RunState` and hands it to its parts
(`Provisioner`, `Failover`, `Recovery`, `LeaseHolder`); each part's docstring says which fields it
changes. Nothing else is shared between the parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cloudtrain.jobs.protocol import ClusterDoc

if TYPE_CHECKING:
    from cloudtrain.plan.planner import Plan
    from cloudtrain.providers.base import ObjectStore, Provider, RunInfo
    from cloudtrain.run.bundle import Bundle
    from cloudtrain.run.view import RunView


@dataclass
class RunState:
    """The run's mutable values (see the module). A plain record: no method acts on a cloud."""

    plan: Plan  # the place's plan: replaced by a failover
    provider: Provider  # fenced by the lease holder; another place's after a failover
    store_uri: str
    store: ObjectStore  # the run's bucket: another cloud's after a failover across clouds
    zone: str | None  # where the nodes are (or are being made)
    info: RunInfo  # what the provider is told about the run (place, zone, store, deadline)
    view: RunView  # what the observer shows: nodes, phase, cost, attempt
    started: float  # when the run began (an adopted run: when its laptop began it)
    deadline: float  # epoch seconds: max_hours from `started`
    attempt: int = 1  # the attempt the agents follow (cluster.json)
    job_end: float | None = None  # when the job ended (success, failure, stop)
    bundle: Bundle | None = None  # the packed workdir, once built (an adopted run's: its sha)
    cluster: ClusterDoc = field(default_factory=ClusterDoc)  # the run's cluster.json


def part_value(part: str, name: str, settable: bool = True) -> Any:
    """A property of the holder of parts that is its part's value `name` (`part`: "state",
    "recovery", ...), read and, where `settable`, set: the Orchestrator's callers (api,
    managed, tests) read and set the run's values on it as before it had parts. Pure."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, part), name)

    def put(self: Any, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, put if settable else None, doc=f"`self.{part}.{name}`")
