"""The node's metrics stream (jobs/metrics.py) and the agent's use of it: the training's metrics
file tailed by offset, the chunks and their sequence, the /proc sampler on a real busy process
tree, nvidia-smi (tests/fakes/nvidia_smi on PATH), Keras' progress lines (real tf-keras output:
tests/fixtures/keras/tf_keras_progress.log) and, through a real agent on a real LocalStore, the
heartbeat's figures and the stream and TensorBoard folder in the bucket. No TensorFlow here."""

# ruff: noqa: F811 - the fixtures (`store`, `work`...) are agent_kit's, taken by name

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs.agent import Agent
from cloudtrain.jobs.metrics import KerasProgress, MetricsPump
from cloudtrain.jobs.protocol import HEARTBEAT_METRICS, metrics_chunk_key
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (
    HANG_S,
    PREFIX,
    RUN_ID,
    AgentThread,
    base_cluster,
    child_groups,  # noqa: F401 - an autouse fixture: imported, it applies here
    get_json,
    node_env,  # noqa: F401 - an autouse fixture: imported, it applies here
    put_json,
    run_in_thread,  # noqa: F401 - a fixture, taken by name
    status_of,
    store,  # noqa: F401 - a fixture, taken by name
    wait_for,
    work,  # noqa: F401 - a fixture, taken by name
)

ROOT = Path(__file__).resolve().parents[3]
KERAS_LOG = ROOT / "tests" / "fixtures" / "keras" / "tf_keras_progress.log"
SHIM = ROOT / "tests" / "fakes" / "nvidia_smi"


def stream(store: LocalStore, node: str = "chief-0") -> list[dict[str, Any]]:
    """Every record of the node's metrics stream, in chunk order."""
    chunks = store.list(f"{PREFIX}metrics/{node}/")
    return [json.loads(line) for o in chunks for line in store.get(o.key).decode().splitlines()]


def keras_lines() -> list[str]:
    """The fixture's lines as the agent's output pump reads them: split at \\n only (Keras'
    \\r updates stay inside a line)."""
    return KERAS_LOG.read_bytes().decode().split("\n")


