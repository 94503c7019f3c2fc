"""The bucket protocol's control documents (jobs/protocol.py re-exports every public name here):
the documents of the run as a whole, `cluster.json` (ClusterDoc: what every agent needs, written
by the controller) and those under `control/` (LeaseDoc: who controls the run; OrphanedDoc: a
node saw the lease expire). Their keys are in jobs/protocol_keys.py, the parsing rule and the
Document base in jobs/protocol_base.py. Standard library only and importing nothing else of the
project: the agent runs it on the node (Python 3.10+), the controller reads with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from cloudtrain.jobs.protocol_base import Document

LARGE_DOCUMENT_BYTES = 4 * 1024 * 1024  # cluster.json (the env) and a log index


@dataclass(frozen=True, eq=False)
class ClusterDoc(Document):
    """cluster.json: what every agent of the run needs, written by the controller before the
    nodes exist and again (with `attempt` moved on) for every new attempt. Holds secrets (`env`):
    blanked once the run is torn down. The intervals are the agents' paces in seconds."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("run_id", "roles", "port", "attempt", "entrypoint")
    INDENT: ClassVar[int | None] = 1
    MAX_BYTES: ClassVar[int] = LARGE_DOCUMENT_BYTES
    INFINITE: ClassVar[tuple[str, ...]] = ("deadline",)  # no deadline: json's Infinity

    run_id: str = ""
    strategy: str = ""
    roles: dict[str, int] = field(default_factory=dict)  # role -> how many nodes
    port: int = 0
    attempt: int = 0
    deadline: float = math.inf  # epoch seconds: the agents stop themselves then
    entrypoint: str = ""
    setup: str = ""
    env: dict[str, str] = field(default_factory=dict)  # secrets included: their only channel
    secrets: list[str] = field(default_factory=list)  # names only: the agents redact their values
    heartbeat_s: float = 2.0
    log_flush_s: float = 1.0
    sync_s: float = 2.0  # the chief's checkpoint sync
    control_s: float = 1.0  # stop and new-attempt latency on the nodes
    poll_s: float = 0.5  # rendezvous and barrier polling
    # the one default of the rendezvous timeout; the controller writes RunOptions' value
    rendezvous_timeout_s: float = 600.0
    stop_grace_s: float = 10.0  # SIGTERM to SIGKILL of the training on a stop
    # the agent closes a log segment (LogIndex) at this size or age, whichever comes first
    log_segment_bytes: int = 8 * 1024 * 1024
    log_segment_s: float = 3600.0
    log_snapshot_s: float = 60.0  # how often the open segment is uploaded whole (if it grew)
    linger_s: float = 3600.0  # how long an agent beats on after its final state


@dataclass(frozen=True, eq=False)
class LeaseDoc(Document):
    """control/lease: exactly one process controls a run (cloudtrain/state/lease.py). `term` only
    grows: every takeover adds one, a renewal keeps it. `successor` names the owner a release
    hands the run to (the controller node); it may take the lease while the document is live."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("owner", "term", "expires")

    owner: str = ""
    term: int = 0
    expires: float = 0.0  # epoch seconds
    successor: str = ""
    time: float = 0.0  # when it was written


@dataclass(frozen=True, eq=False)
class OrphanedDoc(Document):
    """control/orphaned: a node saw the lease expired: nobody replaces lost nodes meanwhile."""

    time: float = 0.0
    by: str = ""  # the node id
    term: int = 0  # the expired lease's term
