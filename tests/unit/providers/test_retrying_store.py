"""RetryingStore: bucket calls through the one retry policy; and the crash points' contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.core import retry
from cloudtrain.core.crashpoints import CRASH_ENV, POINTS, crash_point
from cloudtrain.core.errors import NotFound
from cloudtrain.providers.faults import FaultPlan, wrap
from cloudtrain.providers.retrying import RetryingStore
from tests.fakes.memory_provider import MemoryProvider


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)


def test_every_call_absorbs_throttling() -> None:
    provider = wrap(MemoryProvider(), FaultPlan(store_error_rate=0.5, seed=3))
    store = RetryingStore(provider.store("mem://bucket"))
    store.ensure_bucket()
    for i in range(30):
        store.put(f"k/{i}", b"x")
        assert store.get(f"k/{i}") == b"x"
    assert len(store.list("k/")) == 30
    store.delete("k/0")
    assert store.delete_prefix("k/") == 29
    assert sum(provider.store_faults.throttled.values()) > 10


def test_not_found_is_not_retried() -> None:
    provider = wrap(MemoryProvider(), FaultPlan())
    store = RetryingStore(provider.store("mem://bucket"))
    with pytest.raises(NotFound):
        store.get("missing")
    inner = MemoryProvider().store("mem://b")
    wrapped = RetryingStore(RetryingStore(inner))
    assert wrapped.inner is inner  # never nested twice


def test_crash_points_are_named_and_fire_only_when_asked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        crash_point("no-such-point")
    crash_point("bundle")  # not asked: returns
    assert len(POINTS) >= 12
    code = "from cloudtrain.core.crashpoints import crash_point; "
    code += "crash_point('bundle'); print('alive')"
    proc = subprocess.run(
        [sys.executable, "-c", code], env={CRASH_ENV: "bundle"}, capture_output=True, text=True
    )
    assert proc.returncode == -9 and "alive" not in proc.stdout
