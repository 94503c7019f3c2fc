"""A three-day run's watch poll, `logs` and a 5 GB restore, offline in one process (issue 19).

How: a synthetic bucket (benchmarks/synthetic_run.py) of an 8-node run, written straight into an
in-process moto S3 server and an in-process GCS emulator: the OLD run (three days: 200,576 log
chunks with their segments and indexes, 207,360 metrics chunks, 5,005 checkpoint objects, model,
TensorBoard, documents; 413,022 objects) and a YOUNG one (~1,000 objects, ten minutes old).

1. Poll. For each store and run, a steady-state watch: `--polls` times, the run advances one
   beat through the SDK (per node one new log chunk, then a heartbeat announcing it), then one
   `RunReader.poll()` is timed and its HTTP requests counted by billed kind (poll_meter.HttpCalls:
   LIST pages, GETs) with the prefixes it listed. Each poll must return exactly the 8 new
   chunks' lines. The same for the OLD RunReader (commit 11bd739, loaded from git), started as a
   watch that has run since minute 1 (the chunks and documents it read before are marked read),
   `--old-polls` times (its poll of the old run lists 413 pages, minutes on moto). The request
   charge is priced at each cloud's list and get prices (poll_meter.PRICES, sources there).
   The GCS emulator returns a whole listing in one response (it ignores maxResults): for the old
   design its LIST count is priced as the pages GCS would serve (1,000 items each).
2. `cloudtrain logs RUN` of the old run on moto, the real console script in a subprocess against
   a ledger record made with the public Ledger API under the temp CLOUDTRAIN_HOME; its output
   must equal every chunk's lines, node by node in sorted order ("[node] line": what the old code
   printed).
3. A `--restore-gb` (default 5) checkpoint restore in `--restore-shards` files while the
   controller's RunReader polls (restore_bench.py; also runs alone).

Figures: `long_poll_calls_{store}_{young,old}` (calls per poll, new design), `long_poll_s_...`,
`long_poll_calls_equal_{store}` (== 1 when young and old polls make the same calls by kind),
`long_old_poll_calls_...`/`long_old_poll_s_...`, `long_logs_s` (< 10 s), and the restore's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from _common import REPO, bench_home, console_script, figure, info, result

sys.path.insert(0, str(REPO))

import poll_meter as pm
import synthetic_run as syn

from cloudtrain.jobs import protocol as proto

BUCKET = "ct-bench-long-run"
POLL_TARGET_S = 1.0
LOGS_TARGET_S = 10.0
RUNS = {"young": "young-run-00000a", "old": "old-run-00000b"}


@dataclass
class PollFigures:
    """What the polls of one reader on one run measured."""

    calls: list[Counter[str]] = field(default_factory=list)  # per poll, by kind
    seconds: list[float] = field(default_factory=list)
    listed: set[str] = field(default_factory=set)  # prefixes listed, relative to the run

    @property
    def typical(self) -> Counter[str]:
        """The calls of the median poll (they are all equal in the new design)."""
        return sorted(self.calls, key=lambda c: sum(c.values()))[len(self.calls) // 2]

    def median_s(self) -> float:
        return float(statistics.median(self.seconds))


def _relative(prefix: str, run_id: str) -> str:
    base = proto.run_prefix(run_id)
    return prefix.split(base, 1)[1] if base in prefix else prefix


def _check_lines(snap: Any, run: syn.SyntheticRun, before: dict[str, int]) -> None:
    """The poll returned exactly the new chunks' lines, in order per node."""
    got: dict[str, list[str]] = {}
    for node, line in snap.new_lines:
        got.setdefault(node, []).append(line)
    want = {
        node: [
            line
            for seq in range(before[node] + 1, run.last_seq[node] + 1)
            for line in proto.log_lines(syn.chunk_text(run.run_id, node, seq, run.shape))
        ]
        for node in run.last_seq
    }
    if got != want:
        bad = sorted(n for n in want if got.get(n) != want[n])
        counts = {n: (len(got.get(n, [])), len(want[n])) for n in bad}
        raise SystemExit(
            f"{run.run_id}: a poll returned other lines than the new chunks' "
            f"(node: (lines returned, expected)): {counts}; chunks {before} -> {run.last_seq}"
        )


def _steady_polls(
    reader: Any, store: Any, run: syn.SyntheticRun, meter: pm.HttpCalls, polls: int
) -> PollFigures:
    out = PollFigures()
    for _ in range(polls):
        before = dict(run.last_seq)
        syn.advance(store, run)
        with meter.recording() as calls:
            t0 = time.perf_counter()
            snap = reader.poll()
            out.seconds.append(time.perf_counter() - t0)
        _check_lines(snap, run, before)
        out.calls.append(pm.by_kind(calls))
        out.listed |= {_relative(c.target, run.run_id) for c in calls if c.kind == pm.LIST}
    return out


