"""Helpers for user training scripts launched by the cloudtrain node agent.

Import this module before TensorFlow: it sets ``TF_USE_LEGACY_KERAS=1`` so that ``tf.keras``
is tf-keras (Keras 2), which MultiWorkerMirroredStrategy ``fit`` and ParameterServerStrategy
need in TF 2.21. TensorFlow itself is only imported inside the functions.

Environment read (all optional, so scripts also run outside cloudtrain): ``TF_CONFIG``,
``CLOUDTRAIN_STRATEGY``, ``CLOUDTRAIN_ROLE``, ``CLOUDTRAIN_INDEX``, ``CLOUDTRAIN_IS_CHIEF``,
``CLOUDTRAIN_CHECKPOINT_DIR`` and ``CLOUDTRAIN_MODEL_DIR``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from functools import cache
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

STRATEGIES: tuple[str, ...] = (
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "parameter_server",
    "horovod",
)


def _tf_config() -> dict[str, Any]:
    raw = os.environ.get("TF_CONFIG", "").strip()
    return json.loads(raw) if raw else {}


def task() -> tuple[str, int]:
    """Return this process's ``(role, index)``.

    From ``CLOUDTRAIN_ROLE``/``CLOUDTRAIN_INDEX`` if set, else from ``TF_CONFIG``'s task, else
    ``("chief", 0)`` (a single-node run).
    """
    role = os.environ.get("CLOUDTRAIN_ROLE")
    if role:
        return role, int(os.environ.get("CLOUDTRAIN_INDEX", "0") or 0)
    spec = _tf_config().get("task") or {}
    if spec.get("type"):
        return str(spec["type"]), int(spec.get("index", 0))
    return "chief", 0


def is_chief() -> bool:
    """Return True on the task whose outputs matter (the chief, or worker 0 without a chief).

    ``CLOUDTRAIN_IS_CHIEF`` ("1"/"0") wins when set; otherwise it is derived from ``TF_CONFIG``;
    with neither, the process is a single-node run and is the chief.
    """
    flag = os.environ.get("CLOUDTRAIN_IS_CHIEF")
    if flag is not None and flag.strip() != "":
        return flag.strip() == "1"
    cluster = _tf_config().get("cluster") or {}
    if not cluster:
        return True
    role, index = task()
    if cluster.get("chief"):
        return (role, index) == ("chief", 0)
    return (role, index) == ("worker", 0)


def strategy_name() -> str:
    """Return the strategy name: ``CLOUDTRAIN_STRATEGY`` if set, else inferred.

    Inference: a ``ps`` task in ``TF_CONFIG`` -> ``parameter_server``; workers ->
    ``multi_worker_mirrored``; otherwise ``mirrored`` with more than one visible GPU, else
    ``one_device``. Raises ``ValueError`` for an unknown ``CLOUDTRAIN_STRATEGY``.
    """
    name = os.environ.get("CLOUDTRAIN_STRATEGY", "").strip()
    if name:
        if name not in STRATEGIES:
            raise ValueError(f"unknown CLOUDTRAIN_STRATEGY {name!r}; expected one of {STRATEGIES}")
        return name
    cluster = _tf_config().get("cluster") or {}
    if cluster.get("ps"):
        return "parameter_server"
    if cluster.get("worker"):
        return "multi_worker_mirrored"
    return "mirrored" if len(_gpus()) > 1 else "one_device"


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
    name = strategy_name()
    role, _ = task()
    if name == "parameter_server":
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf

    if role == "evaluator" or name == "horovod":
        return tf.distribute.get_strategy()
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "parameter_server":
        if role in ("worker", "ps"):
            _serve_forever(tf)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10, max_shards=max(1, num_ps)
        )
        return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    device = "/gpu:0" if _gpus() else "/cpu:0"
    return tf.distribute.OneDeviceStrategy(device)


def checkpoint_dir() -> str:
    """Return (and create) the absolute local checkpoint folder.

    ``CLOUDTRAIN_CHECKPOINT_DIR``, or ``./checkpoints`` outside cloudtrain. The agent restores
    it from the bucket on restart and syncs the chief's copy up as it changes.
    """
    path = os.path.abspath(os.environ.get("CLOUDTRAIN_CHECKPOINT_DIR") or "checkpoints")
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
    path = os.path.abspath(os.environ.get("CLOUDTRAIN_MODEL_DIR") or "model")
    os.makedirs(path, exist_ok=True)
    return path


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


def callbacks(epochs: int | None = None) -> list[Any]:
    """Return the fault-tolerance callbacks to pass to ``model.fit`` (call after ``strategy()``).

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
    # same as a single-device MirroredStrategy here (verified: backup and resume).
    supported = getattr(backup, "_supported_strategies", None)
    if isinstance(supported, tuple):
        backup._supported_strategies = (*supported, tf.distribute.OneDeviceStrategy)
    folder = os.path.join(ckpt, "ckpt") if is_chief() else _task_temp_dir("ckpt")
    return [
        backup,
        tf.keras.callbacks.ModelCheckpoint(
            os.path.join(folder, "epoch-{epoch:03d}"), save_weights_only=True
        ),
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
