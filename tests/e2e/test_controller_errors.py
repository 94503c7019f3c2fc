"""Teardown whatever happens (issue 29): an exception anywhere in the watch or the live view still
ends in teardown, and `Orchestrator.run` returns a result instead of raising.

Real local runs of a two-worker tick job (no TensorFlow), in process, through the orchestrator:
- the live view raises on every call (a renderer's bug meeting node text): the run goes on to its
  end and tears down; the display's failure is said once, in the ledger;
- one reply of the cloud is malformed (a `KeyError` out of an adapter's parsing, not one of
  cloudtrain's errors) in the middle of the watch: the run ends `failed` naming it, and
  everything is torn down all the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.catalog.offers import Catalog
from cloudtrain.jobspec.job import load_spec
from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.plan.planner import make_plan
from cloudtrain.providers.base import Compute, Node
from cloudtrain.providers.faults import FaultPlan, FaultyCompute
from cloudtrain.providers.local import LocalProvider
from cloudtrain.run.orchestrator import Orchestrator
from cloudtrain.run.view import Observer, RunResult
from cloudtrain.state.ledger import Ledger
from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.nothing_created import home_processes
from tests.unit.security_kit import QuietObserver

pytestmark = pytest.mark.e2e
TICK = """\
import sys, time
for i in range(1, 9):
    time.sleep(0.3)
    print(f"cloudtrain: epoch {i}/8 done [bold]{i}[/", flush=True)
"""


def _job(home: Path) -> Path:
    dest = home / "jobs" / "faults"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tick.py").write_text(TICK)
    spec = yaml.safe_load((EXAMPLES / "digits-multiworker" / "job.yaml").read_text())
    spec.pop("setup", None)  # the example's scikit-learn check: tick.py needs none
    spec.update(name="faults", workdir=".", entrypoint="python tick.py")
    (dest / "job.yaml").write_text(yaml.safe_dump(spec))
    return dest / "job.yaml"


def _run(ct: Env, monkeypatch: pytest.MonkeyPatch, observer: Observer, **kw: Any) -> RunResult:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(ct.home))
    spec = load_spec(_job(ct.home))
    plan = make_plan(spec, Catalog.bundled())
    provider = LocalProvider()
    if "compute" in kw:
        wrapped = kw["compute"](provider.compute)
        monkeypatch.setattr(LocalProvider, "compute", property(lambda _self: wrapped))
    ledger = Ledger(ct.home / "ledger.db")
    options = RunOptions.for_provider("local")
    orch = Orchestrator(spec, plan, provider, ledger, observer, options)
    if "compute" in kw:
        wrapped.orch = orch
    return orch.run()


def _assert_torn_down(ct: Env, result: RunResult) -> None:
    ledger = Ledger(ct.home / "ledger.db")
    states = [(r.kind, r.resource_id, r.state) for r in ledger.resources(result.run_id)]
    assert states and all(state == "deleted" for _, _, state in states), states
    assert ledger.get_run(result.run_id).status == "done"  # type: ignore[union-attr]
    assert home_processes(ct.home) == {}


class BrokenView(QuietObserver):
    """A live view whose renderer raises on every update and every log line."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = 0

    def update(self, view: Any) -> None:
        self.raised += 1
        raise OverflowError("cannot convert float infinity to integer")

    def log_line(self, node: str, line: str) -> None:
        self.raised += 1
        raise ValueError(f"closing tag '[/' has nothing to close: {line}")


def test_a_live_view_that_raises_neither_ends_the_run_nor_skips_its_teardown(
    ct: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = BrokenView()
    result = _run(ct, monkeypatch, view)
    assert view.raised > 0  # the view was really broken, and really called
    assert result.outcome == "succeeded", result.detail
    _assert_torn_down(ct, result)
    said = [e.message for e in Ledger(ct.home / "ledger.db").events(result.run_id)]
    display = [d for d in said if "display" in d]
    assert len(display) == 1, said  # said once, not once per call
    assert "OverflowError" in display[0] or "ValueError" in display[0]


class OddReplyOnce(FaultyCompute):
    """The local compute, whose first `list_nodes` in the watch gets a malformed reply: the
    adapter's parsing raises a KeyError, as a bug meeting an odd cloud answer would."""

    orch: Orchestrator | None = None

    def __init__(self, inner: Compute) -> None:
        super().__init__(inner, FaultPlan())
        self.odd = 0

    def list_nodes(self, run_id: str) -> list[Node]:
        watching = self.orch is not None and self.orch.view.phase == "running"
        if watching and self.odd == 0 and self.orch.reader is not None:  # type: ignore[union-attr]
            self.odd += 1
            raise KeyError("InstanceId")
        return super().list_nodes(run_id)


def test_an_unexpected_error_in_the_watch_still_tears_everything_down(
    ct: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    observer = QuietObserver()
    result = _run(ct, monkeypatch, observer, compute=OddReplyOnce)
    assert result.outcome == "failed"
    assert "KeyError" in result.detail and "InstanceId" in result.detail, result.detail
    _assert_torn_down(ct, result)
    events = Ledger(ct.home / "ledger.db").events(result.run_id)
    assert any("Traceback" in e.message and "KeyError" in e.message for e in events), events
