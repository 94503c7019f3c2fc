"""The one retry policy: retry only errors marked `retryable`, with jittered exponential backoff.

The policy is applied in ONE place, the retry layer (providers/retrying.py), which wraps every
provider the registry builds: each Compute and ObjectStore call goes through `retrying` there,
with that operation's one deadline. Callers above the providers never call `retrying` around a
provider call; an adapter uses it only for its cloud's eventual-consistency waits (with a
narrow `retry_on`). Errors without `retryable = True` (see `cloudtrain.core.errors.TransientError`)
propagate at once; when the policy gives up, the last error is re-raised unchanged.

The backoff is read from `BACKOFF_INITIAL_S`/`BACKOFF_MAX_S` at call time, so tests shrink it with
`monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)`.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

try:  # tenacity >= 8.3: stop *before* a sleep that would cross the deadline
    from tenacity import stop_before_delay as _stop_at_deadline
except ImportError:  # pragma: no cover - older tenacity
    from tenacity import stop_after_delay as _stop_at_deadline

T = TypeVar("T")
P = ParamSpec("P")

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0
MAX_ATTEMPTS = 8  # calls in all (the first one included) before the last error propagates

log = logging.getLogger("cloudtrain.core.retry")


def is_retryable(exc: BaseException) -> bool:
    """Whether `exc` is marked safe to retry (`retryable = True`, as on TransientError). Pure."""
    return getattr(exc, "retryable", False) is True


def backoff_s(attempt: int, initial_s: float | None = None, max_s: float | None = None) -> float:
    """The sleep after failed attempt number `attempt` (1-based): "equal jitter" backoff.

    The base doubles from `initial_s` up to `max_s`; the sleep is uniform in [base/2, base], so
    many threads throttled at once spread out. Thread-safe.
    """
    initial = BACKOFF_INITIAL_S if initial_s is None else initial_s
    cap = BACKOFF_MAX_S if max_s is None else max_s
    base = min(cap, initial * 2 ** max(0, attempt - 1))
    return base / 2 + random.uniform(0, base / 2)


def retrying(
    fn: Callable[[], T],
    *,
    what: str,
    deadline_s: float = 120,
    max_attempts: int = MAX_ATTEMPTS,
    initial_s: float | None = None,
    max_s: float | None = None,
    retry_on: Callable[[BaseException], bool] = is_retryable,
) -> T:
    """Call `fn` until it returns, retrying retryable errors with backoff. Blocks.

    Stops after `max_attempts` calls, or before a sleep that would pass `deadline_s` from the
    first call; then re-raises the last error. Errors `retry_on` rejects (by default: those not
    marked retryable) propagate at once; a narrower `retry_on` retries one condition only (the
    caller's caller retries the rest). `what` names the operation in log lines. Thread-safe;
    `fn` must be safe to call again (idempotent).
    """

    def wait(state: RetryCallState) -> float:
        return backoff_s(state.attempt_number, initial_s, max_s)

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.info(
            "%s: %s; retry %d/%d in %.2fs",
            what,
            exc,
            state.attempt_number,
            max_attempts - 1,
            state.upcoming_sleep,
        )

    policy = Retrying(
        retry=retry_if_exception(retry_on),
        wait=wait,
        stop=stop_after_attempt(max_attempts) | _stop_at_deadline(deadline_s),
        before_sleep=before_sleep,
        reraise=True,
    )
    return policy(fn)


def retry_transient(
    *,
    what: str,
    deadline_s: float = 120,
    max_attempts: int = MAX_ATTEMPTS,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorator form of `retrying`: each call of the wrapped function is retried as a whole."""

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            return retrying(
                lambda: fn(*args, **kwargs),
                what=what,
                deadline_s=deadline_s,
                max_attempts=max_attempts,
            )

        return wrapper

    return decorate
