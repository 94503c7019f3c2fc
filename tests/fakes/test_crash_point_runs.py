"""The crash-point suite tears down the run of each point, never a neighbour's
(tests/e2e/test_crash_points.py): its scenarios run three at a time against one ledger, and
points' names extend one another (`network`, `network-ledger`; `controller-identity`,
`controller-identity-ledger`). A point that finds a neighbour's run `down`s that one twice and
leaves its own running: its VMs' sessions were then the suite's "VM sessions still running".
"""

from __future__ import annotations

from pathlib import Path

from cloudtrain.core.crashpoints import POINTS
from cloudtrain.jobspec.run_ids import new_run_id
from cloudtrain.state.ledger import Ledger
from tests.e2e.test_crash_points import _run_id, _short


def test_each_point_finds_its_own_run_whatever_ran_since(tmp_path: Path) -> None:
    names = [*POINTS, "ledgerless"]
    # the points' runs made in both orders: whichever of two neighbours is the newer
    for order, points in (("forward", names), ("backward", names[::-1])):
        path = tmp_path / f"{order}.db"
        ledger = Ledger(path)
        made = {}
        for point in points:
            made[point] = new_run_id(_short(point))
            ledger.create_run(made[point], _short(point), "gcp", "us-central1", *[None] * 4)
        found = {point: _run_id(path, point, timeout=5) for point in names}
        assert found == made, order
