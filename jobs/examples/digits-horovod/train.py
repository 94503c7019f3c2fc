"""Digits classifier trained with Horovod (the guide's Horovod example), one process per GPU.

The node agents start every rank with Horovod's Gloo environment (cloudtrain/jobs/horovod.py);
this script is what the guide's Horovod example does with Keras:

- ``hvd.init()``, each rank training on its own shard of the data;
- the learning rate scaled by ``hvd.size()`` and the optimizer wrapped in
  ``hvd.DistributedOptimizer`` (gradients averaged by allreduce across every rank and node);
- ``BroadcastGlobalVariablesCallback(0)``: every rank starts from rank 0's state (its fresh
  initialisation, or the checkpoint it resumed from), and ``MetricAverageCallback`` averages the
  logged metrics over the ranks;
- checkpoints and the final model written by rank 0 only (cloudtrain's runtime: rank 0 is the
  chief, ``CLOUDTRAIN_IS_CHIEF``); after a restart rank 0 resumes from the newest checkpoint the
  agent restored, and tells the other ranks the epoch to start at (``hvd.broadcast``).

Runs standalone too (one process: size 1). ``--epoch-seconds`` makes epochs last long enough
to interrupt and resume in tests and demos.
"""

from cloudtrain.jobs import runtime  # first: the runtime sets its environment before TensorFlow

# isort: split
import argparse
import os
import re
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def parse_args() -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size of each rank")
    parser.add_argument("--lr", type=float, default=0.002, help="learning rate of one rank")
    parser.add_argument(
        "--steps-per-epoch", type=int, default=None, help="default: one pass over the shard"
    )
    parser.add_argument(
        "--epoch-seconds",
        type=float,
        default=0.0,
        help="minimum duration of an epoch in seconds (sleeps the remainder; for demos/tests)",
    )
    return parser.parse_args()


class MinEpochDuration(tf.keras.callbacks.Callback):
    """Sleep at the end of each epoch until it has lasted at least ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.monotonic()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self._start)))


def load_shard(rank: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): this rank's share of sklearn's digits, in [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    return x[:1500][rank::size], y[:1500][rank::size], x[1500:], y[1500:]


def build_model(lr: float) -> tf.keras.Model:
    """A small dense classifier whose optimizer averages gradients over every rank."""
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(lr * hvd.size()))
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    return model


def resume_epoch(model: tf.keras.Model) -> int:
    """On rank 0, load the newest checkpoint (``ckpt/epoch-NNN``, written by rank 0) and return
    its epoch; 0 when there is none. Every rank gets rank 0's answer."""
    epoch = 0
    if hvd.rank() == 0:
        latest = tf.train.latest_checkpoint(os.path.join(runtime.checkpoint_dir(), "ckpt"))
        found = re.search(r"epoch-(\d+)$", latest or "")
        if latest and found:
            model.load_weights(latest)
            epoch = int(found.group(1))
    return int(hvd.broadcast(tf.constant(epoch), 0, name="resume_epoch").numpy())


def main() -> None:
    """Train, save the model on rank 0 and print the final accuracy."""
    args = parse_args()
    hvd.init()
    runtime.strategy()  # the default strategy: Horovod distributes
    x_train, y_train, x_test, y_test = load_shard(hvd.rank(), hvd.size())
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2048, seed=hvd.rank())
    train = train.repeat().batch(args.batch_size).prefetch(2)
    steps = args.steps_per_epoch or max(1, len(x_train) // args.batch_size)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)
    model = build_model(args.lr)
    initial_epoch = resume_epoch(model)
    print(
        f"horovod rank {hvd.rank()} of {hvd.size()} (local {hvd.local_rank()} of"
        f" {hvd.local_size()}, node {hvd.cross_rank()} of {hvd.cross_size()}),"
        f" gloo={int(hvd.gloo_enabled())} mpi={int(hvd.mpi_enabled())}"
        f" iface={os.environ.get('HOROVOD_GLOO_IFACE', '-')},"
        f" tensorflow {tf.__version__}, starting at epoch {initial_epoch + 1}",
        flush=True,
    )
    # the broadcast first: rank 0's weights and optimizer state reach every rank before a step
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ]
    # the runtime's checkpoints (rank 0's only: saving is no collective under Horovod, so the
    # other ranks save nothing, not even to the runtime's throw-away folder), progress lines and
    # metrics; no BackupAndRestore, which would have every rank of a node write one folder
    global_batch = args.batch_size * hvd.size()
    skip = (tf.keras.callbacks.BackupAndRestore,)
    if hvd.rank() != 0:
        skip += (tf.keras.callbacks.ModelCheckpoint,)
    callbacks += [
        c
        for c in runtime.callbacks(args.epochs, batch_size=global_batch)
        if not isinstance(c, skip)
    ]
    if args.epoch_seconds > 0:
        callbacks.append(MinEpochDuration(args.epoch_seconds))
    model.fit(
        train,
        epochs=args.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )
    _, accuracy = model.evaluate(test, verbose=0)
    # the allreduce's proof: every rank ends with the same weights
    total = float(sum(float(tf.reduce_sum(w)) for w in model.get_weights()))
    print(f"horovod rank {hvd.rank()}: weights sum={total:.6f}", flush=True)
    if hvd.rank() == 0:
        path = runtime.save_model(model)
        print(f"final accuracy={accuracy:.4f} model={path}", flush=True)


if __name__ == "__main__":
    main()
