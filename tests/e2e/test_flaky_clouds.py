"""Flaky clouds: with 20 % of the calls throttled or failing with a 5xx, and 20 % of the node
creates succeeding with their reply lost, a run still succeeds, and it creates exactly the nodes
it asked for (a retried create never makes a second VM).

- local, in process, through `providers/faults.py` around the real local provider: the wrapper
  counts what it injected, so the figures (calls throttled and absorbed) go to the report;
- AWS on moto through the CLI (`$CLOUDTRAIN_FAULTS`): moto then holds exactly two instances.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cloudtrain import retry
from cloudtrain.catalog import Catalog
from cloudtrain.ledger import Ledger
from cloudtrain.orchestrator import Orchestrator
from cloudtrain.plan import make_plan
from cloudtrain.providers.aws.network import TAG_RUN
from cloudtrain.providers.base import node_name
from cloudtrain.providers.faults import FaultPlan, wrap
from cloudtrain.providers.local import LocalProvider
from cloudtrain.runtypes import RunOptions
from cloudtrain.spec import load_spec
from tests.e2e import reliability_report
from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.test_aws_in_a_box import REGION, AwsBox, aws
from tests.unit.security_kit import QuietObserver

__all__ = ["aws"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
FLAKY = {"error_rate": 0.2, "store_error_rate": 0.2, "lost_reply_rate": 0.2, "seed": 7}
TICK = """\
import sys, time
for i in range(1, 4):
    time.sleep(0.3)
    print(f"cloudtrain: epoch {i}/3 done", flush=True)
"""


def _job(home: Path, workers: int) -> Path:
    dest = home / "jobs" / "flaky"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tick.py").write_text(TICK)
    spec = yaml.safe_load((EXAMPLES / "digits-multiworker" / "job.yaml").read_text())
    spec.update(name="flaky", workdir=".", entrypoint="python tick.py")
    spec["cluster"]["workers"] = workers
    (dest / "job.yaml").write_text(yaml.safe_dump(spec))
    return dest / "job.yaml"


def test_local_run_absorbs_throttling_and_lost_replies(
    ct: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(ct.home))
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.02)
    spec = load_spec(_job(ct.home, workers=3))
    plan = make_plan(spec, Catalog.bundled())
    provider = wrap(LocalProvider(), FaultPlan.from_dict(FLAKY))
    orch = Orchestrator(
        spec,
        plan,
        provider,
        Ledger(ct.home / "ledger.db"),
        QuietObserver(),
        RunOptions.for_provider("local"),
    )
    result = orch.run()
    assert result.outcome == "succeeded", (result.detail, orch.observer.lines)  # type: ignore[attr-defined]
    compute = provider.compute
    wanted = sorted(node_name(orch.run_id, n.role, n.index) for n in plan.nodes)
    assert sorted(compute.created) == wanted  # each node made once, none twice
    throttled = sum(compute.throttled.values()) + sum(provider.store_faults.throttled.values())
    calls = sum(compute.calls.values()) + sum(provider.store_faults.calls.values())
    assert throttled > 0 and compute.lost_replies >= 0
    assert ct.live_processes() == []
    reliability_report.record(
        "flaky",
        "local",
        calls=calls,
        throttled=throttled,
        lost_replies=compute.lost_replies,
        absorbed=throttled + compute.lost_replies,
        nodes_requested=len(wanted),
        nodes_created=len(compute.created),
        outcome=result.outcome,
    )


def test_aws_run_absorbs_throttling_and_lost_replies(aws: AwsBox) -> None:
    aws.ct.env["CLOUDTRAIN_FAULTS"] = json.dumps(FLAKY)
    job = _job(aws.ct.home, workers=2)
    proc = aws.run("run", "--provider", "aws", "--region", REGION, str(job))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_id,) = aws.ct.run_ids()
    tag = {"Key": TAG_RUN, "Value": run_id}
    mine = [i for i in aws.instances() if tag in i.get("Tags", [])]
    assert len(mine) == 2, [i["InstanceId"] for i in mine]
    aws.assert_nothing_left(run_id)
    reliability_report.record("flaky", "aws", nodes_requested=2, nodes_created=len(mine))
