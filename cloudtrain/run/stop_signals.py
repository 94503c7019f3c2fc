"""Every way a controller is told to stop: SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`,
systemd, schedulers, CI runners) and SIGHUP (the terminal or the SSH session closed).

All three mean the same to a run: stop it gracefully (the agents flush a checkpoint), tear it
down, exit non-zero. `StopSignals` is the one place that installs and restores the handlers:
- the first signal raises `StopSignal` (a KeyboardInterrupt, so every `except
  KeyboardInterrupt` treats it as Ctrl-C) in the main thread, as Python's own SIGINT handler
  does; the handler does nothing else;
- every later signal, and every signal once `defer()` was called (the graceful stop and the
  teardown), is only counted: an interrupted teardown is how VMs leak. A small thread warns
  once, outside the handler (a handler that prints can re-enter the stream it interrupted).

A signal that is ignored when the handlers are installed stays ignored: `nohup` starts its
command with SIGHUP ignored (POSIX, "nohup"), and a shell without job control starts a
background command with SIGINT and SIGQUIT ignored (bash manual, "Signals"; POSIX "Shell
Command Language", 2.11 "Signals and Error Handling"). Both are the user's choice.
Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NOTICE_POLL_S = 0.2  # how soon the warning about a deferred signal is printed
LOG = logging.getLogger("cloudtrain.run.stop_signals")


class StopSignal(KeyboardInterrupt):
    """A stop signal arrived: raised once, in the main thread, by `StopSignals`' handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(signum: int) -> str:
    """'SIGTERM' for 15. Pure."""
    return signal.Signals(signum).name


def stop_detail(exc: BaseException) -> str:
    """The run's detail for an interrupted run: which signal stopped it. Pure."""
    signum = exc.signum if isinstance(exc, StopSignal) else int(signal.SIGINT)
    if signum == signal.SIGINT:
        return "interrupted by Ctrl-C (SIGINT)"
    if signum == signal.SIGHUP:
        return "stopped by SIGHUP (the terminal or session closed)"
    return f"stopped by {signal_name(signum)}"


class StopSignals:
    """While entered (main thread only; elsewhere it installs nothing): SIGINT, SIGTERM and
    SIGHUP, unless ignored at entry, raise `StopSignal` once, then only count. `defer()` makes
    every signal only count from then on. `notice(signum)` is called once, from a thread of its
    own, for the first signal that was only counted. On exit the previous handlers are back.
    Not reentrant; not thread-safe beyond that (one controller, one main thread).

    Where Python cannot install a handler (a thread other than the main one, as when a notebook
    or a pipeline runs `cloudtrain.api.run` in a worker thread: `signal.signal` raises
    ValueError there), it handles nothing, says so once on the `cloudtrain.run.stop_signals`
    logger (WARNING), and `unavailable` says why; the run goes on without signal handling."""

    def __init__(self, notice: Callable[[int], None]) -> None:
        self.notice = notice
        self.received: list[int] = []  # every signal, in order (list.append is atomic)
        self.installed: list[int] = []
        self._previous: dict[int, Any] = {}
        self._raised = False
        self._deferred = False
        self._noticed = False
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self.unavailable: str | None = None  # why no handler is installed (not the main thread)

    # --- the handler: counts, and raises at most once -------------------------------------
    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._raised or self._deferred:
            return
        self._raised = True
        raise StopSignal(signum)

    def defer(self) -> None:
        """From now on every signal only counts (and is warned about). Idempotent."""
        self._deferred = True

    @property
    def deferred_signals(self) -> list[int]:
        """The signals that arrived and did not raise."""
        return self.received[1:] if self._raised else list(self.received)

    # --- the notice, outside the handler ---------------------------------------------------
    def _watch(self) -> None:
        while not self._closing.wait(NOTICE_POLL_S):
            self._notice_once()

    def _notice_once(self) -> None:
        if not self._noticed and self.deferred_signals:
            self._noticed = True
            with contextlib.suppress(Exception):  # a warning must not end anything
                self.notice(self.deferred_signals[0])

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self._without("not on the main thread")  # signal.signal would raise
        try:
            for sig in STOP_SIGNALS:
                previous = signal.getsignal(sig)
                if previous == signal.SIG_IGN:  # the user's choice (nohup, a background job)
                    continue
                self._previous[sig] = previous
                try:
                    signal.signal(sig, self._handle)
                except ValueError:  # not Python's main thread: nothing was installed
                    del self._previous[sig]
                    raise
                self.installed.append(int(sig))
        except ValueError as exc:  # "signal only works in main thread of the main interpreter"
            self.__exit__(None, None, None)
            self.installed.clear()
            return self._without(str(exc))
        except BaseException:  # a signal in the middle (it raised): put back what was there
            self.__exit__(None, None, None)
            raise
        self._thread = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self._thread.start()
        return self

    def _without(self, why: str) -> StopSignals:
        """Entered with no handler: say so once, and leave every signal as it is."""
        self.unavailable = why
        LOG.warning(
            "cloudtrain: %s: stop signals (Ctrl-C, SIGTERM, SIGHUP) are not handled here; "
            "`cloudtrain down RUN` (or cloudtrain.api.tear_down) stops a run",
            why,
        )
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            # None: a handler not set from Python; the default is the closest
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * NOTICE_POLL_S)
            self._thread = None
        self._notice_once()  # a signal in the last moments is still told (not from a handler)


@contextlib.contextmanager
def signals_deferred(notice: Callable[[int], None]) -> Iterator[StopSignals]:
    """Within: SIGINT, SIGTERM and SIGHUP (unless ignored) only count, and `notice(signum)` is
    told once. For work that must finish what it started (a teardown). Main thread only;
    elsewhere it changes nothing."""
    with StopSignals(notice) as signals:
        signals.defer()
        yield signals
