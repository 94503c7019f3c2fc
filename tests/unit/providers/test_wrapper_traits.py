"""Every wrapper of a compute (the retry layer, the fault injector, the lease's fence) shows the
traits of the compute it wraps (`Compute.TRAITS`): the orchestrator reads them through all
three, so a gang compute (Slurm) read as a per-node one would have its queued nodes judged lost
and its nodes recreated one at a time."""

from __future__ import annotations

from pathlib import Path

from cloudtrain.providers.base import Compute
from cloudtrain.providers.faults import FaultPlan, FaultyCompute
from cloudtrain.providers.local_store import LocalStore, _path_to_uri
from cloudtrain.providers.retrying import RetryingCompute
from cloudtrain.providers.slurm.compute import SlurmCompute
from cloudtrain.providers.slurm.login import LoginHost
from cloudtrain.state.fencing import FencedCompute
from cloudtrain.state.lease import Lease


def test_every_wrapper_shows_the_wrapped_compute_s_traits(tmp_path: Path) -> None:
    inner = SlurmCompute(LoginHost("login.example.org", "ann"), "cloudtrain")
    inner.max_parallel, inner.holds_nodes_kinds = 7, frozenset({"job-folder"})
    inner.deletes_on_power_off = True  # every trait other than the base class's default
    lease = Lease(LocalStore(_path_to_uri(tmp_path / "bucket")), "job-abc123", "me")
    wrappers: list[Compute] = [
        RetryingCompute(inner),
        FaultyCompute(inner, FaultPlan()),
        FencedCompute(inner, lease),
        RetryingCompute(FaultyCompute(FencedCompute(inner, lease), FaultPlan())),
    ]
    for trait in Compute.TRAITS:  # the stand-in differs from the base class in every one
        assert getattr(inner, trait) != getattr(Compute, trait), trait
    for wrapper in wrappers:
        for trait in Compute.TRAITS:
            assert getattr(wrapper, trait) == getattr(inner, trait), (type(wrapper), trait)
