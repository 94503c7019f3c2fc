"""Helpers for user training scripts launched by the cloudtrain node agent.

Import this module before TensorFlow: it sets ``TF_USE_LEGACY_KERAS=1`` so that ``tf.keras``
is tf-keras (Keras 2), which MultiWorkerMirroredStrategy ``fit`` and ParameterServerStrategy
need in TF 2.21. TensorFlow itself is only imported inside the functions.

Environment read (all optional, so scripts also run outside cloudtrain): ``TF_CONFIG``,
``CLOUDTRAIN_STRATEGY``, ``CLOUDTRAIN_ROLE``, ``CLOUDTRAIN_INDEX``, ``CLOUDTRAIN_IS_CHIEF``,
``CLOUDTRAIN_CHECKPOINT_DIR``, ``CLOUDTRAIN_MODEL_DIR``, ``CLOUDTRAIN_TENSORBOARD_DIR``,
``CLOUDTRAIN_METRICS_FILE`` (the METRICS records of jobs/protocol.py are appended there) and
``CLOUDTRAIN_MAX_STEPS`` (``fit`` stops after that many steps), plus ``HOROVOD_SIZE``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from typing import Any

from cloudtrain.core import env
from cloudtrain.jobs import strategies as registry
from cloudtrain.jobs.tf_strategies import BUILDERS as _BUILDERS

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

STRATEGIES: tuple[str, ...] = registry.NAMES  # the declared strategies (jobs/strategies.py)
WINDOW_SECONDS = 2.0  # a "window" METRICS record about this often during an epoch


def _tf_config() -> dict[str, Any]:
    raw = os.environ.get("TF_CONFIG", "").strip()
    return json.loads(raw) if raw else {}


def task() -> tuple[str, int]:
    """Return this process's ``(role, index)``.

    From ``CLOUDTRAIN_ROLE``/``CLOUDTRAIN_INDEX`` if set, else from ``TF_CONFIG``'s task, else
    ``("chief", 0)`` (a single-node run).
    """
    role = env.ROLE.raw()
    if role:
        return role, int(env.INDEX.raw() or 0)
    spec = _tf_config().get("task") or {}
    if spec.get("type"):
        return str(spec["type"]), int(spec.get("index", 0))
    return "chief", 0


def is_chief() -> bool:
    """Return True on the task whose outputs matter (the chief, or worker 0 without a chief).

    ``CLOUDTRAIN_IS_CHIEF`` ("1"/"0") wins when set; otherwise it is derived from ``TF_CONFIG``;
    with neither, the process is a single-node run and is the chief.
    """
    flag = env.IS_CHIEF.text()
    if flag:
        return flag == "1"
    cluster = _tf_config().get("cluster") or {}
    if not cluster:
        return True
    role, index = task()
    if cluster.get("chief"):
        return (role, index) == ("chief", 0)
    return (role, index) == ("worker", 0)


def strategy_name() -> str:
    """Return the strategy name: ``CLOUDTRAIN_STRATEGY`` if set, else inferred.

    Inference (``strategies.infer``): a ``ps`` task in ``TF_CONFIG`` -> ``parameter_server``;
    workers -> ``multi_worker_mirrored``; otherwise ``mirrored`` with more than one visible GPU,
    else ``one_device``. Raises ``ValueError`` for an unknown ``CLOUDTRAIN_STRATEGY``.
    """
    return _declared().name


def _declared() -> registry.StrategyInfo:
    """The declaration of this task's strategy (see ``strategy_name``). Raises ``ValueError``
    for an unknown ``CLOUDTRAIN_STRATEGY``."""
    name = env.STRATEGY.text()
    if not name:
        cluster = _tf_config().get("cluster") or {}
        roles = [role for role, tasks in cluster.items() if tasks]
        name = registry.infer(roles, lambda: len(_gpus()))
    info = registry.strategy(name)
    if info is None:
        raise ValueError(f"unknown {env.STRATEGY.name} {name!r}; expected one of {STRATEGIES}")
    return info


def _gpus() -> list[Any]:
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def _log(message: str) -> None:
    print(f"cloudtrain: {message}", flush=True)


def _serve_forever(tf: Any) -> None:
    """Run a ParameterServerStrategy worker or ps server; never returns."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    _log(f"{resolver.task_type} {resolver.task_id} serving the parameter-server cluster")
    server.join()
    sys.exit(0)  # pragma: no cover - join() only returns when the process is killed


