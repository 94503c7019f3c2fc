"""The bucket protocol's node documents (jobs/protocol.py re-exports every public name here):
what the agents write about their nodes, a node's progress (NodeStatus), pulse (Heartbeat),
preemption notice (NoticeDoc) and log index (LogIndex), and what they tell each other in an
attempt (Registration, CheckpointsReady). Their keys are in jobs/protocol_keys.py, the parsing
rule and the Document base in jobs/protocol_base.py. Standard library only and importing nothing
else of the project: the agent runs it on the node (Python 3.10+), the controller reads with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cloudtrain.jobs.protocol_base import (
    Document,
    NodeState,
    read_integer,
    read_number,
    read_object,
    read_text,
)
from cloudtrain.jobs.protocol_control import LARGE_DOCUMENT_BYTES
from cloudtrain.jobs.protocol_streams import HEARTBEAT_METRICS

# --- what a document's fields hold, where their type says too little ------------------------------
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
