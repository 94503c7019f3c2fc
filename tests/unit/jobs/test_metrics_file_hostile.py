"""The training's metrics file ($CLOUDTRAIN_METRICS_FILE) is untrusted (issue 29): the job
writes it. The real MetricsPump on a real file and a real LocalStore: bad JSON, a huge line,
wrong types, deep nesting, huge integers and non-finite numbers are skipped, each kind said at
most once in the node's log; the good records around them go through, and neither `flush` nor
`summary` (the heartbeat's figures) ever raises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cloudtrain.jobs.metrics import MAX_READ_BYTES, MAX_RECORD_BYTES, MetricsPump
from cloudtrain.jobs.protocol import run_prefix
from cloudtrain.providers.local import LocalStore

RUN = "run-hostile"


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _pump(tmp_path: Path) -> tuple[MetricsPump, LocalStore, list[str], Path]:
    store = LocalStore(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    said: list[str] = []
    path = tmp_path / "metrics" / "train.jsonl"
    pump = MetricsPump(store, RUN, "chief-0", path, say=said.append)
    pump.new_attempt()
    return pump, store, said, path


def _stream(store: LocalStore) -> list[str]:
    keys = store.list(f"{run_prefix(RUN)}metrics/chief-0/")
    return [line for o in keys for line in store.get(o.key).decode().splitlines()]


GOOD = {"time": 1.0, "kind": "window", "epoch": 1, "step": 3, "steps_per_s": 2.5}
HOSTILE = [
    b"{not json",
    b'{"kind": "window", "pad": "' + b"z" * (2 * 1024 * 1024) + b'"}',  # huge
    b"[" * 100_000 + b"]" * 100_000,  # deep: RecursionError in json
    b'{"kind": "window", "n": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b'{"kind": "window", "steps_per_s": ' + b"9" * 4000 + b"}",  # no float holds it
    b'{"kind": "window", "steps_per_s": ' + b"9" * 5000 + b"}",  # int() refuses it (3.11+)
    b'{"kind": "epoch", "loss": NaN}',
    b'{"kind": "epoch", "loss": Infinity, "seconds": 1e999}',
    b'{"kind": 5}',
    b'["kind", "window"]',
    b'{"kind": "epoch", "source": {"a": 1}, "epoch": "x", "loss": "0.5"}',
    b"\x00\xff\xfe",
]


def test_hostile_lines_are_skipped_and_good_ones_kept(tmp_path: Path) -> None:
    pump, store, said, path = _pump(tmp_path)
    lines = [json.dumps(GOOD).encode(), *HOSTILE, json.dumps({**GOOD, "step": 4}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    pump.flush(final=True)
    summary = pump.summary()
    records = [_strict(line) for line in _stream(store)]
    kinds = [(r["kind"], r.get("step")) for r in records]
    assert ("window", 3) in kinds and ("window", 4) in kinds
    for record in records:
        assert record.get("loss") is None or isinstance(record["loss"], float)
        assert not isinstance(record.get("steps_per_s"), int) or record["steps_per_s"] < 10**18
    assert summary["steps_per_s"] == 2.5
    json.dumps(summary, allow_nan=False)
    assert len(said) == len(set(said)), said  # each kind of problem said once
    assert said and all("metrics file" in s for s in said), said
    assert all(len(s) < 400 for s in said), said


def test_each_kind_is_said_once(tmp_path: Path) -> None:
    pump, _store, said, path = _pump(tmp_path)
    path.write_bytes(b"{bad\n" * 50 + b'{"kind": "epoch", "loss": NaN}\n' * 50)
    pump.flush()
    assert len(said) == 2, said


def test_a_line_longer_than_a_read_is_skipped_whole(tmp_path: Path) -> None:
    """A line longer than one read's worth, without a newline yet: its tail (which may look like
    a record) is not taken for one when its newline comes."""
    pump, store, _said, path = _pump(tmp_path)
    tail = json.dumps({**GOOD, "step": 99}).encode()
    with open(path, "wb") as f:
        f.write(b" " * (MAX_READ_BYTES + 10))  # blanks: with its tail, valid JSON
        f.flush()
        pump.flush()
        f.write(b" " + tail + b"\n" + json.dumps(GOOD).encode() + b"\n")
    pump.flush()
    pump.flush()
    steps = [_strict(line).get("step") for line in _stream(store)]
    assert steps == [3], steps
    assert MAX_RECORD_BYTES < MAX_READ_BYTES
