"""What `cloudtrain report` shows of one run, read from what exists during and after it, for any
provider: the ledger (the run's record, its resources with their billed intervals and hourly
prices, its events, the controller's spans) and the run's bucket (the nodes' metrics streams
metrics/<node>/<seq>.jsonl, their bootstrap logs, statuses, rendezvous registrations and traces
trace/<node>.json).

`collect` reads; everything else here is pure. A run that left no metrics (an older run, a job
without the runtime whose agent saw no Keras progress lines) gets empty series, and a bucket that
cannot be read (gone, no credentials) is `store_error`: the report still shows the ledger's part.
The bucket's contents are untrusted: node names must look like nodes, records like records, and
what does not is skipped (counted in `skipped`). Imports no SDK and no plotting library.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from cloudtrain.core.errors import CloudtrainError
from cloudtrain.insight.run_trace import SPAN_EVENT
from cloudtrain.insight.trace_view import Phase, breakdown, controller_spans
from cloudtrain.jobs import protocol
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.bucket_reads import (
    BOOT_LOG_MAX_BYTES,
    METRICS_CHUNK_MAX_BYTES,
    TRACE_MAX_BYTES,
    Skips,
    get_bounded,
    parse_document,
)
from cloudtrain.jobs.protocol import NodeStatus, Registration, load_json, node_id, run_prefix
from cloudtrain.jobspec.runrules import NODE_RE
from cloudtrain.state import bootlog

if TYPE_CHECKING:
    from cloudtrain.providers.base import ObjectStore
    from cloudtrain.state.ledger import Ledger, RunRecord

# the Gantt chart's lanes, top to bottom ("boot <node>" lanes go after provision)
PROVISION, RENDEZVOUS, TRAINING, RESTARTS, TEARDOWN = (
    "provision",
    "rendezvous",
    "training",
    "restarts",
    "teardown",
)
BOOT = "boot"  # a lane per node: "boot worker-0"
BOOT_PHASES = tuple(p for p in bootlog.PHASES if p != "agent")  # the agent's time is the job's
RECORD_KINDS = ("epoch", "window", "process", "gpu")
FINAL_STATES = frozenset(str(s) for s in protocol.FINAL_STATES)
_ROLE_ORDER = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
_BOOT_LINE_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) cloudtrain-bootstrap\[[^\]]*\]: "
    r"(?:phase )?(?P<phase>[a-z]+): (?P<state>.*)$"
)
_IN_SECONDS_RE = re.compile(r"\bin (?P<s>\d+(?:\.\d+)?)s\s*$")
_ATTEMPT_RE = re.compile(r"^attempt (?P<n>\d+)\b")
_CHUNK_RE = re.compile(r"^[0-9]{1,12}\.jsonl$")
_ATTEMPT_DIR_RE = re.compile(r"^attempt-(?P<n>[0-9]{1,6})$")
MAX_RECORDS_PER_NODE = 200_000  # a runaway stream is cut here (the report says so)
MAX_SPANS_PER_NODE = 2_000  # a node's trace is cut here (its agent records a few dozen)
MAX_TRACE_SPANS = 20_000  # the nodes' spans together: a node's past it are not read
MAX_NODES = 256  # nodes drawn: the plan's, then those only the bucket names, up to this
MAX_CHUNKS_PER_NODE = 10_000  # metrics chunks read per node (the records' cap comes first)


@dataclass(frozen=True)
class Span:
    """One bar of the timeline: `lane` ("provision", "boot worker-0", ...), what it is (`label`:
    a boot phase, "attempt 2", ...), from `start` to `end` (epoch seconds; equal for an
    instant)."""

    lane: str
    label: str
    start: float
    end: float


@dataclass
class ReportData:
    """One run's report: the header's figures, the nodes' metric records, the timeline and the
    cost curve. Built by `collect`; read by cloudtrain/insight/report_html.py."""

    run_id: str
    name: str
    provider: str
    region: str | None
    status: str
    outcome: str | None
    detail: str | None
    started: float
    ended: float | None  # the ledger's end (None while the run lives)
    read_at: float
    cost_usd: float  # billed so far: the ledger's rule (Ledger.billed_cost)
    hourly_usd: float  # the plan's price of all its nodes
    nodes: list[str]  # node ids ("worker-0"): the plan's, then any other the bucket names
    instance_types: dict[str, str] = field(default_factory=dict)  # node -> the plan's type
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node -> by time
    spans: list[Span] = field(default_factory=list)
    cost_points: list[tuple[float, float]] = field(default_factory=list)  # (time, cumulative $)
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (time, kind, message)
    trace: list[tr.Span] = field(default_factory=list)  # the controller's spans, the nodes'
    phases: list[Phase] = field(default_factory=list)  # trace_view.breakdown (the root's end)
    attempts: int = 0
    store_error: str | None = None
    skipped: int = 0  # metrics lines or documents that did not parse

    @property
    def wall_s(self) -> float:
        """From the run's creation to its end (or to `read_at` while it lives)."""
        return max(0.0, (self.ended if self.ended is not None else self.read_at) - self.started)

    @property
    def chief(self) -> str | None:
        """The node whose figures speak for the job: chief-0, else the first worker."""
        for name in ("chief-0", "worker-0"):
            if name in self.nodes:
                return name
        return self.nodes[0] if self.nodes else None

    def of_kind(self, node: str, kind: str) -> list[dict[str, Any]]:
        """The node's records of one kind, oldest first."""
        return [r for r in self.records.get(node, []) if r["kind"] == kind]

    def epochs(self, node: str) -> list[dict[str, Any]]:
        """The node's epoch records, one per epoch number (a restarted attempt's repeat of an
        epoch replaces the earlier one), in epoch order."""
        by_epoch: dict[int, dict[str, Any]] = {}
        for r in self.of_kind(node, "epoch"):
            epoch = r.get("epoch")
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                by_epoch[epoch] = r
        return [by_epoch[e] for e in sorted(by_epoch)]

    @property
    def has_metrics(self) -> bool:
        """Whether any node left any metrics record."""
        return any(self.records.values())


