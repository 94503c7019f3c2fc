"""A node forges the run's lease mid-training (issue 29): anything in the run's prefix is
writable from a node that runs the user's code (and on local, by the user's processes). Before
the run's key signed every lease write, the controller read the forged document as a takeover,
ended `lease_lost` and tore nothing down: the nodes ran on to their deadline. Now it takes its
lease back, says so, and the run ends as it would have.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import Env, assert_clean

pytestmark = pytest.mark.e2e


def test_a_lease_a_node_forged_is_taken_back_and_the_run_finishes(ct: Env) -> None:
    ct.env["CLOUDTRAIN_LEASE_TTL_S"] = "4"  # renewed every ~0.7 s: the forgery is met at once
    job = ct.tick_job("forged-lease", epochs=16, seconds=0.5)
    cli = ct.start("run", str(job))
    ct.wait_for_node_line("worker-1", r"epoch 3/16")
    run_id = ct.run_ids()[0]
    forged = {"owner": "attach:evil", "term": 99, "expires": time.time() + 3600, "version": 1}
    (ct.bucket / run_id / "control" / "lease").write_text(json.dumps(forged))
    assert cli.wait(timeout=240) == 0, ct.output()[-4000:]
    out = ct.output()
    assert "written without the run's key" in out and "attach:evil" in out, out[-3000:]
    assert "succeeded" in out
    lease = json.loads((ct.bucket / run_id / "control" / "lease").read_text())
    assert lease["owner"].startswith("run:") and "mac" in lease
    assert_clean(ct, run_id)
