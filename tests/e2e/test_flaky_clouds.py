"""Flaky clouds: with 20 % of the calls throttled or failing with a 5xx, and 20 % of the node
creates succeeding with their reply lost, a run still succeeds, and it creates exactly the nodes
it asked for (a retried create never makes a second VM).

- local, in process, through `providers/faults.py` around the real local provider: the wrapper
  counts what it injected (calls throttled, replies lost), and the nodes are counted where the
  local cloud keeps them (node folders, boots in each console.log, processes);
- AWS on moto through the CLI (`$CLOUDTRAIN_FAULTS`): moto then holds exactly two instances.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cloudtrain.catalog.offers import Catalog
from cloudtrain.core import retry
from cloudtrain.core.errors import TransientError
from cloudtrain.jobspec.job import load_spec
from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.plan.planner import make_plan
from cloudtrain.providers.aws.network import TAG_RUN
from cloudtrain.providers.base import Compute, Node, NodeRequest, RunInfo, node_name
from cloudtrain.providers.faults import THROTTLED, FaultPlan, FaultyCompute, wrap
from cloudtrain.providers.local import LocalProvider
from cloudtrain.providers.retrying import wrap_provider
from cloudtrain.run.orchestrator import Orchestrator
from cloudtrain.state.ledger import Ledger
from tests.e2e import reliability_report
from tests.e2e.conftest import EXAMPLES, Env
from tests.e2e.nothing_created import home_processes
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
    spec.pop("setup", None)  # the example's scikit-learn check: tick.py needs none
    spec.update(name="flaky", workdir=".", entrypoint="python tick.py")
    spec["cluster"]["workers"] = workers
    (dest / "job.yaml").write_text(yaml.safe_dump(spec))
    return dest / "job.yaml"


def _boots(node_dir: Path) -> int:
    """How many times a local node's startup script began: its console.log gets one `start`
    line per session started in the folder (providers/local.py `start_session` appends)."""
    console = (node_dir / "console.log").read_text(errors="replace")
    return len(re.findall(r"cloudtrain-bootstrap\[[\w-]+\]: start \(deadline", console))


class FirstReplyLost(FaultyCompute):
    """FaultyCompute that also loses the reply to the first create of each node (the create
    succeeds, then answers with an error), so every node's create is retried at least once:
    the random faults alone may lose no reply at all."""

    def __init__(self, inner: Compute, plan: FaultPlan) -> None:
        super().__init__(inner, plan)
        self.replied_once: set[str] = set()

    def create_node(self, run: RunInfo, request: NodeRequest) -> Node:
        """FaultyCompute's create, whose first success per node name is answered as an error."""
        node = super().create_node(run, request)
        with self._lock:
            first = request.name not in self.replied_once
            self.replied_once.add(request.name)
            if first:
                self.lost_replies += 1
        if first:
            raise TransientError(f"{THROTTLED}: first reply to create {request.name} lost")
        return node


def test_local_run_absorbs_throttling_and_lost_replies(
    ct: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(ct.home))
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.02)
    spec = load_spec(_job(ct.home, workers=3))
    plan = make_plan(spec, Catalog.bundled())
    faulty = wrap(LocalProvider(), FaultPlan.from_dict(FLAKY))
    compute = FirstReplyLost(faulty.inner.compute, faulty.plan)
    monkeypatch.setattr(type(faulty), "compute", property(lambda self: compute))
    provider = wrap_provider(faulty)  # as the registry builds it: the retry layer outside
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
    wanted = sorted(node_name(orch.run_id, n.role, n.index) for n in plan.nodes)
    # what the local cloud holds, not the wrapper's bookkeeping: one node folder per node, and
    # one boot per folder (a second VM made by a retried create boots again in the same folder,
    # appending to its console.log), and no process left of any of them
    nodes_dir = ct.home / "local" / "runs" / orch.run_id / "nodes"
    made = sorted(p.name for p in nodes_dir.iterdir() if (p / "node.json").is_file())
    assert made == wanted
    boots = {name: _boots(nodes_dir / name) for name in made}
    assert boots == dict.fromkeys(wanted, 1), boots
    assert home_processes(ct.home) == {}
    throttled = sum(compute.throttled.values()) + sum(faulty.store_faults.throttled.values())
    calls = sum(compute.calls.values()) + sum(faulty.store_faults.calls.values())
    # the faults were really injected: calls throttled, and creates that succeeded but answered
    # with an error (at least the first of each node), so the run retried creates of live nodes
    assert throttled > 0, compute.calls
    assert compute.replied_once == set(wanted) and compute.lost_replies >= len(wanted)
    reliability_report.record(
        "flaky",
        "local",
        calls=calls,
        throttled=throttled,
        lost_replies=compute.lost_replies,
        absorbed=throttled + compute.lost_replies,
        nodes_requested=len(wanted),
        nodes_created=sum(boots.values()),
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
