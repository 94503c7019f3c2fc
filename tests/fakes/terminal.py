"""Reading what a command wrote to a pseudo-terminal (the CLI's live view, `status` and `logs` on
a terminal), for the tests that check what reaches a user's terminal."""

from __future__ import annotations

import os
import select
import time


def read_until_closed(leader: int, deadline: float) -> bytes:
    """Every byte the leader side of a pseudo-terminal receives until its command closes the
    terminal (EIO or EOF) or `deadline` (a `time.monotonic()` value) passes. Blocks."""
    received = bytearray()
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([leader], [], [], min(left, 1.0))
        if not ready:
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the command ended and closed the terminal
            break
        if not chunk:
            break
        received += chunk
    return bytes(received)
