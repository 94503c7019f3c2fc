"""The rules of a run that need no provider: its id, the ports its nodes open to each other,
when a node counts as lost, which failures a restart can fix, and Ctrl-C during teardown.

Used by the orchestrator; pure except `sigint_deferred`, which swaps the SIGINT handler.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cloudtrain.runtypes import Observer, RunOptions

if TYPE_CHECKING:
    from cloudtrain.spec import JobSpec

# an agent failure a new attempt can fix (a restarted cluster rendezvous again)
RESTARTABLE_REASONS = frozenset({"rendezvous timeout"})


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


def new_run_id(name: str) -> str:
    """A short unique run id usable in every cloud's resource names."""
    return f"{name}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def sigint_deferred(observer: Observer) -> Iterator[None]:
    """While tearing down, Ctrl-C only warns: an interrupted teardown is how VMs leak."""

    def warn(_signum: int, _frame: object) -> None:
        observer.event("teardown in progress; it finishes first (cloudtrain down RUN also works)")

    try:
        previous = signal.signal(signal.SIGINT, warn)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
