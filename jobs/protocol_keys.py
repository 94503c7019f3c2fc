"""The bucket protocol's key layout (jobs/protocol.py re-exports every public name here): the one
place a key of a run's bucket is spelled. Each builder returns the object key, or a listing
prefix ending in "/"; `classify` reads a key back as the controller lists the run's prefix.

Everything a run keeps in its bucket lives under `run_prefix(run_id)` ("cloudtrain/runs/<id>/"):

    cluster.json                        ClusterDoc    controller -> agents (rewritten per attempt)
    control/stop                        (any body)    controller -> agents: flush and stop
    status/<node>.json                  NodeStatus    agent -> controller (final state last)
    heartbeat/<node>.json               Heartbeat     agent -> controller (every heartbeat_s)
    notice/<node>.json                  NoticeDoc     agent -> controller (preemption notice)
    logs/<node>/<seq>.log               text          agent -> controller (ordered chunks)
    logs/<node>/segments/<a>-<b>.log    text          agent -> `logs` (chunks a..b rolled up)
    logs/<node>/index.json              LogIndex      agent -> `logs` (the closed segments)
    logs/<node>/segments/open-<a>.log   text          agent -> `logs` (the open segment so far)
    metrics/<node>/<seq>.jsonl          JSON lines    agent -> report (ordered chunks; METRICS)
    tensorboard/<rel>                   event files   chief -> `cloudtrain tensorboard`
    bootstrap/<node>.log                text          startup script -> controller
    attempt-<n>/nodes/<node>.json       Registration  agent -> agents (rendezvous)
    attempt-<n>/checkpoints-ready       (a marker)    chief -> agents (restore barrier)
    attempt-<n>/bootstrap/<node>.log    text          controller (an archived bootstrap log)
    checkpoints/<rel>                   files         chief -> later attempts and `--resume`
    model/<rel>                         files         chief -> the user
    bundle/<sha256>.tar.gz              tar.gz        controller -> startup script

`<node>` is "<role>-<index>" (`node_id`). The documents are in jobs/protocol_control.py (the
controller's: cluster.json, control/lease, control/orphaned) and jobs/protocol_node.py (the
agents'). Standard library only and importing nothing of the project: the agent runs it on the
node (Python 3.10+), the controller reads with it.
"""

from __future__ import annotations

RUNS_ROOT = "cloudtrain/runs/"
CLUSTER_NAME = "cluster.json"  # the names inside the run's prefix that prose may mention too
STOP_NAME = "control/stop"
LEASE_NAME = "control/lease"
# the run's key (cloudtrain/state/run_key.py): no node identity may read it
KEY_NAME = "control/key"
# the reason in the status of an agent that stopped because it found the stop key
STOPPED_BY_CONTROL = STOP_NAME


def node_id(role: str, index: int) -> str:
    """'worker-1': how a node is named inside the run's prefix. Pure."""
    return f"{role}-{index}"


# --- key builders (each returns the object key, or a listing prefix ending in "/") ---------------
def run_prefix(run_id: str) -> str:
    """The run's folder in its bucket: 'cloudtrain/runs/<run_id>/'. Pure."""
    return f"{RUNS_ROOT}{run_id}/"


def lease_key(run_id: str) -> str:
    """control/lease: who controls the run (LeaseDoc), written only by conditional writes."""
    return run_prefix(run_id) + LEASE_NAME


def orphaned_key(run_id: str) -> str:
    """control/orphaned: a node saw the lease expired (OrphanedDoc): the run needs a controller."""
    return run_prefix(run_id) + "control/orphaned"


def yield_key(run_id: str) -> str:
    """control/yield: `cloudtrain attach` asks the controller node to hand the lease back."""
    return run_prefix(run_id) + "control/yield"


def launch_key(run_id: str) -> str:
    """control/launch.json: what a controller needs to adopt the run
    (cloudtrain/state/launch_doc.py)."""
    return run_prefix(run_id) + "control/launch.json"


def journal_prefix(run_id: str) -> str:
    """ledger/: the run's journal, one object per ledger write (cloudtrain/state/journal.py)."""
    return run_prefix(run_id) + "ledger/"


def cluster_key(run_id: str) -> str:
    """cluster.json: the ClusterDoc. Pure."""
    return f"{run_prefix(run_id)}{CLUSTER_NAME}"


def stop_key(run_id: str) -> str:
    """control/stop: present once the controller (or `cloudtrain down`) asks the run to stop."""
    return f"{run_prefix(run_id)}{STOP_NAME}"


def status_prefix(run_id: str) -> str:
    """status/: every node's NodeStatus. Pure."""
    return f"{run_prefix(run_id)}status/"


