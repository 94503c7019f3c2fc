"""Helpers for tests of rendered startup scripts: syntax and shellcheck, and running bash with
a recording `curl` shim first on PATH.

    check_script(path)                    # bash -n, then shellcheck -S warning
    require_tool("curl")                  # its path; fails the test when it is not on PATH
    rc, calls = run_with_curl_shim(tmp, shim_text, script, **env)   # calls: curl's argv lines

The shim text must append "$*" to "$SHIM_LOG" for every call (that is how calls are read back).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# how each tool the tests need gets onto a test machine (tests/run.sh installs them)
INSTALL = {
    "shellcheck": "tests/run.sh installs it (apt-get install shellcheck)",
    "curl": "the nodes' bootstrap needs it too (apt-get install curl)",
}


def require_tool(name: str) -> str:
    """The path of the program `name` on PATH. A missing tool fails the test, and never skips
    it: the suite's command installs every tool it uses, so a check that passed without its
    tool would pass having checked nothing. Read-only."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: {INSTALL.get(name, 'install it')}", pytrace=False)
    return path


def check_script(path: Path) -> None:
    """Assert `bash -n` accepts the script and shellcheck finds no warning (fails without
    shellcheck: see `require_tool`)."""
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [require_tool("shellcheck"), "-S", "warning", "-s", "bash", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_with_curl_shim(tmp_path: Path, shim: str, script: str, **env: str) -> tuple[int, list[str]]:
    """Run `script` under `set -Eeuo pipefail` with `shim` as curl; (exit code, curl calls)."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "curl").write_text(shim)
    (shims / "curl").chmod(0o755)
    log = tmp_path / "curl.log"
    log.write_text("")
    proc = subprocess.run(
        ["bash", "-c", "set -Eeuo pipefail\n" + script],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SHIM_LOG": str(log), **env},
    )
    return proc.returncode, log.read_text().splitlines()
