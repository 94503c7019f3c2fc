"""An observer that cannot stop a run: the display (the live view, a plain printer, an API's
callbacks) renders node text and figures that come from the user's code, so a renderer's bug
must never end the watch or skip the teardown (issue 29).

`GuardedObserver` forwards `event`, `log_line` and `update` and swallows what they raise; the
first failure is reported once through `on_error` (the orchestrator records it in the ledger).
Every other attribute is the inner observer's. Pure, no I/O of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from cloudtrain.run.view import Observer, RunView


class GuardedObserver:
    """`inner`, whose every call is guarded (see the module). Thread-safe as `inner` is."""

    def __init__(self, inner: Observer, on_error: Callable[[str], None]) -> None:
        self.inner = inner
        self._on_error = on_error
        self._failed = False
        self._lock = threading.Lock()

    def event(self, message: str) -> None:
        """The inner `event`; never raises an Exception."""
        self._call("event", message)

    def log_line(self, node: str, line: str) -> None:
        """The inner `log_line`; never raises an Exception."""
        self._call("log_line", node, line)

    def update(self, view: RunView) -> None:
        """The inner `update`; never raises an Exception."""
        self._call("update", view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _call(self, method: str, *args: Any) -> None:
        try:
            getattr(self.inner, method)(*args)
        except Exception as exc:  # a display's bug of any kind (see the module)
            with self._lock:
                first, self._failed = not self._failed, True
            if first:
                self._report(f"the display failed in {method} ({type(exc).__name__}: {exc})")

    def _report(self, message: str) -> None:
        with contextlib.suppress(Exception):  # the report is best effort: the run goes on
            self._on_error(message[:500])


def guarded(observer: Observer, on_error: Callable[[str], None]) -> GuardedObserver:
    """`observer` guarded (an already guarded one is returned as it is). Pure."""
    if isinstance(observer, GuardedObserver):
        return observer
    return GuardedObserver(observer, on_error)
