"""jobs/trace.py: spans, their JSON, the phases that tile a recorder's time, the startup script's
trace file, and the node's trace document as the agent writes it. Node-side: runs on 3.10-3.12."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.jobs import protocol
from cloudtrain.jobs import trace as tr
from cloudtrain.jobs.node_trace import AGENT_LAUNCH_ENV, BOOT_START_ENV, NodeTrace
from cloudtrain.jobs.trace import PhaseClock, Span, TraceDoc, Tracer, read_boot_trace
from cloudtrain.providers.local import LocalStore


def test_a_span_round_trips_and_a_bad_one_is_refused() -> None:
    span = Span("create worker-0", 10.0, 10.5, "", 0, "create", "ct-x-worker-0")
    assert Span.from_dict(json.loads(json.dumps(span.to_dict()))) == span
    assert span.seconds == 0.5
    for bad in (
        [],
        {"name": "x", "start": 1.0},
        {"name": "", "start": 1.0, "end": 2.0},
        {"name": "x", "start": "1", "end": 2.0},
        {"name": "x", "start": True, "end": 2.0},
        {"name": "x", "start": 1.0, "end": 2.0, "attempt": 1.5},
        {"name": "x", "start": 1.0, "end": 2.0, "node": 3},
    ):
        with pytest.raises(ValueError):
            Span.from_dict(bad)
    with pytest.raises(ValueError):
        TraceDoc.from_json(b'{"spans": {}}')
    with pytest.raises(ValueError):
        TraceDoc.from_json(b"not json")


def test_phases_follow_each_other_without_a_gap() -> None:
    seen: list[Span] = []
    tracer = Tracer("", on_span=seen.append)
    clock = PhaseClock(tracer, tr.ROOT, start=100.0)
    clock.next(tr.STARTUP, at=100.0)
    clock.next(tr.BUNDLE, at=100.2)
    clock.next(tr.WATCH, attempt=1, at=101.0)
    clock.next(tr.WATCH, attempt=2, at=105.0)
    assert clock.current == tr.WATCH
    assert clock.close(at=107.0) == 107.0
    assert clock.close(at=108.0) == 108.0 and clock.current is None  # idempotent
    spans = tracer.spans()
    assert spans == seen
    assert [(s.name, s.start, s.end, s.attempt) for s in spans] == [
        (tr.STARTUP, 100.0, 100.2, 0),
        (tr.BUNDLE, 100.2, 101.0, 0),
        (tr.WATCH, 101.0, 105.0, 1),
        (tr.WATCH, 105.0, 107.0, 2),
    ]
    assert all(s.parent == tr.ROOT for s in spans)


def test_a_span_is_recorded_when_its_body_raises() -> None:
    tracer = Tracer("worker-0")
    with pytest.raises(RuntimeError), tracer.span(tr.SETUP, parent=tr.NODE, attempt=2):
        raise RuntimeError("setup failed")
    (span,) = tracer.spans()
    assert (span.name, span.node, span.parent, span.attempt) == (tr.SETUP, "worker-0", "node", 2)
    assert span.end >= span.start


def test_the_startup_scripts_trace_file_is_read_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.tsv"
    path.write_text(
        "driver\t1700000000.100000\t1700000000.150000\n"
        "python\t1700000000,150000\t1700000000,900000\n"  # a locale with a decimal comma
        "bundle\t1700000000.900000\n"  # a boot cut short mid-line
        "\t1\t2\n"
        "bundle\tnot-a-time\t1\n"
        "agent\t1700000001.0\t1700000000.0\tnode\n"  # an end before its start is clipped
    )
    spans = read_boot_trace(path, "worker-1")
    assert [(s.name, s.parent, s.node) for s in spans] == [
        ("driver", tr.BOOT, "worker-1"),
        ("python", tr.BOOT, "worker-1"),
        ("agent", "node", "worker-1"),
    ]
    assert spans[1].start == pytest.approx(1700000000.15) and spans[1].seconds == pytest.approx(
        0.75
    )
    assert spans[2].seconds == 0.0
    assert read_boot_trace(tmp_path / "missing.tsv", "worker-1") == []


def test_process_start_is_when_the_process_began_not_when_it_asks() -> None:
    code = "import time; time.sleep(0.5); from cloudtrain.jobs.trace import process_start; "
    code += "print(process_start(), time.time())"
    spawned = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    start, asked = (float(x) for x in out.stdout.split())
    # /proc counts in 10 ms ticks and /proc/uptime in 10 ms steps
    assert spawned - 0.05 <= start <= spawned + (asked - spawned) - 0.45


class _Node(NodeTrace):
    def __init__(self, store: LocalStore, work: Path) -> None:
        self.run_id, self.me, self.store, self.work, self.attempt = (
            "r-1",
            "worker-0",
            store,
            work,
            1,
        )
        self._init_trace()


def test_the_agent_publishes_its_spans_under_a_node_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    now = time.time()
    (work / "trace.tsv").write_text(f"driver\t{now - 3:.6f}\t{now - 2.9:.6f}\n")
    monkeypatch.setenv(BOOT_START_ENV, f"{now - 3.2:.6f}")
    monkeypatch.setenv(AGENT_LAUNCH_ENV, f"{now - 1:.6f}")
    store = LocalStore((tmp_path / "bucket").as_uri())
    node = _Node(store, work)
    node.agent_up()
    with node.traced(tr.RESTORE):
        pass
    node.publish_trace()
    doc = TraceDoc.from_json(store.get(protocol.trace_key("r-1", "worker-0")))
    by_name = {s.name: s for s in doc.spans}
    assert list(by_name) == [tr.NODE, "driver", tr.BOOT, tr.AGENT_START, tr.RESTORE]
    assert by_name[tr.NODE].start == pytest.approx(now - 3.2)
    assert by_name[tr.NODE].parent == tr.ROOT and by_name["driver"].parent == tr.BOOT
    assert by_name[tr.BOOT].end == pytest.approx(now - 1)  # the agent's launch
    assert by_name[tr.AGENT_START].start == pytest.approx(now - 1)
    assert by_name[tr.RESTORE].attempt == 1 and by_name[tr.RESTORE].parent == tr.NODE
    assert all(s.node == "worker-0" for s in doc.spans)
