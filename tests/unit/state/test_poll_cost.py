"""A watch poll costs the same API calls on an old run as on a young one (issue 19's acceptance).

Two synthetic runs (benchmarks/synthetic_run.py) in one moto S3 bucket: a young one (~1,000
objects) and an old one whose whole prefix takes 5 LIST pages (3,000 log chunks, metrics,
checkpoints: the RunReader before issue 19 listed it all every poll, so it needed more pages for
the old run). After a first poll, each run advances one beat (a chunk and a heartbeat per node,
through the SDK) and one poll is counted at the HTTP level (benchmarks/poll_meter.py): its
requests by kind must be equal for both runs, it must list none of logs/, checkpoints/, metrics/,
model/, and it must return exactly the new chunks' lines. Counts, never times.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from cloudtrain.jobs import protocol as proto
from cloudtrain.providers import open_store
from cloudtrain.state.runstate import RunReader
from tests.fakes.gcs_emulator import (  # noqa: F401
    GcsEmulator,
    gcs_emulator,
    gcs_emulator_session,
)
from tests.fakes.moto_server import MotoServer, moto_server, moto_server_session  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import poll_meter as pm
import synthetic_run as syn

BUCKET = "ct-test-poll-cost"
YOUNG = syn.YOUNG  # ~1,000 objects
# 8 hours, 3,000 log chunks (and their segments), 1,200 metrics chunks, 100 checkpoint objects
# and the documents: ~4,400 objects, 5 LIST pages of the whole prefix (the young run's: 2)
OLD = replace(
    syn.YOUNG, hours=8.0, chunks_per_node=375, metrics_per_node=150, checkpoint_objects=100
)
NEVER_LISTED = ("logs/", "checkpoints/", "metrics/", "model/")


Lines = list[tuple[str, str]]


def _steady_poll(
    store: Any, meter: pm.HttpCalls, run_id: str, shape: syn.Shape, sink: Any = None
) -> tuple[Counter[str], set[str], Lines, Lines, syn.SyntheticRun]:
    """A steady poll of a new synthetic run: its calls by kind, the prefixes it listed (relative
    to the run), the lines it returned, the new chunks' lines, and the run."""
    run = syn.generate(sink or syn.MotoSink(BUCKET), run_id, shape)
    reader = RunReader(store, run_id, nodes=shape.node_names())  # as the controller does
    reader.poll()  # the watch's first poll reads the run so far
    before = dict(run.last_seq)
    syn.advance(store, run)
    with meter.recording() as calls:
        snap = reader.poll()
    base = proto.run_prefix(run_id)
    listed = {c.target.split(base, 1)[-1] for c in calls if c.kind == pm.LIST}
    want = [
        (node, line)
        for node in sorted(before)
        for line in proto.log_lines(syn.chunk_text(run_id, node, before[node] + 1, shape))
    ]
    return pm.by_kind(calls), listed, snap.new_lines, want, run


def test_a_poll_of_a_day_old_run_makes_the_calls_of_a_young_ones(
    moto_server: MotoServer,  # noqa: F811
) -> None:
    meter = pm.HttpCalls()
    meter.install()
    store = open_store(f"s3://{BUCKET}")
    store.ensure_bucket()

    young, young_listed, young_got, young_want, y = _steady_poll(
        store, meter, "young-run-00000a", YOUNG
    )
    old, old_listed, old_got, old_want, o = _steady_poll(store, meter, "old-run-00000b", OLD)

    # the old run is big enough that listing its prefix takes more pages than the young one's
    assert pm.pages(o.objects, "s3") >= 5 > pm.pages(y.objects, "s3") == 2
    assert young_got == young_want and old_got == old_want  # exactly the new chunks' lines
    assert old == young, f"old run {dict(old)} vs young run {dict(young)}"
    # each node's status, heartbeat and notice, the stop key, and the 8 new chunks; one LIST
    assert young[pm.GET] == 3 * 8 + 1 + 8 and young[pm.LIST] == 1
    for listed in (young_listed, old_listed):
        assert listed and not {p for p in listed if p.startswith(NEVER_LISTED) or p == ""}


def test_a_gcs_poll_of_an_old_run_makes_the_calls_of_a_young_ones(
    gcs_emulator: GcsEmulator,  # noqa: F811
) -> None:
    """The same on GCS, where the SDK itself may add requests: none but the poll's own (no
    bucket metadata GET per new client or per 404, google-cloud-storage 3.x's default)."""
    meter = pm.HttpCalls()
    meter.install()
    store = open_store(f"gs://{BUCKET}")
    store.ensure_bucket()
    storage = gcs_emulator.server._storage
    syn.quiet_metadata(storage)
    sink = syn.GcsSink(storage, BUCKET, gcs_emulator.url)
    young, *_ = _steady_poll(store, meter, "young-run-00000a", YOUNG, sink)
    old, _listed, got, want, _run = _steady_poll(store, meter, "old-run-00000b", OLD, sink)
    assert got == want
    assert old == young == Counter({pm.GET: 3 * 8 + 1 + 8, pm.LIST: 1}), dict(old)


def test_logs_follow_and_status_of_an_old_run_print_its_lines_in_order(
    moto_server: MotoServer,  # noqa: F811
    tmp_path: Path,
    monkeypatch: Any,
) -> None:
    """`cloudtrain logs RUN`, `logs RUN --follow` and `status RUN` of the old synthetic run (read
    from its segments and chunks, never a listing of logs/) print what the pre-issue reader did:
    every chunk's lines, node by node in sorted node order, chunk order within a node; and each
    node's heartbeat."""
    import subprocess
    import sysconfig

    from cloudtrain.state.ledger import Ledger

    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    store = open_store(f"s3://{BUCKET}")
    store.ensure_bucket()
    run = syn.generate(syn.MotoSink(BUCKET), "old-run-00000c", OLD)
    ledger = Ledger()
    ledger.create_run(run.run_id, run.run_id, "aws", "us-east-1", None, None, store.uri, None)
    ledger.set_status(run.run_id, "done", "succeeded", "")
    cli = str(Path(sysconfig.get_path("scripts")) / "cloudtrain")
    want = [
        f"[{node}] {line}"
        for node in sorted(run.last_seq)
        for line in syn.expected_lines(run.run_id, run.shape, {node: run.last_seq[node]})
    ]
    for follow in ([], ["--follow"]):
        done = subprocess.run(
            [cli, "logs", run.run_id, *follow], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.splitlines() == want, f"logs {follow}: not the chunks' lines"
    status = subprocess.run(
        [cli, "status", run.run_id], capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0, status.stderr[-2000:]
    for node in sorted(run.last_seq):  # each node's line: its status and its heartbeat's epoch
        st = proto.NodeStatus.from_json(store.get(proto.status_key(run.run_id, node)))
        beat = proto.Heartbeat.from_json(store.get(proto.heartbeat_key(run.run_id, node)))
        line = f"  {node}: {st.state} (attempt {st.attempt}) epoch {beat.epoch}/{beat.epochs}"
        assert line in status.stdout.splitlines()
