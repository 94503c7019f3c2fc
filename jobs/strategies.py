"""The distribution strategies: one `StrategyInfo` per strategy, declared once here, as each
provider declares its `INFO` (providers/info.py).

Everything the program knows about a strategy is in its declaration: the role counts the spec
accepts (and the error for a count it refuses), whether it spans nodes, what `cloudtrain scale`
varies, which roles `TF_CONFIG` lists, the ports its nodes open to each other, how the agent
launches the training, what the image must ship, which roles only serve the chief, and which
`tf.distribute` builder `runtime.strategy()` calls. Every other module reads the declaration
(`STRATEGIES`, `strategy(name)`); none compares a strategy's name
(tests/unit/jobs/test_strategies.py enforces it).

Adding a strategy: one `StrategyInfo` below, listed in `STRATEGIES`,
plus, when no existing builder fits, its builder in `jobs/tf_strategies.py` (`BUILDERS`, keyed
by `StrategyInfo.builder`). The spec accepts the name at once; plan, scale, the ports, the agent
and the runtime follow the declaration.

Standard library only, Python 3.10+, importing nothing else of the project: the node agent and
the training runtime read it on the nodes, and the controller imports it too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Literal

ROLES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")  # TensorFlow's task types
UNPRIVILEGED_PORTS = (1024, 65535)
# what jobs/horovod.py sets for each rank (tests/unit/jobs/test_node_rules.py keeps them in step)
HOROVOD_ENV = frozenset(
    {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR",
        "HOROVOD_GLOO_RENDEZVOUS_PORT",
        "HOROVOD_CONTROLLER",
        "HOROVOD_CPU_OPERATIONS",
        "HOROVOD_HOSTNAME",
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "HOROVOD_LOCAL_RANK",
        "HOROVOD_LOCAL_SIZE",
        "HOROVOD_CROSS_RANK",
        "HOROVOD_CROSS_SIZE",
        "CUDA_VISIBLE_DEVICES",
    }
)


@dataclass(frozen=True)
class Count:
    """How many nodes of one role a strategy takes: `low` to `high` (None: no bound of its own;
    the spec's field limits still apply first). An unset count (the spec's `chief`) is `low`.
    `refusal` is the spec's error for a count outside, formatted with `name` (the strategy's)
    and `value` (the count as given)."""

    low: int = 0
    high: int | None = 0
    refusal: str = "must be {low} to {high} for strategy {name!r} (got {value})"

    def problem(self, name: str, value: int | None) -> str | None:
        """The refusal for `value` (None: unset) under strategy `name`, or None. Pure."""
        count = self.low if value is None else value
        if count >= self.low and (self.high is None or count <= self.high):
            return None
        return self.refusal.format(name=name, value=value, low=self.low, high=self.high)

    def settle(self, value: int | None) -> int:
        """The count a valid `value` (None: unset) stands for. Pure."""
        return max(self.low, value or 0)


NONE = Count()  # the role is not used
_ONE_CHIEF = "must be 0 or unset for strategy {name!r} (its single node is the chief)"
_ONE_WORKER = "must be 1 for strategy {name!r} (got {value}; use multi_worker_mirrored)"
_NO_PS = "must be 0 for strategy {name!r} (only parameter_server uses ps nodes)"
_ONE_EVALUATOR = "must be 0 for strategy {name!r}, a single node without an evaluator"


@dataclass(frozen=True)
class StrategyInfo:
    """A strategy's declared knowledge. Pure data: reading it imports nothing."""

    name: str  # the spec's `cluster.strategy` value
    # the tf.distribute builder `runtime.strategy()` calls (a key of jobs/tf_strategies.py's
    # BUILDERS); TensorFlow itself is imported only by the runtime
    builder: str
    # the counts the spec accepts, per role (the spec's fields chief, workers, ps, evaluator)
    chief: Count
    worker: Count
    ps: Count = Count(refusal=_NO_PS)
    evaluator: Count = NONE
    # False: one node, the chief, whatever the spec's `workers: 1` (`ClusterSpec.roles()`)
    spans_nodes: bool = True
    scale: str | None = None  # the spec field `cloudtrain scale` varies; None: it cannot
    # the roles TF_CONFIG's cluster lists (never the evaluator); () gives no TF_CONFIG at all.
    # A lone chief gets none either (`tf_config.needs_tf_config`)
    tf_config_roles: tuple[str, ...] = ("chief", "worker", "ps")
    # the TCP ports its nodes open to each other; None: the run's range (cluster.port to +10)
    peer_ports: tuple[int, int] | None = None
    # how the agent starts the entrypoint: one plain process, or one process per GPU with
    # Horovod's Gloo environment (jobs/horovod.py), each node registering its slot count
    launch: Literal["plain", "horovod_ranks"] = "plain"
    reserved_env: frozenset[str] = frozenset()  # names its launcher sets; the spec may not
    # a module the image must ship: the bootstrap fails unless `import <it>` works, saying
    # `image_hint` (what to do about it)
    image_module: str | None = None
    image_hint: str = ""
    # roles whose process only serves the chief (ps and evaluator always do): the agent ends
    # them when the chief is final, and `runtime.strategy()` never returns on them
    serving_roles: tuple[str, ...] = ()
    # set in the training process, when unset, before TensorFlow loads
    process_env: tuple[tuple[str, str], ...] = ()
    # how `runtime.data_parallel_workers()` counts the nodes splitting the global batch: one
    # process sees all of it; TF_CONFIG's chief and workers; or HOROVOD_CROSS_SIZE
    data_parallel: Literal["one", "tf_config_workers", "horovod_nodes"] = "one"
    # what its nodes compute on: GPU (or CPU) machines, or a Cloud TPU VM, whose type the spec's
    # accelerator names and which only providers that declare TPU types sell
    device: Literal["gpu", "tpu"] = "gpu"

    @property
    def on_tpu(self) -> bool:
        """Whether its nodes are Cloud TPU VMs (a run's launcher then needs the TPU API and its
        rights). Pure."""
        return self.device == "tpu"

    def counts(self) -> dict[str, Count]:
        """The count rule per role, in ROLES' order. Pure."""
        return {
            "chief": self.chief,
            "worker": self.worker,
            "ps": self.ps,
            "evaluator": self.evaluator,
        }


