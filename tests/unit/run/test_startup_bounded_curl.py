"""Every network call of the node's startup script is bounded (issue 29: one unanswered
connection once held a boot for ~130 s). Two kinds of check:

- presence: every curl the template, the wheelhouse template and the providers' blocks run has
  a connect timeout and a total or stall bound, and the rendered script carries the production
  values;
- behaviour: the rendered script's own functions and bundle download line, run by bash against
  a loopback server that accepts and never answers, end within their stated bound (made small
  through the variables the script exposes) and say `... timed out after N s (curl exit 28)`.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.shell import require_tool
from tests.unit.run.test_startup import VARIANTS, render

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [
    ROOT / "jobs" / "startup.sh.j2",
    ROOT / "jobs" / "wheelhouse.sh.j2",
    *sorted((ROOT / "providers").rglob("*.py")),
]
PRODUCTION = {  # the bounds the rendered script carries (seconds)
    "CT_CONNECT_S": 10,
    "CT_SMALL_S": 30,
    "CT_STALL_S": 60,
    "CT_LARGE_S": 1800,
    "CT_RETRY_S": 120,
}
BOUNDED = ("--max-time", "ct_small[@]", "ct_large[@]", "METADATA_CURL")
HANG_S = 30.0  # far above the small bounds below; an unbounded curl waits forever


def _curl_commands(text: str) -> list[str]:
    """The curl commands in `text`, continuation lines joined; the wrappers that only pass
    their arguments on ("$@") excluded."""
    found = []
    for line in re.split(r"\n", text.replace("\\\\\n", " ").replace("\\\n", " ")):
        stripped = line.strip()
        if stripped.startswith("#") or '"$@"' in stripped:
            continue
        if re.search(r"(^|[\s(\"'])(curl|ct_curl|ct_fetch)\s+[-\"{f]", stripped):
            found.append(stripped)
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_curl_has_a_connect_timeout_and_a_bound(source: Path) -> None:
    for command in _curl_commands(source.read_text()):
        if "METADATA_CURL" in command:
            continue  # startup_snippets.METADATA_CURL, itself checked below
        assert (
            "--connect-timeout" in command or "ct_small[@]" in command or ("ct_large[@]" in command)
        ), f"{source.name}: no connect timeout: {command}"
        assert any(b in command for b in BOUNDED), f"{source.name}: unbounded: {command}"


def test_the_metadata_curl_is_bounded() -> None:
    from cloudtrain.providers.startup_snippets import METADATA_CURL

    for flag in ("--connect-timeout 2", "--max-time 10", "--retry-max-time 60"):
        assert flag in METADATA_CURL


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_rendered_script_carries_the_production_bounds(variant: str) -> None:
    script = render(variant)
    for name, value in PRODUCTION.items():
        assert f"{name}=${{{name}:-{value}}}\n" in script, name
    assert "--speed-limit 10240" in script


# --- a loopback server that accepts and never answers --------------------------------------
@pytest.fixture
def silent_server() -> Iterator[int]:
    """The port of a loopback TCP server that accepts every connection and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def _section(script: str, start: str, end: str) -> str:
    """The text of `script` from the line starting with `start` to the next line that starts
    with `end` (included)."""
    lines = script.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(i for i in range(first, len(lines)) if lines[i].startswith(end))
    return "".join(lines[first : last + 1])


def _run(tmp_path: Path, body: str, url: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`body` in bash with the script's helpers (phase, ct_curl, the bounds, ct_fetch,
    upload_log) from the rendered cloud script, the bounds made small."""
    require_tool("curl")
    script = render("cloud-cpu-ps")
    helpers = _section(script, "utc_time() {", "# Phase timing")
    boot_log = tmp_path / "boot.log"
    harness = f"""
set -Eeuo pipefail
CT_ROLE=ps CT_INDEX=0 BOOT_LOG={boot_log} CT_LOG_URL={url} CT_BUNDLE_URL={url}
exec 3>/dev/null
: >"$BOOT_LOG"
fail() {{ phase "FAILED: $*"; exit 1; }}
{helpers}
ct_phase=bundle
{body}
"""
    env = {
        "PATH": "/usr/bin:/bin",
        "CT_CONNECT_S": "1",
        "CT_SMALL_S": "1",
        "CT_STALL_S": "1",
        "CT_LARGE_S": "2",
        "CT_RETRY_S": "1",
    }
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", harness],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    return done, time.monotonic() - started


def test_the_log_upload_to_a_silent_endpoint_ends_and_says_so(
    tmp_path: Path, silent_server: int
) -> None:
    url = f"http://127.0.0.1:{silent_server}/bootstrap/ps-0.log"
    done, took = _run(tmp_path, 'ct_phase=python\nupload_log\necho "rc=$?"', url)
    assert done.stdout.strip() == "rc=0", done  # best effort: the boot goes on
    log = (tmp_path / "boot.log").read_text()
    assert re.search(
        r"phase python: the boot log upload timed out after \d+ s \(curl exit 28\)", log
    ), log
    assert took < 10, took  # CT_SMALL_S=1 a try, no retry after CT_SMALL_S


def test_the_bundle_download_from_a_silent_endpoint_fails_the_boot_naming_it(
    tmp_path: Path, silent_server: int
) -> None:
    script = render("cloud-cpu-ps")
    download = _section(script, 'ct_fetch "the bundle download"', "  fail ")
    url = f"http://127.0.0.1:{silent_server}/bundle.tar.gz"
    done, took = _run(tmp_path, download, url)
    assert done.returncode == 1, done
    log = (tmp_path / "boot.log").read_text()
    assert re.search(
        r"phase bundle: the bundle download timed out after \d+ s \(curl exit 28\)", log
    ), log
    assert "FAILED: bundle: download failed (curl exit 28)" in log, log
    assert took < 15, took  # CT_LARGE_S=2 (a stall of CT_STALL_S=1 ends it sooner), retries <= 1 s
