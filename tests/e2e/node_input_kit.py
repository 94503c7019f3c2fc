"""The node-input corpus's building blocks (tests/e2e/test_node_input_corpus.py holds the cases):
a one-node local job from a script, the CLI on a pseudo-terminal or into pipes under a stated
time bound, a strict JSON parser, the node's hostile payloads and the checks every command's
output must pass, and what a node (its user code) can put in the run's bucket."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import Env
from tests.fakes.terminal import read_until_closed

# what the node prints to attack the terminal (class 5) and rich's markup (class 2), by case;
# each payload is its own line, so a case that breaks is named by its bytes
TERMINAL_PAYLOADS: dict[str, bytes] = {
    "osc0-title": b"\x1b]0;ct-pwned-title\x07",
    "osc52-clipboard": b"\x1b]52;c;Y3QtcHduZWQ=\x07",
    "osc8-link": b"\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\",
    "csi-2j-clear": b"\x1b[2J",
    "csi-cursor-to": b"\x1b[13;37H",
    "csi-cursor-up": b"\x1b[37A",
    "csi-6n-status-query": b"\x1b[6n",
    "c1-csi-utf8": "\u009b31;7H".encode(),
    "c1-csi-byte": b"\x9b32;8H",
}
# on a terminal, none of these bytes may arrive (rich's own styling never writes them)
TERMINAL_FORBIDDEN: dict[str, bytes] = {
    **TERMINAL_PAYLOADS,
    "c1-csi-utf8": b"\x9b31;7H",  # the C1 control itself, however it was encoded
    "osc8-link": b"\x1b]8;",  # no hyperlink at all: neither the node's nor one markup made
}
MARKUP_PAYLOADS: dict[str, str] = {
    "markup-unclosed": "[bold]x[/",
    "markup-link": "[link=file:///etc/passwd]x[/link]",
    "markup-style": "[reverse blink]ct-styled[/]",
}
# a bound for each command: the longest a command of the corpus may take on a loaded 2-core
# machine (a hang is a command past its bound); the run includes the job's own time
BOUND_S = {"run": 180.0, "status": 60.0, "logs": 90.0, "report": 90.0, "down": 60.0}


def one_node_job(ct: Env, name: str, script: str, **fields: Any) -> Path:
    """A one-node local job (mirrored, no TensorFlow) whose entrypoint is `python job.py` with
    `script` as job.py; `fields` replace spec fields. Returns the job.yaml path."""
    dest = ct.home / "jobs" / name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "job.py").write_text(script)
    spec: dict[str, Any] = {
        "name": name,
        "cluster": {"strategy": "mirrored", "workers": 1},
        "workdir": ".",
        "entrypoint": "python job.py",
        "max_hours": 0.5,
    }
    spec.update(fields)
    (dest / "job.yaml").write_text(yaml.safe_dump(spec))
    return dest / "job.yaml"


@dataclass
class Result:
    """One command's end: its exit code, its output (stdout and stderr apart, or the terminal's
    bytes in `out`), and how long it took."""

    args: tuple[str, ...]
    code: int
    out: bytes
    err: bytes
    seconds: float

    @property
    def text(self) -> str:
        return (self.out + self.err).decode("utf-8", errors="replace")


def _bounded_wait(proc: subprocess.Popen[bytes], args: tuple[str, ...], bound: float) -> None:
    """Wait for `proc` up to `bound` seconds; past it, kill it and fail naming the command."""
    try:
        proc.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        hung = f"`cloudtrain {' '.join(args)}` hung past its bound of {bound} s"
        raise AssertionError(hung) from None


def _start(ct: Env, args: tuple[str, ...], out: int, err: int) -> subprocess.Popen[bytes]:
    """`cloudtrain ARGS` started in a session of its own (so a hung one is killed whole), its
    stdout and stderr to the descriptors `out` and `err`. No wait."""
    return subprocess.Popen(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        env=ct.env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
    )


class Piped:
    """`cloudtrain ARGS` started with stdout and stderr into files (pipes that never fill)."""

    def __init__(self, ct: Env, *args: str) -> None:
        self.args = args
        name = "-".join(a.replace("/", "_") for a in args if not a.startswith("/"))[:80]
        self.out_path, self.err_path = ct.home / f"{name}.out", ct.home / f"{name}.err"
        self.start = time.monotonic()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = _start(ct, args, out.fileno(), err.fileno())

    def output(self) -> str:
        """What it wrote so far, stdout then stderr."""
        data = self.out_path.read_bytes() + self.err_path.read_bytes()
        return data.decode("utf-8", errors="replace")

    def wait_for(self, text: str, timeout: float, case: str) -> None:
        """Wait until its output holds `text`; fail naming `case` past `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"[{case}] {text!r} not seen:\n{self.output()[-4000:]}")
            time.sleep(0.1)

    def wait(self, bound: float) -> Result:
        """Wait for its end, killed and failed past `bound` seconds from its start."""
        _bounded_wait(self.proc, self.args, max(1.0, bound - (time.monotonic() - self.start)))
        seconds = time.monotonic() - self.start
        out, err = self.out_path.read_bytes(), self.err_path.read_bytes()
        return Result(self.args, self.proc.returncode, out, err, seconds)


def piped(ct: Env, *args: str, bound: float) -> Result:
    """`cloudtrain ARGS` into files, killed and failed past `bound` seconds. Blocks."""
    return Piped(ct, *args).wait(bound)


def on_terminal(ct: Env, *args: str, bound: float) -> Result:
    """`cloudtrain ARGS` with stdout and stderr on a pseudo-terminal: `out` is every byte the
    terminal received. Killed and failed past `bound` seconds. Blocks."""
    import pty

    leader, follower = pty.openpty()
    start = time.monotonic()
    proc = _start(ct, args, follower, follower)
    os.close(follower)
    try:
        received = read_until_closed(leader, start + bound)
        _bounded_wait(proc, args, max(1.0, bound - (time.monotonic() - start)))
    finally:
        os.close(leader)
    return Result(args, proc.returncode, received, b"", time.monotonic() - start)


def strict_json(text: bytes | str) -> Any:
    """`text` parsed as strict JSON: NaN, Infinity and -Infinity are refused (ValueError)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def check(result: Result, case: str, code: int = 0) -> None:
    """What every command of the corpus must do: exit `code`, print no traceback, end within
    its bound (`BOUND_S`, by command). `case` names the corpus case in the failure."""
    where = f"[{case}] `cloudtrain {' '.join(result.args)}`"
    tail = result.text[-3000:]
    assert result.code == code, f"{where} exited {result.code}, not {code}:\n{tail}"
    assert "Traceback" not in result.text, f"{where} printed a traceback:\n{result.text[-6000:]}"
    bound = BOUND_S[result.args[0]]
    assert result.seconds < bound, f"{where} took {result.seconds:.0f} s (bound {bound} s)"


def assert_no_payload(result: Result, case: str) -> None:
    """No terminal payload of the node reached the terminal `result` wrote to."""
    where = f"[{case}] `cloudtrain {' '.join(result.args)}` on a terminal"
    for name, payload in TERMINAL_FORBIDDEN.items():
        assert payload not in result.out, f"{where}: the node's {name} {payload!r} reached it"
    for name, markup in MARKUP_PAYLOADS.items():  # shown as text, not taken as markup
        if name == "markup-style":
            continue  # checked by its text below: the words may be wrapped in styles
        assert markup.encode() in result.out, f"{where}: {name} {markup!r} not shown as text"


def plant(path: Path, data: bytes) -> Path:
    """Write `data` at `path` (its folders made): what a node's code can do to the bucket."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def nested(depth: int) -> bytes:
    """A JSON document `depth` arrays deep."""
    return b"[" * depth + b"]" * depth


def large_document(size: int) -> bytes:
    """A valid JSON object of about `size` bytes (one long string field)."""
    return b'{"version": 1, "pad": "' + b"x" * size + b'"}'
