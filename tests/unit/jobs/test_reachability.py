"""A node is a host (issue 16): the agent's own address and its peers' reachability
(`cloudtrain.jobs.reachability`, hooked into the agent after the rendezvous).

Real sockets throughout. A listening peer and a closed port (refused: an RST) answer; a silent
peer is made two ways: a listener whose accept queue is full (Linux drops further SYNs) in this
process, and, as a cloud firewall does it, an nftables `drop` rule in the peer's own network
namespace (tests/fakes/netns.py; the host's own network here accepts any outbound connect, so an
"unroutable" address would answer). The namespace tests run the product code in a subprocess on
a namespace's host: the real agent process end to end, then the controller's reading of its
failed status (`failures.read_reports` / `describe`), as `cloudtrain run` and `status` show it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.jobs import reachability as reach
from cloudtrain.jobspec.runrules import status_verdict
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.failures import NodeFailure, describe, not_retried, read_reports, repeats
from cloudtrain.state.runstate import RunReader
from tests.fakes.netns import ETC_NETNS, Host, Network
from tests.unit.agent_kit import (
    HANG_S,
    RUN_ID,
    base_cluster,
    get_json,
    put_json,
    status_of,
    store,  # noqa: F401 - a fixture, taken by name
    work,  # noqa: F401 - a fixture, taken by name
)

needs_netns = pytest.mark.usefixtures("_namespaces_possible")


@pytest.fixture
def _namespaces_possible() -> None:
    from tests.fakes import netns

    netns.require()  # fails, never skips: tests/run.sh installs what it needs
PORT = 2222


# --- helpers ---------------------------------------------------------------------------------
def free_port() -> int:
    """A port nothing listens on (bound, then closed): a connect to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A port whose listener's accept queue is full: Linux drops further SYNs (no RST), as a
    firewall does. Yields the port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    held = []
    try:
        for _ in range(4):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            held.append(client)
        time.sleep(0.1)  # the handshakes complete and fill the queue
        yield port
    finally:
        for client in held:
            client.close()
        server.close()


def drop_rule(port: int) -> str:
    """An nftables ruleset that silently drops TCP to `port`, as a cloud firewall does."""
    return (
        "table inet ctbfw {\n"
        "  chain input {\n"
        "    type filter hook input priority 0; policy accept;\n"
        f"    tcp dport {port} drop\n"
        "  }\n"
        "}\n"
    )


def node_env() -> dict[str, str]:
    """This process's environment without the node-address variables: the product discovers."""
    env = dict(os.environ)
    env.pop(reach.HOST_ENV, None)
    env.pop("CLOUDTRAIN_NODE_PORT", None)
    return env


@pytest.fixture
def network() -> Iterator[Network]:
    with Network() as net:
        yield net


# --- the peers' reachability -----------------------------------------------------------------
def test_listening_and_refusing_peers_answer_at_once() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        peers = [
            reach.Peer("worker-0", "127.0.0.1", int(server.getsockname()[1])),  # accepts
            reach.Peer("ps-0", "127.0.0.1", free_port()),  # refuses: the path is open
        ]
        start = time.monotonic()
        took = reach.check_peers(peers, timeout_s=HANG_S)
    # far below one connect timeout: nobody waited for a silent peer or the deadline
    assert took < reach.CONNECT_TIMEOUT_S
    assert time.monotonic() - start < reach.CONNECT_TIMEOUT_S


def test_a_silent_peer_fails_naming_it_and_the_others_are_not_named() -> None:
    with silent_listener() as port:
        # drawn while the listener holds its port: bound first, the kernel could hand the
        # freed port to the listener (the CI saw both peers on one port)
        refusing = reach.Peer("ps-0", "127.0.0.1", free_port())
        silent = reach.Peer("worker-1", "127.0.0.1", port)
        start = time.monotonic()
        with pytest.raises(reach.Unreachable) as info:
            reach.check_peers([refusing, silent], timeout_s=1.0)
        waited = time.monotonic() - start
    assert 1.0 <= waited < HANG_S  # not before the deadline
    assert str(info.value) == (
        f"rendezvous: worker-1 at 127.0.0.1:{port} never answered in 1 s: {reach.HINT}"
    )
    assert info.value.why == {"worker-1": "timed out"}
    assert isinstance(info.value, RuntimeError)  # the agent's failed-status path
    assert not isinstance(info.value, TimeoutError)  # which would be a restartable timeout


