"""A laptop's lid closes mid-training (issue 29): the attached controller is SIGSTOPped for twice
the lease's ttl and then continued.

- Nobody took the run meanwhile: its lease is untouched in the bucket, so the controller takes
  it back with the same term, carries on, and the run succeeds and tears down.
- `cloudtrain attach` took the run meanwhile: the old controller ends `lease_lost` naming the new
  holder and deletes nothing; the attach follows the run to its end and tears it down.

Every wait is on an event (a node's log line, the lease document's expiry and owner, a process's
exit); the pause is the lease's own expiry plus one ttl, read from the bucket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Env, assert_clean

pytestmark = pytest.mark.e2e

TTL_S = 4.0


def _lease(ct: Env, run_id: str) -> dict[str, object]:
    return json.loads((ct.bucket / run_id / "control" / "lease").read_text())


def _wait(what: str, ready: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise AssertionError(f"not in {timeout:.0f} s: {what}")


def _start_and_pause(ct: Env, name: str, gate: Path) -> tuple[subprocess.Popen[str], str]:
    """A two-worker tick run, attached, SIGSTOPped once its workers tick. Returns the stopped
    CLI and the run id; the lease has expired (by its own document) when this returns. The
    workers hold after epoch 3 until `gate` exists: the pause lies inside the training however
    long it takes, and they have 9 epochs left to tick after it."""
    ct.env["CLOUDTRAIN_LEASE_TTL_S"] = str(TTL_S)
    job = ct.tick_job(name, epochs=12, seconds=0.5, gate=(gate, 3))
    cli = ct.start("run", str(job))
    ct.wait_for_node_line("worker-1", r"epoch 3/12")
    run_id = ct.run_ids()[0]
    os.kill(cli.pid, signal.SIGSTOP)  # the lid closes: no thread of the controller runs
    expires = float(_lease(ct, run_id)["expires"])  # type: ignore[arg-type]
    # twice the ttl since its last renewal, at the least: the lease has expired for a whole ttl
    _wait("the paused controller's lease expired", lambda: time.time() > expires + TTL_S)
    assert cli.poll() is None
    return cli, run_id


def test_a_controller_paused_past_its_lease_takes_it_back_and_finishes(
    ct: Env, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    cli, run_id = _start_and_pause(ct, "lid-closed", gate)
    term = _lease(ct, run_id)["term"]
    os.kill(cli.pid, signal.SIGCONT)  # the lid opens
    gate.touch()
    assert cli.wait(timeout=240) == 0, ct.output()[-4000:]
    out = ct.output()
    assert "succeeded" in out, out[-3000:]
    assert "lost control" not in out and "lease_lost" not in out, out[-3000:]
    assert _lease(ct, run_id)["term"] == term  # the same term: nobody else ever held it
    assert_clean(ct, run_id)


def test_a_paused_controller_whose_run_was_attached_names_the_holder_and_deletes_nothing(
    ct: Env, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    cli, run_id = _start_and_pause(ct, "lid-attached", gate)
    attach_log = tmp_path / "attach.log"
    attach = ct.start("attach", run_id, log=attach_log)
    try:
        _wait(
            "attach took the lease",
            lambda: str(_lease(ct, run_id).get("owner", "")).startswith("attach:"),
        )
        holder = str(_lease(ct, run_id)["owner"])
        nodes_before = ct.live_processes()
        assert nodes_before, "the nodes should still be training"
        os.kill(cli.pid, signal.SIGCONT)
        assert cli.wait(timeout=120) == 6, ct.output()[-4000:]  # Outcome.LEASE_LOST
        out = ct.output()
        assert holder in out, out[-3000:]  # the old controller names who holds the run now
        # it deleted nothing: no node of the run is marked deleted, and every node still runs
        deleted = [r.resource_id for r in ct.ledger().resources(run_id) if r.state == "deleted"]
        assert deleted == [], deleted
        assert ct.live_processes(), "the old controller ended the nodes"
        gate.touch()  # the workers finish under attach
        assert attach.wait(timeout=240) == 0, attach_log.read_text()[-4000:]
    finally:
        for proc in (cli, attach):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=30)
    assert "succeeded" in attach_log.read_text()
    assert_clean(ct, run_id)