def collect(
    ledger: Ledger, rec: RunRecord, store: ObjectStore | None, now: float | None = None
) -> ReportData:
    """The report's data of the run `rec` from `ledger` and its bucket `store` (None: no bucket
    is known; an unreadable one is `store_error`). Read-only; blocks for one listing of the
    run's prefix and one read per status, registration, bootstrap log, trace document and
    metrics chunk (the nodes' log chunks are not read). Never raises for what the bucket holds.
    The ledger's "span" events are the controller's part of `trace`, not `events`."""
    read_at = time.time() if now is None else now
    plan = _plan(rec)
    data = ReportData(
        run_id=rec.run_id,
        name=rec.name,
        provider=rec.provider,
        region=rec.region,
        status=rec.status,
        outcome=rec.outcome,
        detail=rec.detail,
        started=rec.created_at,
        ended=rec.ended_at,
        read_at=read_at,
        cost_usd=ledger.billed_cost(rec.run_id, now=read_at),
        hourly_usd=number(plan.get("hourly_usd")) or 0.0,
        nodes=[],
        instance_types=_instance_types(plan),
    )
    bucket = _Bucket()
    if store is None:
        data.store_error = "the ledger records no bucket for this run"
    else:
        try:
            bucket = _read_bucket(store, rec.run_id)
        except CloudtrainError as exc:  # gone, or unreadable from here: the ledger's part stays
            data.store_error = str(exc)
    data.nodes = _nodes(data.instance_types, bucket)
    data.records, data.skipped = bucket.records, bucket.skipped
    resources = ledger.resources(rec.run_id)
    events = ledger.events(rec.run_id)
    data.events = [(e.ts, e.kind, e.message) for e in events if e.kind != SPAN_EVENT]
    data.trace = controller_spans(events)
    data.trace += [s for node in data.nodes for s in bucket.traces.get(node, [])]
    data.phases = breakdown(data.trace, data.chief or "worker-0")
    data.attempts = max([*bucket.registrations, *(s.attempt for s in bucket.statuses.values()), 0])
    data.cost_points = cost_curve(
        [(r.created_at, r.deleted_at, r.price_hourly) for r in resources if r.kind == "node"],
        start=rec.created_at,
        now=read_at,
    )
    data.spans = timeline(data, bucket, resources_deleted(resources), rec.run_id)
    return data


