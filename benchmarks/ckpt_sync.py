"""Checkpoint sync throughput against the raw SDK upload of the same files, on moto's S3 (issue 18).

How: a realistic checkpoint folder (`--large` .data files of `--large-mb` MiB each, plus
`--small` small files: .index shards, `checkpoint`, metadata, from 1 KiB to 256 KiB) is uploaded
to a moto S3 server running in its own process (`tests/fakes/moto_server.start_moto`, so that
the server does not share the client's interpreter lock: S3 is another machine) by
(a) the raw SDK, as a user would: boto3's `upload_file` of each file in turn (its default
    TransferConfig: multipart above 8 MiB, 10 parts at a time), and
(b) `Checkpoints.sync_checkpoints()` of the chief (jobs/checkpoints.py) with the store a node
    opens (`open_store`: the real S3Store inside the retry layer), from an empty sync state.
`--rounds` pairs in alternating order after `--warmup` untimed uploads of each (so that every
timed upload overwrites the same keys); `ckpt_raw_sdk_mbps` and `ckpt_sync_mbps` are medians
(MB = 10^6 bytes), and `ckpt_sync_vs_raw_ratio` is the median of the paired ratios sync/raw
(which cancels drifts in the host's load). Then (c) a second sync with nothing changed: the
files it uploaded (`ckpt_resync_files`) and the PUT/POST requests the server saw
(`ckpt_resync_puts`), read from S3's server access log of the bucket (PutBucketLogging: moto
writes one log object per request); a sync after touching one file shows that the log counts.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _common import REPO, bench_home, cpus, figure, info, median, result

sys.path.insert(0, str(REPO))

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.checkpoints import Checkpoints

MiB = 1024 * 1024
BUCKET = "ct-bench-ckpt"
LOGS = "ct-bench-ckpt-logs"
RUN = "bench-run"
TARGET_RATIO = 0.8
REQUEST_RE = re.compile(r" (GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.1 ")


class Chief(Checkpoints):
    """The state the mixin reads, as the node agent sets it (a fresh sync state)."""

    def __init__(self, store: Any, work: Path) -> None:
        self.store, self.run_id, self.me = store, RUN, "chief-0"
        self.ckpt_dir = work / "checkpoints"
        self.model_dir = work / "model"
        self.tb_dir = work / "tensorboard"
        self._synced = {}


def make_folder(root: Path, large: int, large_mb: int, small: int) -> int:
    """Write the checkpoint folder (random bytes); returns its total size in bytes."""
    rng = random.Random(18)
    root.mkdir(parents=True)
    block = os.urandom(MiB)
    for i in range(large):  # distinct content per MiB, cheap to make
        with (root / f"ckpt-7.data-{i:05d}-of-{large:05d}").open("wb") as out:
            for _ in range(large_mb):
                out.write(os.urandom(16) + block[16:])
    for i in range(small):
        name = "checkpoint" if i == 0 else f"ckpt-{i % 8}.index" if i < 9 else f"meta/{i:03d}.json"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(rng.randint(1024, 256 * 1024)))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def serve() -> int:
    """The server process: start moto, print its URL, serve until stdin closes."""
    from tests.fakes.moto_server import start_moto

    server = start_moto()
    print(server.url, flush=True)
    sys.stdin.read()
    server.stop()
    return 0


def raw_upload(s3: Any, folder: Path, prefix: str) -> float:
    """Seconds for boto3 `upload_file` of every file of `folder`, one after the other."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    t0 = time.perf_counter()
    for path in files:
        s3.upload_file(str(path), BUCKET, f"{prefix}{path.relative_to(folder).as_posix()}")
    return time.perf_counter() - t0


def synced(store: Any, work: Path) -> tuple[float, int, Chief]:
    """Seconds and files uploaded by a first `sync_checkpoints()` of the folder in `work`."""
    chief = Chief(store, work)
    t0 = time.perf_counter()
    n = chief.sync_checkpoints()
    return time.perf_counter() - t0, n, chief


def check_bucket(s3: Any, folder: Path, prefix: str) -> None:
    """Every file of `folder` is under `prefix`, at its size (else SystemExit)."""
    want = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*")}
    want = {k: v for k, v in want.items() if not (folder / k).is_dir()}
    have: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        have.update({o["Key"][len(prefix) :]: o["Size"] for o in page.get("Contents", [])})
    if have != want:
        raise SystemExit(f"{prefix}: the bucket holds {len(have)} objects, not the folder's")


def start_logging(s3: Any) -> None:
    """Turn on the bucket's server access log (into LOGS)."""
    s3.create_bucket(Bucket=LOGS)
    delivery = 'uri="http://acs.amazonaws.com/groups/s3/LogDelivery"'
    s3.put_bucket_acl(Bucket=LOGS, GrantWrite=delivery, GrantReadACP=delivery)
    s3.put_bucket_logging(
        Bucket=BUCKET,
        BucketLoggingStatus={"LoggingEnabled": {"TargetBucket": LOGS, "TargetPrefix": "s3/"}},
    )


