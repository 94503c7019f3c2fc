"""TCP probes between the box's hosts (tests/fakes/netns.py): a listener on a host's address,
and a connect from another host that tells connected, refused (an RST: the path is open) and
timed out (dropped, as a cloud firewall drops) apart."""

from __future__ import annotations

import subprocess
import sys

from tests.fakes.netns import Host

OPEN, REFUSED, DROPPED = 0, 1, 2  # connect()'s answers
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except ConnectionRefusedError:
    sys.exit(1)
except (TimeoutError, socket.timeout):
    sys.exit(2)
"""
LISTEN = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


def connect(host: Host, ip: str, port: int, timeout: float = 2.0) -> int:
    """A TCP connect from `host` to ip:port: OPEN, REFUSED or DROPPED (timed out). Blocks up
    to `timeout`."""
    args = [sys.executable, "-c", CONNECT, ip, str(port), str(timeout)]
    return host.run(args, capture_output=True, timeout=30).returncode


def listen(host: Host, port: int) -> subprocess.Popen:
    """A listener on `host`'s address and `port`, ready when this returns; the host's removal
    (or the caller) kills it."""
    proc = host.popen(
        [sys.executable, "-c", LISTEN, host.ip, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc
