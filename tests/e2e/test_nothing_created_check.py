"""The bad-input corpus's "nothing created" check can fail: a `run` that really creates (a ledger
row, a bucket folder, a node folder and its processes) and a planted stray process are each
reported. Without this, a check that looked in the wrong place would pass every case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Env
from tests.e2e.nothing_created import assert_nothing_created, created_since, snapshot

pytestmark = pytest.mark.e2e
SLEEPER = "import time\nprint('cloudtrain: epoch 1/1 started', flush=True)\ntime.sleep(300)\n"


def _sleeping_job(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "sleep.py").write_text(SLEEPER)
    spec = {
        "name": "planted",
        "cluster": {"strategy": "mirrored", "workers": 1},
        "entrypoint": "python sleep.py",
        "max_hours": 0.1,
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(spec))
    return folder / "job.yaml"


def test_a_run_that_creates_is_reported(ct: Env, tmp_path: Path) -> None:
    """`run --detach` of a valid job leaves a run row, its resources, the local bucket, the node
    folder and the node's processes: the check names each of them."""
    job = _sleeping_job(tmp_path / "job")
    before = snapshot(ct.home)
    proc = ct.cli("run", "--quiet", "--detach", "--no-controller", str(job), timeout=180)
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        found = created_since(before)
        text = "\n".join(found)
        assert any(f.startswith("ledger runs: 0 rows before, 1 after") for f in found), text
        assert any(f.startswith("ledger resources: 0 rows before") for f in found), text
        assert any(f.startswith("path buckets") for f in found), text
        assert any(f.startswith("path local/runs/") and "/nodes/" in f for f in found), text
        assert any(f.startswith("process ") for f in found), text
        with pytest.raises(AssertionError, match="created:"):
            assert_nothing_created(before)
    finally:
        for run_id in ct.run_ids():
            ct.cli("down", run_id, timeout=180)


def test_a_planted_process_is_reported(ct: Env, tmp_path: Path) -> None:
    before = snapshot(ct.home)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        cwd=tmp_path,
        env=dict(os.environ, CLOUDTRAIN_HOME=str(ct.home)),
    )
    try:
        want = f"process {child.pid}: {sys.executable} -c import time; time.sleep(300)"
        assert created_since(before) == [want]
    finally:
        child.kill()
        child.wait(timeout=10)
    assert created_since(before) == []  # and a dead one is not


def test_a_process_working_in_the_home_is_reported(ct: Env) -> None:
    before = snapshot(ct.home)
    env = {k: v for k, v in os.environ.items() if k != "CLOUDTRAIN_HOME"}
    child = subprocess.Popen(["sleep", "300"], cwd=ct.home, env=env)
    try:
        assert created_since(before) == [f"process {child.pid}: sleep 300"]
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_planted_ledger_row_and_file_are_reported(ct: Env) -> None:
    before = snapshot(ct.home)
    ct.ledger().create_run(
        run_id="planted-1a2b3c",
        name="planted",
        provider="local",
        region=None,
        zone=None,
        spec_path=None,
        store_uri=None,
        plan_json=None,
    )
    (ct.home / "runs").mkdir()
    found = created_since(before)
    assert "ledger runs: 0 rows before, 1 after" in found, found
    assert "path runs" in found, found
