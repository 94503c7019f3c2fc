"""The shared kit of the Horovod tests (test_horovod.py, test_horovod_agent.py): `FakeServers`, an
injected rendezvous server that records each start and stop, and `hosts_of`, a job's hosts. Not
itself a test module. Standard library and cloudtrain only, like the tests that import it: they
run on the nodes' Pythons too (tests/node-side-tests.txt), from 3.10.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudtrain.jobs import horovod as hvd


def hosts_of(nodes: int, gpus: int) -> list[tuple[str, int]]:
    return [(f"worker-{i}", gpus) for i in range(nodes)]


class FakeServers:
    """An injected `start_server`: records each start (port, plan) and each stop."""

    def __init__(self) -> None:
        self.started: list[tuple[int, list[hvd.Slot]]] = []
        self.stopped = 0

    def __call__(self, port: int, plan: Sequence[hvd.Slot]) -> FakeServers:
        self.started.append((port, list(plan)))
        return self

    def stop(self) -> None:
        self.stopped += 1
