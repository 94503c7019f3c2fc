"""The retry policy: retryable errors only, bounded by attempts and deadline, last error raised."""

from __future__ import annotations

import time

import pytest

from cloudtrain.core import retry
from cloudtrain.core.errors import NoCapacityError, ProviderError, QuotaError, TransientError
from cloudtrain.core.retry import backoff_s, is_retryable, retry_transient, retrying


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.004)


class Flaky:
    """Raises the given errors in order, then returns 'ok'; counts calls."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_first_success_is_returned() -> None:
    fn = Flaky()
    assert retrying(fn, what="list nodes") == "ok"
    assert fn.calls == 1


def test_transient_errors_are_retried() -> None:
    fn = Flaky(TransientError("throttled"), TransientError("503"))
    assert retrying(fn, what="create node") == "ok"
    assert fn.calls == 3


@pytest.mark.parametrize(
    "error",
    [
        NoCapacityError("no g5 in us-east-1a", zone="us-east-1a"),
        QuotaError("vCPU quota"),
        ProviderError("bad request"),
        ValueError("a bug"),
    ],
)
def test_other_errors_propagate_at_once(error: Exception) -> None:
    fn = Flaky(error)
    with pytest.raises(type(error)) as raised:
        retrying(fn, what="create node")
    assert raised.value is error
    assert fn.calls == 1


def test_any_error_marked_retryable_is_retried() -> None:
    class SdkThrottle(Exception):
        retryable = True

    fn = Flaky(SdkThrottle())
    assert retrying(fn, what="x") == "ok"
    assert is_retryable(SdkThrottle())
    assert not is_retryable(ProviderError("no"))


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    errors = [TransientError(f"throttled #{i}") for i in range(10)]
    fn = Flaky(*errors)
    with pytest.raises(TransientError) as raised:
        retrying(fn, what="delete node", max_attempts=4)
    assert fn.calls == 4
    assert raised.value is errors[3]


def test_gives_up_at_the_deadline() -> None:
    """The 0.1 s deadline stops the retries while 995 of the 1000 attempts remain: every call
    takes at least 0.02 s, so at most 5 fit before the deadline (fewer on a loaded machine;
    a count of calls, not a wall-clock bound)."""
    calls = 0

    def slow_throttle() -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.02)
        raise TransientError("throttled")

    with pytest.raises(TransientError):
        retrying(slow_throttle, what="x", deadline_s=0.1, max_attempts=1000)
    assert 1 <= calls <= 5


def test_a_sleep_past_the_deadline_is_not_taken() -> None:
    """The first backoff (at least 30 s: jitter keeps half of the 60 s base) would cross the
    0.5 s deadline, so it is not slept: one call, and the error at once. The bound is the
    sleep's own length, which no load on the machine comes near."""
    fn = Flaky(TransientError("throttled"), TransientError("throttled"))
    start = time.monotonic()
    with pytest.raises(TransientError):
        retrying(fn, what="x", deadline_s=0.5, initial_s=60.0, max_s=60.0)
    assert fn.calls == 1
    assert time.monotonic() - start < 30


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    for attempt, base in [(1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6)]:
        waits = [backoff_s(attempt, 0.2, 10.0) for _ in range(50)]
        assert all(base / 2 <= w <= base for w in waits)
        assert len(set(waits)) > 1
    assert all(5.0 <= backoff_s(30, 0.2, 10.0) <= 10.0 for _ in range(50))
    assert backoff_s(1) <= retry.BACKOFF_INITIAL_S  # module defaults, read at call time


def test_decorator_form() -> None:
    fn = Flaky(TransientError("throttled"))

    @retry_transient(what="ensure bucket", max_attempts=3)
    def ensure(name: str, *, region: str) -> str:
        """Docstring kept."""
        return f"{fn()}:{name}:{region}"

    assert ensure("b", region="eu") == "ok:b:eu"
    assert fn.calls == 2
    assert ensure.__name__ == "ensure" and ensure.__doc__ == "Docstring kept."


def test_retry_on_narrows_what_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)

    class Narrow(TransientError):
        pass

    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Narrow("not yet")
        raise TransientError("throttled")

    with pytest.raises(TransientError, match="throttled"):
        retry.retrying(flaky, what="x", retry_on=lambda e: isinstance(e, Narrow), initial_s=0.001)
    assert len(calls) == 3  # two Narrow retried; the plain TransientError left to the caller
