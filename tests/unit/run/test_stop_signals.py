"""The stop signals in-process (cloudtrain.run.stop_signals) and output that survives a vanished
terminal (cloudtrain.cli.ui.ConsoleObserver). The whole controller under real signals:
tests/e2e/test_signals.py."""

from __future__ import annotations

import errno
import io
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from cloudtrain.cli.ui import ConsoleObserver
from cloudtrain.run.stop_signals import STOP_SIGNALS, StopSignal, StopSignals, signals_deferred
from cloudtrain.run.stop_signals import stop_detail as detail_of
from cloudtrain.run.view import NodeView, RunView

EXPECTED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # written out: not the module's list
ESCAPED: list[int] = []  # signals that reached the handler in place before StopSignals


def _before(signum: int, _frame: object) -> None:
    ESCAPED.append(signum)


@pytest.fixture(autouse=True)
def recording_handlers() -> Iterator[None]:
    """Each test starts with a recording handler for each of the three signals (so a signal
    StopSignals failed to take is seen, instead of ending pytest) and ends with what was there
    before."""
    before = {sig: signal.getsignal(sig) for sig in EXPECTED}
    for sig in EXPECTED:
        signal.signal(sig, _before)
    ESCAPED.clear()
    yield
    for sig, handler in before.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _wait(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def _signal_self(sig: int) -> None:
    """Send `sig` to this process; its Python handler runs at the next bytecode boundary."""
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # a few calls: the handler has run by now


@pytest.mark.parametrize("sig", EXPECTED, ids=lambda s: s.name)
def test_the_first_signal_stops_once_and_later_ones_only_warn_once(sig: int) -> None:
    told: list[int] = []
    with StopSignals(told.append) as signals:
        assert set(signals.installed) == set(EXPECTED) == set(STOP_SIGNALS)
        with pytest.raises(StopSignal) as caught:
            _signal_self(sig)
        assert caught.value.signum == sig and isinstance(caught.value, KeyboardInterrupt)
        for again in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # survived: no raise
            _signal_self(again)
        assert _wait(lambda: told == [signal.SIGTERM])
        time.sleep(0.5)
        assert told == [signal.SIGTERM], "warned more than once"
    assert signals.received == [sig, signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    assert ESCAPED == []
    assert all(signal.getsignal(s) is _before for s in EXPECTED)  # the previous ones are back


def test_deferred_signals_never_raise_and_warn_once() -> None:
    told: list[int] = []
    with signals_deferred(told.append) as signals:
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            _signal_self(sig)
        assert _wait(lambda: told == [signal.SIGHUP])
    assert ESCAPED == []
    assert signals.deferred_signals == [
        signal.SIGHUP,
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
    ]


def test_a_signal_ignored_at_the_start_stays_ignored() -> None:
    """nohup (SIGHUP) and a background job of a shell without job control (SIGINT)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    told: list[int] = []
    with StopSignals(told.append) as signals:
        assert signals.installed == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        _signal_self(signal.SIGHUP)  # would end the process if it were not ignored
        _signal_self(signal.SIGINT)
        assert signals.received == [] and ESCAPED == []
        with pytest.raises(StopSignal):
            _signal_self(signal.SIGTERM)
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_outside_the_main_thread_nothing_is_installed() -> None:
    import threading

    found: list[list[int]] = []

    def body() -> None:
        with StopSignals(lambda _s: None) as signals:
            found.append(signals.installed)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert found == [[]]
    assert signal.getsignal(signal.SIGTERM) is _before


def test_the_detail_names_the_signal() -> None:
    assert detail_of(StopSignal(signal.SIGTERM)) == "stopped by SIGTERM"
    assert detail_of(StopSignal(signal.SIGHUP)).startswith("stopped by SIGHUP")
    assert detail_of(StopSignal(signal.SIGINT)) == "interrupted by Ctrl-C (SIGINT)"
    assert detail_of(KeyboardInterrupt()) == "interrupted by Ctrl-C (SIGINT)"


# --- output when the terminal is gone ------------------------------------------------------
def _view(run_id: str) -> RunView:
    return RunView(run_id, "running", 1, [NodeView(f"{run_id}-worker-0", "worker", 0)], 0.0, 1.0)


@pytest.mark.parametrize("error", ["EPIPE", "EIO"])
def test_a_closed_stream_moves_the_output_to_the_runs_log(
    error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe whose reader is gone (EPIPE: rich's own answer is SystemExit) and a hung-up
    terminal (EIO, here a closed pty): no exception, the lines land in the run's log."""
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    if error == "EPIPE":
        read_end, write_end = os.pipe()
    else:
        read_end, write_end = os.openpty()  # master, slave
    stream = os.fdopen(write_end, "w")
    caller = Console(file=stream, force_terminal=False, width=100)  # the CLI's console
    observer = ConsoleObserver(caller)
    observer.update(_view("sig-abc123"))
    os.close(read_end)  # the terminal / the reader is gone
    observer.event("deleting 2 node(s)")
    observer.log_line("worker-0", "stop requested (control/stop): flushing checkpoints")
    caller.print("the summary, from the caller")
    log = tmp_path / "runs" / "sig-abc123" / "controller.log"
    assert observer.diverted_to == str(log)
    text = log.read_text()
    assert "cloudtrain deleting 2 node(s)" in text and text.count("deleting 2 node(s)") == 1
    assert "[worker-0] stop requested (control/stop)" in text
    assert "the summary, from the caller" in text
    with pytest.raises(OSError):  # the premise: the stream itself is dead
        stream.write("x\n")
        stream.flush()


class _HungUpMidPrint(Console):
    """A console on a terminal that hangs up while it prints: the hang-up's SIGHUP raises in
    the middle of rendering, and rich's flush in `Console.__exit__` then fails with EIO, which
    replaces the signal's exception (what a closing pty did to the controller)."""

    def print(self, *_args: object, **_kwargs: object) -> None:
        try:
            raise StopSignal(signal.SIGHUP)  # the handler, at a safe point inside rich
        finally:
            raise OSError(errno.EIO, "Input/output error")  # rich flushing in its __exit__


def test_a_signal_that_lands_mid_print_on_a_hung_up_terminal_still_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    observer = ConsoleObserver(_HungUpMidPrint(file=io.StringIO(), force_terminal=False))
    observer.run_id = "sig-abc123"
    with pytest.raises(StopSignal) as stopped:
        observer.event("epoch 3/200 done")
    assert stopped.value.signum == signal.SIGHUP
    log = tmp_path / "runs" / "sig-abc123" / "controller.log"
    assert observer.diverted_to == str(log)
    assert "cloudtrain epoch 3/200 done" in log.read_text()  # the line itself is not lost either
