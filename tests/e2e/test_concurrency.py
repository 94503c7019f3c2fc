"""Two cloudtrain processes at once on one machine, sharing one $CLOUDTRAIN_HOME (its ledger, its
bundles folder, its local bucket): two `run`s of the same job, and a `run` racing a `down` of
it. Real CLI processes on the local provider; the job is tick.py (no TensorFlow).

Both must behave: each run succeeds, or the raced run ends with a clear outcome and exit code;
and nothing is left: no node process, no live resource in the ledger, every run `done`.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from cloudtrain.state.ledger import Ledger
from tests.e2e.conftest import Env

pytestmark = pytest.mark.e2e

# what `cloudtrain run` exits with for each outcome (cloudtrain.cli.main.OUTCOME_EXIT)
EXIT = {"succeeded": 0, "failed": 3, "interrupted": 130, "crashed": 1}


def _nothing_left(ct: Env) -> list[str]:
    """What is left of every run of this home: processes, live ledger rows, runs not done."""
    ledger = Ledger(ct.home / "ledger.db")
    left = [f"process {pid}" for pid in ct.live_processes()]
    for rec in ledger.list_runs(limit=100):
        if rec.status != "done":
            left.append(f"run {rec.run_id} is {rec.status}")
        left += [
            f"{rec.run_id}: {r.kind}/{r.resource_id} {r.state}"
            for r in ledger.resources(rec.run_id, live_only=True)
            if r.kind != "bucket"
        ]
    return left


def test_two_runs_of_the_same_job_at_once(ct: Env) -> None:
    job = ct.tick_job("twin", 3, 0.3)
    procs = [ct.start("run", str(job), log=ct.home / f"twin-{i}.log") for i in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    logs = [(ct.home / f"twin-{i}.log").read_text(errors="replace") for i in range(2)]
    assert codes == [0, 0], "\n=====\n".join(log[-3000:] for log in logs)
    runs = Ledger(ct.home / "ledger.db").list_runs()
    assert len({r.run_id for r in runs}) == 2
    assert {(r.status, r.outcome) for r in runs} == {("done", "succeeded")}
    for run in runs:  # each run's own nodes trained: the logs are per run
        assert any((ct.bucket / run.run_id / "logs").rglob("*.log")), run.run_id
    assert _nothing_left(ct) == []


@pytest.mark.parametrize("when", ["ledger row", "nodes created", "training"])
def test_a_run_racing_a_down_of_it(ct: Env, when: str) -> None:
    _race_down(ct, when)


@pytest.mark.parametrize("when", ["nodes created", "training"])
def test_a_raced_run_is_stopped_by_the_down(ct: Env, when: str) -> None:
    output = _race_down(ct, when)
    rec = Ledger(ct.home / "ledger.db").get_run(ct.run_ids()[0])
    assert rec is not None and rec.outcome == "interrupted", (rec, output[-2000:])
    assert "cloudtrain down" in (rec.detail or "")
    assert "attempt 2" not in output, "the run created its nodes again after the down"


def _race_down(ct: Env, when: str) -> str:
    """`cloudtrain run` of a 20 s job, and `cloudtrain down` of it once the run is at `when`.
    Checks both behave and nothing is left; returns the run's output."""
    job = ct.tick_job("raced", 40, 0.5)
    run = ct.start("run", str(job), log=ct.home / "run.log")
    try:
        deadline = time.time() + 120
        run_id = None
        while run_id is None and time.time() < deadline and run.poll() is None:
            ids = ct.run_ids()
            run_id = ids[0] if ids else None
            time.sleep(0.02)
        assert run_id is not None, (ct.home / "run.log").read_text()
        if when == "nodes created":
            _wait(lambda: any(ct.home.glob(f"local/runs/{run_id}/nodes/*/node.json")), run)
        elif when == "training":
            _wait(lambda: "epoch 2/40" in (ct.home / "run.log").read_text(errors="replace"), run)
        down = ct.cli("down", run_id, timeout=300)
        code = run.wait(timeout=300)
    finally:
        run.kill()
        run.wait()
    output = (ct.home / "run.log").read_text(errors="replace")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Traceback" not in output + down.stderr, output[-3000:]
    rec = Ledger(ct.home / "ledger.db").get_run(run_id)
    assert rec is not None and rec.status == "done", rec
    # the raced run ends with a clear outcome, and exits with that outcome's code
    assert rec.outcome in EXIT and rec.outcome != "succeeded", (rec.outcome, output[-3000:])
    assert code == EXIT[rec.outcome], (code, rec.outcome, output[-3000:])
    # nothing is left, and nothing comes back: a run that carried on would create nodes again
    time.sleep(3)
    assert _nothing_left(ct) == [], output[-3000:]
    return output


def _wait(done: object, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if done():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("the run did not get there in time")