def logged(s3: Any, seen: set[str]) -> list[str]:
    """'METHOD /bucket/key' of the requests logged since the last call (`seen`: log keys)."""
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=LOGS):
        keys += [o["Key"] for o in page.get("Contents", []) if o["Key"] not in seen]
    seen.update(keys)
    out = []
    for key in keys:
        found = REQUEST_RE.search(s3.get_object(Bucket=LOGS, Key=key)["Body"].read().decode())
        if found:
            out.append(" ".join(found.groups()))
    return out


def writes(requests: list[str]) -> int:
    return sum(r.split(" ")[0] in ("PUT", "POST") for r in requests)


def bench(url: str, tmp: Path, args: argparse.Namespace) -> bool:
    import boto3

    from cloudtrain.providers import open_store
    from tests.fakes.moto_server import MotoServer, clear_aws_caches, use_moto

    with pytest.MonkeyPatch.context() as mp:
        use_moto(mp, MotoServer(server=None, url=url))
        clear_aws_caches()
        s3 = boto3.client("s3", region_name="us-east-1")
        store = open_store(f"s3://{BUCKET}/team")
        store.ensure_bucket()
        work = tmp / "work"
        total = make_folder(work / "checkpoints", args.large, args.large_mb, args.small)
        mb = total / 1e6
        info(
            f"folder: {args.large} x {args.large_mb} MiB .data + {args.small} small files, "
            f"{mb:.0f} MB; moto in its own process; {cpus()} CPU(s)"
        )
        for _ in range(args.warmup):  # clients, connections; then every round overwrites
            raw_upload(s3, work / "checkpoints", "raw/")
            synced(store, work)
        raw_s, sync_s, ratios = [], [], []
        cpu: dict[str, list[float]] = {"raw": [], "sync": []}
        for i in range(args.rounds):
            order = ("raw", "sync") if i % 2 == 0 else ("sync", "raw")
            pair: dict[str, float] = {}
            for which in order:
                cpu0 = time.process_time()
                if which == "raw":
                    pair["raw"] = raw_upload(s3, work / "checkpoints", "raw/")
                else:
                    pair["sync"], n, chief = synced(store, work)
                    if n != args.large + args.small:
                        raise SystemExit(f"sync uploaded {n} files, not {args.large + args.small}")
                cpu[which].append(time.process_time() - cpu0)
            raw_s.append(pair["raw"])
            sync_s.append(pair["sync"])
            ratios.append(pair["raw"] / pair["sync"])  # sync MB/s over raw MB/s
            info(
                f"round {i + 1} ({' then '.join(order)}): raw {mb / pair['raw']:.0f} MB/s, "
                f"sync {mb / pair['sync']:.0f} MB/s, ratio {ratios[-1]:.2f}"
            )
        info(
            f"client CPU s (user+sys, the server's not counted): raw {median(cpu['raw']):.2f}, "
            f"sync {median(cpu['sync']):.2f}"
        )
        check_bucket(s3, work / "checkpoints", "raw/")
        check_bucket(s3, work / "checkpoints", "team/" + proto.checkpoints_prefix(RUN))

        start_logging(s3)  # the last round's chief syncs again: nothing changed
        seen: set[str] = set()
        again = chief.sync_checkpoints()
        resync = logged(s3, seen)
        touched = min((p for p in work.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        touched.write_bytes(touched.read_bytes() + b"+")
        changed = chief.sync_checkpoints()
        after_change = logged(s3, seen)
        info(
            f"second sync, nothing changed: {again} files uploaded, {len(resync)} requests "
            f"({writes(resync)} PUT/POST); {touched.name} changed: {changed} uploaded, "
            f"{writes(after_change)} PUT/POST"
        )
        if changed < 1 or writes(after_change) < changed:
            raise SystemExit("the access log did not see the changed file's upload")

    figure("ckpt_raw_sdk_mbps", mb / median(raw_s), n=len(raw_s))
    figure("ckpt_sync_mbps", mb / median(sync_s), n=len(sync_s))
    ok = result("ckpt_sync_vs_raw_ratio", median(ratios), TARGET_RATIO, op=">=", n=len(ratios))
    ok &= result("ckpt_resync_files", again, 0, op="==", stat="value")
    ok &= result("ckpt_resync_puts", writes(resync), 0, op="==", stat="value")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=3, help=".data files (default 3)")
    parser.add_argument("--large-mb", type=int, default=100, help="MiB each (default 100)")
    parser.add_argument("--small", type=int, default=48, help="small files (default 48)")
    parser.add_argument("--rounds", type=int, default=3, help="raw/sync pairs (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs (default 1)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve()
    with bench_home("ckpt_sync") as tmp:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            if not url.startswith("http"):
                raise SystemExit("the moto server did not start")
            ok = bench(url, tmp, args)
        finally:
            assert server.stdin is not None
            server.stdin.close()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
