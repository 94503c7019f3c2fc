"""jobs/node_rights.py: the rules each cloud renders say exactly the kit's table (issue 29)."""

from __future__ import annotations

import pytest

from cloudtrain.jobs import node_rights as rights
from tests.unit.node_rights_kit import CHIEF, NODE, NODES, node_rights, other_runs

RUN = "r-20261128-abc"


@pytest.mark.parametrize("node", NODES)
def test_each_node_may_write_its_own_keys_only(node: str) -> None:
    chief = node == rights.chief_of(NODES)
    table = {**node_rights(RUN, node), **other_runs(RUN)}
    wrong = {
        key: write
        for key, (_read, write) in table.items()
        if rights.may_write(RUN, node, key, chief=chief) != write
    }
    assert wrong == {}


def test_the_chief_is_chief_0_else_worker_0() -> None:
    assert rights.chief_of(NODES) == CHIEF
    assert rights.chief_of(["worker-1", "worker-0", "ps-0"]) == "worker-0"


def test_a_rule_is_one_pattern_under_the_stores_root() -> None:
    rule = rights.node_writes(RUN, NODE, chief=False)[-1].under("team/")
    assert rule.wildcard() == f"team/cloudtrain/runs/{RUN}/attempt-*/nodes/{NODE}.json"
    assert rule.matches(f"team/cloudtrain/runs/{RUN}/attempt-12/nodes/{NODE}.json")
    assert not rule.matches(f"team/cloudtrain/runs/{RUN}/attempt-12/nodes/{NODE}0.json")
