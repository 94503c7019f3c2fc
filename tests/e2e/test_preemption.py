"""Preemption: a lost worker is replaced alone, every agent resumes from the latest checkpoint,
and the run ends with the requested epochs.

- local: worker-1's whole node (its process session) dies mid-epoch, as a VM taken back does;
- AWS on moto: worker-1's instance is terminated from outside, mid-epoch;
- AWS on moto with a spot interruption notice: worker-1's agent reads it from the instance
  metadata service (tests/fakes/metadata_server.py), flushes and reports it, and the controller
  replaces that node at once.

"Lost work" is measured in epochs: the attempt after the loss resumes at the epoch that was in
progress (the last epoch checkpoint was in the bucket), so less than one checkpoint interval (one
epoch) is trained twice. The figures go to the reliability report.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from cloudtrain.providers.aws.network import TAG_RUN
from cloudtrain.providers.local import session_pids
from tests.e2e import reliability_report
from tests.e2e.conftest import Env
from tests.e2e.test_aws_in_a_box import REGION, AwsBox, aws
from tests.fakes.metadata_server import MetadataServer

__all__ = ["aws"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
# the loss lands 2.5 s into epoch 2, the last one: the next attempt resumes there and ends
EPOCHS = 2
TRAIN = f"python train.py --epochs {EPOCHS} --epoch-seconds 6"
# on a cloud box the epoch line reaches the test later (the agent's flush, the controller's 2 s
# poll, moto, the harness noticing the termination): under a loaded CI the kill landed after
# epoch 2 had ended, and the run resumed "after the last epoch". Longer epochs keep it inside.
BOX_TRAIN = f"python train.py --epochs {EPOCHS} --epoch-seconds 10"
NODE_DONE_RE = rf"^cloudtrain: epoch (\d)/{EPOCHS} done"
# the notice keeps a third epoch: the agent reads the metadata service every 5 s, so it may act
# on the notice up to about 7 s after the epoch line was seen, past the end of a second epoch
NOTICE_EPOCHS = 3
NOTICE_TRAIN = f"python train.py --epochs {NOTICE_EPOCHS} --epoch-seconds 6"
NOTICE_DONE_RE = rf"^\[worker-1\] cloudtrain: epoch (\d)/{NOTICE_EPOCHS} done"


def _created(ct: Env, run_id: str) -> list[str]:
    """The node creates the ledger logged, in order (one per create that succeeded)."""
    return [e.message for e in ct.ledger().events(run_id) if e.message.startswith("created ")]


def _check_recovery(
    ct: Env, run_id: str, lost_during: int, provider: str, epochs: int = EPOCHS
) -> None:
    """The run succeeded with all `epochs`, resumed at the epoch in progress at the loss (the
    one during which it was asked, or a later one where the cloud took longer to act: never
    an earlier one, which would redo finished work), and created exactly one new node
    (worker-1)."""
    out = ct.output()
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and rec.outcome == "succeeded", out[-4000:]
    assert "restart 1/" in out and "attempt 2" in out, out[-4000:]
    resumed = {
        int(k) for k in re.findall(r"^\[worker-\d\] cloudtrain: resumed at epoch (\d)", out, re.M)
    }
    story = [ln for ln in out.splitlines() if re.search(r"resumed|restored|restart|lost|done", ln)]
    assert len(resumed) == 1, (resumed, lost_during, story, out[-3000:])
    assert lost_during <= min(resumed) <= epochs, (resumed, lost_during, story, out[-3000:])
    for node in ("worker-0", "worker-1"):
        assert re.search(rf"^\[{node}\] cloudtrain: epoch {epochs}/{epochs} done", out, re.M)
    created = _created(ct, run_id)
    assert len(created) == 3 and sum(c.endswith("-worker-1") for c in created) == 2, created
    reliability_report.record(
        "preemption",
        provider,
        recovered=True,
        lost_epochs=0,  # resumed at the epoch in progress: only its partial work is redone
        new_nodes=len(created) - 2,
    )


def test_local_worker_lost_mid_epoch_is_replaced_alone(ct: Env) -> None:
    job = ct.job("digits-multiworker", TRAIN)
    cli = ct.start("run", str(job))
    try:
        # the node's own log chunks, not the CLI's output (seconds behind on a loaded machine)
        done = int(ct.wait_for_node_line("worker-1", NODE_DONE_RE)[1])
        (run_id,) = ct.run_ids()
        # at once: the chief (worker-0) lives on and flushes its checkpoints before attempt 2
        # (jobs/checkpoints.py: checkpoint_barrier); a wait here only brings the next epoch's end
        # closer (CI: an eviction 2.5 s after the line took effect after the last epoch ended)
        meta = next(ct.home.glob(f"local/runs/{run_id}/nodes/*-worker-1/node.json"))
        for pid in session_pids(int(json.loads(meta.read_text())["pid"])):
            os.kill(pid, signal.SIGKILL)  # the whole node is gone, not just its training
        assert cli.wait(timeout=300) == 0, ct.output()[-4000:]
    finally:
        cli.kill()
    _check_recovery(ct, run_id, done + 1, "local")


def _run_aws(aws: AwsBox, job: Path) -> object:
    aws.ct.env["COLUMNS"] = "200"
    return aws.ct.start("run", "--provider", "aws", "--region", REGION, str(job))


def _instances_of(aws: AwsBox, run_id: str, name: str = "") -> list[dict[str, object]]:
    tag = {"Key": TAG_RUN, "Value": run_id}
    return [
        i
        for i in aws.instances()
        if tag in i.get("Tags", [])
        and any(t["Key"] == "Name" and t["Value"].endswith(name) for t in i["Tags"])
    ]


def test_aws_instance_terminated_from_outside_is_replaced_alone(aws: AwsBox) -> None:
    job = aws.ct.job("digits-multiworker", BOX_TRAIN)
    cli = _run_aws(aws, job)
    try:
        # the node's own log chunks in the bucket, not the CLI's output (seconds behind under
        # load: the tracker's CI terminated the VM after the last epoch had ended)
        done = int(aws.wait_for_node_line("worker-1", NODE_DONE_RE)[1])
        (run_id,) = aws.ct.run_ids()
        # at once: the chief (worker-0) lives on and flushes its checkpoints before attempt 2
        # (jobs/checkpoints.py: checkpoint_barrier); a wait here only brings the next epoch's end
        # closer (CI: an eviction 2.5 s after the line took effect after the last epoch ended)
        (victim,) = [
            i for i in _instances_of(aws, run_id, "-worker-1") if i["State"]["Name"] == "running"
        ]
        aws.ec2.terminate_instances(InstanceIds=[victim["InstanceId"]])
        assert cli.wait(timeout=400) == 0, aws.ct.output()[-4000:]
    finally:
        cli.kill()
    _check_recovery(aws.ct, run_id, done + 1, "aws")
    assert len(_instances_of(aws, run_id)) == 3  # two, then the one replacement
    aws.assert_nothing_left(run_id)


def test_aws_spot_notice_replaces_the_node_at_once(aws: AwsBox, tmp_path: Path) -> None:
    with MetadataServer() as metadata:
        aws.harness.metadata_url = metadata.url
        job = aws.ct.job("digits-multiworker", NOTICE_TRAIN)
        cli = _run_aws(aws, job)
        try:
            done = int(aws.ct.wait_for(NOTICE_DONE_RE, timeout=300)[1])
            (run_id,) = aws.ct.run_ids()
            (victim,) = [
                i
                for i in _instances_of(aws, run_id, "-worker-1")
                if i["State"]["Name"] == "running"
            ]
            metadata.preempt(victim["InstanceId"])  # that instance's own metadata service
            aws.ct.wait_for(r"worker-1: preemption notice from the cloud", timeout=60)
            assert cli.wait(timeout=400) == 0, aws.ct.output()[-4000:]
        finally:
            cli.kill()
    out = aws.ct.output()
    assert "[worker-1] cloudtrain-agent[worker-1]: preemption notice (" in out, out[-4000:]
    # the notice came within the epoch after `done`: the run resumes at most one epoch back
    resumed = {
        int(k) for k in re.findall(r"^\[worker-\d\] cloudtrain: resumed at epoch (\d)", out, re.M)
    }
    assert len(resumed) == 1 and resumed.pop() >= done, out[-4000:]
    assert len(_instances_of(aws, run_id)) == 3
    aws.assert_nothing_left(run_id)
    reliability_report.record("preemption", "aws-notice", recovered=True, new_nodes=1)
