"""Every way a controller is told to stop: SIGTERM (`kill`, `timeout`, systemd, CI runners),
SIGHUP (the terminal or SSH session closed) and SIGINT (Ctrl-C) stop `cloudtrain run`
gracefully (the agents flush), tear it down, and exit 130 with the signal in the ledger; more
signals during the stop and the teardown only warn; signals the user left ignored (nohup, a
background job) stay ignored. Each child's dispositions are set here (signals_kit), never
inherited from the test runner.

The jobs tick instead of training (the graceful stop is the same protocol; the Ctrl-C test in
test_local_pipeline.py flushes a real TensorFlow checkpoint); one variant runs on AWS in a box.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e import signals_kit
from tests.e2e.conftest import Env, assert_clean
from tests.e2e.test_aws_in_a_box import REGION, AwsBox, aws

__all__ = ["aws"]  # a fixture, for pytest
pytestmark = pytest.mark.e2e

NOTICE = "received: the stop and teardown under way finish first"


def _epochs(ct: Env, run_id: str, node: str = "worker-0") -> int:
    """The last epoch the node's log in the bucket reports (0: none yet)."""
    text = "".join(
        p.read_text(errors="replace") for p in (ct.bucket / run_id / "logs" / node).glob("*.log")
    )
    found = re.findall(r"cloudtrain: epoch (\d+)/", text)
    return max(map(int, found), default=0)


def _training(ct: Env, proc: subprocess.Popen[bytes], at_least: int = 1) -> str:
    """Wait until the run's worker-0 reported `at_least` epochs; returns the run id."""
    deadline = time.time() + 150
    while time.time() < deadline:
        assert proc.poll() is None, f"the controller ended early ({proc.returncode})"
        runs = ct.run_ids()
        if runs and _epochs(ct, runs[0]) >= at_least:
            return runs[0]
        time.sleep(0.2)
    raise AssertionError(f"no epoch {at_least} within 150 s")


@pytest.fixture
def child() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Controllers a test started: killed at the end if the test left one running."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ended_by(ct: Env, run_id: str, code: int, detail: str, output: str) -> None:
    """Exit 130, outcome interrupted with `detail`, the agents asked to stop, nothing left."""
    assert code == 130, f"exit {code}\n{output[-3000:]}"
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and rec.outcome == "interrupted", rec
    assert rec.detail == detail or (rec.detail or "").startswith(detail), rec.detail
    assert (ct.bucket / run_id / "control" / "stop").exists(), "no graceful stop was asked"
    statuses = [json.loads(p.read_text()) for p in (ct.bucket / run_id / "status").glob("*.json")]
    assert {s["state"] for s in statuses} == {"stopped"}, statuses
    assert_clean(ct, run_id)


def test_sigterm_and_the_users_ignored_signals(ct: Env, child: list[subprocess.Popen[bytes]]):
    """Started as `nohup cloudtrain run &` from a script would be: SIGHUP and SIGINT ignored.
    They stay ignored (the run trains on); SIGTERM then stops it gracefully."""
    job = ct.tick_job("sig-term")
    log = ct.home / "cli.log"
    proc = signals_kit.start(ct.env, ["run", str(job)], log=log, ignore=("SIGHUP", "SIGINT"))
    child.append(proc)
    run_id = _training(ct, proc)
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGINT)
    seen = _epochs(ct, run_id)
    _training(ct, proc, at_least=seen + 3)  # trains on: both were ignored, as the user chose
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    out = log.read_text(errors="replace")
    assert "cloudtrain-agent[worker-0]: final checkpoint flushed" in out, out[-3000:]
    assert "phase: tearing down" in out and "deleting 2 node(s)" in out
    _ended_by(ct, run_id, code, "stopped by SIGTERM", out)


