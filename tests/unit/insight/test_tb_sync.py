"""`cloudtrain tensorboard RUN` (cloudtrain/insight/tb_sync.py, cloudtrain/cli/tensorboard.py): a
run's TensorBoard event files, written by a real fit through `runtime.callbacks()`, mirrored from a
real store into the local cache, incrementally and refusing keys that would leave it; then
served by a real TensorBoard whose scalars API must answer the fit's epoch losses, while the run
is live and after it ended.

The sync against S3 (moto's server, the real boto3 and S3Store); the served run on the local
provider's bucket. One fit (one TensorFlow import, in a subprocess) and one TensorBoard start in
the file. Controller-side (the CLI needs Python 3.11): not among the node-side tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.moto_server import moto_server, moto_server_session

__all__ = ["moto_server", "moto_server_session"]  # fixtures used below

RUN = "tboard-0a1b2c"
READY_S = 180.0  # a deadline for TensorBoard's answers, not a wait


@dataclass(frozen=True)
class Events:
    """The event files of a real fit through `runtime.callbacks()`: train/ and validation/ run
    folders, `epoch_loss` per 0-based epoch (Keras' TensorBoard layout). `train_early` is the
    train file after the first two epochs; `train` is the same file (same name) grown by the
    third. `train_losses`/`valid_losses`: the fit's history, what TensorBoard must answer."""

    train_name: str
    train_early: bytes
    train: bytes
    valid_name: str
    valid: bytes
    train_losses: list[float]
    valid_losses: list[float]


# A node's training: the runtime's callbacks, TensorFlow without the tensorboard package.
FIT = r"""
import json, os, shutil, sys
sys.modules["tensorboard"] = None  # the nodes do not have it
from cloudtrain.jobs import runtime  # before TensorFlow: tf.keras is tf-keras
import numpy as np
import tensorflow as tf

out = sys.argv[1]
os.environ.update(
    CLOUDTRAIN_TENSORBOARD_DIR=os.path.join(out, "tb"),
    CLOUDTRAIN_CHECKPOINT_DIR=os.path.join(out, "ckpt"),
)


class Snapshot(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):  # after the runtime's writer flushed epoch 2
        if epoch == 1:
            shutil.copytree(os.path.join(out, "tb", "train"), os.path.join(out, "early"))


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
with runtime.strategy().scope():
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
history = model.fit(
    data,
    epochs=3,
    validation_data=data,
    callbacks=[*runtime.callbacks(3, batch_size=32), Snapshot()],
    verbose=0,
)
print("HISTORY " + json.dumps(history.history), flush=True)
"""


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Events:
    pytest.importorskip("tensorflow")
    out = tmp_path_factory.mktemp("fit")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDTRAIN_")}
    proc = subprocess.run(
        [sys.executable, "-c", FIT, str(out)],
        env=env,
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("HISTORY ")]
    history = json.loads(line.split(" ", 1)[1])
    (early,) = (out / "early").iterdir()
    (train,) = (out / "tb" / "train").iterdir()
    (valid,) = (out / "tb" / "validation").iterdir()
    assert early.name == train.name and "tfevents" in train.name
    found = Events(
        train.name,
        early.read_bytes(),
        train.read_bytes(),
        valid.name,
        valid.read_bytes(),
        history["loss"],
        history["val_loss"],
    )
    assert len(found.train) > len(found.train_early) > 0
    assert len(found.train_losses) == len(found.valid_losses) == 3
    return found


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but the mirror's own (.cloudtrain-*), by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".cloudtrain-")
    }


