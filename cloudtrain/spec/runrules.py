"""The rules of a run that need no provider: its id, the ports its nodes open to each other,
and when a node counts as lost and when as failed (and so which end a restart can fix).

Used by the orchestrator; pure. (Signals during a teardown: `cloudtrain.run.stop_signals`.)
"""

from __future__ import annotations

import re
import secrets
import signal
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from cloudtrain.jobs.protocol import NodeState
from cloudtrain.spec.runtypes import RunOptions

if TYPE_CHECKING:
    from cloudtrain.spec.job import JobSpec

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
    every unprivileged port (Gloo and NCCL connect between processes on random ports)."""
    if spec.cluster.strategy == "horovod":
        return (1024, 65535)
    return (spec.cluster.port, spec.cluster.port + 10)


RUN_ID_HEX = 3  # bytes of randomness: six hex digits after the job's name
# a run id is `new_run_id(name)`: the job's name (spec.py's rule: a lowercase letter, then up to
# 29 lowercase letters, digits or '-') and six lowercase hex digits. Commands take a unique
# prefix of one, so a reference is any non-empty prefix of that shape.
RUN_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,29}-[0-9a-f]{6}")
RUN_REF_RE = re.compile(r"[a-z][a-z0-9-]{0,36}")
RUN_REF_MAX = 37


def new_run_id(name: str) -> str:
    """A short unique run id usable in every cloud's resource names (see `check_run_ref`)."""
    return f"{name}-{secrets.token_hex(RUN_ID_HEX)}"


def check_run_ref(value: str, *, exact: bool = False) -> str:
    """`value` if it has the shape of a run id (`exact`) or of a prefix of one, else UsageError
    naming the problem. Pure. Every command checks a run id from the command line here before
    any path, query, cloud filter or object key is built from it; so do the providers' path
    builders (defence in depth)."""
    from cloudtrain.core.errors import UsageError

    shown = repr(value[:40] + ("..." if len(value) > 40 else ""))
    what = "a run id" if exact else "a run id (or a unique prefix of one)"
    hint = "`cloudtrain ls` lists the runs"
    if not value:
        raise UsageError(f"expected {what}, got an empty string", hint=hint)
    if len(value) > RUN_REF_MAX:
        raise UsageError(
            f"{shown} is not {what}: longer than {RUN_REF_MAX} characters", hint=hint
        )
    rule = RUN_ID_RE if exact else RUN_REF_RE
    if rule.fullmatch(value) is None:
        shape = "NAME-xxxxxx" if exact else "NAME-xxxxxx or a prefix of it"
        raise UsageError(
            f"{shown} is not {what}: expected {shape}, where NAME starts with a lowercase letter "
            "and has only lowercase letters, digits and '-'",
            hint=hint,
        )
    return value


def is_run_id(value: str) -> bool:
    """Whether `value` has the exact shape of a run id (as `new_run_id` makes). Pure."""
    return isinstance(value, str) and RUN_ID_RE.fullmatch(value) is not None
