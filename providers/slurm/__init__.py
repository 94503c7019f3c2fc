"""The Slurm provider (issue 33): a cluster a team owns, reached over SSH through its login
host, running the cluster's own commands (sbatch, squeue, sacct, scancel, sinfo) and Python.
Nothing is installed on the cluster by an administrator.

This file holds only `INFO`, what the registry reads; it imports nothing heavy. The modules:
`login` (a command on the login host, each failure one clear error), `cluster` (partitions,
GPUs free and in all, Slurm's start estimate), `jobs` (one gang allocation per attempt: submit,
state, cancel, find), `compute` (SlurmCompute, a gang compute), `storage` (the bucket: a folder
on the shared filesystem, slurm:///PATH), `folder_serve` (that folder's operations, run on the
cluster by the controller), `offers` (the plan's live offers and notes), `options`
(SlurmOptions), `times` (Slurm's times, read in UTC whatever the login host's zone),
`provider` (SlurmProvider).
"""

from __future__ import annotations

from cloudtrain.providers.info import ProviderInfo

INFO = ProviderInfo(
    name="slurm",
    display="Slurm",
    scheme="slurm",
    # a bucket in an object store the cluster reaches (provider.py: SlurmProvider.store)
    other_schemes=("s3", "gs", "az"),
    adapter="cloudtrain.providers.slurm.provider:SlurmProvider",
    options="cloudtrain.providers.slurm.options:SlurmOptions",
    storage_usd_per_gb_month=0.0,  # the cluster's own filesystem
    preemption=None,  # Slurm's preemption ends the job: the controller sees the allocation go
    pricing=None,  # no price list: an optional GPU-hour rate (providers.slurm.gpu_hour_usd)
    inventory_scope="account",  # one cluster: gc looks once
    searched_by_cheapest=False,  # `provider: cheapest` means the clouds
    catalog_zones=False,
    live_offers="cloudtrain.providers.slurm.offers:live_offers",
    ignored_fields=(
        (("cluster", "ssh"), "Slurm nodes are reached through the cluster's login host"),
        (("cluster", "image"), "Slurm nodes run the cluster's own system and Python"),
        (("cluster", "disk_gb"), "Slurm nodes use the cluster's filesystems"),
        (("cluster", "spot"), "a Slurm allocation is the cluster's own: no spot"),
        (("zone",), "a Slurm cluster has partitions, not zones"),
    ),
    may_fail_over=False,  # one cluster: there is no other place to go
)