def test_a_tick_that_raises_ends_the_wait_at_once() -> None:
    class Stop(Exception):
        pass

    calls = []

    def tick() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise Stop

    with silent_listener() as port:
        start = time.monotonic()
        with pytest.raises(Stop):
            reach.check_peers([reach.Peer("worker-1", "127.0.0.1", port)], HANG_S, tick=tick)
    assert len(calls) == 3
    assert time.monotonic() - start < HANG_S / 2  # the stop came long before the deadline


def test_peers_of_skips_me_the_evaluator_and_unregistered_nodes() -> None:
    cluster = {
        "chief": ["10.0.0.1:2222"],
        "worker": ["10.0.0.2:2222", ""],
        "ps": ["10.0.0.4:2223"],
        "evaluator": ["10.0.0.5:2222"],
    }
    assert reach.peers_of(cluster, "worker-0") == [
        reach.Peer("chief-0", "10.0.0.1", 2222),
        reach.Peer("ps-0", "10.0.0.4", 2223),
    ]
    assert reach.peers_of(cluster, "evaluator-0") == []  # it connects to nobody
    assert reach.peers_of({"chief": ["10.0.0.1:2222"]}, "chief-0") == []  # alone: no check
    with pytest.raises(ValueError, match=r"worker-0 registered '10\.0\.0\.2', not host:port"):
        reach.peers_of({"chief": ["10.0.0.1:1"], "worker": ["10.0.0.2"]}, "chief-0")


def test_the_probe_deadline_follows_the_rendezvous_timeout() -> None:
    assert reach.probe_deadline_s(120.0) == 30.0  # local's rendezvous timeout
    assert reach.probe_deadline_s(600.0) == reach.PROBE_CAP_S  # the clouds'
    assert reach.probe_deadline_s(4.0) == 1.0


@needs_netns
def test_a_firewalled_peer_fails_the_real_agent_and_the_controller_shows_why(
    network: Network,
    store: LocalStore,  # noqa: F811 - a fixture
    work: Path,  # noqa: F811 - a fixture
) -> None:
    """The real agent process on its own host, discovering its address; worker-0's host drops
    the run's port (a cloud firewall), ps-0's refuses its own (nothing listens yet): the chief
    fails naming worker-0 only, and the controller's reading of the bucket says so."""
    chief, peer = network.add_host("chief"), network.add_host("peer")
    peer.apply_nft(drop_rule(PORT))
    roles = {"chief": 1, "worker": 1, "ps": 1}
    started = work / "training-started"
    timeouts = {"rendezvous_timeout_s": 4.0, "linger_s": 0.3}
    cluster = base_cluster(roles=roles, port=PORT, entrypoint=f"touch {started}", **timeouts)
    put_json(store, "cluster.json", cluster)
    put_json(store, "attempt-1/nodes/worker-0.json", {"address": f"{peer.ip}:{PORT}"})
    put_json(store, "attempt-1/nodes/ps-0.json", {"address": f"{peer.ip}:{PORT + 1}"})
    args = ["--run-id", RUN_ID, "--role", "chief", "--index", "0"]
    args += ["--store-uri", store.uri, "--work", str(work)]
    proc = chief.run(
        [sys.executable, "-m", "cloudtrain.jobs.agent", *args],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S * 2,
    )
    assert proc.returncode == 0, proc.stderr
    registered = get_json(store, "attempt-1/nodes/chief-0.json") or {}
    assert registered["address"] == f"{chief.ip}:{PORT}"  # its own host's, not a loopback
    expected = f"rendezvous: worker-0 at {peer.ip}:{PORT} never answered in 1 s: {reach.HINT}"
    status = status_of(store, "chief-0")
    assert (status["state"], status["attempt"], status["reason"]) == ("failed", 1, expected)
    assert not started.exists()  # the training never started

    snap = RunReader(store, RUN_ID).poll()
    assert status_verdict(snap.statuses["chief-0"]) == "failed"  # ends the run: not a lost node
    reports = read_reports(snap, 1)
    assert reports.reported_lost == set()
    failures = list(reports.failed.values())
    assert describe(failures).splitlines()[0] == f"chief-0 failed: {expected}"
    # a firewall does not change between attempts: not retried, whatever the spec allows
    assert [repeats(f) for f in failures] == [True]
    assert not_retried(2, RUN_ID, failures).startswith("a peer that never answered is not retried")
    crashed = NodeFailure("worker-0", "the training process exited with code 1")
    assert not repeats(crashed)
    assert not_retried(2, RUN_ID, [crashed]).startswith("failed again after 2 retries")


