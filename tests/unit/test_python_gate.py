"""The node-side code stays runnable on Python 3.10 (tests/python_gate.py), and the gate is able to
fail: it reports each construct that once broke the agent on the images' Python 3.10."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.python_gate import MIN_NODE_PYTHON, ROOT, node_side_files, violations

# each once shipped in node-side code and crashed the agent at import or start on Python 3.10
PLANTED = {
    "datetime_utc.py": "import datetime\nNOW = datetime.datetime.now(datetime.UTC)\n",
    "from_datetime_utc.py": "from datetime import UTC\n",
    "popen_group.py": "import subprocess\nsubprocess.Popen(['true'], process_group=0)\n",
    "tomllib_use.py": "import tomllib\n",
}


def test_the_closure_reaches_what_the_node_runs() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in node_side_files()}
    # the agent, the runtime, and every provider's store (open_store loads providers by name)
    for expected in (
        "jobs/agent.py",
        "jobs/runtime.py",
        "jobs/preemption.py",
        "providers/aws/storage.py",
        "providers/gcp/storage.py",
        "providers/azure/storage.py",
        "providers/local.py",
        "cloudtrain/core/redact.py",
    ):
        assert expected in files
    # the controller node (issue 17) runs the watch loop on the image's Python ...
    assert "cloudtrain/run/orchestrator.py" in files
    assert "cloudtrain/managed/controller_node.py" in files
    # ... but the command line and its views run on the user's machine only: they may use 3.11
    assert "cloudtrain/cli/main.py" not in files
    assert "cloudtrain/cli/ui.py" not in files


def test_node_side_code_runs_on_python_3_10() -> None:
    assert violations(node_side_files()) == []


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_gate_catches_a_planted_construct(tmp_path: Path, name: str) -> None:
    planted = tmp_path / name
    planted.write_text(PLANTED[name])
    report = violations([planted])
    assert report, f"the gate let {name} through"
    assert any("3.11" in line for line in report)


def test_the_wheel_refuses_what_the_bootstrap_refuses() -> None:
    import tomllib

    from cloudtrain.run.startup import NODE_MIN_PYTHON

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = ".".join(map(str, NODE_MIN_PYTHON))
    assert project["requires-python"] == f">={floor}"
    assert floor == MIN_NODE_PYTHON


def test_the_controller_refuses_the_nodes_oldest_python_in_one_line() -> None:
    from cloudtrain.cli.main import controller_python_error

    assert controller_python_error((3, 11, 7)) is None
    assert controller_python_error((3, 12, 1)) is None
    message = controller_python_error((3, 10, 13))
    assert message is not None and "\n" not in message
    assert message.startswith("error: ") and "3.10.13" in message and "3.11" in message
