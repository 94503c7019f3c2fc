"""How fast a run trains and what an epoch costs, from its nodes' heartbeats.

Every agent puts its node's latest figures in its heartbeat (`Heartbeat.metrics`, the keys of
jobs/protocol.py's HEARTBEAT_METRICS): examples/s of its own share of the global batch, step times,
the last losses, CPU and GPU use. This module turns one heartbeat per node into the run's figures:
the cluster's examples/s (the sum of the shares), each node's efficiency against the fastest node,
the straggler and idle flags the live view shows, the $ per epoch and the $ per million examples at
the run's hourly price. Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cloudtrain.core.node_text import figure, finite

# a node this much slower than the median of the run's nodes holds back every all-reduce
STRAGGLER_FRACTION = 0.20
# a training node below this GPU use (or, without a GPU, CPU use: 100 = one core) waits for work
IDLE_GPU_PERCENT = 10.0
IDLE_CPU_PERCENT = 5.0


@dataclass(frozen=True)
class NodeRate:
    """One node's figures, as its last heartbeat gave them (None: not measured)."""

    node: str
    examples_per_s: float | None = None
    steps_per_s: float | None = None
    step_p50_s: float | None = None
    step_p95_s: float | None = None
    epoch_seconds: float | None = None
    examples: float | None = None
    loss: float | None = None
    losses: tuple[float, ...] = ()
    gpu_util_percent: float | None = None
    cpu_percent: float | None = None
    source: str | None = None
    straggler: bool = False  # more than STRAGGLER_FRACTION slower than the median node
    idle: bool = False  # measured, and its GPU (or CPU) is nearly unused
    efficiency: float | None = None  # its rate over the fastest node's (1.0 for the fastest)

    @property
    def rate(self) -> float | None:
        """What nodes are compared by: examples/s, else steps/s (a job without a batch size)."""
        return self.examples_per_s if self.examples_per_s is not None else self.steps_per_s


@dataclass(frozen=True)
class Throughput:
    """The run's figures. `cluster_examples_per_s` is the sum of the nodes' shares (under
    ParameterServer only the chief reports, with the global figure); `epoch_seconds` is the
    slowest node's last epoch (or, before a whole epoch, steps_per_epoch / steps/s)."""

    nodes: dict[str, NodeRate]
    cluster_examples_per_s: float | None
    epoch_seconds: float | None
    steps_per_epoch: int | None
    hourly_usd: float

    @property
    def usd_per_epoch(self) -> float | None:
        """The run's $/h over the time of one epoch."""
        if self.epoch_seconds is None:
            return None
        return self.hourly_usd * self.epoch_seconds / 3600.0

    @property
    def usd_per_million_examples(self) -> float | None:
        """The run's $/h over the examples it trains on in an hour, per million."""
        rate = self.cluster_examples_per_s
        if not rate:
            return None
        return self.hourly_usd / (rate * 3600.0) * 1e6

    @property
    def stragglers(self) -> list[str]:
        return sorted(n for n, r in self.nodes.items() if r.straggler)

    @property
    def measured(self) -> bool:
        """Whether any node reported a rate."""
        return any(r.rate is not None for r in self.nodes.values())

    def to_dict(self) -> dict[str, Any]:
        """What `status --json` and the summary's JSON carry. Pure."""
        return {
            "cluster_examples_per_s": self.cluster_examples_per_s,
            "epoch_seconds": self.epoch_seconds,
            "steps_per_epoch": self.steps_per_epoch,
            "hourly_usd": self.hourly_usd,
            "usd_per_epoch": self.usd_per_epoch,
            "usd_per_million_examples": self.usd_per_million_examples,
            "stragglers": self.stragglers,
            "nodes": {
                name: {**asdict(rate), "losses": list(rate.losses)}
                for name, rate in sorted(self.nodes.items())
            },
        }


def _number(value: Any) -> float | None:
    return finite(value)  # an int too big for a float (a 4000-digit one) is no figure either


