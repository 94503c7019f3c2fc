"""The whole pipeline on the local provider with real distributed TensorFlow: success, parameter
servers, a killed worker that resumes, Ctrl-C, and a crashed controller cleaned up by `down`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import pytest
import yaml

from tests.e2e import signals_kit
from tests.e2e.conftest import EXAMPLES, Env, assert_clean
from tests.e2e.trace_kit import assert_traced

pytestmark = pytest.mark.e2e


def _files(path: object) -> list[str]:
    from pathlib import Path

    root = Path(str(path))
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]


def test_parameter_server_job_ends_its_servers(ct: Env) -> None:
    job = ct.job("digits-ps", "python train.py --epochs 2")
    spawned = time.time()
    proc = ct.cli("run", str(job))
    exited = time.time()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_id,) = ct.run_ids()
    statuses = {p.stem: p.read_text() for p in (ct.bucket / run_id / "status").glob("*.json")}
    assert set(statuses) == {"chief-0", "worker-0", "worker-1", "ps-0"}
    for node in ("worker-0", "worker-1", "ps-0"):
        assert "chief finished" in statuses[node], statuses[node]
    assert_clean(ct, run_id)
    # the run is traced: its spans nest and cover the CLI's wall time (issue 20)
    assert re.search(r"^  time: start [\d.]+ s, .*training [\d.]+ s", proc.stdout, re.M)
    assert_traced(ct, run_id, spawned, exited, statuses)
    # the chief's training (runtime.callbacks) reported its first and last train steps
    spans = json.loads(ct.cli("status", run_id, "--json").stdout)["trace"]["spans"]
    steps = {s["name"] for s in spans if s["node"] == "chief-0" and s["parent"] == "node"}
    assert {"first step", "after last step"} <= steps, sorted(steps)


def test_central_storage_job_trains_on_one_node(ct: Env) -> None:
    example = yaml.safe_load((EXAMPLES / "digits-mirrored" / "job.yaml").read_text())
    cluster = {**example["cluster"], "strategy": "central_storage"}
    job = ct.job("digits-mirrored", "python train.py --epochs 2", cluster=cluster)
    proc = ct.cli("run", str(job))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "strategy central_storage, 1 node(s)" in proc.stdout, proc.stdout[-3000:]
    (run_id,) = ct.run_ids()
    logs = ct.cli("logs", run_id).stdout
    assert "strategy CentralStorageStrategy: 1 replica(s)" in logs, logs[-3000:]
    assert "final accuracy=" in logs, logs[-3000:]
    assert_clean(ct, run_id)


def test_killed_worker_resumes_from_the_synced_checkpoint(ct: Env) -> None:
    job = ct.job("digits-multiworker", "python train.py --epochs 4 --epoch-seconds 2")
    cli = ct.start("run", str(job))
    try:
        # from the node's own log chunks: the CLI's copy of the line comes a heartbeat and a
        # poll later, which on a loaded machine can put the kill past the last epoch
        ct.wait_for_node_line("worker-1", r"^cloudtrain: epoch 1/4 done")
        (run_id,) = ct.run_ids()
        pid = int(ct.heartbeat(run_id, "worker-1")["pid"])  # type: ignore[call-overload]
        os.killpg(pid, signal.SIGKILL)  # the training process of worker 1 dies
        assert cli.wait(timeout=240) == 0, ct.output()[-4000:]
    finally:
        cli.kill()
    out = ct.output()
    assert "restart 1/2: attempt 2" in out
    resumed = re.findall(r"^\[(worker-\d)\] cloudtrain: resumed at epoch (\d)", out, re.M)
    assert {node for node, _ in resumed} == {"worker-0", "worker-1"}, out[-4000:]
    assert len({epoch for _, epoch in resumed}) == 1 and int(resumed[0][1]) >= 2
    for node in ("worker-0", "worker-1"):
        assert re.search(rf"^\[{node}\] === cloudtrain attempt 2", out, re.M)
        assert re.search(rf"^\[{node}\] cloudtrain: epoch 4/4 done", out, re.M)
    assert ct.ledger().get_run(run_id).outcome == "succeeded"  # type: ignore[union-attr]
    assert_clean(ct, run_id)


def test_ctrl_c_flushes_a_checkpoint_and_tears_down(ct: Env) -> None:
    job = ct.job("digits-multiworker", "python train.py --epochs 20 --epoch-seconds 2")
    # SIGINT at its default, as in a terminal: not inherited (a background test run ignores it)
    cli = signals_kit.start(ct.env, ["run", str(job)], log=ct.home / "cli.log")
    try:
        ct.wait_for(r"^\[worker-0\] cloudtrain: epoch 1/20 done")
        cli.send_signal(signal.SIGINT)
        code = cli.wait(timeout=120)
    finally:
        cli.kill()
    out = ct.output()
    assert code != 0
    (run_id,) = ct.run_ids()
    assert (ct.bucket / run_id / "control" / "stop").exists()
    assert "[worker-0] cloudtrain-agent[worker-0]: final checkpoint flushed" in out, out[-3000:]
    assert any(f.endswith(".index") for f in _files(ct.bucket / run_id / "checkpoints"))
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and rec.outcome == "interrupted", rec
    assert rec.detail == "interrupted by Ctrl-C (SIGINT)"
    assert code == 130, out[-3000:]
    assert_clean(ct, run_id)


def test_crashed_controller_is_cleaned_up_by_down(ct: Env) -> None:
    # the nodes' job only has to be running: a ticking one, without TensorFlow's start-up
    job = ct.tick_job("crashed", epochs=20, seconds=2)
    cli = ct.start("run", str(job))
    try:
        ct.wait_for(r"^\[worker-0\] cloudtrain: epoch 1/20 done")
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
    finally:
        cli.kill()
    (run_id,) = ct.run_ids()
    time.sleep(1)
    assert ct.live_processes(), "the nodes should outlive a crashed controller"
    proc = ct.cli("down", run_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing of it is left" in proc.stdout
    assert_clean(ct, run_id)
    again = ct.cli("down", run_id)  # idempotent
    assert again.returncode == 0, again.stdout + again.stderr


def test_bootstrap_failure_ends_the_run_with_its_reason(ct: Env) -> None:
    shims = ct.home / "shims"
    shims.mkdir()
    real_curl = shutil.which("curl")
    (shims / "curl").write_text(
        "#!/usr/bin/env bash\n"
        "# downloads fail (a bucket the node cannot reach); uploads still work\n"
        'for a in "$@"; do [ "$a" = -o ] && { echo "curl: (7) refused" >&2; exit 7; }; done\n'
        f'exec {real_curl} "$@"\n'
    )
    (shims / "curl").chmod(0o755)
    ct.env["PATH"] = f"{shims}:{ct.env['PATH']}"
    job = ct.job("digits-multiworker", "python train.py --epochs 2")
    proc = ct.cli("run", str(job))
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "failed to bootstrap: bundle: download failed (curl exit 7)" in proc.stdout
    (run_id,) = ct.run_ids()
    assert ct.ledger().get_run(run_id).outcome == "failed"  # type: ignore[union-attr]
    assert "restart" not in proc.stdout  # deterministic: not retried
    logs = ct.cli("logs", run_id, "--bootstrap")
    assert "FAILED: bundle: download failed" in logs.stdout
    assert_clean(ct, run_id)


def test_detach_then_status_logs_and_down(ct: Env) -> None:
    job = ct.job("digits-multiworker", "python train.py --epochs 2")
    started = time.monotonic()
    proc = ct.cli("run", "--detach", "--no-controller", str(job))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 30, "detach should return once the nodes exist"
    (run_id,) = ct.run_ids()
    assert f"cloudtrain down {run_id}" in proc.stdout
    follow = ct.cli("logs", run_id, "--follow", timeout=180)
    assert follow.returncode == 0
    assert "[worker-0] cloudtrain: epoch 2/2 done" in follow.stdout
    status = json.loads(ct.cli("status", run_id, "--json").stdout)
    assert status["nodes"]["worker-0"]["status"]["state"] == "succeeded"
    down = ct.cli("down", run_id)
    assert down.returncode == 0, down.stderr
    assert_clean(ct, run_id)


def test_partial_create_failure_leaves_nothing(ct: Env) -> None:
    # the first create in the zone has no capacity, the second node is made: the run must fail
    # with a clear message and the node that was made must be gone
    ct.env["CLOUDTRAIN_FAULTS"] = json.dumps({"capacity_errors": {"local": 1}})
    job = ct.job("digits-multiworker", "python train.py --epochs 2")
    proc = ct.cli("run", str(job))
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert "no capacity" in proc.stdout and "zone local" in proc.stdout
    (run_id,) = ct.run_ids()
    assert_clean(ct, run_id)


def test_a_full_zone_fails_over_to_the_next(ct: Env) -> None:
    ct.env["CLOUDTRAIN_FAULTS"] = json.dumps({"capacity_errors": {"local": 99, "local-b": 0}})
    job = ct.tick_job("failover", epochs=1, seconds=0.1)  # the zones matter, not the training
    proc = ct.cli("run", str(job))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "zone local: " in proc.stdout and "trying the next zone" in proc.stdout
    (run_id,) = ct.run_ids()
    events = [e.message for e in ct.ledger().events(run_id)]
    assert "landed in zone local-b after trying zone local" in events
    assert_clean(ct, run_id)