@cache
def strategy() -> Any:
    """Return the ``tf.distribute`` strategy for this task (created once, then cached).

    Call it first thing in the script, before any other TensorFlow op (MultiWorkerMirrored
    requires it). Under ``parameter_server`` the worker and ps tasks never return from this
    call: they start a ``tf.distribute.Server`` and ``join()`` until the agent kills them, so
    the same script works on every role; the chief gets a ``ParameterServerStrategy`` with a
    ``MinSizePartitioner`` over the ps tasks. An ``evaluator`` task gets the default strategy,
    and so does every ``horovod`` process (Horovod distributes; each process sees one GPU).
    """
    info = _declared()
    role, _ = task()
    for key, value in info.process_env:
        os.environ.setdefault(key, value)
    import tensorflow as tf

    if role == "evaluator":
        return tf.distribute.get_strategy()
    if role in info.serving_roles:
        _serve_forever(tf)
    return _BUILDERS[info.builder](tf)


def checkpoint_dir() -> str:
    """Return (and create) the absolute local checkpoint folder.

    ``CLOUDTRAIN_CHECKPOINT_DIR``, or ``./checkpoints`` outside cloudtrain. The agent restores
    it from the bucket on restart and syncs the chief's copy up as it changes.
    """
    path = os.path.abspath(env.CHECKPOINT_DIR.raw() or "checkpoints")
    os.makedirs(path, exist_ok=True)
    return path


