"""The chief's mirrors (jobs/checkpoints.py) against moto's S3 server, through the store a node
opens (`open_store`: the real S3Store inside the retry layer).

What the server saw is read from S3's own server access log: the bucket logs every request it
gets into a log bucket (PutBucketLogging; moto writes one log object per request, naming its
method and path), so "nothing was uploaded" is counted at the server, not in our code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.checkpoints import SMALL_FILE, Checkpoints
from tests.fakes.moto_server import moto_server, moto_server_session

pytest.importorskip("boto3")

__all__ = ["moto_server", "moto_server_session"]  # fixtures used by this module

pytestmark = pytest.mark.usefixtures("moto_server")

BUCKET = "ct-ckpt-sync"
LOGS = "ct-ckpt-sync-logs"
RUN = "r-ckpt"
REQUEST_RE = re.compile(r" (GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.1 ")


class Chief(Checkpoints):
    """The state the mixin reads, as the agent sets it (the chief of run RUN in `work`)."""

    def __init__(self, store: Any, work: Path) -> None:
        self.store, self.run_id, self.me = store, RUN, "chief-0"
        self.ckpt_dir = work / "checkpoints"
        self.model_dir = work / "model"
        self.tb_dir = work / "tensorboard"
        self._synced = {}


class AccessLog:
    """The requests the server got for BUCKET, from its server access log (read with a plain
    boto3 client: the test's own view)."""

    def __init__(self) -> None:
        import boto3

        self.s3 = boto3.client("s3", region_name="us-east-1")
        self.s3.create_bucket(Bucket=LOGS)
        delivery = 'uri="http://acs.amazonaws.com/groups/s3/LogDelivery"'  # S3's log writer
        self.s3.put_bucket_acl(Bucket=LOGS, GrantWrite=delivery, GrantReadACP=delivery)
        self.s3.put_bucket_logging(
            Bucket=BUCKET,
            BucketLoggingStatus={"LoggingEnabled": {"TargetBucket": LOGS, "TargetPrefix": "s3/"}},
        )
        self.seen: set[str] = set()

    def new(self) -> list[str]:
        """'METHOD /bucket/key' of each request logged since the last call."""
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=LOGS):
            keys += [o["Key"] for o in page.get("Contents", []) if o["Key"] not in self.seen]
        self.seen.update(keys)
        lines = [self.s3.get_object(Bucket=LOGS, Key=k)["Body"].read().decode() for k in keys]
        return [" ".join(REQUEST_RE.search(line).groups()) for line in lines]  # type: ignore[union-attr]

    def writes(self) -> list[str]:
        """The keys of the PUT and POST requests since the last call (uploads and their parts)."""
        return sorted(r.split(" ", 1)[1] for r in self.new() if r.split(" ")[0] in ("PUT", "POST"))


@pytest.fixture
def chief(tmp_path: Path) -> Chief:
    from cloudtrain.providers import open_store

    store = open_store(f"s3://{BUCKET}/team")
    store.ensure_bucket()
    return Chief(store, tmp_path)


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def bucket(chief: Chief, prefix: str) -> dict[str, bytes]:
    store = chief.store
    return {o.key[len(prefix) :]: store.get(o.key) for o in store.list(prefix)}


def local(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_unchanged_files_are_not_uploaded_again_changed_ones_are_and_deletions_follow(
    chief: Chief,
) -> None:
    log, prefix = AccessLog(), proto.checkpoints_prefix(RUN)
    ckpt = chief.ckpt_dir
    assert chief.sync_checkpoints() == 0  # no folder yet
    write(ckpt, {"checkpoint": b"ckpt-1", "ckpt-1.index": b"i1", "ckpt-1.data-0-of-1": b"d1"})
    assert chief.sync_checkpoints() == 3
    assert len(log.writes()) == 3  # the log sees our uploads: its silence below means something

    assert chief.sync_checkpoints() == 0
    assert log.new() == []  # nothing changed: not one request, let alone a PUT

    (ckpt / "ckpt-1.index").write_bytes(b"i1 grown")  # changed
    (ckpt / "ckpt-1.data-0-of-1").unlink()  # deleted
    assert chief.sync_checkpoints() == 1
    seen = log.new()
    assert sorted(seen) == [
        f"DELETE /{BUCKET}/team/{prefix}ckpt-1.data-0-of-1",
        f"PUT /{BUCKET}/team/{prefix}ckpt-1.index",
    ]
    assert bucket(chief, prefix) == {"checkpoint": b"ckpt-1", "ckpt-1.index": b"i1 grown"}
    assert chief.sync_checkpoints() == 0
    assert log.writes() == []


def test_many_files_go_up_in_parallel_whole_and_come_back_on_restore(
    chief: Chief, tmp_path: Path
) -> None:
    files = {f"sub{i % 3}/ckpt-{i}.index": os.urandom(100 + i) for i in range(40)}
    files["checkpoint"] = b'model_checkpoint_path: "ckpt-39"\n'
    files["ckpt-39.data-00000-of-00001"] = os.urandom(SMALL_FILE + 1)  # put_file: multipart
    write(chief.ckpt_dir, files)
    assert chief.sync_checkpoints() == len(files)
    assert bucket(chief, proto.checkpoints_prefix(RUN)) == files

    other = Chief(chief.store, tmp_path / "worker")
    write(other.ckpt_dir, {"stale": b"old"})
    assert other.restore_checkpoints() == len(files)
    assert local(other.ckpt_dir) == files
    assert other.sync_checkpoints() == 0  # what was restored counts as synced


def test_sync_tensorboard_mirrors_a_growing_event_file_apart_from_the_checkpoints(
    chief: Chief,
) -> None:
    log, prefix = AccessLog(), proto.tensorboard_prefix(RUN)
    assert chief.sync_tensorboard() == 0  # the training has written nothing yet
    event = chief.tb_dir / "train" / "events.out.tfevents.1.host"
    write(chief.tb_dir, {"train/events.out.tfevents.1.host": b"\x01" * 50})
    assert chief.sync_tensorboard() == 1
    with event.open("ab") as out:
        out.write(b"\x02" * 30)
    assert chief.sync_tensorboard() == 1
    assert bucket(chief, prefix) == {
        "train/events.out.tfevents.1.host": b"\x01" * 50 + b"\x02" * 30
    }
    assert len(log.writes()) == 2
    assert chief.sync_tensorboard() == 0
    assert log.writes() == []
    assert chief._synced == {}  # the checkpoints' map is the checkpoints' own
    assert chief.sync_checkpoints() == 0