# --- the node's own address ------------------------------------------------------------------
DISCOVER = "from cloudtrain.jobs.reachability import discover_host; print(discover_host())"


def discovered(host: Host, env: dict[str, str] | None = None) -> str:
    """What discover_host() answers on `host`."""
    proc = host.run(
        [sys.executable, "-c", DISCOVER],
        env=node_env() if env is None else env,
        capture_output=True,
        text=True,
        check=True,
    )
    return str(proc.stdout.strip())


def test_the_node_host_variable_is_honoured_even_when_loopback() -> None:
    assert reach.discover_host({reach.HOST_ENV: "10.213.9.9"}) == "10.213.9.9"
    assert reach.discover_host({reach.HOST_ENV: "127.0.0.1"}) == "127.0.0.1"  # the local provider


@needs_netns
def test_a_node_finds_its_own_address_not_a_loopback(network: Network) -> None:
    """A host whose hostname resolves to a loopback (Debian's `127.0.1.1 hostname` line) and
    whose first interface is not the one its default route leaves by (a second NIC, a docker0):
    the default route's interface address; without a default route, the hostname's address when
    it is not a loopback, else the first interface's; a loopback only when nothing else exists;
    $CLOUDTRAIN_NODE_HOST above all."""
    host = network.add_host("node")
    hosts_file = ETC_NETNS / host.ns / "hosts"  # what /etc/hosts is on that host
    debian = hosts_file.read_text() + f"127.0.1.1 {socket.gethostname()}\n"
    hosts_file.write_text(debian)
    second = network.subnet.rsplit(".", 1)[0] + ".250"  # in the network's /24; no host gets it
    for command in (
        ["ip", "link", "add", "ctbnic", "type", "veth", "peer", "name", "ctbpeer"],
        ["ip", "addr", "add", f"{second}/32", "dev", "ctbnic"],
        ["ip", "link", "set", "ctbnic", "up"],
        ["ip", "link", "set", "ctbpeer", "up"],
    ):
        host.run(command, check=True)
    assert discovered(host) == host.ip  # the default route's interface

    host.run(["ip", "route", "del", "default"], check=True)
    hosts_file.write_text(hosts_file.read_text() + f"{host.ip} {socket.gethostname()}\n")
    hosts_file.write_text(hosts_file.read_text().replace("127.0.1.1", "# 127.0.1.1"))
    assert discovered(host) == host.ip  # no route off the subnet: the hostname's address
    hosts_file.write_text(debian)
    assert discovered(host) == second  # the hostname's is a loopback: the first interface's
    host.run(["ip", "link", "del", "ctbnic"], check=True)
    host.run(["ip", "addr", "flush", "dev", "eth0"], check=True)
    assert discovered(host) == "127.0.1.1"  # nothing else exists
    env = {**node_env(), reach.HOST_ENV: "10.213.9.9"}
    assert discovered(host, env) == "10.213.9.9"
