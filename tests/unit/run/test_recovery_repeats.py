"""A failure that would repeat costs one attempt: the recovery ends the run at the first
firewall failure (a peer that never answered) whatever max_restarts_on_errors allows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloudtrain.jobs.reachability import HINT
from cloudtrain.run.recovery import Recovery, Stop
from cloudtrain.run.view import Outcome
from cloudtrain.state.failures import NodeFailure


class _Recovery(Recovery):
    """The part with just the inputs `after_failure` reads; a new attempt is recorded."""

    def __init__(self, allowed: int) -> None:
        self.events: list[str] = []
        state = SimpleNamespace(attempt=1, job_end=None, plan=SimpleNamespace(nodes=[]))
        spec = SimpleNamespace(max_restarts_on_errors=allowed, secret_values=lambda: [])
        observer = SimpleNamespace(event=self.events.append)
        provisioner = SimpleNamespace(list_nodes=lambda: [])
        super().__init__(state, spec, None, observer, None, "job-abc123", provisioner)  # type: ignore[arg-type]
        self.retried: list[str] = []

    def _next_attempt(self, why: str, what: str, dead: list[str], detail: str) -> None:
        self.retried.append(what)


def test_a_firewall_failure_ends_the_run_although_retries_remain() -> None:
    rec = _Recovery(allowed=2)
    reason = f"rendezvous: worker-0 at 10.213.7.3:2222 never answered in 30 s: {HINT}"
    silent = NodeFailure("chief-0", reason)
    with pytest.raises(Stop) as stop:
        rec.after_failure([silent])
    assert stop.value.outcome is Outcome.FAILED
    assert "a peer that never answered is not retried" in stop.value.detail
    assert rec.retried == [] and rec.error_retries == 0


def test_another_failure_is_retried_while_retries_remain() -> None:
    rec = _Recovery(allowed=2)
    rec.after_failure([NodeFailure("worker-0", "exit code 1")])
    assert rec.retried == ["worker-0"] and rec.error_retries == 1
