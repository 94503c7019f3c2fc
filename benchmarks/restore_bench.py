"""A large checkpoint restore watched by the controller's poll (issue 19, long_run.py part 3).

A `gb` GB checkpoint in `shards` sparse data files (no disk until read; TF shards a large
checkpoint's variables the same way) is uploaded to `checkpoints/` of a run through the store
(`put_file`; moto answers each ranged GET by reading the whole object, so one 5 GB object would
take hours to restore there: the shards keep moto's own cost linear), then the real node agent
(jobs/agent.Agent, worker-0, heartbeat_s 2 s) runs
`restore_checkpoints()` with its heartbeat thread beating (`start_beating`, when the agent has
one; `beat_thread=False` measures the agent as it was before: one heartbeat before the restore and
none during it). Meanwhile a RunReader polls every POLL_S and records, at each poll, the age of
the node's heartbeat as the controller sees it: seconds since a poll last read a new heartbeat
(`Snapshot.heartbeat_seen`, what the watch loop's lost-node check uses). Figures: the restore's
seconds and the largest age (target: heartbeat_s + 5 s).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from _common import figure, info, result

from cloudtrain.jobs import protocol as proto

RUN = "restore-run-00000c"
NODE_ROLE, NODE_INDEX = "worker", 0
HEARTBEAT_S = 2.0
SLACK_S = 5.0
POLL_S = 1.0


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as out:
        out.truncate(size)


def bench(store: Any, gb: float, tmp: Path, beat_thread: bool = True, shards: int = 40) -> bool:
    """Upload, restore while polling, print the figures; returns whether the age goal holds."""
    from cloudtrain.jobs.agent import Agent
    from cloudtrain.state.runstate import RunReader

    size = int(gb * 1e9)
    free = shutil.disk_usage(tmp).free
    if free < 3 * size + 5e9:
        info(f"restore: skipped, {free / 1e9:.0f} GB free for a {gb:g} GB file")
        return True
    src = tmp / "ckpt-src.data"
    _sparse(src, size // shards)
    ckpt = proto.checkpoints_prefix(RUN)
    names = [f"ckpt-1.data-{i:05d}-of-{shards:05d}" for i in range(shards)]
    t0 = time.perf_counter()
    for name in names:
        store.put_file(ckpt + name, str(src))
    store.put(ckpt + "ckpt-1.index", b"index")
    store.put(ckpt + "checkpoint", b'model_checkpoint_path: "ckpt-1"\n')
    src.unlink()
    info(f"restore: {gb:g} GB uploaded in {time.perf_counter() - t0:.0f} s")

    agent = Agent(RUN, NODE_ROLE, NODE_INDEX, store, tmp / "node")
    agent.cluster = proto.ClusterDoc(
        run_id=RUN,
        roles={NODE_ROLE: 1},
        port=2222,
        attempt=1,
        entrypoint="python train.py",
        heartbeat_s=HEARTBEAT_S,
    )
    agent.attempt = 1
    store.put(proto.cluster_key(RUN), agent.cluster.to_json())  # as the controller does first
    node = proto.node_id(NODE_ROLE, NODE_INDEX)
    reader = RunReader(store, RUN, nodes=[node])  # as the controller does
    ages: list[float] = []
    activities: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(POLL_S):
            try:
                snap = reader.poll()
            except Exception as exc:  # the check below fails the figure
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            seen = snap.heartbeat_seen.get(node)
            if seen is not None:
                ages.append(time.time() - seen)
            beat = snap.heartbeats.get(node)
            activity = str(beat.get("activity", "")) if beat is not None else ""
            if activity and (not activities or activities[-1] != activity):
                activities.append(activity)

    threaded = beat_thread and hasattr(agent, "start_beating")
    if threaded:
        agent.start_beating()
    else:  # the agent before its heartbeat thread: a beat from the main loop, then the restore
        agent.heartbeat() if hasattr(agent, "heartbeat") else agent.beat()
    errors: list[str] = []
    if hasattr(agent, "write_status"):
        agent.write_status(proto.NodeState.BOOTSTRAPPED)
    reader.poll()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    try:
        restored = agent.restore_checkpoints()
        seconds = time.perf_counter() - t0
    finally:
        stop.set()
        watcher.join(30)
        if threaded:
            agent.stop_beating()
    got = sum((agent.ckpt_dir / name).stat().st_size for name in names)
    if restored != shards + 2 or got != size // shards * shards or errors:
        raise SystemExit(f"restore: {restored} files, {got} bytes; poll errors: {errors[:3]}")
    shutil.rmtree(agent.ckpt_dir, ignore_errors=True)
    mode = "with the heartbeat thread" if threaded else "WITHOUT a heartbeat thread (before)"
    info(
        f"restore {mode}: {gb:g} GB in {seconds:.1f} s ({size / 1e6 / seconds:.0f} MB/s), "
        f"{len(ages)} polls; activities seen: {activities[:3]}...{activities[-2:]}"
    )
    figure("long_restore_s", seconds, stat="value")
    return result(
        "long_restore_max_heartbeat_age_s",
        max(ages, default=seconds),
        HEARTBEAT_S + SLACK_S,
        stat="value",
    )


def main() -> int:
    """Standalone: the restore alone, on its own in-process moto server."""
    import argparse
    import sys

    import pytest
    from _common import REPO, bench_home

    sys.path.insert(0, str(REPO))
    from cloudtrain.providers import open_store
    from tests.fakes.moto_server import clear_aws_caches, start_moto, use_moto

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=5.0, help="checkpoint size (default 5)")
    parser.add_argument("--shards", type=int, default=40, help="data files (default 40)")
    parser.add_argument(
        "--no-beat-thread", dest="thread", action="store_false", help="the agent before issue 19"
    )
    args = parser.parse_args()
    with bench_home("restore") as tmp:
        server = start_moto()
        try:
            with pytest.MonkeyPatch.context() as mp:
                use_moto(mp, server)
                clear_aws_caches()
                store = open_store("s3://ct-bench-restore")
                store.ensure_bucket()
                ok = bench(store, args.gb, tmp, beat_thread=args.thread, shards=args.shards)
        finally:
            server.stop()
            clear_aws_caches()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
