"""runtime.callbacks() measures the training (issue 18): METRICS records in the metrics file, a
stop after CLOUDTRAIN_MAX_STEPS, TensorBoard scalars that TensorBoard itself reads back, and
nothing of it without the env vars.

One subprocess runs every scenario with real tf-keras fits, with the tensorboard package made
unimportable (the nodes do not have it; TF 2.21 no longer brings it). The tests read what it left.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DRIVER = r"""
import json, os, sys
sys.modules["tensorboard"] = None  # what a node without the tensorboard package sees
try:
    import tensorboard  # noqa: F401
    sys.exit("the tensorboard blocker does not work")
except ImportError:
    pass
from cloudtrain.jobs import runtime
import numpy as np
import tensorflow as tf

out = sys.argv[1]
os.chdir(out)  # where ./tensorboard would go
strategy = runtime.strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = rng.integers(0, 4, size=256)


def fit(name, epochs, validation=False, batch_size=32, **env):
    for key in ("CLOUDTRAIN_METRICS_FILE", "CLOUDTRAIN_TENSORBOARD_DIR", "CLOUDTRAIN_MAX_STEPS"):
        os.environ.pop(key, None)
    os.environ.update(env, CLOUDTRAIN_CHECKPOINT_DIR=os.path.join(out, "ckpt-" + name))
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(4)])
        model.compile(
            optimizer="adam",
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # 8 steps per epoch
    history = model.fit(
        data,
        epochs=epochs,
        validation_data=data.take(2) if validation else None,
        callbacks=runtime.callbacks(epochs, batch_size=batch_size),
        verbose=0,
    )
    print("HISTORY " + name + " " + json.dumps(history.history), flush=True)


runtime.WINDOW_SECONDS = 0.0  # a window record after every step
fit(
    "metered",
    2,
    validation=True,
    CLOUDTRAIN_METRICS_FILE=os.path.join(out, "metrics", "metered.jsonl"),
    CLOUDTRAIN_TENSORBOARD_DIR=os.path.join(out, "tb"),
)
runtime.WINDOW_SECONDS = 2.0
fit(
    "capped",
    2,
    CLOUDTRAIN_METRICS_FILE=os.path.join(out, "metrics", "capped.jsonl"),
    CLOUDTRAIN_TENSORBOARD_DIR=os.path.join(out, "tb-capped"),
    CLOUDTRAIN_MAX_STEPS="3",
)
os.chdir(os.path.join(out, "quiet"))
fit("quiet", 1)
os.environ.update(CLOUDTRAIN_IS_CHIEF="0", CLOUDTRAIN_ROLE="worker", CLOUDTRAIN_INDEX="2")
fit(
    "worker",
    1,
    batch_size=None,  # a script that does not say its batch size: steps only
    CLOUDTRAIN_METRICS_FILE=os.path.join(out, "metrics", "worker.jsonl"),
    CLOUDTRAIN_TENSORBOARD_DIR=os.path.join(out, "tb-worker"),
)
folder = runtime.tensorboard_dir()
files = sorted(
    os.path.relpath(os.path.join(d, f), folder)
    for d, _, fs in os.walk(folder) for f in fs
)
print("WORKER " + json.dumps({"dir": folder, "files": files}), flush=True)
for key in ("CLOUDTRAIN_IS_CHIEF", "CLOUDTRAIN_ROLE", "CLOUDTRAIN_INDEX"):
    os.environ.pop(key)
workers = {}
for name, config, extra in (
    ("mwms", {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, {}),
    ("ps", {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, {}),
    ("horovod", {}, {"CLOUDTRAIN_STRATEGY": "horovod", "HOROVOD_SIZE": "4",
                     "HOROVOD_CROSS_SIZE": "2"}),
):
    os.environ.update(TF_CONFIG=json.dumps({"cluster": config}), **extra)
    workers[name] = runtime.data_parallel_workers()
print("WORKERS " + json.dumps(workers), flush=True)
print("TENSORBOARD " + repr(sys.modules.get("tensorboard")), flush=True)

# read the event files back the way TensorBoard's scalars dashboard does (TF is loaded already)
del sys.modules["tensorboard"]
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.compat.proto.summary_pb2 import DataClass
from tensorboard.util.tensor_util import make_ndarray

scalars = {}
for folder in ("train", "validation"):
    events = EventAccumulator(os.path.join(out, "tb", folder))
    if os.path.isdir(os.path.join(out, "tb", folder)):
        events.Reload()
    scalars[folder] = {
        tag: {
            "plugin": events.SummaryMetadata(tag).plugin_data.plugin_name,
            "data_class": DataClass.Name(events.SummaryMetadata(tag).data_class),
            "points": [[e.step, make_ndarray(e.tensor_proto).item()] for e in events.Tensors(tag)],
        }
        for tag in events.Tags()["tensors"]
    }
print("SCALARS " + json.dumps(scalars), flush=True)
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the driver once; return its folder, stdout lines and tagged outputs."""
    out = tmp_path_factory.mktemp("runtime-metrics")
    (out / "quiet").mkdir()
    script = out / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDTRAIN_", "HOROVOD_"))}
    env.pop("TF_CONFIG", None)
    env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    tagged: dict[str, Any] = {}
    for line in lines:
        tag, _, rest = line.partition(" ")
        if tag == "HISTORY":
            name, _, payload = rest.partition(" ")
            tagged[f"history-{name}"] = json.loads(payload)
        elif tag in ("WORKER", "WORKERS", "SCALARS"):
            tagged[tag.lower()] = json.loads(rest)
        elif tag == "TENSORBOARD":
            tagged["tensorboard"] = rest
    return {"out": out, "lines": lines, **tagged}


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a metrics file (each one whole, newline-terminated)."""
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def assert_rates(record: dict[str, Any], steps: int) -> None:
    """The rate fields agree with the counts and the seconds they were computed from."""
    assert record["steps"] == steps
    assert record["examples"] == steps * 32  # one process: its share is the global batch
    assert record["seconds"] > 0
    assert math.isclose(record["examples_per_s"], record["examples"] / record["seconds"])
    assert math.isclose(record["steps_per_s"], steps / record["seconds"])
    assert 0 < record["step_p50_s"] <= record["step_p95_s"]
    assert record["source"] == "runtime"
    assert (record["global_batch"], record["workers"]) == (32, 1)
    assert record["steps_per_epoch"] == 8
    assert isinstance(record["time"], float)


def test_epoch_and_window_records(run: dict[str, Any]) -> None:
    rows = records(run["out"] / "metrics" / "metered.jsonl")
    # the fit's first step's end first, its last step's last (the run's trace)
    first, *rows, end = rows
    assert first["kind"] == "first_step" and end["kind"] == "train_end"
    assert first["time"] <= end["last_step_time"] <= end["time"] and end["steps"] == 16
    epochs = [row for row in rows if row["kind"] == "epoch"]
    windows = [row for row in rows if row["kind"] == "window"]
    assert len(epochs) + len(windows) == len(rows)
    history = run["history-metered"]
    assert [row["epoch"] for row in epochs] == [1, 2]
    for number, row in enumerate(epochs):
        assert_rates(row, 8)
        assert (row["epochs"], row["partial"]) == (2, False)
        assert row["train_seconds"] <= row["seconds"]
        assert math.isclose(row["loss"], history["loss"][number], rel_tol=1e-6)
        assert set(row["metrics"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
        for name, value in row["metrics"].items():
            assert math.isclose(value, history[name][number], rel_tol=1e-6)
    # WINDOW_SECONDS=0: one window per step, except the fit's first (its tf.function tracing)
    assert [(row["epoch"], row["step"]) for row in windows] == [
        *((1, step) for step in range(2, 9)),
        *((2, step) for step in range(1, 9)),
    ]
    for row in windows:
        assert_rates(row, 1)
        assert row["epochs"] == 2


def test_max_steps_stops_fit_and_writes_a_last_window(run: dict[str, Any]) -> None:
    assert "cloudtrain: stopped after 3 steps (CLOUDTRAIN_MAX_STEPS)" in run["lines"]
    assert len(run["history-capped"]["loss"]) == 1  # the second epoch never ran
    rows = records(run["out"] / "metrics" / "capped.jsonl")
    windows = [row for row in rows if row["kind"] == "window"]
    assert windows and windows[-1]["step"] == 3
    assert sum(row["steps"] for row in windows) == 2  # steps 2 and 3: the first one traces
    for row in windows:
        assert_rates(row, row["steps"])
    (epoch,) = [row for row in rows if row["kind"] == "epoch"]
    assert_rates(epoch, 3)
    assert epoch["partial"] is True


def test_scalars_are_what_tensorboard_reads(run: dict[str, Any]) -> None:
    assert run["tensorboard"] == "None"  # the training ran without the tensorboard package
    rows = records(run["out"] / "metrics" / "metered.jsonl")
    metrics = [row["metrics"] for row in rows if row["kind"] == "epoch"]
    for folder, prefix in (("train", ""), ("validation", "val_")):
        tags = run["scalars"][folder]
        assert set(tags) == {"epoch_loss", "epoch_accuracy"}
        for tag, read in tags.items():
            assert (read["plugin"], read["data_class"]) == ("scalars", "DATA_CLASS_SCALAR")
            assert [step for step, _ in read["points"]] == [0, 1]  # the 0-based epoch
            for (_, value), values in zip(read["points"], metrics, strict=True):
                assert math.isclose(value, values[prefix + tag[6:]], rel_tol=1e-6)


def test_nothing_measured_without_the_env_vars(run: dict[str, Any]) -> None:
    out = run["out"]
    jsonl = sorted(path.relative_to(out).as_posix() for path in out.rglob("*.jsonl"))
    assert jsonl == ["metrics/capped.jsonl", "metrics/metered.jsonl", "metrics/worker.jsonl"]
    # outside cloudtrain the scalars go to ./tensorboard, like checkpoints to ./checkpoints
    quiet = {path.relative_to(out / "quiet").parts[0] for path in (out / "quiet").rglob("*")}
    assert quiet == {"tensorboard"}
    # and the runtime printed nothing but its progress and MAX_STEPS lines
    ours = [line for line in run["lines"] if line.startswith("cloudtrain:")]
    assert ours and all(" done loss=" in line or "stopped after" in line for line in ours)


def test_without_a_batch_size_only_steps_are_counted(run: dict[str, Any]) -> None:
    _first, row, _end = records(run["out"] / "metrics" / "worker.jsonl")
    assert row["kind"] == "epoch"
    assert (row["steps"], row["global_batch"], row["workers"]) == (8, None, 1)
    assert row["examples"] is None and row["examples_per_s"] is None
    assert math.isclose(row["steps_per_s"], 8 / row["seconds"])


def test_non_chief_writes_a_throwaway_workertemp_folder(run: dict[str, Any]) -> None:
    worker = run["worker"]
    assert Path(worker["dir"]).name == "workertemp_2"
    assert any(name.startswith("train/events.out.tfevents.") for name in worker["files"])
    assert not Path(worker["dir"]).exists()  # removed when the training exited
    assert not (run["out"] / "tb-worker").exists()


def test_examples_are_shared_among_data_parallel_workers(run: dict[str, Any]) -> None:
    assert run["workers"] == {"mwms": 3, "ps": 1, "horovod": 2}  # nodes, not ranks


def test_only_a_nodes_local_rank_0_reports_under_horovod(monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.jobs import runtime

    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "1")
    assert not runtime._reports()  # its ranks step together: rank 0 speaks for the node
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
    assert runtime._reports()
    monkeypatch.delenv("HOROVOD_LOCAL_RANK")
    assert runtime._reports()