def new_design(store: Any, run: syn.SyntheticRun, meter: pm.HttpCalls, polls: int) -> PollFigures:
    """The current RunReader: a first poll (a watch starting on the run, untimed here), then
    steady polls."""
    from cloudtrain.state.runstate import RunReader

    reader = RunReader(store, run.run_id, nodes=run.shape.node_names())  # as the controller
    t0 = time.perf_counter()
    with meter.recording() as calls:
        reader.poll()
    info(
        f"  new design, first poll of {run.run_id}: {time.perf_counter() - t0:.2f} s, "
        f"{dict(pm.by_kind(calls))}"
    )
    return _steady_polls(reader, store, run, meter, polls)


def old_design(
    store: Any, run: syn.SyntheticRun, meter: pm.HttpCalls, polls: int, old: Any
) -> PollFigures:
    """The RunReader of 11bd739 as a watch that has been running since the run began: every
    chunk up to now is marked read and every document's listing signature is known (from
    listings of the small prefixes, made before the timed polls)."""
    reader = old.RunReader(store, run.run_id)
    reader._log_done = {
        proto.log_chunk_key(run.run_id, node, seq)
        for node, last in run.last_seq.items()
        for seq in range(last + 1)
    }
    for prefix in ("status/", "heartbeat/", "bootstrap/", "notice/"):
        for obj in store.list(proto.run_prefix(run.run_id) + prefix):
            reader._seen[obj.key] = (obj.size, obj.updated)
    return _steady_polls(reader, store, run, meter, polls)


def logs_cli(run: syn.SyntheticRun, store_uri: str, region: str) -> float:
    """Seconds of `cloudtrain logs RUN` (the console script) on the run; checks its output."""
    from cloudtrain.state.ledger import Ledger

    ledger = Ledger()  # the temp CLOUDTRAIN_HOME's
    ledger.create_run(run.run_id, run.run_id, "aws", region, None, None, store_uri, None)
    ledger.set_status(run.run_id, "running")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(console_script()), "logs", run.run_id],
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"cloudtrain logs failed ({proc.returncode}): {proc.stderr[-2000:]}")
    want_nodes = sorted(run.last_seq)
    got = proc.stdout.splitlines()
    want = [
        f"[{node}] {line}"
        for node in want_nodes
        for line in syn.expected_lines(run.run_id, run.shape, {node: run.last_seq[node]})
    ]
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        raise SystemExit(
            f"cloudtrain logs printed {len(got)} lines, {len(want)} expected; first difference "
            f"at line {first}: {got[first] if first is not None else ''!r}"
        )
    info(f"cloudtrain logs {run.run_id}: {len(got):,} lines, identical to the chunks' lines")
    return seconds


def _row(store: str, label: str, design: str, fig: PollFigures, cloud: str, listed: int) -> str:
    calls = fig.typical
    lists = calls[pm.LIST] if listed <= 0 else listed
    cost = pm.dollars_per_1000_polls(lists, calls[pm.GET] + calls[pm.BUCKET_GET], cloud)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(calls.items()))
    billed = f" (billed as {lists} LIST pages)" if listed > 0 else ""
    return (
        f"| {store} | {label} | {design} | {kinds}{billed} | {fig.median_s():.3f} s | ${cost:.3f} |"
    )


