"""Node ports on local (and in the box's harness): drawn below the kernel's ephemeral range, so no
outgoing connection takes one between its choice and the node's TensorFlow binding it."""

from __future__ import annotations

import socket

from cloudtrain.providers.local import EPHEMERAL_RANGE, LOW_PORT, free_port


def test_node_ports_are_free_and_below_the_ephemeral_range() -> None:
    top = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(LOW_PORT <= p < top for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random: concurrent callers seldom meet
    for port in list(ports)[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free indeed
