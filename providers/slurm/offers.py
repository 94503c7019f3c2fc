"""What a Slurm cluster offers a plan, read live through its login host (INFO.live_offers): one
row per partition and GPU count a node of it can give (a node with 4 GPUs serves 1 to 4 per
node through `--gpus-per-node`), and one without GPUs (a parameter server's), each priced at the
optional GPU-hour rate (`gpu_hour_usd`: 0 without one); and the plan's notes: the partition's
free and total GPUs (`sinfo`) and Slurm's own start estimate for the run (`sbatch
--test-only`, which submits nothing).

A row's `instance_type` and `region` are the partition: the plan's region is the partition the
run goes to (SlurmProvider reads it back). A partition whose GPUs gres.conf leaves untyped
(`gpu:2`) offers them under the accelerator the spec asks for: the cluster does not say, the
user knows it. Rows are plain dicts with the catalog's Offer fields (providers sit below the
catalog: cloudtrain/plan/live_offers.py makes them Offers).
"""

from __future__ import annotations

import datetime
from typing import Any

from cloudtrain.core.errors import PlanError, ProviderError
from cloudtrain.providers.base import ProviderConfig
from cloudtrain.providers.slurm.cluster import Partition, read_partitions, start_estimate
from cloudtrain.providers.slurm.times import shown

UNTYPED = "GPU"  # how an untyped GPU is named when the spec names none


def _row(partition: Partition, gpus: int, accelerator: str | None, rate: float) -> dict[str, Any]:
    price = round(rate * gpus, 6)
    return {
        "provider": "slurm",
        "instance_type": partition.name,
        "accelerator": accelerator if gpus else None,
        "accelerator_count": gpus,
        "vcpus": None,
        "memory_gib": None,
        "region": partition.name,
        "zone": None,
        "price_hourly": price,
        "spot_price_hourly": None,
        "prices_date": datetime.date.today().isoformat(),
        "source": f"Slurm partition {partition.name} (sinfo)",
    }


def live_offers(
    config: ProviderConfig, accelerator: str | None, nodes: int, gpus: int, hours: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """The cluster's rows and the plan's notes for `nodes` nodes of `gpus` GPUs each for
    `hours`. Blocks (ssh: sinfo, and sbatch --test-only for the partition the run would go
    to); submits nothing. Raises PlanError when the cluster has no such partition, or when
    Slurm says no node of it could ever run the job (a partition without GPUs asked for some);
    CredentialsError or ProviderError when the login host cannot be used."""
    from cloudtrain.providers.slurm.provider import SlurmProvider

    provider = SlurmProvider(config)
    login = provider.login_host()
    partitions = read_partitions(login)
    wanted = config.option("partition")
    if wanted is not None and wanted not in {p.name for p in partitions}:
        names = ", ".join(p.name for p in partitions) or "none"
        raise PlanError(f"the cluster has no partition {wanted!r} (its partitions: {names})")
    chosen = [p for p in partitions if p.name == wanted] if wanted else partitions
    rate = float(config.option("gpu_hour_usd", 0.0))
    rows: list[dict[str, Any]] = []
    for partition in chosen:
        typed = partition.gpu_type.upper() if partition.gpu_type else None
        name = typed or accelerator or UNTYPED
        rows.append(_row(partition, 0, None, rate))
        rows += [_row(partition, n, name, rate) for n in range(1, partition.gpus_per_node + 1)]
    target = next((p for p in chosen if p.default), chosen[0] if chosen else None)
    notes = [] if rate else ["no providers.slurm.gpu_hour_usd: the cluster's GPU-hours cost $0"]
    if target is None:
        return rows, notes
    notes.append(
        f"Slurm partition {target.name}: {target.gpus_free} of {target.gpus} GPUs free, "
        f"{target.nodes_taking_jobs} of {target.nodes} nodes taking jobs"
    )
    if gpus > target.gpus_per_node:
        asked = f"{accelerator} x{gpus}" if accelerator else f"{gpus} GPU(s)"
        raise PlanError(
            f"Slurm partition {target.name}'s nodes have {target.gpus_per_node} GPU(s) at most;"
            f" the job asks {asked} per node",
            hint="choose a partition with GPUs (providers.slurm.partition) or fewer GPUs",
        )
    minutes = max(1, int(hours * 60))
    try:
        estimate = start_estimate(login, target.name, nodes, gpus, minutes)
    except ProviderError as exc:
        if exc.codes & {"host-key", "key-refused", "unreachable", "not-found"}:
            raise
        raise PlanError(
            f"Slurm refuses {nodes} node(s) with {gpus} GPU(s) each for {minutes} min in "
            f"partition {target.name}: {exc.message}",
            hint="choose another partition (providers.slurm.partition) or fewer GPUs or nodes",
        ) from exc
    when = shown(estimate.start) if estimate.start else "an unknown time"
    notes.append(f"Slurm's estimate: the job would start at {when} on {estimate.nodes}")
    return rows, notes
