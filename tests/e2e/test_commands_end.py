"""Every command ends: `logs --follow` and `status` of a local run in each state it can be left in
end within a bound (or say what they wait for while they wait).

The states come from the real lifecycle: a controller SIGKILLed at a crash point
(`cloudtrain.core.crashpoints`: before any cloud call, with its bucket half made, during training,
half-way through teardown), a detached run, and a finished one. The job is tick.py (no
TensorFlow): the point is the end of the commands, not the training.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.core.crashpoints import CRASH_ENV
from tests.e2e.conftest import Env

pytestmark = pytest.mark.e2e

FOLLOW_BOUND_S = 120  # generous for a loaded 2-core machine; a hang is unbounded


def _crash(ct: Env, name: str, point: str, epochs: int = 3, seconds: float = 0.2) -> str:
    """`cloudtrain run` SIGKILLed at `point`; the run id it left in the ledger."""
    env = dict(ct.env, **{CRASH_ENV: point})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloudtrain.cli.main",
            "run",
            str(ct.tick_job(name, epochs, seconds)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_id,) = [r for r in ct.run_ids() if r.startswith(f"{name}-")]
    return run_id


def _follow(ct: Env, run_id: str) -> subprocess.CompletedProcess[str]:
    """`logs --follow`, which must end by itself within the bound."""
    started = time.monotonic()
    proc = ct.cli("logs", "--follow", run_id, timeout=FOLLOW_BOUND_S)
    proc.elapsed = time.monotonic() - started  # type: ignore[attr-defined]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


def _down(ct: Env, run_id: str) -> None:
    proc = ct.cli("down", run_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ct.live_processes() == []


GONE = "controller is gone and none of its nodes is alive; `cloudtrain down {}` cleans up"


def test_a_run_whose_controller_died_before_any_cloud_call(ct: Env) -> None:
    run_id = _crash(ct, "early", "ledger-row")
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and rec.status == "planned"  # a ledger row, nothing else
    assert not (ct.bucket / run_id).exists()  # its bucket prefix does not exist either
    follow = _follow(ct, run_id)
    assert follow.returncode == 1, follow.stderr
    assert GONE.format(run_id) in follow.stderr
    status = ct.cli("status", run_id, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "controller is gone" in status.stdout and f"cloudtrain down {run_id}" in status.stdout
    _down(ct, run_id)
    follow = _follow(ct, run_id)  # after down: a done run, which ends at once
    assert follow.returncode == 0 and "crashed" in follow.stdout


def test_a_run_whose_bucket_was_half_made(ct: Env) -> None:
    run_id = _crash(ct, "halfbucket", "bucket")
    follow = _follow(ct, run_id)
    assert follow.returncode == 1 and GONE.format(run_id) in follow.stderr
    _down(ct, run_id)


def test_a_run_whose_controller_died_in_training_ends_with_its_nodes(ct: Env) -> None:
    run_id = _crash(ct, "orphan", "training", epochs=12, seconds=0.5)
    follow = _follow(ct, run_id)
    # the nodes were alive: it waited for them, said so, and ended when they reported
    assert "waiting for 2 live node(s) of run" in follow.stderr, follow.stderr
    assert follow.returncode == 0, follow.stderr
    assert "epoch 12/12 done" in follow.stdout
    _down(ct, run_id)


def test_a_run_whose_controller_died_half_way_through_teardown(ct: Env) -> None:
    run_id = _crash(ct, "midteardown", "teardown-half")
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and rec.status == "tearing_down"
    follow = _follow(ct, run_id)
    assert follow.returncode in (0, 1), follow.stderr
    if follow.returncode == 1:
        assert GONE.format(run_id) in follow.stderr
    status = ct.cli("status", run_id, timeout=60)
    assert status.returncode == 0 and "controller is gone" in status.stdout
    _down(ct, run_id)


def test_a_detached_run_ends_when_its_nodes_report(ct: Env) -> None:
    job = ct.tick_job("detached", 6, 0.5)
    proc = ct.cli("run", "--detach", "--no-controller", str(job), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_id,) = ct.run_ids()
    follow = _follow(ct, run_id)
    assert follow.returncode == 0, follow.stderr
    assert "epoch 6/6 done" in follow.stdout
    _down(ct, run_id)


def test_a_finished_run_and_a_run_with_its_bucket_gone(ct: Env) -> None:
    proc = ct.cli("run", str(ct.tick_job("done", 2, 0.1)), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_id,) = ct.run_ids()
    follow = _follow(ct, run_id)
    assert follow.returncode == 0 and "epoch 2/2 done" in follow.stdout
    shutil.rmtree(ct.home / "buckets")
    follow = _follow(ct, run_id)
    assert follow.returncode == 0 and follow.stdout == ""
    status = ct.cli("status", run_id, timeout=60)
    assert status.returncode == 0 and f"{run_id} done succeeded" in status.stdout


def test_follow_says_what_it_waits_for_while_a_live_controller_tears_down(tmp_path: Path) -> None:
    """A run whose controller is alive (this process) and tearing down: `logs --follow` waits,
    says so once on stderr, and ends as soon as the run is done."""
    import io
    import threading

    from cloudtrain.cli.runs import Follower
    from cloudtrain.providers.base import ProviderConfig
    from cloudtrain.providers.local import LocalProvider
    from cloudtrain.state.ledger import Ledger
    from cloudtrain.state.runstate import RunReader

    ledger = Ledger(tmp_path / "ledger.db")
    bucket = f"file://{tmp_path / 'bucket'}"
    ledger.create_run("live-abcdef", "live", "local", None, None, None, bucket, None)
    ledger.set_status("live-abcdef", "tearing_down")
    rec = ledger.get_run("live-abcdef")
    assert rec is not None
    prov = LocalProvider(ProviderConfig("local", options={"root": str(tmp_path / "local")}))
    reader = RunReader(prov.store(bucket), rec.run_id)
    out, err = io.StringIO(), io.StringIO()
    follower = Follower(rec, prov, reader, ledger, None, out, err, poll_s=0.05)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(follower.run(True)), daemon=True)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive(), "it ended while the controller was still tearing down"
    waiting = [line for line in err.getvalue().splitlines() if line]
    assert len(waiting) == 1, waiting  # said once, not once a poll
    assert "waiting for run live-abcdef (tearing_down; controller pid" in waiting[0]
    assert f"pid {os.getpid()} " in waiting[0] and "(alive)" in waiting[0]
    ledger.set_status("live-abcdef", "done", "interrupted", "by Ctrl-C")
    thread.join(timeout=30)
    assert codes == [0]
    assert "== run live-abcdef interrupted:" in out.getvalue()
