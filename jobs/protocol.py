"""The bucket protocol: the one definition of what the nodes and the controller say to each other.

Everything a run keeps in its bucket lives under `run_prefix(run_id)` ("cloudtrain/runs/<id>/"):

    cluster.json                        ClusterDoc    controller -> agents (rewritten per attempt)
    control/stop                        (any body)    controller -> agents: flush and stop
    status/<node>.json                  NodeStatus    agent -> controller (final state last)
    heartbeat/<node>.json               Heartbeat     agent -> controller (every heartbeat_s)
    notice/<node>.json                  NoticeDoc     agent -> controller (preemption notice)
    logs/<node>/<seq>.log               text          agent -> controller (ordered chunks)
    bootstrap/<node>.log                text          startup script -> controller
    attempt-<n>/nodes/<node>.json       Registration  agent -> agents (rendezvous)
    attempt-<n>/checkpoints-ready       (a marker)    chief -> agents (restore barrier)
    attempt-<n>/bootstrap/<node>.log    text          controller (an archived bootstrap log)
    checkpoints/<rel>                   files         chief -> later attempts and `--resume`
    model/<rel>                         files         chief -> the user
    bundle/<sha256>.tar.gz              tar.gz        controller -> startup script

`<node>` is "<role>-<index>" (`node_id`). Standard library only and importing nothing else of
the project: the agent runs it on the node (Python 3.10+), the controller reads with it.
"""

from __future__ import annotations

from enum import Enum

RUNS_ROOT = "cloudtrain/runs/"


class NodeState(str, Enum):
    """What an agent says it is doing (`NodeStatus.state`, `Heartbeat.state`). A `str` enum:
    `NodeState.RUNNING == "running"`, which is also what the documents hold."""

    BOOTSTRAPPED = "bootstrapped"  # the agent started and read cluster.json
    RENDEZVOUS = "rendezvous"  # checkpoints restored; waiting for every node of the attempt
    RUNNING = "running"  # the entrypoint runs
    SUCCEEDED = "succeeded"  # the entrypoint exited 0 (or a server ended after the chief)
    FAILED = "failed"  # the entrypoint, the setup, the rendezvous or the agent failed
    STOPPED = "stopped"  # control/stop, the deadline, SIGTERM or the linger time ended it

    def __str__(self) -> str:
        return self.value


FINAL_STATES = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.STOPPED})


def node_id(role: str, index: int) -> str:
    """'worker-1': how a node is named inside the run's prefix. Pure."""
    return f"{role}-{index}"


# --- key builders (each returns the object key, or a listing prefix ending in "/") ---------------
def run_prefix(run_id: str) -> str:
    """The run's folder in its bucket: 'cloudtrain/runs/<run_id>/'. Pure."""
    return f"{RUNS_ROOT}{run_id}/"


def cluster_key(run_id: str) -> str:
    """cluster.json: the ClusterDoc. Pure."""
    return f"{run_prefix(run_id)}cluster.json"


def stop_key(run_id: str) -> str:
    """control/stop: present once the controller (or `cloudtrain down`) asks the run to stop."""
    return f"{run_prefix(run_id)}control/stop"


def status_key(run_id: str, node: str) -> str:
    """status/<node>.json: the node's NodeStatus. Pure."""
    return f"{run_prefix(run_id)}status/{node}.json"


def heartbeat_key(run_id: str, node: str) -> str:
    """heartbeat/<node>.json: the node's Heartbeat. Pure."""
    return f"{run_prefix(run_id)}heartbeat/{node}.json"


def notice_key(run_id: str, node: str) -> str:
    """notice/<node>.json: the node's NoticeDoc (a preemption notice). Pure."""
    return f"{run_prefix(run_id)}notice/{node}.json"


def logs_prefix(run_id: str, node: str) -> str:
    """logs/<node>/: the node's log chunks. Pure."""
    return f"{run_prefix(run_id)}logs/{node}/"


def log_chunk_key(run_id: str, node: str, seq: int) -> str:
    """logs/<node>/<seq>.log, seq zero-padded to 8 digits so keys sort in order. Pure."""
    return f"{logs_prefix(run_id, node)}{seq:08d}.log"


def bootstrap_prefix(run_id: str) -> str:
    """bootstrap/: the startup scripts' logs. Pure."""
    return f"{run_prefix(run_id)}bootstrap/"


def bootstrap_log_key(run_id: str, node: str) -> str:
    """bootstrap/<node>.log: the node's startup-script log. Pure."""
    return f"{bootstrap_prefix(run_id)}{node}.log"


def attempt_prefix(run_id: str, attempt: int) -> str:
    """attempt-<n>/: what belongs to one attempt. Pure."""
    return f"{run_prefix(run_id)}attempt-{attempt}/"


def registrations_prefix(run_id: str, attempt: int) -> str:
    """attempt-<n>/nodes/: the attempt's Registrations. Pure."""
    return f"{attempt_prefix(run_id, attempt)}nodes/"


def registration_key(run_id: str, attempt: int, node: str) -> str:
    """attempt-<n>/nodes/<node>.json: a node's Registration for the attempt. Pure."""
    return f"{registrations_prefix(run_id, attempt)}{node}.json"


def checkpoints_ready_key(run_id: str, attempt: int) -> str:
    """attempt-<n>/checkpoints-ready: the chief flushed its checkpoints for the attempt. Pure."""
    return f"{attempt_prefix(run_id, attempt)}checkpoints-ready"


def archived_bootstrap_log_key(run_id: str, attempt: int, node: str) -> str:
    """attempt-<n>/bootstrap/<node>.log: a bootstrap log kept when its node was re-created."""
    return f"{attempt_prefix(run_id, attempt)}bootstrap/{node}.log"


def checkpoints_prefix(run_id: str) -> str:
    """checkpoints/: the chief's checkpoint folder, mirrored. Pure."""
    return f"{run_prefix(run_id)}checkpoints/"


def model_prefix(run_id: str) -> str:
    """model/: the chief's model folder, uploaded on success. Pure."""
    return f"{run_prefix(run_id)}model/"


def bundle_key(run_id: str, sha256: str) -> str:
    """bundle/<sha256>.tar.gz: the job's code and wheel. Pure."""
    return f"{run_prefix(run_id)}bundle/{sha256}.tar.gz"