def bench_store(
    name: str,
    store: Any,
    sink: syn.Sink,
    meter: pm.HttpCalls,
    args: argparse.Namespace,
    old_module: Any,
    table: list[str],
) -> bool:
    """Generate both runs into `store`, measure the polls; returns whether the goals hold."""
    cloud = "s3" if name == "moto" else "gcs"
    ok = True
    new: dict[str, PollFigures] = {}
    runs: dict[str, syn.SyntheticRun] = {}
    old_shape = replace(
        syn.OLD, chunks_per_node=args.chunks_per_node, metrics_per_node=args.metrics_per_node
    )
    for label, shape in (("young", syn.YOUNG), ("old", old_shape)):
        t0 = time.perf_counter()
        run = syn.generate(sink, RUNS[label], shape)
        runs[label] = run
        info(
            f"{name}: {label} run written in {time.perf_counter() - t0:.0f} s: "
            f"{run.objects:,} objects {run.by_kind}"
        )
        new[label] = fig = new_design(store, run, meter, args.polls)
        info(f"  new design, prefixes listed: {sorted(fig.listed)}")
        figure(
            f"long_poll_calls_{name}_{label}",
            sum(pm.object_calls(fig.typical).values()),
            stat="value",
        )
        ok &= result(
            f"long_poll_s_{name}_{label}",
            fig.median_s(),
            POLL_TARGET_S,
            n=len(fig.seconds),
            digits=3,
        )
        table.append(_row(name, label, "new", fig, cloud, 0))
        never = ("logs/", "checkpoints/", "model/", "metrics/")
        if any(p.startswith(never) for p in fig.listed):
            info(f"  FAIL: the new poll listed {sorted(fig.listed)}")
            ok = False
        polls = args.old_polls if label == "old" else args.polls
        if polls > 0:
            t0 = time.perf_counter()
            old = old_design(store, run, meter, polls, old_module)
            info(
                f"  old design: {polls} poll(s) in {time.perf_counter() - t0:.0f} s, "
                f"listed {sorted(old.listed)}"
            )
            # the emulator answers a listing whole; GCS would serve it in pages of 1,000
            objects = run.objects + 8 * run.beat
            billed = pm.pages(objects, cloud) if name == "gcs" else 0
            figure(
                f"long_old_poll_calls_{name}_{label}",
                billed or sum(old.typical.values()),
                stat="value",
            )
            figure(f"long_old_poll_s_{name}_{label}", old.median_s(), n=len(old.seconds))
            table.append(_row(name, label, "old (11bd739)", old, cloud, billed))
    # the object API's calls (GCS's per-client bucket reads vary with threads: reported apart)
    first = pm.object_calls(new["young"].calls[0])
    equal = all(pm.object_calls(c) == first for label in new for c in new[label].calls)
    ok &= result(f"long_poll_calls_equal_{name}", int(equal), 1, op="==", stat="value")
    if name == "moto" and args.logs:
        seconds = logs_cli(runs["old"], store.uri, "us-east-1")
        ok &= result("long_logs_s", seconds, LOGS_TARGET_S, stat="value")
    return ok


def bench_moto(args: argparse.Namespace, meter: pm.HttpCalls, old: Any, table: list[str]) -> bool:
    from cloudtrain.providers import open_store
    from tests.fakes.moto_server import clear_aws_caches, start_moto, use_moto

    server = start_moto()
    try:
        with pytest.MonkeyPatch.context() as mp:
            use_moto(mp, server)
            clear_aws_caches()
            store = open_store(f"s3://{BUCKET}")
            store.ensure_bucket()
            ok = bench_store("moto", store, syn.MotoSink(BUCKET), meter, args, old, table)
            if args.restore_gb > 0:
                import restore_bench

                ok &= restore_bench.bench(
                    store, args.restore_gb, args.tmp, shards=args.restore_shards
                )
            return ok
    finally:
        server.reset()  # frees the 400,000 objects before the next store
        server.stop()
        clear_aws_caches()


def bench_gcs(args: argparse.Namespace, meter: pm.HttpCalls, old: Any, table: list[str]) -> bool:
    from cloudtrain.providers import open_store
    from tests.fakes.gcs_emulator import start_gcs_emulator, use_gcs_emulator

    emulator = start_gcs_emulator()
    try:
        with pytest.MonkeyPatch.context() as mp:
            use_gcs_emulator(mp, emulator)
            store = open_store(f"gs://{BUCKET}")
            store.ensure_bucket()
            storage = emulator.server._storage
            syn.quiet_metadata(storage)
            sink = syn.GcsSink(storage, BUCKET, emulator.url)
            return bench_store("gcs", store, sink, meter, args, old, table)
    finally:
        emulator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=5, help="steady polls per run (default 5)")
    parser.add_argument(
        "--old-polls", type=int, default=1, help="old-design polls of the old run (default 1)"
    )
    parser.add_argument("--stores", nargs="+", default=["moto", "gcs"], choices=["moto", "gcs"])
    parser.add_argument("--no-logs", dest="logs", action="store_false", help="skip `logs RUN`")
    parser.add_argument(
        "--restore-gb", type=float, default=5.0, help="checkpoint restore size (0: skip; default 5)"
    )
    parser.add_argument(
        "--restore-shards", type=int, default=40, help="the checkpoint's data files (default 40)"
    )
    parser.add_argument(
        "--chunks-per-node", type=int, default=syn.OLD.chunks_per_node, help="old run's log chunks"
    )
    parser.add_argument(
        "--metrics-per-node", type=int, default=syn.OLD.metrics_per_node, help="old run's metrics"
    )
    args = parser.parse_args()
    meter = pm.HttpCalls()
    meter.install()
    old = pm.old_runstate()
    table = [
        "| store | run | design | calls per poll | wall per poll (median) | $ per 1,000 polls "
        "(S3 / GCS list+get prices) |",
        "|---|---|---|---|---|---|",
    ]
    ok = True
    with bench_home("long_run") as tmp:
        args.tmp = tmp
        for name in args.stores:
            ok &= (bench_moto if name == "moto" else bench_gcs)(args, meter, old, table)
    print("\n".join(["", *table]), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
