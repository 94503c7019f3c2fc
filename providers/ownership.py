"""Deletes by name refuse what is not the run's (issue 29): a name in the ledger may come from a
forged journal entry or a stale record, so every adapter's `delete_resources` checks each
resource's tag (where the cloud has tags: read from the resource first) or its name pattern
(`ct-<run>-...`, `cloudtrain-<run>...`) before its delete call, deletes the rest, and then raises
`NotTheRuns` naming what it refused (teardown records it and drops it from the run's record).
Pure; standard library only.
"""

from __future__ import annotations

from cloudtrain.core.errors import NotTheRuns
from cloudtrain.providers.base import Resource


class Refusals:
    """The resources one `delete_resources` call refused, and why. Not thread-safe."""

    def __init__(self) -> None:
        self.items: list[tuple[Resource, str]] = []

    def refuse(self, res: Resource, why: str) -> None:
        """Note that `res` is not deleted because `why` (e.g. "its tag names no run")."""
        self.items.append((res, why))

    def check(self) -> None:
        """Raise NotTheRuns naming every refusal (none: nothing). Call after the deletes."""
        if not self.items:
            return
        shown = "; ".join(f"{r.kind} {r.id!r}: {why}" for r, why in self.items)
        run = self.items[0][0].run_id
        raise NotTheRuns(
            f"run {run}: not deleted, not the run's: {shown}",
            refused=tuple((r.kind, r.id) for r, _ in self.items),
        )

