"""Named crash points of the run lifecycle, for the crash-safety tests.

`crash_point(name)` SIGKILLs this process when `$CLOUDTRAIN_CRASH_AT` names that point: a real
crash (no `finally`, no atexit, no teardown), at a precise place. The crash-safety suite
(`tests/e2e/test_crash_points.py`) runs `cloudtrain run` once per point and then checks that
`cloudtrain down RUN` leaves nothing of the run in the cloud. Unset, a point costs one environment
lookup. Every point is listed in POINTS, in lifecycle order; a name not listed is a bug.
"""

from __future__ import annotations

import os
import signal

from cloudtrain.core import env

CRASH_ENV = env.CRASH_AT.name

POINTS: dict[str, str] = {
    "ledger-row": "after the ledger row, before any cloud call",
    "bucket": "mid bucket creation: created, not yet secured",
    "bundle": "after the bundle upload, before cluster.json",
    "network-ledger": "after the network is in the ledger, before it is created",
    "network": "after the network exists, before the ledger marks it created",
    "nodes-ledger": "after the nodes are in the ledger, before any create call",
    "between-creates": "between two node creates: one returned, the others not yet",
    "after-creates": "after every create returned, before the ledger marks them",
    # run --detach (issue 17): the controller node, made by the CLI after the nodes
    "controller-identity-ledger": "after the controller's identity is in the ledger, not made",
    "controller-identity": "after the controller's identity exists, before the ledger marks it",
    "controller-ledger": "after the controller node is in the ledger, before its create call",
    "controller-created": "after the controller node's create returned, before the ledger marks it",
    "handover": "after the lease is handed to the controller node, before the CLI returns",
    # ... and on the controller node itself
    "controller-adopted": "on the controller node: the run adopted, before its first watch",
    "controller-torn-down": "on the controller node: the rest torn down, before itself",
    "rendezvous": "during the rendezvous: an agent is waiting for its peers",
    "training": "during training: an epoch is being reported",
    "stop": "during the stop: control/stop written, agents flushing",
    "teardown-half": "half-way through teardown: node deletes in flight",
    "nodes-deleted": "after the nodes are deleted, before the network is",
    "network-deleted": "after the network is deleted, before the ledger is updated",
}


def crash_point(name: str) -> None:
    """SIGKILL this process if `$CLOUDTRAIN_CRASH_AT` is `name`; otherwise return at once."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    if env.CRASH_AT.raw() == name:
        os.kill(os.getpid(), signal.SIGKILL)
