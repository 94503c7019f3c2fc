"""`cloudtrain status` and `cloudtrain logs` of a run whose bucket holds what a hostile job
wrote: its text reaches a terminal as text (no markup, no escape sequence), `logs --raw` and a
pipe get the lines as the node printed them, and `--json` is valid JSON whatever the numbers.

The run is real as far as the CLI can tell: a ledger row in $CLOUDTRAIN_HOME and the node's
documents and log chunk in a local (file://) bucket, read by `python -m cloudtrain.cli.main` in a
subprocess, on a pseudo-terminal where the test is about a terminal."""

from __future__ import annotations

import json
import math
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.jobs import protocol
from cloudtrain.providers import open_store
from cloudtrain.providers.base import Resource
from cloudtrain.state.ledger import Ledger
from tests.fakes.terminal import read_until_closed

RUN = "hostile-abcdef"
# what the job printed and put into its heartbeat, status and failure report
EVIL = (
    "[/bold] [link=https://evil.example]x[/link] \x1b]0;PWNED-TITLE\x07 "
    "\x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J \x1b[6n \x9b31m \x7f\b"
)
SEQUENCES = ("\x1b]", "\x1b[2J", "\x1b[6n", "\x9b", "\x07", "\x7f", "\x08")


def hostile_run(home: Path) -> None:
    """RUN in the ledger of `home` (failed, its detail quoting the node) and its bucket: a
    failed worker-0 whose status, heartbeat (extreme figures) and log chunk carry EVIL."""
    uri = f"file://{home / 'bucket'}"
    ledger = Ledger(home / "ledger.db")
    ledger.create_run(RUN, "hostile", "local", None, None, None, uri, "{}")
    node = Resource("local", "node", f"ct-{RUN}-worker-0", None, RUN)
    ledger.record_intent(node, price_hourly=2.0)
    ledger.mark_deleted(RUN, "node", node.id)
    ledger.set_status(RUN, "done", "failed", f"worker-0 failed: {EVIL}\nlast line: {EVIL}")
    store = open_store(uri)
    store.ensure_bucket()
    status = {"state": "failed", "attempt": 0, "exit_code": 1, "reason": EVIL, "tail": [EVIL]}
    store.put(protocol.status_key(RUN, "worker-0"), json.dumps({**status, "log_seq": 0}).encode())
    beat = {
        "attempt": 0,
        "state": EVIL,
        "epoch": 3,
        "epochs": 10,
        "last_line": EVIL,
        "activity": f"restoring {EVIL}",
        "log_seq": 0,
        # in the protocol's bounds (at most 1e18), and yet $ per million examples is infinite
        "metrics": {"examples_per_s": 5e-324, "epoch_seconds": 1e18, "loss": 1e18},
    }
    store.put(protocol.heartbeat_key(RUN, "worker-0"), json.dumps(beat).encode())
    store.put(protocol.log_chunk_key(RUN, "worker-0", 0), f"hello\n{EVIL}\nbye\n".encode())
    store.put(protocol.bootstrap_log_key(RUN, "worker-0"), f"phase boot\n{EVIL}\n".encode())


def env(home: Path) -> dict[str, str]:
    out = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200", TERM="xterm")
    out.pop("CLOUDTRAIN_FAULTS", None)
    return out


def piped(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        env=env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )


def on_terminal(home: Path, *args: str) -> tuple[int, str]:
    """The command with stdout and stderr on a pseudo-terminal: its exit code and what the
    terminal received."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        env=env(home),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    received = read_until_closed(leader, time.monotonic() + 60)
    os.close(leader)
    code = proc.wait(timeout=60)
    return code, received.decode("utf-8", errors="replace")


def assert_no_sequence(text: str) -> None:
    for sequence in SEQUENCES:
        assert sequence not in text, f"{sequence!r} reached the terminal: {text[-3000:]!r}"


def test_status_on_a_terminal_shows_the_node_text_as_text(tmp_path: Path) -> None:
    hostile_run(tmp_path)
    code, text = on_terminal(tmp_path, "status", RUN)
    assert code == 0, text[-3000:]
    assert "Traceback" not in text
    assert "[/bold] [link=https://evil.example]x[/link]" in text  # markup as text
    assert "\\x1b]0;PWNED-TITLE" in text  # the escape, shown escaped
    assert_no_sequence(text)


def test_logs_on_a_terminal_escapes_and_raw_does_not(tmp_path: Path) -> None:
    hostile_run(tmp_path)
    code, text = on_terminal(tmp_path, "logs", RUN)
    assert code == 0, text[-3000:]
    assert "[worker-0] hello" in text and "[worker-0] bye" in text
    assert "\\x1b]52;c;" in text and "\\x9b31m" in text
    assert_no_sequence(text)
    code, text = on_terminal(tmp_path, "logs", "--raw", RUN)
    assert code == 0 and "\x1b]52;c;cm0gLXJmIH4=\x07" in text


def test_bootstrap_logs_on_a_terminal_are_escaped(tmp_path: Path) -> None:
    hostile_run(tmp_path)
    code, text = on_terminal(tmp_path, "logs", "--bootstrap", RUN)
    assert code == 0 and "phase boot" in text and "\\x1b[6n" in text, text[-3000:]
    assert_no_sequence(text)


def test_logs_into_a_pipe_are_the_lines_as_printed(tmp_path: Path) -> None:
    hostile_run(tmp_path)
    proc = piped(tmp_path, "logs", RUN)
    assert proc.returncode == 0, proc.stderr
    assert f"[worker-0] {EVIL}\n" in proc.stdout


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_status_json_is_valid_json_whatever_the_numbers(tmp_path: Path) -> None:
    hostile_run(tmp_path)
    proc = piped(tmp_path, "status", "--json", RUN)
    assert proc.returncode == 0, proc.stderr
    data = _strict(proc.stdout)
    assert isinstance(data, dict)
    # 2 $/h over 5e-324 examples/s: infinite $ per million examples
    assert data["throughput"]["usd_per_million_examples"] is None
    assert data["throughput"]["nodes"]["worker-0"]["examples_per_s"] == 5e-324
    assert data["nodes"]["worker-0"]["heartbeat"]["last_line"] == EVIL  # JSON escapes it


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, {"a": [math.nan, (1, math.inf)]}, 10**400]
)
def test_emit_json_writes_strict_json(value: object, capsys: pytest.CaptureFixture[str]) -> None:
    from cloudtrain.cli.common import emit_json

    emit_json({"value": value, "ok": 1.5})
    data = _strict(capsys.readouterr().out)
    assert isinstance(data, dict) and data["ok"] == 1.5
    assert re.search(r"NaN|Infinity", json.dumps(data)) is None
