"""An ObjectStore whose every call goes through the one retry policy (`cloudtrain.retry`).

The controller and the node agents talk only through the bucket, so a throttled or failed
bucket call must never end a run: `RetryingStore(store)` retries each call that raised a
retryable error (TransientError: throttling, 5xx, a dropped connection) with jittered backoff
and a deadline, and re-raises anything else (NotFound, access denied) at once. Every method of
ObjectStore is idempotent, so retrying one as a whole is safe. Thread-safe if the inner store is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cloudtrain.providers.base import ObjectInfo, ObjectStore, Resource
from cloudtrain.retry import retrying

T = TypeVar("T")
STORE_DEADLINE_S = 60.0


class RetryingStore:
    """`inner` with each call retried on retryable errors (see the module docstring)."""

    def __init__(self, inner: ObjectStore, deadline_s: float = STORE_DEADLINE_S) -> None:
        self.inner = inner.inner if isinstance(inner, RetryingStore) else inner
        self.uri = self.inner.uri
        self.deadline_s = deadline_s

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        return retrying(fn, what=f"{what} ({self.uri})", deadline_s=self.deadline_s)

    def ensure_bucket(self) -> Resource:
        """See ObjectStore.ensure_bucket; retried. Idempotent; blocks."""
        return self._call("ensure bucket", self.inner.ensure_bucket)

    def put(self, key: str, data: bytes) -> None:
        """See ObjectStore.put; retried. Idempotent; blocks."""
        self._call(f"put {key}", lambda: self.inner.put(key, data))

    def get(self, key: str) -> bytes:
        """See ObjectStore.get; retried (NotFound is raised at once). Blocks."""
        return self._call(f"get {key}", lambda: self.inner.get(key))

    def put_file(self, key: str, path: str) -> None:
        """See ObjectStore.put_file; retried. Idempotent; blocks."""
        self._call(f"upload {key}", lambda: self.inner.put_file(key, path))

    def get_file(self, key: str, path: str) -> None:
        """See ObjectStore.get_file; retried (NotFound is raised at once). Blocks."""
        self._call(f"download {key}", lambda: self.inner.get_file(key, path))

    def list(self, prefix: str) -> list[ObjectInfo]:
        """See ObjectStore.list; retried. Blocks."""
        return self._call(f"list {prefix}", lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        """See ObjectStore.delete; retried. Idempotent."""
        self._call(f"delete {key}", lambda: self.inner.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        """See ObjectStore.delete_prefix; retried. Idempotent."""
        return self._call(f"delete {prefix}", lambda: self.inner.delete_prefix(prefix))

    def presign_get(self, key: str, ttl_s: int = 3600) -> str:
        """See ObjectStore.presign_get (local signing: not retried)."""
        return self.inner.presign_get(key, ttl_s)

    def presign_put(self, key: str, ttl_s: int = 3600) -> str:
        """See ObjectStore.presign_put (local signing: not retried)."""
        return self.inner.presign_put(key, ttl_s)
