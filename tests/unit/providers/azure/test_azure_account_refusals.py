"""What the stingy Azure box refuses a real create, in Azure's shapes, and what cloudtrain makes
of it: AzureCompute through the real azure-mgmt clients against the ARM fake's account
(tests/fakes/azure_account.py).

- over a quota: 409 OperationNotAllowed, synchronous, nothing stored -> QuotaError naming the
  quota and the region (a family, Total Regional Cores, LowPriorityCores for Spot);
- a sold-out zone: the create's operation fails ZonalAllocationFailed -> NoCapacityError naming
  the zone, every time until the test restores it; a size not offered: SkuNotAvailable;
- a caller without `Microsoft.Compute/virtualMachines/write`: 403 AuthorizationFailed naming it,
  which `missing_rights()` names first -> a CredentialsError whose message names the right.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from azure.core.exceptions import HttpResponseError

from cloudtrain.core.errors import CredentialsError, NoCapacityError, QuotaError
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.errors import error_codes
from cloudtrain.providers.azure.provider import AzureProvider
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azurite, azurite_session
from tests.unit.providers.azure.test_azure_account import provider
from tests.unit.providers.azure.test_azure_compute import RUN, request, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session", "provider"]  # fixtures, for pytest
T4_FAMILY = "standardNCASv3_T4Family"
VM_WRITE = "Microsoft.Compute/virtualMachines/write"


@pytest.fixture
def compute(provider: AzureProvider) -> Iterator[AzureCompute]:
    provider.store(f"az://devstoreaccount1/ct-{RUN}").ensure_bucket()
    provider.compute.ensure_network(run_info())
    yield provider.compute


def vms(cloud: AzureCloud) -> list[dict]:
    return cloud.arm.resources(kind="virtualMachines")


def regular(index: int = 0):  # a regular (not Spot) T4 node
    return replace(request(index), spot=False)


def sdk_error(err: BaseException) -> HttpResponseError:
    cause = err.__cause__
    assert isinstance(cause, HttpResponseError), cause
    return cause


def test_a_create_over_a_family_quota_is_refused_naming_it(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    azure_cloud.arm.account.set_quota("eastus", T4_FAMILY, 0)
    with pytest.raises(QuotaError) as refused:
        compute.create_node(run_info(), regular())
    cause = sdk_error(refused.value)
    assert (cause.status_code, cause.error.code) == (409, "OperationNotAllowed")
    assert f"exceeding approved {T4_FAMILY} Cores quota" in cause.error.message
    assert "Current Limit: 0, Current Usage: 0, Additional Required: 4" in cause.error.message
    assert T4_FAMILY in refused.value.message and "eastus" in str(refused.value.hint)
    assert vms(azure_cloud) == [], "refused synchronously: nothing stored"


def test_regional_and_spot_quotas_count_what_runs(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    account = azure_cloud.arm.account
    account.set_quota("eastus", "cores", 6)
    compute.create_node(run_info(), regular(0))  # 4 of 6 regional vCPUs
    with pytest.raises(QuotaError, match="Total Regional Cores") as regional:
        compute.create_node(run_info(), regular(1))
    assert "Current Limit: 6, Current Usage: 4" in sdk_error(regional.value).error.message
    account.set_quota("eastus", "lowPriorityCores", 0)
    with pytest.raises(QuotaError, match="LowPriorityCores"):
        compute.create_node(run_info(), request(2))  # Spot: not the family, not cores
    account.set_quota("eastus", "lowPriorityCores", 4)
    assert compute.create_node(run_info(), request(2)).spot
    assert account.usage("eastus", "lowPriorityCores") == 4
    assert account.usage("eastus", "cores") == 4 and account.usage("eastus", T4_FAMILY) == 4


def test_a_sold_out_zone_refuses_every_create_until_restored(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    account = azure_cloud.arm.account
    account.sell_out("eastus", "2")
    for _ in range(2):
        with pytest.raises(NoCapacityError) as refused:
            compute.create_node(run_info("2"), request(0))
        assert refused.value.zone == "2" and "zone 2" in refused.value.message
        assert "ZonalAllocationFailed" in error_codes(refused.value)
        compute.delete_listed(compute.list_nodes(RUN))
    assert compute.create_node(run_info("1"), request(1)).state == "running", "zone 1 has some"
    account.restore("eastus", "2")
    assert compute.create_node(run_info("2"), request(0)).state == "running"
    account.sell_out("eastus")
    with pytest.raises(NoCapacityError) as regional:
        compute.create_node(run_info("3"), request(3))
    assert regional.value.zone == "3"


def test_a_size_not_offered_is_sku_not_available(
    compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    azure_cloud.arm.account.withdraw("eastus", "Standard_NC4as_T4_v3")
    with pytest.raises(NoCapacityError) as refused:
        compute.create_node(run_info("1"), request(0))
    assert "SkuNotAvailable" in error_codes(refused.value)
    assert vms(azure_cloud) == []


def test_a_missing_right_is_named_by_the_probe_and_the_refusal(
    provider: AzureProvider, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    azure_cloud.arm.account.deny(VM_WRITE)
    probe = provider.account_probe()
    assert probe is not None and probe.missing_rights() == [VM_WRITE]
    with pytest.raises(CredentialsError) as refused:
        compute.create_node(run_info(), request(0))
    cause = sdk_error(refused.value)
    assert (cause.status_code, cause.error.code) == (403, "AuthorizationFailed")
    assert f"does not have authorization to perform action '{VM_WRITE}'" in cause.error.message
    assert f"lacks permission {VM_WRITE}" in refused.value.message
    assert vms(azure_cloud) == []