# --- the bucket ----------------------------------------------------------------------------------
@dataclass
class _Bucket:
    """What the run's prefix holds that the report reads."""

    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    statuses: dict[str, NodeStatus] = field(default_factory=dict)
    registrations: dict[int, dict[str, float]] = field(default_factory=dict)  # attempt -> times
    boot_logs: dict[str, list[str]] = field(default_factory=dict)  # node -> its logs' texts
    traces: dict[str, list[tr.Span]] = field(default_factory=dict)  # node -> its spans
    skipped: int = 0
    skips: Skips = field(default_factory=Skips)  # what was not read, by key (one warning each)


def _read_bucket(store: ObjectStore, run_id: str) -> _Bucket:
    """One listing of the run's prefix, then the reads. CloudtrainError when it cannot be
    listed; an object gone between the listing and its read is skipped."""
    prefix = run_prefix(run_id)
    out = _Bucket()
    chunks: dict[str, list[str]] = {}
    for obj in store.list(prefix):
        parts = obj.key[len(prefix) :].split("/")
        if len(parts) == 3 and parts[0] == "metrics" and _is_node(parts[1]):
            if _CHUNK_RE.match(parts[2]):
                chunks.setdefault(parts[1], []).append(obj.key)
        elif len(parts) == 2 and parts[0] == "status" and parts[1].endswith(".json"):
            node = parts[1].removesuffix(".json")
            status = _document(out, store, obj.key, NodeStatus) if _is_node(node) else None
            if status is not None:
                out.statuses[node] = status
        elif len(parts) == 2 and parts[0] == "bootstrap" and parts[1].endswith(".log"):
            _add_boot_log(out, store, obj.key, parts[1].removesuffix(".log"))
        elif len(parts) == 2 and parts[0] == "trace" and parts[1].endswith(".json"):
            _add_trace(out, store, obj.key, parts[1].removesuffix(".json"))
        elif len(parts) == 3 and (m := _ATTEMPT_DIR_RE.match(parts[0])):
            name = parts[2].removesuffix(".json").removesuffix(".log")
            if parts[1] == "bootstrap" and parts[2].endswith(".log"):
                _add_boot_log(out, store, obj.key, name)
            elif parts[1] == "nodes" and parts[2].endswith(".json") and _is_node(name):
                reg = _document(out, store, obj.key, Registration)
                if reg is not None and reg.time > 0:
                    out.registrations.setdefault(int(m["n"]), {})[name] = reg.time
    for node, keys in sorted(chunks.items()):
        records: list[dict[str, Any]] = []
        if len(keys) > MAX_CHUNKS_PER_NODE:
            out.skipped += len(keys) - MAX_CHUNKS_PER_NODE
        for key in sorted(keys)[:MAX_CHUNKS_PER_NODE]:  # zero-padded: key order is stream order
            body = _get(out, store, key, METRICS_CHUNK_MAX_BYTES)
            if body is None:
                continue
            got, bad = parse_records(body.decode(errors="replace").splitlines())
            records += got
            out.skipped += bad
            if len(records) > MAX_RECORDS_PER_NODE:
                out.skipped += len(records) - MAX_RECORDS_PER_NODE
                records = records[:MAX_RECORDS_PER_NODE]
                break
        records.sort(key=lambda r: r["time"])
        out.records[node] = records
    return out