@pytest.mark.parametrize("terminal", ["pty", "pipe"])
def test_sighup_with_the_terminal_gone_still_tears_down(
    terminal: str, ct: Env, child: list[subprocess.Popen[bytes]]
) -> None:
    """pty: the controller's controlling terminal (rich's live view) hangs up, and the kernel
    sends the SIGHUP, as when a terminal window or an SSH session closes. pipe: its stdout is
    a pipe whose reader is gone, then SIGHUP. Either way every later write fails (EIO, EPIPE):
    the teardown goes on and its output lands in the run's controller.log."""
    job = ct.tick_job(f"sig-hup-{terminal}")
    env = dict(ct.env, TERM="xterm-256color")
    if terminal == "pty":
        ours, theirs = os.openpty()
        proc = signals_kit.start(
            env, ["run", str(job)], stdin=theirs, stdout=theirs, controlling_tty=True
        )
    else:
        ours, theirs = os.pipe()
        proc = signals_kit.start(env, ["run", str(job)], stdout=theirs)
    child.append(proc)
    os.close(theirs)
    seen = bytearray()
    draining = threading.Event()
    draining.set()

    def drain() -> None:  # a live terminal reads what it is sent
        while draining.is_set():
            if select.select([ours], [], [], 0.1)[0]:
                try:
                    chunk = os.read(ours, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    run_id = _training(ct, proc)
    draining.clear()
    reader.join()
    os.close(ours)  # the terminal is gone
    if terminal == "pipe":
        proc.send_signal(signal.SIGHUP)
    code = proc.wait(timeout=120)
    assert f"run {run_id} on local".encode() in seen, bytes(seen[-2000:])
    log = ct.home / "runs" / run_id / "controller.log"
    text = log.read_text(errors="replace") if log.exists() else "(no controller.log)"
    _ended_by(ct, run_id, code, "stopped by SIGHUP", text)
    assert "the terminal is gone" in text and "deleting 2 node(s)" in text, text[-3000:]
    assert f"run {run_id}: interrupted" in text, text[-3000:]  # the summary, printed after


def test_signals_during_the_stop_and_teardown_only_warn(
    ct: Env, child: list[subprocess.Popen[bytes]]
) -> None:
    """The test runner ignores SIGINT (as a background job does); the controller gets it at
    its default (signals_kit), so Ctrl-C still stops it gracefully. Then SIGTERM, SIGINT,
    SIGHUP and SIGTERM again while it stops and tears down: one warning, and it finishes."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        job = ct.tick_job("sig-again")
        # every cloud call 0.3 s slower: the stop and teardown last long enough to be signalled
        env = dict(ct.env, CLOUDTRAIN_FAULTS=json.dumps({"latency_s": 0.3}))
        proc = signals_kit.start(env, ["run", str(job)], log=ct.home / "cli.log")
        child.append(proc)
        run_id = _training(ct, proc)
        proc.send_signal(signal.SIGINT)
        ct.wait_for(r"phase: stopping$", timeout=30)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            proc.send_signal(sig)
            time.sleep(0.05)
        code = proc.wait(timeout=120)
    finally:
        signal.signal(signal.SIGINT, previous)
    out = ct.output()
    _ended_by(ct, run_id, code, "interrupted by Ctrl-C (SIGINT)", out)
    assert out.count(NOTICE) == 1 and "deleting 2 node(s)" in out, out[-3000:]
    assert f"SIGTERM {NOTICE} (`cloudtrain down {run_id}`" in out
    assert out.index(NOTICE) < out.index("deleting 2 node(s)"), "the signals came too late"


def test_sigterm_while_a_detached_run_provisions_tears_down_what_exists(
    ct: Env, child: list[subprocess.Popen[bytes]]
) -> None:
    job = ct.tick_job("sig-detach")
    # worker-1's create takes 6 s: worker-0 exists, worker-1 is on its way
    env = dict(ct.env, CLOUDTRAIN_FAULTS=json.dumps({"slow_create_s": {"worker-1": 6}}))
    proc = signals_kit.start(env, ["run", "--detach", str(job)], log=ct.home / "cli.log")
    child.append(proc)
    ct.wait_for(r"creating 2 node\(s\)", timeout=60)
    deadline = time.time() + 30
    while not list(ct.home.glob("local/runs/*/nodes/*-worker-0/node.json")):
        assert time.time() < deadline, "worker-0 was never created"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    out = ct.output()
    (run_id,) = ct.run_ids()
    assert code == 130, out[-3000:]
    assert "detached:" not in out
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and (rec.outcome, rec.detail) == ("interrupted", "stopped by SIGTERM")
    nodes = {r.resource_id for r in ct.ledger().resources(run_id) if r.kind == "node"}
    assert len(nodes) == 2, nodes
    assert_clean(ct, run_id)


def test_sigterm_on_aws_in_a_box_leaves_nothing(
    aws: AwsBox, child: list[subprocess.Popen[bytes]]
) -> None:
    ct = aws.ct
    job = ct.tick_job("sig-aws", epochs=400)
    args = ["run", "--provider", "aws", "--region", REGION, str(job)]
    proc = signals_kit.start(ct.env, args, log=ct.home / "cli.log")
    child.append(proc)
    ct.wait_for(r"^\[worker-0\] cloudtrain: epoch 1/", timeout=240)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=180)
    out = ct.output()
    assert code == 130, out[-3000:]
    (run_id,) = ct.run_ids()
    rec = ct.ledger().get_run(run_id)
    assert rec is not None and (rec.outcome, rec.detail) == ("interrupted", "stopped by SIGTERM")
    prefix = f"cloudtrain/runs/{run_id}/"
    assert prefix + "control/stop" in aws.keys(prefix)
    assert len(aws.harness.booted) == 2
    aws.assert_nothing_left(run_id)


def test_down_finishes_what_it_started_when_signalled(
    ct: Env, child: list[subprocess.Popen[bytes]]
) -> None:
    """`cloudtrain down` is told to stop half-way (SIGTERM, then SIGINT and SIGHUP): it warns
    once, finishes the teardown and exits 0; nothing of the run is left."""
    job = ct.tick_job("sig-down")
    detached = ct.cli("run", "--detach", str(job))
    assert detached.returncode == 0, detached.stdout[-3000:] + detached.stderr[-3000:]
    (run_id,) = ct.run_ids()
    # every cloud call 0.5 s slower: the teardown lasts long enough to be signalled in
    env = dict(ct.env, CLOUDTRAIN_FAULTS=json.dumps({"latency_s": 0.5}))
    proc = signals_kit.start(env, ["down", run_id], log=ct.home / "cli.log")
    child.append(proc)
    ct.wait_for(r"deleting 3 node\(s\)", timeout=60)  # two workers and the controller node
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        proc.send_signal(sig)
        time.sleep(0.05)
    code = proc.wait(timeout=120)
    out = ct.output()
    assert code == 0, out[-3000:]
    assert out.count("received: down finishes what it started first") == 1, out[-3000:]
    assert "SIGTERM received" in out and "nothing of it is left" in out, out[-3000:]
    assert_clean(ct, run_id)
