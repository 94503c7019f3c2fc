"""Start a `cloudtrain` child whose stop signals are set by the test, not inherited.

A child inherits ignored signals (exec keeps SIG_IGN) and the signal mask. A test run started
in the background from a non-interactive shell has SIGINT ignored (bash manual, "Signals"), and
so would every `cloudtrain` it starts: CPython installs its SIGINT handler only when SIGINT is
not ignored at start-up, so a Ctrl-C test would see its SIGINT ignored. So every test that
signals a child starts it through `with_signals`: a tiny exec shim sets SIGINT, SIGTERM and
SIGHUP to the default (or to ignored, as `nohup` would), unblocks them, then execs the command.
An exec shim rather than `preexec_fn`: the tests start children from threads, where
`preexec_fn` is not safe (Python's subprocess docs).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")

# argv: [ignored signals, comma-separated; "ctty" to make fd 0 the controlling terminal of a new
# session; the command...]
_SHIM = """\
import fcntl, os, signal, sys, termios
ignore, options, argv = set(filter(None, sys.argv[1].split(","))), sys.argv[2], sys.argv[3:]
sigs = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")]
for sig in sigs:
    signal.signal(sig, signal.SIG_IGN if sig.name in ignore else signal.SIG_DFL)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; exec would keep that
signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
if options == "ctty":  # a terminal's hang-up then sends SIGHUP, as closing a terminal does
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
os.execv(argv[0], argv)
"""


def with_signals(
    argv: Sequence[str], ignore: Sequence[str] = (), controlling_tty: bool = False
) -> list[str]:
    """`argv` behind the shim: SIGINT, SIGTERM and SIGHUP start at their default, except those
    named in `ignore` (e.g. "SIGHUP", as under nohup), which start ignored. Pure."""
    unknown = set(ignore) - set(STOP_SIGNALS)
    assert not unknown, f"not a stop signal: {unknown}"
    options = "ctty" if controlling_tty else "-"
    return [sys.executable, "-c", _SHIM, ",".join(ignore), options, *argv]


def cloudtrain(*args: str) -> list[str]:
    """The argv of `cloudtrain ARGS` run by this Python."""
    return [sys.executable, "-m", "cloudtrain.cli.main", *args]


def start(
    env: dict[str, str],
    args: Sequence[str],
    log: Path | None = None,
    ignore: Sequence[str] = (),
    controlling_tty: bool = False,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start `cloudtrain ARGS` with the stop signals set as `with_signals` says; its output
    goes to `log` (stdout and stderr) unless `popen` says otherwise. No wait."""
    out: IO[Any] | int = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - the child's
    popen.setdefault("stdout", out)
    popen.setdefault("stderr", subprocess.STDOUT)
    try:
        return subprocess.Popen(
            with_signals(cloudtrain(*args), ignore, controlling_tty), env=env, **popen
        )
    finally:
        if not isinstance(out, int):
            out.close()  # the child has its own copy