def _add_boot_log(out: _Bucket, store: ObjectStore, key: str, node: str) -> None:
    if _is_node(node) and (body := _get(out, store, key, BOOT_LOG_MAX_BYTES)) is not None:
        out.boot_logs.setdefault(node, []).append(body.decode(errors="replace"))


def _add_trace(out: _Bucket, store: ObjectStore, key: str, node: str) -> None:
    """The node's spans from its trace document (jobs/trace.py's TraceDoc; one GET, as
    trace_view.load_spans reads it): only those it recorded as itself, at finite times, and
    at most MAX_SPANS_PER_NODE of them. The GET is bounded and the JSON read by the protocol's
    rule (depth, finite numbers); what does not parse is skipped."""
    if not _is_node(node):
        return
    if sum(map(len, out.traces.values())) >= MAX_TRACE_SPANS:
        out.skipped += 1  # the trace documents after the cap: counted, not read
        return
    if (body := _get(out, store, key, TRACE_MAX_BYTES)) is None:
        return
    try:
        data = load_json(body, what="trace", max_bytes=TRACE_MAX_BYTES)
        if not isinstance(data, dict) or not isinstance(data.get("spans"), list):
            raise ValueError("a trace document is an object with a list of spans")
        listed = data["spans"]
        spans = [tr.Span.from_dict(s) for s in listed[:MAX_SPANS_PER_NODE]]
    except ValueError as exc:  # ProtocolError, a span that is not one
        out.skipped += 1
        out.skips.skip(key, str(exc))
        return
    out.skipped += len(listed) - len(spans)
    mine = [s for s in spans if s.node == node]
    out.traces[node] = [s for s in mine if math.isfinite(s.start) and math.isfinite(s.end)]
    out.skipped += len(mine) - len(out.traces[node])


def _get(out: _Bucket, store: ObjectStore, key: str, max_bytes: int) -> bytes | None:
    """The object at `key` if at most `max_bytes` (else skipped and counted); None if none."""
    body = get_bounded(store, key, max_bytes, out.skips)
    if body is None and key in out.skips.reasons:
        out.skipped += 1
    return body


def _document(
    out: _Bucket, store: ObjectStore, key: str, kind: type[protocol.D]
) -> protocol.D | None:
    """The `kind` document at `key`, or None when there is none or it is skipped (counted)."""
    body = _get(out, store, key, kind.MAX_BYTES)
    doc = None if body is None else parse_document(kind, body, key, out.skips)
    out.skipped += body is not None and doc is None
    return doc


def _is_node(name: str) -> bool:
    return NODE_RE.fullmatch(name) is not None