@pytest.fixture
def gpu_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH folder holding the shim as `nvidia-smi`, first on PATH."""
    folder = tmp_path / "gpu-bin"
    folder.mkdir()
    (folder / "nvidia-smi").symlink_to(SHIM)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def test_tail_takes_whole_lines_into_ordered_chunks_and_a_restart_continues(
    store: LocalStore, tmp_path: Path
) -> None:
    path = tmp_path / "metrics" / "train.jsonl"
    pump = MetricsPump(store, RUN_ID, "worker-1", path)
    pump.new_attempt()
    assert pump.flush() == 0  # no file yet: no chunk
    epoch = {"time": 1.0, "kind": "epoch", "epoch": 1, "examples": 640, "loss": 0.5}
    with open(path, "a") as f:
        f.write(json.dumps(epoch) + "\nnot json\n" + '{"time": 2.0, "kind": "win')
    assert pump.flush() == 1  # the partial last line waits for its newline
    with open(path, "a") as f:
        f.write('dow", "epoch": 2, "step": 3}\n')
    assert pump.flush() == 1
    assert pump.flush() == 0  # nothing new: no empty chunk
    keys = [o.key for o in store.list(f"{PREFIX}metrics/worker-1/")]
    assert keys == [metrics_chunk_key(RUN_ID, "worker-1", seq) for seq in (0, 1)]
    assert stream(store, "worker-1") == [
        epoch,
        {"time": 2.0, "kind": "window", "epoch": 2, "step": 3},
    ]

    again = MetricsPump(store, RUN_ID, "worker-1", path)  # the agent restarted on the node
    with open(path, "a") as f:
        f.write(json.dumps({**epoch, "epoch": 2}) + "\n")
    assert again.flush() == 1  # only the new line: what the file held was read before
    assert store.list(metrics_chunk_key(RUN_ID, "worker-1", 2))
    assert [r["epoch"] for r in stream(store, "worker-1")] == [1, 2, 2]


def test_process_sampler_sees_a_busy_descendant(store: LocalStore, tmp_path: Path) -> None:
    # bash (no group leader here) waits, idle: only the walk to its child finds the busy one
    busy = f"'{sys.executable}' -c 'while True: pass' & wait"
    # its own session, so the busy child dies with it (a kill of bash alone left it spinning)
    proc = subprocess.Popen(["bash", "-c", busy], start_new_session=True)
    pump = MetricsPump(store, RUN_ID, "chief-0", tmp_path / "train.jsonl")
    try:

        def busy_seen() -> bool:
            pump.sample(proc.pid)
            return pump.summary().get("cpu_percent", 0) > 0

        assert wait_for(busy_seen)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    figures = pump.summary()
    assert figures["rss_bytes"] > 0
    pump.flush()
    records = stream(store)
    assert {r["kind"] for r in records} == {"process"}  # no nvidia-smi on this PATH
    assert records[0]["cpu_percent"] is None  # the first sample has nothing to compare with
    assert records[-1]["processes"] >= 2


def test_gpu_samples_come_from_nvidia_smi_on_path(
    store: LocalStore, tmp_path: Path, gpu_path: Path
) -> None:
    pump = MetricsPump(store, RUN_ID, "chief-0", tmp_path / "train.jsonl")
    pump.sample(os.getpid(), now=5.0)
    assert pump.summary()["gpu_util_percent"] == 50.0  # the mean of the shim's 40 and 60
    assert pump.summary()["gpu_mem_used_mib"] == 4000.0
    pump.flush()
    gpu = [r for r in stream(store) if r["kind"] == "gpu"]
    assert gpu == [
        {
            "time": 5.0,
            "kind": "gpu",
            "gpus": [
                {
                    "index": 0,
                    "util_percent": 40.0,
                    "mem_used_mib": 1000.0,
                    "mem_total_mib": 16384.0,
                },
                {
                    "index": 1,
                    "util_percent": 60.0,
                    "mem_used_mib": 3000.0,
                    "mem_total_mib": 16384.0,
                },
            ],
        }
    ]

    (gpu_path / "nvidia-smi").unlink()  # a broken driver: nvidia-smi fails
    (gpu_path / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (gpu_path / "nvidia-smi").chmod(0o755)
    said: list[str] = []
    broken = MetricsPump(store, RUN_ID, "worker-0", tmp_path / "w.jsonl", say=said.append)
    broken.sample(os.getpid())
    broken.sample(os.getpid())
    broken.flush()
    assert {r["kind"] for r in stream(store, "worker-0")} == {"process"}  # samples skipped
    assert len(said) == 1  # said once
    assert "nvidia-smi failed" in said[0]


def test_keras_progress_of_real_tf_keras_output() -> None:
    parser = KerasProgress()
    records = [r for r in (parser.feed(line, 7.0) for line in keras_lines()) if r]
    # fit(verbose=2, validation_split) then fit(verbose=1); evaluate's final line is no epoch
    assert [(r["epoch"], r["epochs"], r["steps"]) for r in records] == [
        (1, 2, 24),
        (2, 2, 24),
        (1, 2, 32),
        (2, 2, 32),
    ]
    first, third = records[0], records[2]
    assert first == {
        "time": 7.0,
        "kind": "epoch",
        "source": "keras-log",
        "epoch": 1,
        "epochs": 2,
        "steps": 24,
        "seconds": 0.711,  # verbose=2 prints the epoch's time: "711ms/epoch"
        "steps_per_s": pytest.approx(1 / 0.030),
        "step_p50_s": 0.030,
        "loss": 0.8744,
        "metrics": {"accuracy": 0.5039, "val_loss": 0.9044, "val_accuracy": 0.4336},
    }
    assert third["seconds"] == pytest.approx(32 * 0.013)  # verbose=1: steps x "13ms/step"
    assert third["step_p50_s"] == pytest.approx(0.013)
    assert (third["loss"], third["metrics"]) == (0.7751, {"accuracy": 0.4922})
    other_rank = KerasProgress()
    assert not [r for r in (other_rank.feed("[rank 1] " + x, 0) for x in keras_lines()) if r]
    rank_0 = KerasProgress()
    assert len([r for r in (rank_0.feed("[rank 0] " + x, 0) for x in keras_lines()) if r]) == 4


def test_keras_log_records_only_without_the_runtime_and_figures_per_attempt(
    store: LocalStore, tmp_path: Path
) -> None:
    path = tmp_path / "metrics" / "train.jsonl"
    pump = MetricsPump(store, RUN_ID, "chief-0", path, hold_s=10.0)
    pump.new_attempt()
    for line in keras_lines():
        pump.log_line(line, now=100.0)
    assert pump.flush(now=105.0) == 0  # held: the runtime's records may still come
    assert pump.flush(now=110.0) == 4
    figures = pump.summary()
    assert figures["source"] == "keras-log"
    assert figures["losses"] == [0.8744, 0.8175, 0.7751, 0.7195]
    assert figures["loss"] == 0.7195
    assert figures["steps_per_epoch"] == 32
    assert figures["step_p50_s"] == pytest.approx(0.013)
    assert figures["epoch_seconds"] == pytest.approx(0.416)
    assert "examples_per_s" not in figures  # the batch size is unknown from outside
    assert set(figures) <= set(HEARTBEAT_METRICS)

    pump.new_attempt()  # a new training process: its figures start again
    assert pump.summary() == {}
    window = {"time": 200.0, "kind": "window", "epoch": 2, "step": 5, "examples_per_s": 800.0}
    window.update(steps_per_s=25.0, step_p50_s=0.04, step_p95_s=0.05)
    window.update(steps_per_epoch=10, global_batch=64, workers=2)
    epoch = {"time": 150.0, "kind": "epoch", "source": "runtime", "epoch": 1, "examples": 320}
    epoch.update(seconds=0.5, examples_per_s=640.0, steps_per_s=20.0, loss=0.9, global_batch=64)
    for line in keras_lines():  # the runtime writes too: Keras' lines must not count twice
        pump.log_line(line, now=100.0)
    path.write_text(json.dumps(epoch) + "\n" + json.dumps(window) + "\n")
    pump.flush(now=1000.0, final=True)
    kinds = [(r["kind"], r.get("source")) for r in stream(store)[4:]]
    assert kinds == [("epoch", "runtime"), ("window", None)]
    figures = pump.summary()
    assert figures["source"] == "runtime"
    assert (figures["examples_per_s"], figures["step_p95_s"]) == (800.0, 0.05)  # the newer
    assert figures["examples"] == 320 + 5 * 64 / 2  # epoch 1's and epoch 2's 5 steps so far
    assert (figures["epoch_seconds"], figures["losses"], figures["workers"]) == (0.5, [0.9], 2)
    assert set(figures) <= set(HEARTBEAT_METRICS)

    cut = {**epoch, "time": 300.0, "epoch": 2, "seconds": 0.1, "loss": 0.8, "partial": True}
    with open(path, "a") as f:  # CLOUDTRAIN_MAX_STEPS stopped fit within epoch 2
        f.write(json.dumps(cut) + "\n")
    pump.flush(now=1000.0)
    figures = pump.summary()
    assert (figures["epoch_seconds"], figures["losses"], figures["loss"]) == (0.5, [0.9, 0.8], 0.8)


def test_agent_heartbeat_carries_the_figures_and_the_stream_lands_in_the_bucket(
    store: LocalStore,
    work: Path,
    tmp_path: Path,
    gpu_path: Path,
    run_in_thread: Callable[[Agent], AgentThread],
) -> None:
    done = tmp_path / "done"
    busy = f"import itertools, os; any(os.path.exists('{done}') for _ in itertools.count())"
    record = {"time": 1.0, "kind": "window", "epoch": 1, "step": 4, "examples_per_s": 123.0}
    entrypoint = (
        f"cat '{KERAS_LOG}'"  # Keras' lines first, the runtime's records after: those win
        f" && echo '{json.dumps(record)}' >> \"$CLOUDTRAIN_METRICS_FILE\""
        ' && mkdir -p "$CLOUDTRAIN_TENSORBOARD_DIR/train"'
        ' && echo ev > "$CLOUDTRAIN_TENSORBOARD_DIR/train/events.out.tfevents.1"'
        f' && python -c "{busy}"'
    )
    put_json(store, "cluster.json", base_cluster(entrypoint=entrypoint))
    runner = run_in_thread(Agent(RUN_ID, "chief", 0, store, work))

    def figures() -> dict[str, Any]:
        return (get_json(store, "heartbeat/chief-0.json") or {}).get("metrics") or {}

    assert wait_for(lambda: figures().get("cpu_percent", 0) > 0)  # the busy python
    beat = figures()
    assert (beat["examples_per_s"], beat["source"]) == (123.0, "runtime")
    assert beat["gpu_util_percent"] == 50.0
    assert beat["rss_bytes"] > 0
    done.touch()
    assert wait_for(lambda: status_of(store, "chief-0").get("state") == "succeeded")
    assert runner.join(HANG_S)
    records = stream(store)
    assert record in records
    kinds = {r["kind"] for r in records}
    assert kinds == {"window", "process", "gpu"}  # no keras-log epochs: the runtime wrote
    assert store.get(PREFIX + "tensorboard/train/events.out.tfevents.1") == b"ev\n"


def test_agent_streams_keras_log_epochs_of_a_job_without_the_runtime(
    store: LocalStore, work: Path
) -> None:
    put_json(store, "cluster.json", base_cluster(entrypoint=f"cat '{KERAS_LOG}'"))
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    epochs = [r for r in stream(store) if r["kind"] == "epoch"]
    assert [(r["source"], r["epoch"], r["loss"]) for r in epochs] == [
        ("keras-log", 1, 0.8744),
        ("keras-log", 2, 0.8175),
        ("keras-log", 1, 0.7751),
        ("keras-log", 2, 0.7195),
    ]
    beat = (get_json(store, "heartbeat/chief-0.json") or {})["metrics"]
    assert beat["source"] == "keras-log"
    assert beat["losses"] == [0.8744, 0.8175, 0.7751, 0.7195]
