"""A node is a host: the agent's own address, and whether its peers answer at TCP level.

`discover_host()` is the address a node registers for the rendezvous: $CLOUDTRAIN_NODE_HOST
when set (the local provider sets it), else the source address of the route to the default
route's side of the network (a UDP `connect`, which sends nothing), else a non-loopback address
of an interface, else `gethostbyname(gethostname())`. A loopback address only when nothing else
exists: Debian's `127.0.1.1 hostname` line in /etc/hosts (and many sandboxes' `127.0.0.1
hostname`) make `gethostbyname` answer loopback on a real VM.

`check_peers()` runs after the rendezvous and before the training starts: every peer's
registered host:port must answer a TCP connect, where a refusal (RST: the path is open, the
peer's server is just not up yet) counts as an answer and only silence (a timeout, no route,
host unreachable) does not. The clouds' firewalls (an AWS security group, a GCP firewall rule,
an Azure NSG) drop what they do not allow rather than reject it, so a misconfigured rule shows
up here as silence and fails the node with one clear line naming the peer, instead of a
training process that waits for it until the rendezvous timeout of TensorFlow or Gloo.

Standard library only (this runs on the nodes, Python 3.10+).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cloudtrain.core.env import NODE_HOST

__all__ = [
    "HINT",
    "Peer",
    "Unreachable",
    "check_peers",
    "discover_host",
    "peers_of",
    "probe",
    "probe_deadline_s",
    "unreachable_reason",
]

HOST_ENV = NODE_HOST.name
# Any address off this machine's own networks: a UDP socket's connect() only asks the kernel for
# the route and the source address it would use (UDP sends nothing until a datagram is written).
DEFAULT_ROUTE_PROBE = "8.8.8.8"
SIOCGIFADDR = 0x8915  # Linux <linux/sockios.h>: an interface's IPv4 address (netdevice(7))
# Roles that take part in the TF cluster's connections. The evaluator only reads checkpoints:
# it connects to nobody and nobody connects to it (tf_config leaves it out of the cluster).
SILENT_ROLES = frozenset({"evaluator"})
HINT = "the cloud's firewall (security group / firewall rule / NSG) drops the run's ports"
PROBE_CAP_S = 30.0  # a peer that wrote its registration yet is silent this long is cut off
CONNECT_TIMEOUT_S = 2.0  # one SYN and its retransmit (Linux: 1 s initial RTO, RFC 6298)
RETRY_PAUSE_S = 0.2  # between attempts at a peer that answered "no route" at once


class Unreachable(RuntimeError):
    """A peer never answered at TCP level before the deadline. A RuntimeError: the agent reports
    it as the node's failed status with `str(exc)` as the reason (one line). `why`: each silent
    peer's node -> the last connect's error ("timed out", "No route to host")."""

    def __init__(self, message: str, why: Mapping[str, str]) -> None:
        super().__init__(message)
        self.why = dict(why)


@dataclass(frozen=True)
class Peer:
    """One node of the run as another node reaches it: its id ("worker-1") and host:port."""

    node: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


# --- the node's own address ----------------------------------------------------------------
def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("0.0.0.0", "")


def route_source(target: str) -> str | None:
    """The source address the kernel would use to reach `target` (an IPv4 address), or None
    when there is no route to it. Sends nothing; never blocks."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((target, 9))  # the discard port; nothing is sent
            return str(sock.getsockname()[0])
    except OSError:
        return None


