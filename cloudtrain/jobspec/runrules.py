"""The rules of a run that need no provider: the ports its nodes open to each other, and when a
node counts as lost and when as failed (and so which end a restart can fix). Its id: run_ids.py.

Used by the orchestrator; pure. (Signals during a teardown: `cloudtrain.run.stop_signals`.)
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from cloudtrain.jobs.protocol import NodeState
from cloudtrain.jobs.strategies import ROLES
from cloudtrain.jobspec.run_options import RunOptions

# a node's short name in the bucket: the role (jobs/strategies.py's ROLES) and its index
NODE_RE = re.compile(rf"({'|'.join(ROLES)})-[0-9]{{1,4}}")

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec

# an agent failure a new attempt can fix (a restarted cluster rendezvous again)
RESTARTABLE_REASONS = frozenset({"rendezvous timeout"})
# Signals that come from outside the training process: the OOM killer, an operator, the VM
# shutting down. A training process ended by one of them was killed (the node is counted as
# lost, as before); one ended by any other signal (SIGSEGV, SIGABRT, SIGBUS...) crashed itself.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def status_verdict(status: Mapping[str, Any]) -> Literal["lost", "failed"] | None:
    """What a node's own status (a protocol.NodeStatus, or any Mapping of its fields) says
    about it: None unless its state is `failed`; "lost" when a restart can fix it (a rendezvous
    timeout: a peer never came; the training killed from outside); "failed" for everything else:
    the training exited non-zero or crashed, its setup failed, or the agent itself raised. Pure."""
    if status.get("state") != NodeState.FAILED:
        return None
    if status.get("reason") in RESTARTABLE_REASONS:
        return "lost"
    sig = status.get("signal")
    if isinstance(sig, int) and not isinstance(sig, bool) and sig in OUTSIDE_SIGNALS:
        return "lost"
    return "failed"


def agent_exit_verdict(returncode: int) -> Literal["lost", "failed"] | None:
    """What the agent's exit code (the bootstrap log's `phase agent: exited with N`) says: None
    for 0 (it stopped as asked, or lingered out); "lost" when a signal from outside killed it
    (128 + SIGKILL/SIGTERM...); "failed" otherwise (it crashed: a traceback, a missing
    cluster document). Pure."""
    if returncode == 0:
        return None
    if returncode > 128 and returncode - 128 in OUTSIDE_SIGNALS:
        return "lost"
    return "failed"


@dataclass(frozen=True)
class Verdict:
    """What the controller does about the current attempt: carry on (`ok`), `restart` it for
    the `lost` nodes, `wait` before judging the `failed` ones, or end the run as `failed`."""

    action: Literal["ok", "restart", "wait", "failed"]
    lost: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


def judge_attempt(
    gone: Set[str],
    reported_lost: Set[str],
    failed: Set[str],
    failed_since: float | None,
    heard: Mapping[str, float],
    now: float,
    grace_s: float,
) -> Verdict:
    """Lost or failed? `gone`: nodes the cloud lists as gone or whose heartbeat went silent;
    `reported_lost`: nodes whose own report says a restart can fix them (a preemption notice,
    `status_verdict` "lost"); `failed`: nodes that reported a failure in this attempt (status or
    the agent's exit), first seen at `failed_since`; `heard`: when the controller last read a
    new heartbeat of each node heard from in this attempt (its own clock, like `now`). Pure.

    The rule, and why:
    1. A node that reported its own failure is failed even if it is gone by now: a crashed
       agent's node powers itself off right after the report. (The controller lists the cloud
       before it reads the bucket, so a report written before a node vanished is always seen
       with the vanishing.)
    2. A node lost in the attempt explains every failure in it: MultiWorkerMirrored workers
       (and parameter-server workers) exit non-zero when a peer dies. So any lost node means
       a restart (counted against max_restarts), and the failed ones join the next attempt.
    3. A failure with no loss is final only once nothing can still turn into a loss: the
       survivor sees a peer's death (a reset connection) seconds before the controller can
       (a listing every `list_nodes_s`, a heartbeat timeout of minutes). So the controller
       waits `grace_s`, and until every other node heard from in this attempt has beaten
       again since the failure was seen: a node that is dead or cut off never does, and
       becomes lost instead (rule 2). A node not heard from in this attempt (still booting)
       cannot have broken a peer's training, so it does not hold the verdict.
    """
    lost = (set(gone) - set(failed)) | set(reported_lost)
    if lost:
        return Verdict("restart", tuple(sorted(lost)), tuple(sorted(set(failed) - lost)))
    if not failed:
        return Verdict("ok")
    since = now if failed_since is None else failed_since
    silent = [n for n, t in heard.items() if n not in failed and t <= since]
    if now - since < grace_s or silent:
        return Verdict("wait", failed=tuple(sorted(failed)))
    return Verdict("failed", failed=tuple(sorted(failed)))


def node_lost(
    alive: bool, beat_time: float | None, attempt_started: float, now: float, opts: RunOptions
) -> bool:
    """Whether a node counts as lost: gone from the cloud, silent past the heartbeat timeout,
    or not yet heard from in this attempt within the boot timeout. A heartbeat older than the
    attempt is a re-created node's predecessor's, so the new node still has its boot time."""
    if not alive:
        return True
    if beat_time is None or beat_time < attempt_started:
        return now - attempt_started > opts.boot_timeout_s
    return now - beat_time > opts.heartbeat_timeout_s


def port_range_for(spec: JobSpec) -> tuple[int, int]:
    """The TCP ports the run's nodes open to each other: the run's small range, or for Horovod
    every unprivileged port (Gloo and NCCL connect between processes on random ports): the
    declaration's `peer_ports` (jobs/strategies.py). Pure."""
    return spec.cluster.strategy_info.peer_ports or (spec.cluster.port, spec.cluster.port + 10)
