"""The local node's dead-man switch (providers/local_sessions.DEADMAN_SH), run by bash as the
bootstrap runs it: under `set -Eeuo pipefail` with the bootstrap's ERR trap, which writes
"FAILED" to the node's log. At power-off the node's processes are killed one by one; when the
switch's `sleep` dies before its subshell, that subshell must not report a failure: in CI16 it
did, after the agent had exited with 1, and the controller judged the node "failed to
bootstrap" (exit 137) instead of retrying the agent's error."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from cloudtrain.providers.local_sessions import DEADMAN_SH, END_NODE_SH


def _sleeps_of(pid: int) -> list[int]:
    """The `sleep` processes whose parent is `pid` (one that ends meanwhile is skipped)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[-1].split()[1]) == pid and comm == "sleep":
            found.append(int(entry))
    return found


def test_the_switch_killed_at_power_off_reports_no_failure(tmp_path: Path) -> None:
    log = tmp_path / "bootstrap.log"
    script = f"""set -Eeuo pipefail
trap 'echo "FAILED: command failed at line $LINENO (exit $?)" >>"{log}"' ERR
DEADLINE_EPOCH=$(( $(date +%s) + 600 ))
{END_NODE_SH}
{DEADMAN_SH}
echo "$!"
wait
"""
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        switch = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        sleeps: list[int] = []
        while not sleeps:  # the switch's subshell has started its sleep
            assert time.monotonic() < deadline, "the switch never slept"
            sleeps = _sleeps_of(switch)
        os.kill(sleeps[0], signal.SIGKILL)  # the power-off reaches the sleep first
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not log.exists(), log.read_text()
