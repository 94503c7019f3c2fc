"""A bounded GET (issue 29): `get(key, max_bytes=n)` and `get_tagged(key, max_bytes=n)` never
take more than n + 1 bytes of an object into memory and raise TooLarge (a ProviderError, never
retried) when it holds more; without `max_bytes` they read it whole. Every store honours it:
the local folder and the test fake here, every wrapper (retrying, faults) passes it through,
and the clouds in tests/providers/test_contract.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.core.errors import NotFound, ProviderError, TooLarge
from cloudtrain.providers.base import ObjectStore
from cloudtrain.providers.faults import FaultyStore, _Injector
from cloudtrain.providers.local import LocalStore
from cloudtrain.providers.retrying import RetryingStore
from tests.fakes.memory_provider import MemoryProvider


def _stores(tmp_path: Path) -> dict[str, ObjectStore]:
    local = LocalStore((tmp_path / "bucket").as_uri())
    memory = MemoryProvider().store("mem://ct-bounded")
    faulty = FaultyStore(
        LocalStore((tmp_path / "faulty").as_uri()), _Injector(latency_s=0.0, error_rate=0.0, seed=0)
    )
    return {
        "local": local,
        "memory": memory,
        "retrying": RetryingStore(LocalStore((tmp_path / "retrying").as_uri())),
        "faulty": faulty,
    }


@pytest.mark.parametrize("name", ["local", "memory", "retrying", "faulty"])
def test_a_bounded_get_refuses_an_object_over_the_bound(tmp_path: Path, name: str) -> None:
    store = _stores(tmp_path)[name]
    store.ensure_bucket()
    store.put("doc.json", b"x" * 1000)
    assert store.get("doc.json", max_bytes=1000) == b"x" * 1000
    assert store.get("doc.json") == b"x" * 1000
    with pytest.raises(TooLarge, match=r"doc\.json") as caught:
        store.get("doc.json", max_bytes=999)
    assert isinstance(caught.value, ProviderError) and not caught.value.retryable
    found = store.get_tagged("doc.json", max_bytes=1000)
    assert found is not None and found[0] == b"x" * 1000
    with pytest.raises(TooLarge):
        store.get_tagged("doc.json", max_bytes=10)
    with pytest.raises(NotFound):
        store.get("missing.json", max_bytes=10)
    assert store.get_tagged("missing.json", max_bytes=10) is None


def test_a_bounded_local_get_reads_at_most_the_bound_and_one_byte(tmp_path: Path) -> None:
    """A 64 MiB object (sparse: no disk) is refused after reading max_bytes + 1 of it."""
    store = LocalStore((tmp_path / "bucket").as_uri())
    store.ensure_bucket()
    store.put("big.json", b"{}")
    with open(tmp_path / "bucket" / "big.json", "r+b") as fh:
        fh.truncate(64 * 1024 * 1024)
    reads: list[int] = []
    real = __import__("os").read

    def counting(fd: int, n: int) -> bytes:
        data = real(fd, n)
        reads.append(len(data))
        return data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("os.read", counting)
        with pytest.raises(TooLarge):
            store.get("big.json", max_bytes=1024)
    assert 0 < sum(reads) <= 1025
