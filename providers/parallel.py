"""The thread pool the providers fan out on: `parallel_map`, and a thread-safe counter.

`Compute.create_nodes`/`delete_listed` (providers/base.py) and the stores' bulk deletes use it, so
N calls cost about one call's latency. Standard library only (the node side imports it through
the stores). Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Counter:
    """A thread-safe counter (the fan-outs count finished calls with it)."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def bump(self) -> int:
        """Add one; returns the new count."""
        with self._lock:
            self._n += 1
            return self._n


def parallel_map(
    fn: Callable[[T], R], items: list[T], max_parallel: int = 64
) -> list[R | BaseException]:
    """Run `fn` over `items` on a thread pool; results (or the exception raised) in input order."""
    if not items:
        return []

    def call(item: T) -> R | BaseException:
        try:
            return fn(item)
        except Exception as exc:  # collected, re-raised by the caller
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(items)))) as pool:
        return list(pool.map(call, items))


def first_error(results: list[R | BaseException]) -> list[R]:
    """The results of a `parallel_map`, or its first exception raised (after all finished)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return [r for r in results if not isinstance(r, BaseException)]
