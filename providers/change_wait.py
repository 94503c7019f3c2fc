"""Waking on a change in a run's bucket rather than sleeping out a poll interval (issue 20).

A watcher that polls every `poll_s` learns of a node's final status up to `poll_s` late. Where
the bucket is a folder (`file://`: the local provider), a write shows at once in its folder's
modification time: LocalStore writes every object by a rename into its folder. `ChangeWaiter`
stats the folders of a few prefixes every `STAT_S` and returns as soon as one changed, so the
poll that follows runs when there is something to read. It reads no object and lists nothing:
the bucket calls per second do not grow (a poll still runs at most once per wake, and without a
change once per `timeout`). Object stores in the clouds have no change notification a client can
wait on without a queue or a webhook (S3 event notifications, GCS Pub/Sub notifications, Azure
Event Grid all need a resource of their own), so there it sleeps the timeout out.

Standard library only: the agents (jobs/agent.py) wait on it too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from urllib.parse import unquote, urlparse

STAT_S = 0.01  # a stat of a few folders every 10 ms: no object read, no listing


def _folder_of(uri: str) -> str | None:
    """The folder a `file://` URI names (None for any other scheme). Pure."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else None


class ChangeWaiter:
    """Waits for a write under any of `prefixes` (keys' folders, e.g. 'cloudtrain/runs/<id>/
    status/') of the store at `uri`. Not thread-safe: one waiter per waiting thread."""

    def __init__(self, uri: str, prefixes: Sequence[str]) -> None:
        root = _folder_of(uri)
        self.folders = [] if root is None else [os.path.join(root, p) for p in prefixes]
        self._seen = self._stamp()

    @property
    def wakes_on_change(self) -> bool:
        """Whether `wait` can return before its timeout (a folder store)."""
        return bool(self.folders)

    def _stamp(self) -> tuple[int, ...]:
        stamps = []
        for folder in self.folders:
            try:
                stamps.append(os.stat(folder).st_mtime_ns)
            except OSError:  # not there yet: its creation is a change of the parent's own
                stamps.append(-1)
        return tuple(stamps)

    def wait(self, timeout_s: float) -> bool:
        """Block until a folder changed since the last call (or since this waiter was made),
        or `timeout_s` passed. Returns whether a change was seen."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        if not self.folders:
            time.sleep(max(0.0, timeout_s))
            return False
        while True:
            stamp = self._stamp()
            if stamp != self._seen:
                self._seen = stamp
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(STAT_S, left))
