"""tests/fakes/netns.py: hosts on one bridge reach each other and the machine, a host's nftables
ruleset with policy drop blocks a TCP connect, and close() leaves nothing (leftovers() is empty).
Also the leftover check itself can fail: a stray ctb namespace is named by leftovers()."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import netns
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.netns import Network, leftovers
from tests.fakes.netns_probe import connect, listen

pytestmark = [
    pytest.mark.timeout(120),
]


@pytest.fixture(autouse=True)
def _namespaces_possible() -> None:
    netns.require()  # fails, never skips: tests/run.sh installs what it needs


DROP_IN = """
table inet box {
  chain input {
    type filter hook input priority 0; policy drop;
    ct state established,related accept
    iif lo accept
  }
}
"""


def host_listener() -> tuple[socket.socket, threading.Thread]:
    """A listener on the machine's side, any address, a free port."""
    server = socket.create_server(("0.0.0.0", 0))

    def serve() -> None:
        with server:
            while True:
                try:
                    server.accept()[0].close()
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_hosts_reach_each_other_and_the_machine_and_a_drop_policy_blocks() -> None:
    server, _ = host_listener()
    port = server.getsockname()[1]
    try:
        with Network() as net:
            chief, worker = net.add_host("chief"), net.add_host("worker_1")
            assert chief.ip != worker.ip and worker.name == "worker-1"
            assert net.subnet.startswith("10.213.") and net.subnet.endswith(".0/24")
            assert net.host_ip.rsplit(".", 1)[1] == "1"
            # each host is its own machine: its address is on its eth0, not the other's
            addrs = worker.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
            assert worker.ip in addrs and chief.ip not in addrs
            listen(chief, 5000)
            assert connect(worker, chief.ip, 5000) == 0
            assert connect(chief, net.host_ip, port) == 0  # the emulators' address
            assert connect(worker, chief.ip, 5001) == 1  # nothing there: refused, not dropped
            chief.apply_nft(DROP_IN)
            started = time.monotonic()
            assert connect(worker, chief.ip, 5000, timeout=1.5) == 2  # dropped: a timeout
            assert time.monotonic() - started >= 1.0
            assert connect(chief, net.host_ip, port) == 0  # outbound is still open
            chief.apply_nft("")  # replaced: no rules, open again
            assert connect(worker, chief.ip, 5000) == 0
            assert any(f"namespace {chief.ns}" == item for item in leftovers())
            assert any(item.startswith("process ") for item in leftovers())
        assert [item for item in leftovers() if net.bridge in item] == []
        net.close()  # idempotent
    finally:
        server.close()


def test_a_bad_ruleset_raises_with_nfts_message() -> None:
    with Network() as net:
        host = net.add_host("a")
        with pytest.raises(subprocess.CalledProcessError) as caught:
            host.apply_nft("table inet box { chain input { nonsense; } }")
        assert "Error" in caught.value.stderr


def test_close_after_a_failure_leaves_nothing() -> None:
    with pytest.raises(RuntimeError, match="boom"), Network() as net:
        net.add_host("a").popen(["sleep", "300"])
        raise RuntimeError("boom")
    assert [item for item in leftovers() if net.bridge in item] == []


def test_the_leftover_check_names_a_stray_namespace() -> None:
    stray = f"{netns.PREFIX}stray{netns.secrets.token_hex(2)}"
    subprocess.run(["ip", "netns", "add", stray], check=True)
    try:
        assert f"namespace {stray}" in leftovers()
    finally:
        netns.delete_namespace(stray)
    assert f"namespace {stray}" not in leftovers()


STRAY_TEST = """
import subprocess


def test_leaves_a_namespace():
    subprocess.run(["ip", "netns", "add", "{name}"], check=True)
"""


def test_the_session_fails_when_a_test_leaves_a_namespace(tmp_path: Path) -> None:
    """tests/conftest.py's end-of-session check turns a passing session into a failed one."""
    stray = f"{netns.PREFIX}stray{netns.secrets.token_hex(2)}"
    (tmp_path / "test_stray.py").write_text(STRAY_TEST.format(name=stray))
    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            [*args, "--rootdir", str(tmp_path), str(tmp_path / "test_stray.py")],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        netns.delete_namespace(stray)
    assert "1 passed" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout
    assert "error: the test session left" in done.stdout
    assert f"namespace {stray}" in done.stdout


def test_each_host_asks_the_metadata_address_and_hears_its_own_address() -> None:
    """169.254.169.254 (EC2, Azure) and metadata.google.internal (GCE) from inside a host reach
    the fake metadata service on the bridge, which answers the asking host's own address."""
    with Network() as net, MetadataServer(host=net.host_ip) as imds:
        net.serve_link_local(int(imds.url.rsplit(":", 1)[1]))
        for host in (net.add_host("a"), net.add_host("b")):
            curl = ["curl", "-fsS", "-m", "5"]
            token = host.run(
                [
                    *curl,
                    "-X",
                    "PUT",
                    "http://169.254.169.254/latest/api/token",
                    "-H",
                    "X-aws-ec2-metadata-token-ttl-seconds: 60",
                ],
                capture_output=True,
                text=True,
            ).stdout
            answers = [
                [
                    *curl,
                    "-H",
                    f"X-aws-ec2-metadata-token: {token}",
                    "http://169.254.169.254/latest/meta-data/local-ipv4",
                ],
                [
                    *curl,
                    "-H",
                    "Metadata-Flavor: Google",
                    "http://metadata.google.internal/"
                    "computeMetadata/v1/instance/network-interfaces/0/ip",
                ],
                [
                    *curl,
                    "-H",
                    "Metadata: true",
                    "http://169.254.169.254/metadata/instance/network/"
                    "interface/0/ipv4/ipAddress/0/privateIpAddress?api-version=2021-02-01&format=text",
                ],
            ]
            for args in answers:
                done = host.run(args, capture_output=True, text=True)
                assert (done.returncode, done.stdout) == (0, host.ip), (args, done.stderr)
    assert [item for item in leftovers() if net.bridge in item] == []