def _one_node(name: str, builder: str) -> StrategyInfo:
    """A strategy on one node, the chief (its spec says `workers: 1`, nothing else)."""
    return StrategyInfo(
        name=name,
        builder=builder,
        chief=Count(refusal=_ONE_CHIEF),
        worker=Count(1, 1, _ONE_WORKER),
        evaluator=Count(refusal=_ONE_EVALUATOR),
        spans_nodes=False,
    )


ONE_DEVICE = _one_node("one_device", "OneDeviceStrategy")
MIRRORED = _one_node("mirrored", "MirroredStrategy")
# variables on the CPU, compute replicated on the node's GPUs (tf.distribute.experimental's
# CentralStorageStrategy, still in TensorFlow 2.21): one node, all its GPUs
CENTRAL_STORAGE = _one_node("central_storage", "CentralStorageStrategy")
# a Cloud TPU VM's single-host slice (TPUClusterResolver(tpu="local")); only providers that
# declare TPU types run it (the spec's accelerator names the type)
TPU = replace(_one_node("tpu", "TPUStrategy"), device="tpu")
MULTI_WORKER_MIRRORED = StrategyInfo(
    name="multi_worker_mirrored",
    builder="MultiWorkerMirroredStrategy",
    chief=Count(0, 1),
    worker=Count(1, None),
    evaluator=Count(0, 1),
    scale="workers",
    data_parallel="tf_config_workers",
)
PARAMETER_SERVER = StrategyInfo(
    name="parameter_server",
    builder="ParameterServerStrategy",
    chief=Count(1, 1, "must be 1 or unset for strategy {name!r} (it always has a chief)"),
    worker=Count(1, None),
    ps=Count(1, None, "strategy {name!r} needs at least 1 (got {value})"),
    evaluator=Count(0, 1),
    scale="workers",
    serving_roles=("worker", "ps"),
    process_env=(("GRPC_FAIL_FAST", "use_caller"),),
)
HOROVOD = StrategyInfo(
    name="horovod",
    builder="get_strategy",  # Horovod distributes; each process sees one GPU
    chief=Count(
        refusal="must be 0 or unset for strategy {name!r} (worker 0 is the rendezvous host)"
    ),
    worker=Count(1, None),
    evaluator=Count(refusal="must be 0 for strategy {name!r} (it has no evaluator node)"),
    scale="workers",
    tf_config_roles=(),
    peer_ports=UNPRIVILEGED_PORTS,  # Gloo and NCCL connect between processes on random ports
    launch="horovod_ranks",
    reserved_env=HOROVOD_ENV,
    # a stack of its own provides it where the image lacks it (cloudtrain/run/startup.py:
    # HOROVOD_STACK): tensorflow 2.15.1, and horovod 0.28.1 built with Gloo on the node
    image_module="horovod.tensorflow",
    image_hint="cloudtrain installs tensorflow 2.15.1 and builds horovod 0.28.1 (Gloo) on images"
    " with Python 3.9-3.11; elsewhere use an image whose python3 ships horovod",
    data_parallel="horovod_nodes",
)

# every strategy, in the order the spec's error lists them
STRATEGIES: dict[str, StrategyInfo] = {
    s.name: s
    for s in (
        ONE_DEVICE,
        MIRRORED,
        MULTI_WORKER_MIRRORED,
        PARAMETER_SERVER,
        HOROVOD,
        CENTRAL_STORAGE,
        TPU,
    )
}
NAMES: tuple[str, ...] = tuple(STRATEGIES)
DEFAULT = MULTI_WORKER_MIRRORED.name  # the spec's default
# what a node does under a name with no declaration (a cluster.json of another version, a test's
# placeholder): one plain process with the TF_CONFIG of its chief, workers and ps
UNDECLARED = StrategyInfo(name="", builder="", chief=Count(0, 1), worker=Count(1, None))


def strategy(name: str | None) -> StrategyInfo | None:
    """The declaration of strategy `name`, or None for a name (or None) that has none. Never
    raises (no KeyError, no UsageError): the caller decides what an unknown name means (the
    spec refuses it before any lookup, the runtime raises ValueError, the agent runs it as
    UNDECLARED). Pure."""
    return STRATEGIES.get(name or "")


def infer(roles: Collection[str], gpus: Callable[[], int]) -> str:
    """The strategy of a process told none (a script run outside cloudtrain): a ``ps`` task in
    its TF_CONFIG's cluster `roles` -> parameter_server; workers -> multi_worker_mirrored;
    otherwise mirrored with more than one GPU (`gpus()`, called only then), else one_device."""
    if "ps" in roles:
        return PARAMETER_SERVER.name
    if "worker" in roles:
        return MULTI_WORKER_MIRRORED.name
    return MIRRORED.name if gpus() > 1 else ONE_DEVICE.name
