"""The orchestrator by composition (issue 31): its parts (provisioning, failover, recovery, lease
holding) are objects it holds, not mixins. Read from the source: the Orchestrator has no base
class; a part's module touches no private attribute of another object (only `self._x`); and no
part holds the orchestrator or sets a value of another part (they share only the RunState)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cloudtrain.run.orchestrator import Orchestrator

RUN = Path(__file__).resolve().parents[3] / "cloudtrain" / "run"
PARTS = ["provisioning.py", "failover.py", "recovery.py", "lease_holder.py"]
OTHER_PARTS = {"provisioner", "lease_holder", "failover", "recovery"}  # as a part holds them


def test_the_orchestrator_is_no_mixin() -> None:
    assert Orchestrator.__bases__ == (object,)


@pytest.mark.parametrize("name", PARTS)
def test_a_part_touches_no_one_else_s_private_attributes(name: str) -> None:
    tree = ast.parse((RUN / name).read_text())
    bad = [
        f"{name}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert bad == []


@pytest.mark.parametrize("name", PARTS)
def test_a_part_holds_no_orchestrator_and_sets_no_other_part_s_values(name: str) -> None:
    tree = ast.parse((RUN / name).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"Orchestrator", "orch"}
    targets = [
        t
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    bad = [
        f"{name}:{t.lineno} {ast.unparse(t)}"
        for t in flat
        if isinstance(t, ast.Attribute)
        and isinstance(t.value, ast.Attribute)
        and isinstance(t.value.value, ast.Name)
        and t.value.value.id == "self"
        and t.value.attr in OTHER_PARTS
    ]
    assert bad == []
