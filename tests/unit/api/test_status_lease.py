"""`status` of a managed run: whoever holds the run's lease controls it, whatever process made
it. A detached run's laptop process is gone while its controller node holds the lease (not
orphaned); a run whose lease expired has nobody, even when the process that made it still runs."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

from cloudtrain.api.results import RunStatus
from cloudtrain.core.procid import controller
from cloudtrain.state.ledger import Ledger

NOW = 1_800_000_000.0


def _status(tmp_path: Path, lease: dict[str, object] | None, pid: int | None = None) -> RunStatus:
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.create_run("r-1", "r", "local", None, None, None, "file:///b", "{}")
    rec = ledger.get_run("r-1")
    assert rec is not None
    if pid is not None:
        rec = dataclasses.replace(rec, controller_pid=pid)
    return RunStatus(rec, 0.0, controller(rec), {}, {}, {}, {}, {}, [], None, lease, NOW)


def _lease(expires: float) -> dict[str, object]:
    return {"owner": "controller:ct-r-1-controller-0", "term": 2, "expires": expires}


def test_a_live_lease_is_control_even_when_the_laptop_process_is_gone(tmp_path: Path) -> None:
    gone = _status(tmp_path, _lease(NOW + 20), pid=2**22 + 7)  # no such process
    assert gone.controller.state == "gone"
    assert not gone.orphaned
    assert gone.to_dict()["lease"]["term"] == 2


def test_an_expired_lease_is_nobody_even_with_its_maker_running(tmp_path: Path) -> None:
    alive = _status(tmp_path, _lease(NOW - 1))
    assert alive.controller.state == "alive"  # this very process made the run
    assert alive.orphaned and alive.to_dict()["orphaned"] is True


def test_without_a_lease_the_recorded_process_decides(tmp_path: Path) -> None:
    assert not _status(tmp_path, None).orphaned  # this process: alive
    assert _status(tmp_path / "b", None, pid=2**22 + 7).orphaned


def test_a_live_lease_of_the_recorded_process_that_is_gone_is_nobody(tmp_path: Path) -> None:
    """An attached run's CLI killed mid-teardown: its lease is still live for up to a ttl, but
    nobody renews it, and status says so at once."""
    dead = 2**22 + 7
    gone = _status(
        tmp_path, {**_lease(NOW + 20), "owner": f"run:{socket.gethostname()}:{dead}"}, dead
    )
    assert gone.controller.state == "gone" and gone.orphaned