def status_key(run_id: str, node: str) -> str:
    """status/<node>.json: the node's NodeStatus. Pure."""
    return f"{status_prefix(run_id)}{node}.json"


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
    return f"{logs_prefix(run_id, node)}{log_chunk_name(seq)}"


def log_chunk_name(seq: int) -> str:
    """'00000042.log': a log chunk's name inside its node's logs/ folder. Pure."""
    return f"{seq:08d}.log"


def log_seq(key: str) -> int:
    """The sequence number of a log chunk key (`.../00000042.log` -> 42; -1 if not one). Pure."""
    name = key.rsplit("/", 1)[-1].removesuffix(".log")
    return int(name) if name.isdigit() else -1


def log_lines(text: str) -> list[str]:
    """The lines of a log chunk's (or segment's) text, as every reader and the agent count them
    (a segment's `first_line`/`lines`). Pure."""
    return text.splitlines()


def log_index_key(run_id: str, node: str) -> str:
    """logs/<node>/index.json: the node's LogIndex (its closed segments). Pure."""
    return f"{logs_prefix(run_id, node)}index.json"


def log_segment_key(run_id: str, node: str, first_seq: int, last_seq: int) -> str:
    """logs/<node>/segments/<first>-<last>.log: chunks first..last (inclusive) concatenated,
    byte for byte. Pure."""
    return f"{logs_prefix(run_id, node)}segments/{first_seq:08d}-{last_seq:08d}.log"


def log_open_segment_key(run_id: str, node: str, first_seq: int) -> str:
    """logs/<node>/segments/open-<first>.log: the open segment (chunks from `first_seq`, the
    index's next_seq) as its agent last uploaded it: OPEN_SEGMENT_HEADER, then the chunks' bytes.
    Rewritten while the segment is open (every ClusterDoc.log_snapshot_s at most), deleted once
    it closes. Pure."""
    return f"{logs_prefix(run_id, node)}segments/open-{first_seq:08d}.log"


def metrics_prefix(run_id: str, node: str) -> str:
    """metrics/<node>/: the node's metrics stream (JSON lines, see METRICS). Pure."""
    return f"{run_prefix(run_id)}metrics/{node}/"


def metrics_chunk_key(run_id: str, node: str, seq: int) -> str:
    """metrics/<node>/<seq>.jsonl, seq zero-padded to 8 digits so keys sort in order. Pure."""
    return f"{metrics_prefix(run_id, node)}{seq:08d}.jsonl"


def tensorboard_prefix(run_id: str) -> str:
    """tensorboard/: the chief's TensorBoard event files (`runtime.callbacks()`), mirrored by
    its agent as they grow. Pure."""
    return f"{run_prefix(run_id)}tensorboard/"


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


def trace_key(run_id: str, node: str) -> str:
    """trace/<node>.json: the node's spans, a `jobs/trace.py` TraceDoc its agent rewrites as
    spans end (never read by the watch's poll: by `status`, the summary and the report). Pure."""
    return f"{run_prefix(run_id)}trace/{node}.json"


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


def bundle_prefix(run_id: str) -> str:
    """bundle/: the job's code, written by the controller only. Pure."""
    return f"{run_prefix(run_id)}bundle/"


def bundle_key(run_id: str, sha256: str) -> str:
    """bundle/<sha256>.tar.gz: the job's code and wheel. Pure."""
    return f"{bundle_prefix(run_id)}{sha256}.tar.gz"


# --- reading a listing ----------------------------------------------------------------------------
STATUS, HEARTBEAT, NOTICE, BOOTSTRAP, LOG = "status", "heartbeat", "notice", "bootstrap", "log"
_JSON_KINDS = (STATUS, HEARTBEAT, NOTICE)


def classify(run_id: str, key: str) -> tuple[str, str] | None:
    """(kind, node) of a key the controller reads as it lists the run's prefix: STATUS,
    HEARTBEAT or NOTICE (a node's JSON document), BOOTSTRAP (its bootstrap log) or LOG (one of
    its log chunks); None for every other key (cluster.json, attempt-<n>/..., ...). Pure."""
    prefix = run_prefix(run_id)
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    if len(parts) == 2 and parts[0] in _JSON_KINDS and parts[1].endswith(".json"):
        return parts[0], parts[1].removesuffix(".json")
    if len(parts) == 2 and parts[0] == "bootstrap" and parts[1].endswith(".log"):
        return BOOTSTRAP, parts[1].removesuffix(".log")
    if len(parts) == 3 and parts[0] == "logs" and parts[2].endswith(".log"):
        return LOG, parts[1]
    return None