@cache
def _task_temp_dir(kind: str) -> str:
    """Return a per-task throw-away folder, removed when the process exits normally."""
    role, index = task()
    path = tempfile.mkdtemp(prefix=f"cloudtrain-{kind}-{role}{index}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def model_dir() -> str:
    """Return (and create) the folder for the final model.

    On the chief: ``CLOUDTRAIN_MODEL_DIR`` or ``./model`` (uploaded by the agent). Elsewhere: a
    per-task temporary folder, since every MultiWorkerMirrored worker must take part in the
    save but only the chief's copy is kept.
    """
    if not is_chief():
        return _task_temp_dir("model")
    path = os.path.abspath(env.MODEL_DIR.raw() or "model")
    os.makedirs(path, exist_ok=True)
    return path


def tensorboard_dir() -> str:
    """Return (and create) the absolute folder of this task's TensorBoard event files.

    On the chief: ``CLOUDTRAIN_TENSORBOARD_DIR`` or ``./tensorboard`` (mirrored to the bucket by
    the agent). Elsewhere: ``workertemp_<index>`` (TensorFlow's ``distributed_file_utils``
    convention) inside a per-task temporary folder removed at exit. Idempotent.
    """
    if not is_chief():
        path = os.path.join(_task_temp_dir("tensorboard"), f"workertemp_{task()[1]}")
    else:
        path = os.path.abspath(env.TENSORBOARD_DIR.raw() or "tensorboard")
    os.makedirs(path, exist_ok=True)
    return path


def max_steps() -> int | None:
    """Return ``CLOUDTRAIN_MAX_STEPS`` (a positive int), or None when unset or empty.

    Raises ``ValueError`` for anything else. Pure (reads the environment).
    """
    raw = env.MAX_STEPS.text()
    if not raw:
        return None
    try:
        steps = int(raw)
    except ValueError:
        steps = 0
    if steps < 1:
        raise ValueError(f"{env.MAX_STEPS.name} must be a positive integer, not {raw!r}")
    return steps


def data_parallel_workers() -> int:
    """Return how many nodes split the global batch between them (at least 1).

    Under ``multi_worker_mirrored``: the chief and worker tasks of ``TF_CONFIG``; under
    ``horovod``: ``HOROVOD_CROSS_SIZE``, the nodes (each node's ranks step together, and only
    local rank 0 reports, for the node: see ``_reports``); otherwise 1 (one process sees the
    whole global batch: one device, ``mirrored``, and the ``parameter_server`` chief, the only
    task that runs ``fit``).
    """
    return _WIDTHS[_declared().data_parallel]()


def _tf_config_workers() -> int:
    cluster = _tf_config().get("cluster") or {}
    return max(1, len(cluster.get("chief") or []) + len(cluster.get("worker") or []))


# how `data_parallel_workers()` counts, by a declaration's `data_parallel` (jobs/strategies.py)
_WIDTHS: dict[str, Callable[[], int]] = {
    "one": lambda: 1,
    "tf_config_workers": _tf_config_workers,
    "horovod_nodes": lambda: max(1, int(os.environ.get("HOROVOD_CROSS_SIZE", "1") or 1)),
}


def _reports() -> bool:
    """Whether this process writes the node's metrics: not a Horovod rank other than the node's
    local rank 0 (the ranks of a node share one metrics file and one heartbeat)."""
    return os.environ.get("HOROVOD_LOCAL_RANK", "0").strip() in ("", "0")


def _number(value: Any) -> float | None:
    """``value`` as a finite float (JSON has no NaN), or None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _percentile(values: list[float], fraction: float) -> float | None:
    """The ``fraction`` quantile of ``values`` (linear interpolation), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class _MetricsFile:
    """Appends METRICS records as JSON lines to ``path`` (nothing when ``path`` is None).

    Each record is one line, written and flushed on its own, so the agent tailing the file sees
    whole lines. A write error is reported once on stderr and never stops the training.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._warned = False

    def write(self, record: dict[str, Any]) -> None:
        if not self.path:
            return
        line = json.dumps({"time": time.time(), **record}, allow_nan=False)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
                handle.flush()
        except OSError as error:
            if not self._warned:
                self._warned = True
                print(f"cloudtrain: cannot write metrics to {self.path}: {error}", file=sys.stderr)


def _rates(steps: int, seconds: float, times: list[float], share: float | None) -> dict[str, Any]:
    """The rate fields shared by "epoch" and "window" records."""
    examples = steps * share if share is not None else None
    if examples is not None and float(examples).is_integer():
        examples = int(examples)
    return {
        "steps": steps,
        "examples": examples,
        "seconds": seconds,
        "examples_per_s": examples / seconds if examples is not None and seconds > 0 else None,
        "steps_per_s": steps / seconds if seconds > 0 else None,
        "step_p50_s": _percentile(times, 0.5),
        "step_p95_s": _percentile(times, 0.95),
    }


def _throughput_callback(tf: Any, epochs: int | None, batch_size: int | None) -> Any:
    out = _MetricsFile((env.METRICS_FILE.raw() or None) if _reports() else None)
    limit = max_steps()
    workers = data_parallel_workers()
    share = batch_size / workers if batch_size else None
    common = {"source": "runtime", "global_batch": batch_size, "workers": workers}

    class _Throughput(tf.keras.callbacks.Callback):
        """Time each train step; write "epoch" and "window" records; honour MAX_STEPS.

        Under ParameterServerStrategy a step returns once it is scheduled, not run: step times
        are not measurable there (p50/p95 and train_seconds are null), and each window waits
        for the scheduled steps (``coordinator.join()``) before it reads the clock.
        """

        def __init__(self) -> None:
            super().__init__()
            # batch hooks must accept un-fetched logs under ParameterServerStrategy (tf-keras
            # refuses the callback otherwise); elsewhere on_train_batch_end waits for the step
            self._supports_tf_logs = True
            self._total = 0
            self._tracing = True
            self._epoch = 0
            self._epoch_start = 0.0
            self._train_end = 0.0
            self._epoch_steps = 0
            self._epoch_times: list[float] = []
            self._step = 0
            self._batch_start = (0, 0.0)
            self._window_start: float | None = None
            self._window_steps = 0
            self._window_times: list[float] = []

        def _coordinator(self) -> Any:
            return getattr(self.model, "_cluster_coordinator", None)

        def _meta(self) -> dict[str, Any]:
            return {
                "epoch": self._epoch + 1,
                "epochs": epochs or self.params.get("epochs"),
                "steps_per_epoch": self.params.get("steps"),
            }

        def _write_window(self, now: float) -> float:
            coordinator = self._coordinator()
            if coordinator is not None:
                coordinator.join()
                now = time.perf_counter()
            seconds = now - (self._window_start or now)
            rates = _rates(self._window_steps, seconds, self._window_times, share)
            out.write({"kind": "window", **rates, **self._meta(), "step": self._step, **common})
            self._window_start, self._window_steps, self._window_times = now, 0, []
            return now

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            self._total, self._tracing = 0, True

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            if self._total:  # the last train step's end, for the run's trace
                last = time.time() - (time.perf_counter() - self._train_end)
                out.write({"kind": "train_end", "last_step_time": last, "steps": self._total})

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch, self._epoch_start = epoch, time.perf_counter()
            self._train_end, self._epoch_steps, self._epoch_times = self._epoch_start, 0, []
            self._window_start, self._window_steps, self._window_times = None, 0, []

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            now = time.perf_counter()
            self._batch_start = (batch, now)
            if self._window_start is None and not self._tracing:
                self._window_start = now

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            timed = self._coordinator() is None
            if timed:
                for value in (logs or {}).values():  # wait for the step (GPU work is async)
                    if hasattr(value, "numpy"):
                        value.numpy()
                        break
            now = time.perf_counter()
            first, start = self._batch_start
            count = max(1, batch - first + 1)  # steps_per_execution > 1 runs several at once
            step_times = [(now - start) / count] * count if timed else []
            self._epoch_steps += count
            self._epoch_times += step_times
            self._total += count
            self._step = batch + 1
            self._train_end = now
            if self._tracing:  # the fit's first step traces the tf.function: no window rate
                self._tracing = False
                self._window_start = now
                out.write({"kind": "first_step", **common})  # its end, for the run's trace
            else:
                self._window_steps += count
                self._window_times += step_times
                if now - (self._window_start or now) >= WINDOW_SECONDS:
                    now = self._write_window(now)
            if limit is not None and self._total >= limit and not self.model.stop_training:
                self.model.stop_training = True
                _log(f"stopped after {self._total} steps ({env.MAX_STEPS.name})")
                if self._window_steps:
                    self._write_window(now)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if not self._epoch_steps:
                return
            seconds = time.perf_counter() - self._epoch_start
            steps_per_epoch = self.params.get("steps")
            values = {name: _number(value) for name, value in (logs or {}).items()}
            timed = self._coordinator() is None
            record = {
                "kind": "epoch",
                **_rates(self._epoch_steps, seconds, self._epoch_times, share),
                "train_seconds": self._train_end - self._epoch_start if timed else None,
                "loss": values.get("loss"),
                "metrics": {name: value for name, value in values.items() if value is not None},
                "partial": bool(steps_per_epoch and self._step < steps_per_epoch),
                **self._meta(),
                **common,
            }
            out.write(record)

    return _Throughput()


def _scalars_callback(tf: Any) -> Any:
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR,
    )

    class _Scalars(tf.keras.callbacks.Callback):
        """Write epoch scalars as Keras' TensorBoard callback names them, without tensorboard.

        ``train/epoch_<name>`` and ``validation/epoch_<name>`` (from ``val_<name>``), step =
        the 0-based epoch, through ``tf.summary``'s low-level writer and the scalars plugin's
        metadata: TensorBoard's scalars dashboard reads them like Keras' own.
        """

        def __init__(self) -> None:
            super().__init__()
            self._writers: dict[str, Any] = {}

        def _writer(self, run: str) -> Any:
            if run not in self._writers:
                path = os.path.join(tensorboard_dir(), run)
                self._writers[run] = tf.summary.create_file_writer(path)
            return self._writers[run]

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            for name, value in (logs or {}).items():
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    continue
                run, tag = ("validation", name[4:]) if name.startswith("val_") else ("train", name)
                with self._writer(run).as_default():
                    tensor = tf.constant(number, dtype=tf.float32)
                    tf.summary.write(f"epoch_{tag}", tensor, step=epoch, metadata=metadata)
            for writer in self._writers.values():
                writer.flush()

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            for writer in self._writers.values():
                writer.close()
            self._writers = {}

    return _Scalars()


def _progress_callback(tf: Any, epochs: int | None) -> Any:
    class _Progress(tf.keras.callbacks.Callback):
        """Print ``cloudtrain: epoch N/M done loss=...`` and ``resumed at epoch K`` lines."""

        def __init__(self) -> None:
            super().__init__()
            self._first = True

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if self._first and epoch > 0:
                _log(f"resumed at epoch {epoch + 1}")
            self._first = False

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            if self._first:  # the restored backup was taken after the last epoch
                _log(f"resumed after the last epoch: all {epochs or '?'} epochs were done")

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            total = epochs or self.params.get("epochs") or "?"
            loss = (logs or {}).get("loss")
            shown = f"{float(loss):.4f}" if loss is not None else "n/a"
            _log(f"epoch {epoch + 1}/{total} done loss={shown}")

    return _Progress()


def callbacks(epochs: int | None = None, batch_size: int | None = None) -> list[Any]:
    """Return the callbacks to pass to ``model.fit`` (call after ``strategy()``; not blocking).

    ``batch_size`` is the job's GLOBAL batch size (what the dataset is batched with before the
    strategy splits it); without it the throughput records count steps only.

    Call it on every task that runs ``fit`` (all MultiWorkerMirrored workers; only the chief
    under ParameterServerStrategy, where the other roles never leave ``strategy()``):

    - ``BackupAndRestore(<checkpoint_dir>/backup)``: tf-keras writes ``backup/chief`` on the
      chief (non-chiefs write a throw-away ``backup/workertemp_N``) and every task restores
      from ``backup/chief``, so the agent must restore the chief's folder onto every node.
      It is deleted when ``fit`` finishes normally.
    - ``ModelCheckpoint`` saving weights after each epoch to
      ``<checkpoint_dir>/ckpt/epoch-NNN`` (TensorFlow checkpoint format: ``.index`` and
      ``.data-*`` files) on the chief, and to a per-task temp folder on other workers.
    - a progress logger printing ``cloudtrain: epoch N/M done loss=...`` and, when ``fit``
      starts after epoch 0, ``cloudtrain: resumed at epoch K`` (K = first epoch run, 1-based).
    - a throughput meter timing every train step (``perf_counter``; outside
      ParameterServerStrategy it waits for the step's loss, so asynchronous GPU work is
      counted). It appends METRICS records (jobs/protocol.py) to ``CLOUDTRAIN_METRICS_FILE``
      (nothing when unset): an "epoch" record at each epoch's end and a "window" record about
      every ``WINDOW_SECONDS`` within an epoch (the fit's first step, which traces the
      ``tf.function``, counts in epoch records only). ``examples`` is this process's share:
      ``batch_size`` / ``data_parallel_workers()``. With ``CLOUDTRAIN_MAX_STEPS=N`` it stops
      ``fit`` after N steps in all, prints ``cloudtrain: stopped after N steps
      (CLOUDTRAIN_MAX_STEPS)`` and writes a last "window" record.
    - a TensorBoard scalars writer: ``train/`` and ``validation/`` runs with ``epoch_<metric>``
      tags at step = 0-based epoch, as Keras' TensorBoard callback lays them out, in
      ``tensorboard_dir()``; it needs TensorFlow only, not the tensorboard package.

    Measured with TF 2.21 / tf-keras 2.21 on CPU: under MultiWorkerMirroredStrategy
    ModelCheckpoint must run on ALL workers. Chief-only failed in our runs (no hang): saving
    takes part in collectives (reading SyncOnRead variables such as BatchNorm statistics;
    the ``.weights.h5`` format even with a plain dense model), the other workers' next
    collective gets paired with it and both die with "Collective ops is aborted ... Shape
    mismatch" / "expected data_type". The TF checkpoint format is used because the h5 formats
    store each ``ShardedVariable`` shard of ParameterServerStrategy as a separate weight, so
    those files cannot be loaded into an unsharded model; TF checkpoints can.
    """
    import tensorflow as tf

    ckpt = checkpoint_dir()
    backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(ckpt, "backup"))
    # tf-keras 2.21 whitelists strategies and leaves out OneDeviceStrategy, which works the
    # same as a single-device MirroredStrategy here, and CentralStorageStrategy (one worker,
    # its variables on the CPU), which raises NotImplementedError in on_train_begin without
    # this (both verified here: backup, a process killed mid-fit, resume at its epoch)
    supported = getattr(backup, "_supported_strategies", None)
    if isinstance(supported, tuple):
        central = tf.distribute.experimental.CentralStorageStrategy
        backup._supported_strategies = (*supported, tf.distribute.OneDeviceStrategy, central)
    folder = os.path.join(ckpt, "ckpt") if is_chief() else _task_temp_dir("ckpt")
    return [
        backup,
        tf.keras.callbacks.ModelCheckpoint(
            os.path.join(folder, "epoch-{epoch:03d}"), save_weights_only=True
        ),
        # after the checkpoint savers: an epoch's seconds include its saves
        _throughput_callback(tf, epochs, batch_size),
        _scalars_callback(tf),
        _progress_callback(tf, epochs),
    ]


def save_model(model: Any) -> str:
    """Save ``model`` as a TensorFlow SavedModel at ``<model_dir()>/saved_model``; return the path.

    Call it on every task that ran ``fit``: under MultiWorkerMirroredStrategy the save takes
    part in collectives, so a chief-only save makes the chief and the workers fail. Non-chief
    tasks write to their temporary folder. SavedModel is used because it reloads (with
    ``tf.keras.models.load_model``) into a plain model even when ParameterServerStrategy
    sharded the variables; a ``.keras`` file from a sharded model does not.
    """
    path = os.path.join(model_dir(), "saved_model")
    model.save(path)
    return path
