"""Node ports on local (and in the box's harness): drawn below the kernel's ephemeral range, so no
outgoing connection takes one between its choice and the node's TensorFlow binding it; never the
same port twice in one process; and from $CLOUDTRAIN_LOCAL_PORTS when it is set, so runs side by
side (the suite's two workers) draw from slices of their own."""

from __future__ import annotations

import socket

import pytest

from cloudtrain.core.errors import UsageError
from cloudtrain.providers import local_sessions
from cloudtrain.providers.local import EPHEMERAL_RANGE, LOW_PORT, free_port
from cloudtrain.providers.local_sessions import PORTS_ENV
from tests.fakes import port_slices
from tests.fakes.port_slices import worker_slice


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch) -> None:
    """What this process's other tests handed out is not these tests' business."""
    monkeypatch.setattr(local_sessions, "_handed_out", set())


def test_node_ports_are_free_and_below_the_ephemeral_range(monkeypatch) -> None:
    monkeypatch.delenv(PORTS_ENV, raising=False)
    top = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(LOW_PORT <= p < top for p in ports), sorted(ports)
    assert len(set(ports)) == 50  # never the same port twice in one process
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))  # free indeed, on every address (TensorFlow binds 0.0.0.0)


def test_a_slice_is_drawn_whole_and_never_twice(monkeypatch) -> None:
    monkeypatch.setenv(PORTS_ENV, "23000-23039")
    ports = [free_port() for _ in range(40)]
    assert sorted(ports) == list(range(23000, 23040))


def test_a_port_in_use_is_skipped(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        monkeypatch.setenv(PORTS_ENV, f"{port}-{port + 1}")
        got = free_port()
    assert got == port + 1 or got not in range(port, port + 2)  # never the held one
    assert got != port


@pytest.mark.parametrize("value", ["", "23000", "x-y", "23010-23000", "80-90", "23000-70000"])
def test_a_bad_slice_is_a_clear_error(monkeypatch, value: str) -> None:
    monkeypatch.setenv(PORTS_ENV, value)
    with pytest.raises(UsageError, match=PORTS_ENV):
        free_port()


def test_the_suites_workers_get_disjoint_slices() -> None:
    slices = [worker_slice(f"gw{i}", 3, low=20000, top=32768) for i in range(3)]
    ranges = [set(range(lo, hi + 1)) for lo, hi in slices]
    assert all(len(r) > 4000 for r in ranges)
    assert not ranges[0] & ranges[1] and not ranges[1] & ranges[2] and not ranges[0] & ranges[2]
    assert min(min(r) for r in ranges) >= 20000 and max(max(r) for r in ranges) < 32768
    assert worker_slice(None, 0, low=20000, top=32768) is None  # not under xdist: the whole range


def test_tests_run_sh_gets_disjoint_slices_of_the_set_range(monkeypatch, capsys) -> None:
    """`python -m tests.fakes.port_slices 2` (tests/run.sh, the node-side suites): two lines
    that split the range whole, no port in both."""
    monkeypatch.setenv(PORTS_ENV, "30000-30009")
    assert port_slices.main(["port_slices", "2"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines == ["30000-30004", "30005-30009"]
    assert port_slices.main(["port_slices", "1"]) == 2  # one slice is no split: refused
