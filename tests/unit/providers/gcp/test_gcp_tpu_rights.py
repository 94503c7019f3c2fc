"""A TPU run's rights (controller_identity.TPU_PERMISSIONS): asked of a TPU run's caller only, and
enough for every TPU call the provider makes, as the box's TPU fake enforces them."""

from __future__ import annotations

from cloudtrain.providers.base import ProviderConfig
from cloudtrain.providers.gcp.compute import GcpCompute
from cloudtrain.providers.gcp.controller_identity import TPU_PERMISSIONS
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes.gce_fake import GceFake
from tests.fakes.tpu_access import ACT_AS, TPU_ENFORCED
from tests.fakes.tpu_fake import TpuFake
from tests.unit.providers.gcp.test_gcp_tpu import (
    PROJECT,
    REGION,
    RUN,
    compute,
    fakes,
    request,
    run_info,
)

__all__ = ["compute", "fakes"]  # fixtures, for pytest


def _probe(tpu: bool):  # type: ignore[no-untyped-def]
    return GcpProvider(ProviderConfig(name="gcp", region=REGION)).account_probe(tpu=tpu)


def test_a_tpu_runs_caller_is_asked_the_tpu_rights_and_api_a_gpu_runs_is_not(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    _, tpu = fakes
    tpu.account.deny("tpu.nodes.create")
    tpu.account.deny("tpu.queuedResources.delete")
    assert _probe(tpu=True).missing_rights() == ["tpu.nodes.create", "tpu.queuedResources.delete"]
    assert _probe(tpu=False).missing_rights() == []
    tpu.account.disable()
    states = {a.name: a.ok for a in _probe(tpu=True).apis()}
    assert states["tpu.googleapis.com"] is False and states["compute.googleapis.com"]
    assert "tpu.googleapis.com" not in {a.name for a in _probe(tpu=False).apis()}


def test_the_tpu_rights_asked_are_enough_for_every_tpu_call_a_run_makes(
    compute: GcpCompute, fakes: tuple[GceFake, TpuFake]
) -> None:
    # every TPU right the fake enforces, but those asked (and actAs, a GPU run's too), denied:
    # a run's TPU VMs, on demand and spot, are still made, listed and deleted
    _, tpu = fakes
    assert set(TPU_PERMISSIONS) <= TPU_ENFORCED
    unasked = sorted(TPU_ENFORCED - set(TPU_PERMISSIONS) - {ACT_AS})
    assert "tpu.nodes.stop" in unasked  # the fake enforces more than a run uses
    for permission in unasked:
        tpu.account.deny(permission)
    made = [compute.create_node(run_info(), request(spot=spot, index=i)) for i, spot in
            enumerate((False, True))]  # fmt: skip
    assert {n.name for n in compute.list_nodes(RUN)} == {n.name for n in made}
    for node in made:
        compute.delete_node(node)
    assert tpu.nodes(PROJECT) == [] and tpu.queued_resources(PROJECT) == []
