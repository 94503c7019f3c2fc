"""The suite's workers (pytest-xdist) draw node ports from disjoint slices.

A box VM's or a local node's port is drawn at its boot and bound by its TensorFlow seconds later;
a draw in the other worker meanwhile could pick the same free-looking port, and one of the two
servers then fails with "Could not start gRPC server" (the clean-clone CI of stop 27). Each worker
sets $CLOUDTRAIN_LOCAL_PORTS (providers/local_sessions.py) to its own slice, which its CLIs and
harnesses inherit."""

from __future__ import annotations


def worker_slice(worker: str | None, count: int, low: int, top: int) -> tuple[int, int] | None:
    """The inclusive (low, high) slice of [low, top) for xdist worker `worker` ("gw0", ...) of
    `count`; None when not under xdist (the whole range is this process's). Pure."""
    if not worker or count <= 1 or not worker.removeprefix("gw").isdigit():
        return None
    index, width = int(worker.removeprefix("gw")), (top - low) // count
    return low + index * width, low + (index + 1) * width - 1