def test_sync_is_incremental_and_refuses_keys_outside_the_cache(
    events: Events, moto_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from typer.testing import CliRunner

    from cloudtrain.cli.main import app
    from cloudtrain.insight.tb_sync import TbMirror, cache_dir
    from cloudtrain.jobs.protocol import tensorboard_prefix
    from cloudtrain.providers.aws.storage import S3Store
    from cloudtrain.state.ledger import Ledger

    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    store = S3Store("s3://ct-tb-test/team", "us-east-1")
    store.ensure_bucket()
    prefix = tensorboard_prefix(RUN)
    train_key = f"{prefix}train/{events.train_name}"
    valid_key = f"{prefix}validation/{events.valid_name}"
    store.put(train_key, events.train_early)
    store.put(valid_key, events.valid)
    store.put(f"{prefix}validation/", b"")  # a console's folder marker: neither file nor refused
    # what anyone who can write the bucket can write (S3Store itself refuses such keys)
    escape = tmp_path / "escaped"
    hostile = [
        f"{prefix}{escape}",
        f"{prefix}../../../../escaped",
        f"{prefix}.cloudtrain-sync.json",
    ]
    s3 = boto3.client("s3", region_name="us-east-1")
    for key in hostile:
        s3.put_object(Bucket="ct-tb-test", Key=f"team/{key}", Body=b"not yours")
    assert {o.key for o in store.list(prefix)} >= set(hostile)

    cache = cache_dir(RUN)
    first = TbMirror(store, RUN).sync()
    assert (first.downloaded, first.unchanged, first.deleted) == (2, 0, 0)
    assert sorted(first.refused) == sorted(hostile) and not first.failed
    assert first.event_files == 2
    assert _tree(cache) == {
        f"train/{events.train_name}": events.train_early,
        f"validation/{events.valid_name}": events.valid,
    }
    assert not escape.exists() and not (home / "escaped").exists()
    assert not list(tmp_path.rglob("escaped"))

    # a second `cloudtrain tensorboard` (a new mirror, the state file in the cache): nothing new
    again = TbMirror(store, RUN).sync()
    assert (again.downloaded, again.unchanged, again.deleted) == (0, 2, 0)

    store.put(train_key, events.train)  # the chief's agent mirrored the grown file
    grown = TbMirror(store, RUN).sync()
    assert (grown.downloaded, grown.unchanged, grown.bytes) == (1, 1, len(events.train))
    assert (cache / "train" / events.train_name).read_bytes() == events.train

    store.delete(valid_key)
    gone = TbMirror(store, RUN).sync()
    assert (gone.downloaded, gone.deleted, gone.event_files) == (0, 1, 1)
    assert _tree(cache) == {f"train/{events.train_name}": events.train}

    # the command line: the run's record names its provider and bucket; --once syncs and exits
    ledger = Ledger(home / "ledger.db")
    ledger.create_run(RUN, "tboard", "aws", "us-east-1", None, None, store.uri, None)
    result = CliRunner().invoke(app, ["tensorboard", RUN, "--once"])
    assert result.exit_code == 0, result.output
    assert "0 downloaded" in result.output and "1 unchanged" in result.output, result.output


def test_missing_tensorboard_is_a_usage_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cloudtrain.cli.tensorboard import tensorboard
    from cloudtrain.core.errors import UsageError

    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails
    with pytest.raises(UsageError, match=r"pip install 'cloudtrain\[tensorboard\]'"):
        tensorboard(RUN)  # before the run is looked up (this home has none)


class Lines:
    """A process's output lines, read by a thread, waited for with a deadline."""

    def __init__(self, stream: Any) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)  # the end

    def wait_for(self, text: str, deadline: float) -> str:
        for line in self.seen:
            if text in line:
                return line
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self._queue.put(None)  # still the end for the next wait
                raise AssertionError(f"no line with {text!r} in {self.seen}")
            self.seen.append(line)
            if text in line:
                return line


def _losses(url: str, run: str) -> list[float]:
    query = urllib.parse.urlencode({"run": run, "tag": "epoch_loss"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}data/plugin/scalars/scalars?{query}", timeout=10) as resp:
            rows = json.loads(resp.read())
    except OSError:  # not loaded yet (TensorBoard answers 400 for a run it has not read)
        return []
    assert [row[1] for row in rows] == list(range(len(rows)))  # steps: 0-based epochs
    return [row[2] for row in rows]


def _until(url: str, run: str, want: list[float], deadline: float) -> None:
    seen: list[float] = []
    while time.monotonic() < deadline:
        seen = _losses(url, run)
        if seen == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"TensorBoard's {run} epoch_loss: {seen}, expected {want}")


def _processes_with(text: str) -> list[int]:
    """The pids whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Started commands, killed if a test leaves one running, and so is any TensorBoard
    serving a folder of `tmp_path` (a broken `cloudtrain tensorboard` leaks none)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in _processes_with(f"--logdir={tmp_path}"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_serves_the_scalars_of_a_live_run_then_of_the_ended_run_until_sigterm(
    events: Events, tmp_path: Path, serving: list[subprocess.Popen[str]]
) -> None:
    pytest.importorskip("tensorboard")
    from cloudtrain.jobs.protocol import tensorboard_prefix
    from cloudtrain.providers.local import LocalStore
    from cloudtrain.state.ledger import Ledger

    home = tmp_path / "home"
    bucket = LocalStore((home / "buckets" / "local").as_uri())
    bucket.ensure_bucket()
    ledger = Ledger(home / "ledger.db")
    ledger.create_run(RUN, "tboard", "local", None, None, None, bucket.uri, None)
    ledger.set_status(RUN, "running")
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200")
    env.pop("CLOUDTRAIN_FAULTS", None)
    cmd = [sys.executable, "-m", "cloudtrain.cli.main", "tensorboard", RUN, "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--every", "0.5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    serving.append(proc)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    deadline = time.monotonic() + READY_S
    err.wait_for("no event files yet", deadline)  # a live run: it says so, and waits
    shown = re.search(r"http://127\.0\.0\.1:[0-9]+/", out.wait_for("http://", deadline))
    assert shown is not None, out.seen
    url = shown.group(0)

    prefix = tensorboard_prefix(RUN)
    bucket.put(f"{prefix}train/{events.train_name}", events.train_early)
    _until(url, "train", events.train_losses[:2], deadline)
    bucket.put(f"{prefix}train/{events.train_name}", events.train)  # grown, renamed into place
    bucket.put(f"{prefix}validation/{events.valid_name}", events.valid)
    _until(url, "train", events.train_losses, deadline)
    _until(url, "validation", events.valid_losses, deadline)

    ledger.set_status(RUN, "done", "succeeded")
    err.wait_for(f"run {RUN} is done", deadline)
    assert _losses(url, "train") == events.train_losses  # still serving
    cache = str(home / "runs" / RUN / "tensorboard")
    board = _processes_with(f"--logdir={cache}")
    assert len(board) == 1, board  # TensorBoard, as our child

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, err.seen
    err.wait_for("stopped by SIGTERM", deadline)
    assert not _processes_with(f"--logdir={cache}")  # no TensorBoard left behind
    assert not Path(f"/proc/{board[0]}").exists()
