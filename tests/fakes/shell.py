"""Helpers for tests of rendered startup scripts: syntax and shellcheck, and running bash with
a recording `curl` shim first on PATH.

    check_script(path)                    # bash -n, then shellcheck -S warning (skips without it)
    rc, calls = run_with_curl_shim(tmp, shim_text, script, **env)   # calls: curl's argv lines

The shim text must append "$*" to "$SHIM_LOG" for every call (that is how calls are read back).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def check_script(path: Path) -> None:
    """Assert `bash -n` accepts the script and shellcheck finds no warning (skip without it)."""
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not on PATH (apt-get install shellcheck)")
    proc = subprocess.run(
        ["shellcheck", "-S", "warning", "-s", "bash", str(path)],
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