def _losses(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(x for x in (_number(v) for v in value) if x is not None)


def node_rate(node: str, metrics: Mapping[str, Any] | None) -> NodeRate:
    """One node's figures from its heartbeat's `metrics` (unknown or malformed values read as
    not measured). Pure."""
    m = metrics or {}
    source = m.get("source")
    return NodeRate(
        node=node,
        examples_per_s=_number(m.get("examples_per_s")),
        steps_per_s=_number(m.get("steps_per_s")),
        step_p50_s=_number(m.get("step_p50_s")),
        step_p95_s=_number(m.get("step_p95_s")),
        epoch_seconds=_number(m.get("epoch_seconds")),
        examples=_number(m.get("examples")),
        loss=_number(m.get("loss")),
        losses=_losses(m.get("losses")),
        gpu_util_percent=_number(m.get("gpu_util_percent")),
        cpu_percent=_number(m.get("cpu_percent")),
        source=str(source) if isinstance(source, str) else None,
    )


def _is_idle(rate: NodeRate) -> bool:
    if rate.gpu_util_percent is not None:
        return rate.gpu_util_percent < IDLE_GPU_PERCENT
    return rate.cpu_percent is not None and rate.cpu_percent < IDLE_CPU_PERCENT


def _flagged(rates: dict[str, NodeRate]) -> dict[str, NodeRate]:
    """Each node with its straggler/idle flags and its efficiency against the fastest."""
    measured = [r.rate for r in rates.values() if r.rate is not None and r.rate > 0]
    median = statistics.median(measured) if measured else None
    best = max(measured) if measured else None
    out: dict[str, NodeRate] = {}
    for name, r in rates.items():
        value = r.rate
        straggler = (
            median is not None
            and len(measured) > 1
            and value is not None
            and value < (1.0 - STRAGGLER_FRACTION) * median
        )
        efficiency = value / best if value is not None and best else None
        out[name] = _replace(r, straggler=straggler, idle=_is_idle(r), efficiency=efficiency)
    return out


def _replace(rate: NodeRate, **changes: Any) -> NodeRate:
    return NodeRate(**{**asdict(rate), "losses": rate.losses, **changes})


def throughput(heartbeats: Mapping[str, Mapping[str, Any]], hourly_usd: float) -> Throughput:
    """The run's figures from one heartbeat per node ({"worker-0": heartbeat document}) at the
    run's $/h (every node's, the controller's included). Nodes without metrics are listed,
    unmeasured. Pure."""
    rates = {
        name: node_rate(name, beat.get("metrics") if isinstance(beat, Mapping) else None)
        for name, beat in heartbeats.items()
    }
    rates = _flagged(rates)
    shares = [r.examples_per_s for r in rates.values() if r.examples_per_s is not None]
    cluster = sum(shares) if shares else None
    steps_per_epoch = _first_int(heartbeats, "steps_per_epoch")
    epochs = [r.epoch_seconds for r in rates.values() if r.epoch_seconds is not None]
    epoch_seconds = max(epochs) if epochs else None
    if epoch_seconds is None and steps_per_epoch:
        steps = [r.steps_per_s for r in rates.values() if r.steps_per_s]
        if steps:
            epoch_seconds = steps_per_epoch / min(steps)  # the slowest node paces the cluster
    return Throughput(rates, cluster, epoch_seconds, steps_per_epoch, hourly_usd)


def of_attempt(
    heartbeats: Mapping[str, Mapping[str, Any]], attempt: int, hourly_usd: float
) -> Throughput:
    """`throughput` of the nodes whose latest heartbeat is of `attempt` (a lost node's last
    beat from an earlier attempt does not count). Pure."""
    current = {k: v for k, v in heartbeats.items() if v.get("attempt") == attempt}
    return throughput(current, hourly_usd)


def _first_int(heartbeats: Mapping[str, Mapping[str, Any]], key: str) -> int | None:
    for beat in heartbeats.values():
        metrics = beat.get("metrics") if isinstance(beat, Mapping) else None
        value = _number((metrics or {}).get(key))
        if value is not None and value > 0:
            return int(value)
    return None


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: tuple[float, ...] | list[float], width: int = 16) -> str:
    """The last `width` finite values as block characters, lowest to highest ('' for none);
    other values are left out. Pure."""
    tail = [x for x in (finite(v) for v in list(values)[-width:]) if x is not None]
    if not tail:
        return ""
    low, high = min(tail) / 2, max(tail) / 2  # halves: their difference cannot overflow
    span = high - low
    if span <= 0:
        return SPARKS[len(SPARKS) // 2] * len(tail)
    top = len(SPARKS) - 1
    return "".join(SPARKS[min(max(round((v / 2 - low) / span * top), 0), top)] for v in tail)


def fmt_rate(value: float | None) -> str:
    """'1,234/s', '12.3/s', '1.23e+15/s' (at most 12 characters before '/s'), or '-' for no
    finite number. Pure."""
    number = finite(value)
    if number is None:
        return "-"
    return f"{figure(number, ',.0f' if abs(number) >= 100 else '.1f')}/s"
