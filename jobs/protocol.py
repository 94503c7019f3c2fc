"""The bucket protocol: the one definition of what the nodes and the controller say to each other.

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

`<node>` is "<role>-<index>" (`node_id`). Every JSON document is a frozen dataclass below with
`to_json()`/`from_json()`, a `version` field and its defaults (the one place they are written);
each is also the JSON object it is, a read-only dict (`doc["state"]`, `json.dumps(doc)`).
`from_json` reads a document older than the `version` field (it reads as version 0) and ignores
fields it does not know (a newer writer's). Every document is untrusted input: `from_json` reads
it by the one rule of jobs/protocol_base.py (`load_json`: a size cap, a depth cap, finite numbers)
and its fields by their types, and anything else is a ProtocolError. Standard library only and
importing nothing else of the project but its parts jobs/protocol_base.py (the states, the errors,
the parsing rule, the Document base) and jobs/protocol_streams.py (the streams' formats), both
re-exported here: the agent runs it on the node (Python 3.10+), the controller reads with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

# the states, the errors, the parsing rule and the Document base: the protocol's too
from cloudtrain.jobs.protocol_base import (  # noqa: F401
    FINAL_STATES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    PROTOCOL_VERSION,
    UNVERSIONED,
    D,
    Document,
    MissingField,
    NodeState,
    ProtocolError,
    load_json,
    read_integer,
    read_number,
    read_object,
    read_text,
)

# the streams' formats live beside this module (their size); they are the protocol's too
from cloudtrain.jobs.protocol_streams import (  # noqa: F401
    HEARTBEAT_METRICS,
    MAX_STEPS_ENV,
    METRICS,
    METRICS_FILE_ENV,
    OPEN_SEGMENT_HEADER,
    OPEN_SEGMENT_MARK,
    TENSORBOARD_DIR_ENV,
    open_segment_body,
    read_open_segment,
)

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


# --- what a document's fields hold, where their type says too little ------------------------------
LARGE_DOCUMENT_BYTES = 4 * 1024 * 1024  # cluster.json (the env) and a log index
_SEGMENT_COUNTS = ("first_seq", "last_seq", "first_line", "lines")


def _segments(value: Any) -> list[dict[str, Any]]:
    """LogIndex.segments: objects whose first_seq <= last_seq, first_line and lines are
    integers >= 0 (and `bytes`, `time` numbers, `key` text where present)."""
    if not isinstance(value, list):
        raise TypeError(f"not a list of segments: {type(value).__name__}")
    out = []
    for raw in value:
        segment = read_object(raw)
        for name in _SEGMENT_COUNTS:
            if name not in segment:
                raise ValueError(f"a segment without {name!r}")
            segment[name] = read_integer(segment[name])
            if segment[name] < 0:
                raise ValueError(f"a segment's {name} is negative")
        if segment["last_seq"] < segment["first_seq"]:
            raise ValueError("a segment ends before it starts")
        for name, reader in (("bytes", read_number), ("time", read_number), ("key", read_text)):
            if segment.get(name) is not None:
                segment[name] = reader(segment[name])
        out.append(segment)
    return out


def _figures(value: Any) -> dict[str, Any]:
    """Heartbeat.metrics (an object, else TypeError): HEARTBEAT_METRICS' figures, each a
    finite number or null (a figure of another type reads as null: the training's figures
    never cost the node its heartbeat), `source` text (else null) and `losses` the numbers of
    its list; an unknown key (a newer agent's) is kept only when it is a number, text or null."""
    out: dict[str, Any] = {}
    for name, raw in read_object(value).items():
        if name == "source":
            out[name] = raw if isinstance(raw, str) else None
        elif name == "losses":
            out[name] = [x for x in raw if _is_number(x)] if isinstance(raw, list) else []
        elif name in HEARTBEAT_METRICS:
            out[name] = raw if _is_number(raw) else None
        elif raw is None or _is_number(raw) or isinstance(raw, str):
            out[name] = raw
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- documents ------------------------------------------------------------------------------------
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
class NodeStatus(Document):
    """status/<node>.json: a node's progress in an attempt; a final state (FINAL_STATES) is
    written last, after the logs, the checkpoints and the model."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("state",)

    state: str = NodeState.BOOTSTRAPPED  # a NodeState (a newer agent's unknown state: a str)
    attempt: int = 0
    time: float = 0.0
    pid: int | None = None  # the training's process (group) while running
    exit_code: int | None = None
    signal: int | None = None  # the signal that ended the training, if one did
    reason: str | None = None
    tail: list[str] | None = None  # a failure's last lines of output or traceback
    log_seq: int | None = None  # the last log chunk uploaded before this status (see Heartbeat)


@dataclass(frozen=True, eq=False)
class Heartbeat(Document):
    """heartbeat/<node>.json: the node is alive; how far the training is; its last line."""

    FIELD_READERS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"metrics": _figures}
    NON_FINITE_AS_NULL: ClassVar[bool] = True  # a diverged loss (NaN) is a null figure

    time: float = 0.0
    attempt: int = 0
    state: str = ""
    epoch: int | None = None
    epochs: int | None = None
    last_line: str = ""
    pid: int | None = None
    # the node's latest figures (HEARTBEAT_METRICS' keys, each optional); None before any
    metrics: dict[str, Any] | None = None
    # the last log chunk (logs/<node>/<seq>.log) this agent uploaded before writing this
    # heartbeat; None before any. Readers GET the chunks after the last they read up to it,
    # and never list logs/ (a poll's cost does not grow with the run's age)
    log_seq: int | None = None
    # what the agent is busy with besides the training ("restoring 3.1/5.0 GB"), "" when
    # nothing: written by the agent's heartbeat thread, which beats through long transfers
    activity: str = ""


@dataclass(frozen=True, eq=False)
class NoticeDoc(Document):
    """notice/<node>.json: the cloud told the node it is about to be reclaimed (the probe's
    result is jobs/preemption.py's Notice); the controller replaces the node at once."""

    attempt: int = 0
    time: float = 0.0
    cloud: str = ""
    action: str = ""  # e.g. "terminate", "preempt"
    deadline: float = 0.0  # epoch seconds: the cloud's best estimate of the end


@dataclass(frozen=True, eq=False)
class Registration(Document):
    """attempt-<n>/nodes/<node>.json: where a node listens in the attempt (its rendezvous)."""

    OMIT_NULLS: ClassVar[bool] = True  # `slots` only under strategy horovod

    address: str = ""  # "host:port"
    time: float = 0.0
    slots: int | None = None  # strategy horovod: the node's processes (one per GPU)


@dataclass(frozen=True, eq=False)
class CheckpointsReady(Document):
    """attempt-<n>/checkpoints-ready: the chief flushed its checkpoints for the attempt."""

    time: float = 0.0
    by: str = ""  # the chief's node id


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


@dataclass(frozen=True, eq=False)
class LogIndex(Document):
    """logs/<node>/index.json: the node's closed log segments, oldest first. Each segment is a
    dict: `key` (log_segment_key), `first_seq`, `last_seq` (its chunks, inclusive), `first_line`
    (how many lines of the node's stream come before it, by `log_lines`), `lines`, `bytes`,
    `time` (when it was closed). Segments are contiguous: the next one's first_seq is this one's
    last_seq + 1, and the first starts at seq 0. Every chunk of a segment but its last ends with
    a newline, so the segment's lines are its chunks' lines (a reader skips by count). Chunks
    after the last segment are the open segment's; chunks stay in the bucket (readers of the
    live stream GET them by seq). Rewritten
    whole by the node's agent after each segment is uploaded (the segment exists before the
    index names it)."""

    INDENT: ClassVar[int | None] = None
    MAX_BYTES: ClassVar[int] = LARGE_DOCUMENT_BYTES
    FIELD_READERS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"segments": _segments}

    node: str = ""
    segments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        """The first chunk seq no segment holds (0 for an empty index). Pure."""
        return int(self.segments[-1]["last_seq"]) + 1 if self.segments else 0

    @property
    def next_line(self) -> int:
        """How many lines of the stream the segments hold. Pure."""
        if not self.segments:
            return 0
        last = self.segments[-1]
        return int(last["first_line"]) + int(last["lines"])


DOCUMENTS: tuple[type[Document], ...] = (
    ClusterDoc,
    NodeStatus,
    Heartbeat,
    NoticeDoc,
    Registration,
    CheckpointsReady,
    LeaseDoc,
    OrphanedDoc,
    LogIndex,
)
