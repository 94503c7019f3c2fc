"""The suite's workers (pytest-xdist) draw node ports from disjoint slices.

A box VM's or a local node's port is drawn at its boot and bound by its TensorFlow seconds later;
a draw in the other worker meanwhile could pick the same free-looking port, and one of the two
servers then fails with "Could not start gRPC server" (the clean-clone CI of stop 27). Each worker
sets $CLOUDTRAIN_LOCAL_PORTS (providers/local_sessions.py) to its own slice, which its CLIs and
harnesses inherit."""

from __future__ import annotations

import sys


def worker_slice(worker: str | None, count: int, low: int, top: int) -> tuple[int, int] | None:
    """The inclusive (low, high) slice of [low, top) for xdist worker `worker` ("gw0", ...) of
    `count`; None when not under xdist (the whole range is this process's). Pure."""
    if not worker or count <= 1 or not worker.removeprefix("gw").isdigit():
        return None
    index, width = int(worker.removeprefix("gw")), (top - low) // count
    return low + index * width, low + (index + 1) * width - 1


def main(argv: list[str]) -> int:
    """`python -m tests.fakes.port_slices N`: N disjoint slices of this machine's node-port
    range ($CLOUDTRAIN_LOCAL_PORTS, else 20000 up to the ephemeral range), one LOW-HIGH a line
    (tests/run.sh gives one to each node-side suite it runs side by side)."""
    from cloudtrain.providers.local_sessions import _port_range

    count = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 0
    if count < 2:
        print("usage: python -m tests.fakes.port_slices N (N >= 2)", file=sys.stderr)
        return 2
    low, high = _port_range()
    for index in range(count):
        got = worker_slice(f"gw{index}", count, low, high + 1)
        assert got is not None
        print(f"{got[0]}-{got[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
