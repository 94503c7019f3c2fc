"""Count the calls of a method that are running at once, to prove a fan-out without a clock.

`InFlight.spy(monkeypatch, cls, "method", hold=n)` replaces `cls.method` with a wrapper that
calls the real method (the SDK still does the work), records each call's first argument count,
and counts the calls in flight. With `hold=n`, the first `n` calls wait in the wrapper until all
`n` have arrived (a `threading.Barrier`), so the peak is exactly `n` when they really run in
parallel, and a serial caller breaks the barrier (BrokenBarrierError) instead of passing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest


class InFlight:
    """A thread-safe in-flight counter around one method (see the module docstring)."""

    def __init__(self, hold: int = 0, timeout_s: float = 60) -> None:
        self.calls = 0
        self.in_flight = 0
        self.peak = 0
        self.arg_counts: list[int] = []  # positional arguments of each call, self excluded
        self._hold = hold
        self._barrier = threading.Barrier(hold, timeout=timeout_s) if hold else None
        self._lock = threading.Lock()

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """`real` (an unbound method), counted; the first `hold` calls wait for each other."""

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls += 1
                number = self.calls
                self.arg_counts.append(len(args))
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            try:
                if self._barrier is not None and number <= self._hold:
                    self._barrier.wait()
                return real(obj, *args, **kwargs)
            finally:
                with self._lock:
                    self.in_flight -= 1

        return counted

    @classmethod
    def spy(
        cls, monkeypatch: pytest.MonkeyPatch, owner: type, name: str, hold: int = 0
    ) -> InFlight:
        """Count `owner.name`'s calls for the rest of the test (undone by monkeypatch)."""
        counter = cls(hold)
        monkeypatch.setattr(owner, name, counter.wrap(getattr(owner, name)))
        return counter