def interface_addresses() -> list[str]:
    """The IPv4 address of every interface that has one, in interface index order (Linux's
    SIOCGIFADDR ioctl; empty elsewhere). Never raises."""
    found: list[str] = []
    try:
        import fcntl  # Unix only: the nodes are Linux

        names = [name for _index, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return found
    for name in names:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            found.append(socket.inet_ntoa(packed[20:24]))
    return found


def _hostname_address() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def discover_host(
    environ: Mapping[str, str] | None = None, route_to: Iterable[str] = (DEFAULT_ROUTE_PROBE,)
) -> str:
    """This node's address for its peers: $CLOUDTRAIN_NODE_HOST if set (taken as it is, a
    loopback too: the local provider's nodes share one host); else the source address of the
    route to the first of `route_to` that has one (the default route's interface); else the
    first non-loopback interface address; else the hostname's address; loopback only when
    nothing else exists. Sends no packet; never raises; pure apart from reading the machine."""
    given = NODE_HOST.text(environ)
    if given:
        return given
    for target in route_to:
        source = route_source(target)
        if source and not _is_loopback(source):
            return source
    by_name = _hostname_address()
    if by_name and not _is_loopback(by_name):
        return by_name
    for address in interface_addresses():
        if not _is_loopback(address):
            return address
    return by_name or "127.0.0.1"


# --- the peers' reachability ---------------------------------------------------------------
def probe_deadline_s(rendezvous_timeout_s: float) -> float:
    """How long peers may stay silent after the rendezvous: a quarter of the run's rendezvous
    timeout (every peer has registered, so it is up), at most PROBE_CAP_S. Pure."""
    return max(0.0, min(rendezvous_timeout_s / 4, PROBE_CAP_S))


def peers_of(cluster: Mapping[str, list[str]], me: str) -> list[Peer]:
    """The peers node `me` must reach: every other node with a registered address, in the
    cluster's order, except the roles that connect to nobody (SILENT_ROLES). Empty when `me`
    is one of those roles, or alone. Raises ValueError on an address without a port. Pure."""
    if me.rsplit("-", 1)[0] in SILENT_ROLES:
        return []
    peers = []
    for role, addresses in cluster.items():
        if role in SILENT_ROLES:
            continue
        for index, address in enumerate(addresses):
            node = f"{role}-{index}"
            if node == me or not address:
                continue
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"{node} registered {address!r}, not host:port")
            peers.append(Peer(node, host.strip("[]"), int(port)))
    return peers


def probe(host: str, port: int, timeout_s: float) -> str | None:
    """One TCP connect to host:port. None when the peer answered (accepted, or refused: an
    RST means the path is open); else why not ("timed out", "no route to host", ...).
    Blocks at most `timeout_s`; closes what it opened."""
    try:
        with socket.create_connection((host, port), timeout=max(timeout_s, 0.01)):
            return None
    except ConnectionRefusedError:
        return None
    except TimeoutError:  # socket.timeout is an alias of it since 3.10
        return "timed out"
    except OSError as exc:
        return exc.strerror or str(exc)


def _probe_until(peer: Peer, deadline: float, done: threading.Event, out: dict[str, str]) -> None:
    """Probe `peer` until it answers (its entry leaves `out`), the monotonic `deadline` passes
    or `done` is set (the entry stays: why it never answered)."""
    while not done.is_set():
        left = deadline - time.monotonic()
        why = probe(peer.host, peer.port, min(CONNECT_TIMEOUT_S, max(left, 0.05)))
        if why is None:
            out.pop(peer.node, None)
            return
        out[peer.node] = why
        if time.monotonic() >= deadline:
            return
        done.wait(min(RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))


def unreachable_reason(peers: list[Peer], timeout_s: float) -> str:
    """The node's failed reason, one line: `rendezvous: worker-1 at 10.213.7.3:2222 never
    answered in 30 s: <HINT>` (several peers joined by ", "). A stable format: the end-to-end
    tests and the run's summary quote it. Pure."""
    who = ", ".join(f"{p.node} at {p.address}" for p in peers)
    return f"rendezvous: {who} never answered in {timeout_s:g} s: {HINT}"


def check_peers(
    peers: list[Peer],
    timeout_s: float,
    tick: Callable[[], None] | None = None,
    poll_s: float = 0.05,
) -> float:
    """Probe every peer in parallel (one thread each) until all have answered; returns the
    seconds that took (milliseconds when they answer at once). Raises Unreachable (reason:
    `unreachable_reason`) if any is still silent after `timeout_s`. `tick` is called every
    `poll_s` meanwhile (the agent's heartbeat and control checks); what it raises is raised
    here, after the probes are told to end. Blocking; no state of its own."""
    if not peers:
        return 0.0
    started = time.monotonic()
    deadline = started + timeout_s
    done = threading.Event()
    silent: dict[str, str] = {p.node: "not probed yet" for p in peers}
    threads = [
        threading.Thread(
            target=_probe_until, args=(p, deadline, done, silent), daemon=True, name="probe"
        )
        for p in peers
    ]
    try:
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=poll_s / len(threads))
            if tick is not None and any(t.is_alive() for t in threads):
                tick()
    finally:
        done.set()
    if silent:
        never = [p for p in peers if p.node in silent]
        raise Unreachable(unreachable_reason(never, round(timeout_s, 1)), silent)
    return time.monotonic() - started
