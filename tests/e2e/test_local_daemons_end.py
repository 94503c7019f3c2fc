"""Through the real CLI: a local job that leaves a daemon in a session of its own (`setsid`) on
each node; when `cloudtrain run` ends, every node's processes ended with it, the daemons too
(issue 29), as a process on a cloud VM ends when the run deletes the VM."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
import yaml

from cloudtrain.core.procid import stat_fields
from tests.e2e.conftest import Env

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_run_ends_the_daemons_its_nodes_left(ct: Env, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    job = ct.tick_job("daemons", epochs=2, seconds=0.2)
    spec = yaml.safe_load(job.read_text())
    daemon = f"setsid sh -c 'echo $$ > \"$0\"; exec sleep 600' {pids}/daemon-$$.pid"
    spec["entrypoint"] = f"{daemon} </dev/null >/dev/null 2>&1 & {spec['entrypoint']}"
    job.write_text(yaml.safe_dump(spec))
    found: list[int] = []
    try:
        proc = ct.cli("run", "--quiet", str(job), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        found = [int(p.read_text()) for p in pids.iterdir() if p.read_text().strip()]
        assert len(found) == 2, found  # one daemon per worker
        assert [pid for pid in found if _alive(pid)] == [], "daemons outlived the run"
    finally:
        for path in pids.iterdir():
            with contextlib.suppress(ValueError, OSError):
                pid = int(path.read_text())
                if _alive(pid) and "sleep" in _cmdline(pid):
                    os.kill(pid, signal.SIGKILL)