def parse_records(lines: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
    """The metrics records among JSON `lines` (protocol.METRICS: an object with a finite
    `time` and a string `kind` of RECORD_KINDS; other kinds are a newer writer's and are left
    out, uncounted) and how many lines were not such a record. Pure."""
    records: list[dict[str, Any]] = []
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:  # the protocol's rule: depth-capped, finite numbers only
            rec = load_json(line, what="a metrics record", max_bytes=METRICS_CHUNK_MAX_BYTES)
        except ValueError:
            bad += 1
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
            bad += 1
            continue
        at = number(rec.get("time"))
        if at is None:
            bad += 1
            continue
        if rec["kind"] in RECORD_KINDS:
            records.append({**rec, "time": at})
    return records, bad


def number(value: Any) -> float | None:
    """`value` as a finite float, or None for anything else (a bool, text, NaN, None). Pure."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


# --- the ledger's part -----------------------------------------------------------------------
def _plan(rec: RunRecord) -> dict[str, Any]:
    try:
        plan = rec.plan
    except ValueError:
        return {}
    return plan if isinstance(plan, dict) else {}


def _instance_types(plan: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in plan.get("nodes") or []:
        if isinstance(node, dict) and isinstance(node.get("index"), int):
            name = node_id(str(node.get("role")), node["index"])
            if _is_node(name):
                out[name] = str(node.get("instance_type") or "")
    return out


def _nodes(planned: dict[str, str], bucket: _Bucket) -> list[str]:
    seen = set(planned) | set(bucket.records) | set(bucket.statuses) | set(bucket.boot_logs)
    seen |= set(bucket.traces)
    for regs in bucket.registrations.values():
        seen |= set(regs)

    def order(name: str) -> tuple[int, int]:
        role, _, index = name.rpartition("-")
        return _ROLE_ORDER.get(role, 9), int(index)

    others = sorted(seen - set(planned), key=order)[: max(0, MAX_NODES - len(planned))]
    bucket.skipped += len(seen) - len(planned) - len(others)  # named only by the bucket: cut
    return sorted({*planned, *others}, key=order)


def resources_deleted(resources: Iterable[Any]) -> list[float]:
    """The `deleted_at` of every resource the ledger saw deleted. Pure."""
    return [r.deleted_at for r in resources if r.deleted_at is not None]


def cost_curve(
    nodes: list[tuple[float, float | None, float]], start: float, now: float
) -> list[tuple[float, float]]:
    """The cumulative billed $ over time of nodes given as (billed from, billed to or None
    while it lives, $ per hour): the ledger's rule (Ledger.billed_cost: from the intent to the
    confirmed delete, or `now`). Points at `start` and at every change of slope, ending at the
    last delete (or `now` while a node lives); linear between them. Pure."""
    spans = [(a, b if b is not None else now, p) for a, b, p in nodes]
    end = max([b for _, b, _ in spans] + [start])
    marks = sorted({start, end, *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
    points = []
    for t in marks:
        if start <= t <= end:
            usd = sum((p * max(0.0, min(t, b) - a) / 3600.0 for a, b, p in spans if p), 0.0)
            points.append((t, usd))
    return points


# --- the timeline --------------------------------------------------------------------------------
def timeline(data: ReportData, bucket: _Bucket, deleted: list[float], run_id: str) -> list[Span]:
    """The Gantt chart's bars: provision, each node's boot phases, each attempt's rendezvous,
    training (per attempt: "starting" from the rendezvous to the first record, then "epochs"
    from the first epoch's start or window record to the last record; without metrics, "job"
    from the rendezvous to the nodes' final statuses), restarts and teardown. Pure."""
    spans: list[Span] = []
    restarts = [(t, m) for t, kind, m in data.events if kind in ("restart", "retry")]
    first_restart = min([t for t, _ in restarts], default=math.inf)
    created = [t for t, kind, m in data.events if kind == "node" and m.startswith("created ")]
    initial = [t for t in created if t < first_restart]
    boot = {node: boot_spans(texts) for node, texts in bucket.boot_logs.items()}
    boot_starts = [s.start for spans_ in boot.values() for s in spans_]
    provision_end = max(initial) if initial else min(boot_starts, default=None)
    if provision_end is not None:
        spans.append(Span(PROVISION, "nodes", data.started, max(data.started, provision_end)))
    for node in data.nodes:
        for s in boot.get(node, []):
            if s.label in BOOT_PHASES:  # the agent's own time is the rendezvous and the job's
                spans.append(Span(f"{BOOT} {node}", s.label, s.start, s.end))
    agent_starts = [s.start for spans_ in boot.values() for s in spans_ if s.label == "agent"]
    attempt_started: dict[int, float] = {}
    for t, message in restarts:
        if m := _ATTEMPT_RE.match(message):
            attempt_started.setdefault(int(m["n"]), t)
    first = min(bucket.registrations, default=None)
    for n, regs in sorted(bucket.registrations.items()):
        start = attempt_started.get(n)
        if start is None and n == first and agent_starts:
            start = min(agent_starts)
        start = min(start if start is not None else math.inf, min(regs.values()))
        spans.append(Span(RENDEZVOUS, f"attempt {n}", start, max(regs.values())))
    training = _training(data, bucket, [t for t, _ in restarts])
    rendezvous_ends = [s.end for s in spans if s.lane == RENDEZVOUS]
    for bar in training:  # from the rendezvous to the first record: imports, setup, restore
        before = [t for t in rendezvous_ends if t <= bar.start]
        if bar.label == "epochs" and before and max(before) < bar.start:
            spans.append(Span(TRAINING, "starting", max(before), bar.start))
    spans += training
    for t, message in restarts:
        m = _ATTEMPT_RE.match(message)
        regs = bucket.registrations.get(int(m["n"])) if m else None
        spans.append(Span(RESTARTS, message, t, max([t, *(regs or {}).values()])))
    if deleted:
        end = max(deleted)
        job_end = _job_end(bucket)
        start = job_end if job_end is not None and job_end <= end else min(deleted)
        spans.append(Span(TEARDOWN, "delete", start, end))
    # the bootstrap logs' clock has whole seconds: nothing of the run came before its record
    return [
        Span(s.lane, s.label, max(s.start, data.started), max(s.end, s.start, data.started))
        for s in spans
    ]


def _training(data: ReportData, bucket: _Bucket, restarts: list[float]) -> list[Span]:
    """Per attempt (the records between restart events), from the first epoch's start (or
    window record) to the last record; without metrics, each attempt's job from its last
    registration to the nodes' final statuses (label "job")."""
    marks: list[tuple[float, float]] = []  # (start, end) of each epoch/window record
    for records in data.records.values():
        for r in records:
            if r["kind"] == "epoch":
                took = number(r.get("seconds")) or 0.0
                marks.append((r["time"] - max(0.0, took), r["time"]))
            elif r["kind"] == "window":
                marks.append((r["time"], r["time"]))
    if marks:
        cuts = sorted(restarts)
        groups: dict[int, list[tuple[float, float]]] = {}
        for start, end in marks:
            groups.setdefault(sum(1 for c in cuts if c <= end), []).append((start, end))
        return [
            Span(TRAINING, "epochs", min(a for a, _ in g), max(b for _, b in g))
            for _, g in sorted(groups.items())
        ]
    job_end = _job_end(bucket)
    out = []
    for n, regs in sorted(bucket.registrations.items()):
        ends = [s.time for s in bucket.statuses.values() if s.attempt == n and s.time > 0]
        end = max(ends) if ends else job_end
        if end is not None and end >= max(regs.values()):
            out.append(Span(TRAINING, "job", max(regs.values()), end))
    return out


def _job_end(bucket: _Bucket) -> float | None:
    """When the job ended: the newest attempt's latest final node status."""
    final = [s for s in bucket.statuses.values() if str(s.state) in FINAL_STATES and s.time > 0]
    if not final:
        return None
    newest = max(s.attempt for s in final)
    return max(s.time for s in final if s.attempt == newest)


def boot_spans(texts: Iterable[str]) -> list[Span]:
    """Each bootstrap phase's bar (lane "boot"; label the phase, "agent" included) in the
    startup script's logs `texts` (one per incarnation of the node): from the phase's first
    timestamped line to its first line plus its duration (`... in Ns`, or the `durations`
    line; else its last line). The logs' clock has whole seconds. Pure."""
    out: list[Span] = []
    for text in texts:
        durations = bootlog.parse(text).durations
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        took: dict[str, float] = {}
        for line in text.splitlines():
            m = _BOOT_LINE_RE.match(line.strip())
            if not m or m["phase"] not in bootlog.PHASES:
                continue
            try:
                at = (
                    datetime.strptime(m["ts"], "%Y-%m-%dT%H:%M:%SZ")
                    .replace(tzinfo=timezone.utc)
                    .timestamp()
                )
            except ValueError:
                continue
            first.setdefault(m["phase"], at)
            last[m["phase"]] = at
            if s := _IN_SECONDS_RE.search(m["state"]):
                took[m["phase"]] = float(s["s"])
        for phase in bootlog.PHASES:
            if phase in first:
                seconds = took.get(phase, durations.get(phase))
                end = first[phase] + seconds if seconds is not None else last[phase]
                out.append(Span(BOOT, phase, first[phase], max(first[phase], end)))
    return out
