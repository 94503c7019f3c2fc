"""The shared kit of the bounded-read tests (issue 29): a real LocalStore that records every
read's bound and size, and the hostile bodies a node can write. Not itself a test module."""

from __future__ import annotations

import json

from cloudtrain.providers.local import LocalStore

MIB = 1024 * 1024
DEEP = b"[" * 100_000 + b"]" * 100_000  # past any recursion limit


class Recording(LocalStore):
    """A real LocalStore that notes the bound and the size of every read."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.bounds: list[tuple[str, int | None]] = []
        self.largest = 0  # the most bytes one read returned
        self.total = 0  # bytes returned by every read so far

    def _note(self, key: str, body: bytes) -> bytes:
        self.largest = max(self.largest, len(body))
        self.total += len(body)
        return body

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        self.bounds.append((key, max_bytes))
        return self._note(key, super().get(key, max_bytes=max_bytes))

    def get_tagged(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        self.bounds.append((key, max_bytes))
        got = super().get_tagged(key, max_bytes=max_bytes)
        if got is not None:
            self._note(key, got[0])
        return got

    def unbounded(self) -> list[str]:
        """The keys read without a bound."""
        return [key for key, bound in self.bounds if bound is None]


def huge(doc: dict[str, object], size: int = 50 * MIB) -> bytes:
    """`doc` as JSON padded to about `size` bytes with a field nobody reads."""
    return json.dumps({**doc, "pad": "x" * size}).encode()
