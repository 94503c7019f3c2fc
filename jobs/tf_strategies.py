"""The `tf.distribute` builders that `runtime.strategy()` calls, keyed by a declaration's
`StrategyInfo.builder` (jobs/strategies.py). Each takes the imported `tensorflow` module;
nothing here imports TensorFlow itself. Node-side: standard library only, Python 3.10+.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def log(message: str) -> None:
    """Print one `cloudtrain:` line to the job's stdout. Never raises."""
    print(f"cloudtrain: {message}", flush=True)


def parameter_server(tf: Any) -> Any:
    """The chief's ParameterServerStrategy, its variables sharded over the ps tasks."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=max(1, num_ps)
    )
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def tpu(tf: Any) -> Any:
    """The TPU VM's TPUStrategy over its own single-host slice (`TPUClusterResolver(tpu="local")`
    finds the chips through the VM's runtime). A VM without TPU chips (the box's TPU VM, a TPU
    lost to a driver fault) trains under one device instead, saying so: the same script runs."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    try:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except tf.errors.NotFoundError as err:  # "TPUs not found in the cluster"
        first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        log(f"no TPU on this VM ({first}); training under OneDeviceStrategy instead")
        return BUILDERS["OneDeviceStrategy"](tf)
    return tf.distribute.TPUStrategy(resolver)


# what `strategy()` calls for a declaration's `builder` (jobs/strategies.py), given tensorflow
BUILDERS: dict[str, Callable[[Any], Any]] = {
    "OneDeviceStrategy": lambda tf: tf.distribute.OneDeviceStrategy(
        "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
    ),
    "MirroredStrategy": lambda tf: tf.distribute.MirroredStrategy(),
    "CentralStorageStrategy": lambda tf: tf.distribute.experimental.CentralStorageStrategy(),
    "TPUStrategy": tpu,
    "MultiWorkerMirroredStrategy": lambda tf: tf.distribute.MultiWorkerMirroredStrategy(),
    "ParameterServerStrategy": parameter_server,
    "get_strategy": lambda tf: tf.distribute.get_strategy(),
}
