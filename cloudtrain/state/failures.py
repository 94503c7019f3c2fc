"""What the nodes reported about the current attempt (who failed, and why; who a restart can
fix) and the words a failed run ends with: each node's reason and the last lines of its log or
its agent's traceback. The rules themselves are `runrules.status_verdict` / `agent_exit_verdict`
/ `judge_attempt`. Pure: reads a Snapshot, writes nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from cloudtrain.core.redact import Redactor
from cloudtrain.jobs import reachability
from cloudtrain.jobs.protocol import NodeStatus
from cloudtrain.jobspec.runrules import agent_exit_verdict, status_verdict
from cloudtrain.state.runstate import Snapshot

TAIL_SHOWN = 20  # lines of a node's log quoted in the run's end


@dataclass(frozen=True)
class NodeFailure:
    """One node's failure: the reason on one line and the last lines before it."""

    node: str
    reason: str
    tail: tuple[str, ...] = ()


@dataclass
class Reports:
    """What the nodes said about one attempt."""

    failed: dict[str, NodeFailure] = field(default_factory=dict)
    reported_lost: set[str] = field(default_factory=set)


def _reason(status: NodeStatus) -> str:
    """A failed status as words: its reason, else how the training process ended."""
    if status.reason:
        return status.reason
    sig = status.signal
    if sig is not None and sig > 0:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"the training process was killed by {name}"
    return f"the training process exited with code {status.exit_code}"


def read_reports(snap: Snapshot, attempt: int) -> Reports:
    """The failures and restartable reports of `attempt`: failed statuses (the training, its
    setup, the agent's own error), and agents that exited non-zero without one (the bootstrap
    log's last lines then stand for the traceback). An agent killed from outside is left to
    the cloud listing: its node powers off and is found gone. Pure."""
    out = Reports()
    for node, status in snap.statuses.items():
        if status.attempt != attempt:
            continue
        verdict = status_verdict(status)
        if verdict == "lost":
            out.reported_lost.add(node)
        elif verdict == "failed":
            out.failed[node] = NodeFailure(node, _reason(status), tuple(status.tail or ()))
    for node, rc in snap.agent_exits.items():
        if node not in out.failed and agent_exit_verdict(rc) == "failed":
            tail = tuple(snap.bootstrap_tails.get(node, ()))
            out.failed[node] = NodeFailure(node, f"its agent exited with code {rc}", tail)
    return out


def describe(failures: list[NodeFailure], redactor: Redactor | None = None) -> str:
    """Each failure as `NODE failed: REASON` and, indented below, the last lines of its log,
    secrets redacted. Multi-line. Pure."""
    redact = (redactor or Redactor()).redact
    lines: list[str] = []
    for failure in sorted(failures, key=lambda f: f.node):
        lines.append(redact(f"{failure.node} failed: {failure.reason}"))
        shown = [x for x in failure.tail if x.strip()][-TAIL_SHOWN:]
        if shown:
            lines.append(f"  the last lines of {failure.node}:")
            lines.extend(f"    {redact(x)}" for x in shown)
    return "\n".join(lines)


def repeats(failure: NodeFailure) -> bool:
    """Whether a new attempt would fail the same way, whatever max_restarts_on_errors allows:
    a node that found a peer silent after the rendezvous (jobs/reachability.py) is cut off by
    the cloud's firewall, which a new attempt does not change. Pure."""
    return failure.reason.endswith(reachability.HINT)


def not_retried(allowed: int, run_id: str, failures: Iterable[NodeFailure] = ()) -> str:
    """The last line of a failed run's detail: why it was not retried (again); `failures` are
    the attempt's (one that `repeats` is never retried). Pure."""
    if any(repeats(f) for f in failures):
        why = "a peer that never answered is not retried (a new attempt meets the same firewall)"
    elif allowed:
        retries = "retry" if allowed == 1 else "retries"
        why = f"failed again after {allowed} {retries} (max_restarts_on_errors: {allowed})"
    else:
        why = "a failed node is not restarted (max_restarts_on_errors: 0)"
    return f"{why}; `cloudtrain logs {run_id}` has the whole log"
