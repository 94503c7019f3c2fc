"""Digits classifier trained with MirroredStrategy on one node (all its GPUs, or the CPU).

Also runs standalone with no cloudtrain environment at all. ``--epoch-seconds`` sets a
minimum duration per epoch (a callback sleeps the remainder) so tests and demos can make
epochs long enough to interrupt and resume.
"""

from cloudtrain.jobs import runtime  # first: selects tf-keras before TensorFlow is imported

# isort: split
import argparse
import time

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def parse_args() -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument(
        "--steps-per-epoch", type=int, default=None, help="default: one pass over the data"
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


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (x_train, y_train, x_test, y_test) from sklearn's bundled digits, scaled to [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    return x[:1500], y[:1500], x[1500:], y[1500:]


def build_model() -> tf.keras.Model:
    """Return a small compiled dense classifier (call inside ``strategy.scope()``)."""
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.01),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    return model


def main() -> None:
    """Train, save the model and print the final accuracy."""
    args = parse_args()
    strategy = runtime.strategy()  # before any other TensorFlow op
    print(f"strategy {type(strategy).__name__}: {strategy.num_replicas_in_sync} replica(s)")
    x_train, y_train, x_test, y_test = load_data()
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2048, seed=0)
    if args.steps_per_epoch:
        train = train.repeat()
    train = train.batch(args.batch_size).prefetch(2)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)
    with strategy.scope():
        model = build_model()
    callbacks = runtime.callbacks(args.epochs, batch_size=args.batch_size)
    if args.epoch_seconds > 0:
        callbacks.append(MinEpochDuration(args.epoch_seconds))
    model.fit(
        train,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=callbacks,
        verbose=2,
    )
    path = runtime.save_model(model)
    _, accuracy = model.evaluate(test, verbose=0)
    print(f"final accuracy={accuracy:.4f} model={path}", flush=True)


if __name__ == "__main__":
    main()
