"""The commands that read one run parse its id at the edge (`cli.common.run_ref`) and hand the
typed value on: `sync_run` and `attach` trust it (issue 31). A value that is no run id is the
same one `error:` line as before, and nothing is built from it, the ledger file included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.core.errors import UsageError
from cloudtrain.jobspec.run_ids import parse_run_ref

COMMANDS = [
    ("status",),
    ("logs",),
    ("cost",),
    ("tensorboard", "--once"),
    ("attach",),
    ("status", "--provider", "local"),
    ("attach", "--provider", "local"),
]
HOSTILE = ["../x", "a%", "Mnist-0a1b2c"]


def expected_line(value: str) -> str:
    """The line the run id's parse gives (what `sync_run` said before it trusted its input)."""
    with pytest.raises(UsageError) as refused:
        parse_run_ref(value)
    return f"error: {refused.value}"


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_a_value_that_is_no_run_id_is_one_line_and_builds_nothing(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    env = dict(os.environ, CLOUDTRAIN_HOME=str(tmp_path / "home"))
    env.pop("CLOUDTRAIN_FAULTS", None)
    for value in HOSTILE:
        name, *options = command
        proc = subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli.main", name, value, *options],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines[:1] == [expected_line(value)], proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        assert not (tmp_path / "home" / "ledger.db").exists(), "built from an unparsed id"
