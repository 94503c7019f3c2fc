"""When the controller counts a node as lost (and restarts the cluster)."""

from __future__ import annotations

from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.jobspec.runrules import node_lost

OPTS = RunOptions(heartbeat_timeout_s=180, boot_timeout_s=1200)


def test_gone_from_the_cloud_is_lost() -> None:
    assert node_lost(False, 999.0, 0.0, 1000.0, OPTS)


def test_silent_past_the_heartbeat_timeout_is_lost() -> None:
    assert not node_lost(True, 1000.0, 0.0, 1179.0, OPTS)
    assert node_lost(True, 1000.0, 0.0, 1181.0, OPTS)


def test_a_new_node_has_its_boot_time() -> None:
    assert not node_lost(True, None, 1000.0, 2199.0, OPTS)
    assert node_lost(True, None, 1000.0, 2201.0, OPTS)


def test_a_predecessors_heartbeat_does_not_count_against_a_recreated_node() -> None:
    # the lost node beat last at t=990; the attempt restarted at t=1000 with a new VM that takes
    # minutes to boot: at t=1300 its predecessor's beat is 310 s old, but the new node is booting
    assert not node_lost(True, 990.0, 1000.0, 1300.0, OPTS)
    assert node_lost(True, 990.0, 1000.0, 2201.0, OPTS)
