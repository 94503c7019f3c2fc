"""The Azure account probe (providers/azure/account_probe.py) and the stingy box it asks (the ARM
fake's account: tests/fakes/azure_account.py), through the real azure-mgmt clients.

Quotas read through the compute usages API (a family at 0, a usage counted from the fake's VMs
and a scripted extra), a size the subscription is not offered, an unregistered resource
provider, the caller's rights from the permissions listing, and the credential chain's link
(the real DefaultAzureCredential, with a stand-in `az` on PATH).
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.account import QuotaNeed
from cloudtrain.providers.azure import storage
from cloudtrain.providers.azure.account_probe import AzureAccountProbe, token_claims
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.azure.run_rights import RUN_ACTIONS
from tests.fakes.azure_account import CALLER_OID, action_of
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azure_config, azurite, azurite_session
from tests.unit.providers.azure.test_azure_compute import RUN, request, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
T4 = "Standard_NC4as_T4_v3"
T4_FAMILY = "standardNCASv3_T4Family"


@pytest.fixture
def provider(azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch) -> AzureProvider:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", raising=False)
    return AzureProvider(azure_config("eastus"))


@pytest.fixture
def probe(provider: AzureProvider) -> AzureAccountProbe:
    made = provider.account_probe()
    assert isinstance(made, AzureAccountProbe)
    return made


@pytest.fixture
def compute(provider: AzureProvider) -> Iterator[AzureCompute]:
    provider.store(f"az://devstoreaccount1/ct-{RUN}").ensure_bucket()
    yield provider.compute


def need(nodes: int = 1, spot: bool = False, size: str = T4) -> QuotaNeed:
    return QuotaNeed(size, "T4", 1, 4, nodes, spot)


def by_name(lines: list) -> dict:
    return {line.quota: line for line in lines}


def test_a_family_at_zero_and_usage_counted_from_the_vms_and_a_scripted_extra(
    probe: AzureAccountProbe, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    account = azure_cloud.arm.account
    account.set_quota("eastus", T4_FAMILY, 0)
    account.set_quota("eastus", "cores", 10)
    account.add_usage("eastus", "cores", 2)
    lines = by_name(probe.quotas("eastus", [need(nodes=2)]))
    assert set(lines) == {T4_FAMILY, "cores"}
    family, cores = lines[T4_FAMILY], lines["cores"]
    assert (family.limit, family.usage, family.need, family.fits) == (0, 0, 8, False)
    assert (cores.limit, cores.usage, cores.need, cores.fits) == (10, 2, 8, True)
    assert family.unit == "vCPU" and family.region == "eastus"

    account.set_quota("eastus", "lowPriorityCores", 12)
    compute.ensure_network(run_info())
    compute.create_node(run_info(), request(0))  # a Spot T4: 4 low-priority vCPUs
    spot = by_name(probe.quotas("eastus", [need(nodes=2, spot=True)]))
    assert set(spot) == {"lowPriorityCores"}, "Spot counts against lowPriorityCores only"
    assert (spot["lowPriorityCores"].usage, spot["lowPriorityCores"].fits) == (4, True)
    assert account.usage("eastus", T4_FAMILY) == 0 and account.usage("eastus", "cores") == 2
    regular = by_name(probe.quotas("westus2", [need()]))
    assert regular[T4_FAMILY].limit > 0 and regular[T4_FAMILY].usage == 0, "another region"
    assert probe.quotas("eastus", []) == []


def test_a_size_not_offered_is_a_quota_of_zero(
    probe: AzureAccountProbe, azure_cloud: AzureCloud
) -> None:
    azure_cloud.arm.account.withdraw("eastus", T4)
    lines = by_name(probe.quotas("eastus", [need(spot=True)]))
    withheld = lines[f"{T4} (not offered in eastus)"]
    assert (withheld.limit, withheld.fits) == (0, False)
    assert lines["lowPriorityCores"].fits
    assert f"{T4} (not offered in westus2)" not in by_name(probe.quotas("westus2", [need()]))


def test_apis_are_the_registered_resource_providers(
    probe: AzureAccountProbe, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    assert [(a.name, a.ok) for a in probe.apis()] == [
        ("Microsoft.Compute", True),
        ("Microsoft.Network", True),
        ("Microsoft.Storage", True),
    ]
    azure_cloud.arm.account.unregister("Microsoft.Compute")
    compute_api = probe.apis()[0]
    assert not compute_api.ok and "az provider register --namespace Microsoft.Compute" in (
        compute_api.detail
    )
    compute.ensure_network(run_info())
    with pytest.raises(ProviderError, match="MissingSubscriptionRegistration") as refused:
        compute.create_node(run_info(), request(0))
    assert "az provider register --namespace Microsoft.Compute" in str(refused.value.hint)


def test_missing_rights_come_from_the_callers_permissions(
    probe: AzureAccountProbe, azure_cloud: AzureCloud
) -> None:
    account = azure_cloud.arm.account
    assert probe.missing_rights() == []
    account.deny("Microsoft.Compute/virtualMachines/write")
    assert probe.missing_rights() == ["Microsoft.Compute/virtualMachines/write"]
    account.allow_only("*/read")
    missing = probe.missing_rights()
    assert "Microsoft.Compute/virtualMachines/write" in missing
    assert not [m for m in missing if m.endswith("/read")]
    account.allow_only("Microsoft.Compute/*", "Microsoft.Network/*")
    missing = probe.missing_rights()
    assert missing and all(
        m.split("/")[0] not in ("Microsoft.Compute", "Microsoft.Network") for m in missing
    )


def test_a_run_needs_no_right_outside_the_list(
    provider: AzureProvider, compute: AzureCompute, azure_cloud: AzureCloud
) -> None:
    """Only RUN_ACTIONS held: a node's whole life goes through, and every action the fake
    derived from the adapter's requests is listed (so `missing_rights` can name it)."""
    azure_cloud.arm.account.allow_only(*RUN_ACTIONS)
    assert provider.account_probe().missing_rights() == []
    compute.ensure_network(run_info())
    compute.create_nodes(run_info(), [request(0), request(1)])
    compute.console_output(compute.list_nodes(RUN)[0])
    left = compute.list_resources(RUN)
    compute.delete_nodes(RUN)
    compute.delete_resources(left)
    arm = [r.split("?")[0].split(" ", 1) for r in azure_cloud.arm.requests]
    used = {action_of(method, path) for method, path in arm if path.startswith("/subscriptions/")}
    listed = {a.lower() for a in RUN_ACTIONS}
    polls = ("/operations/", "/asyncoperations/", "/operationresults/", "/permissions/")
    unlisted = {
        a for a in used if a.lower() not in listed and not any(p in a.lower() for p in polls)
    }
    assert not unlisted, unlisted


def test_rights_are_asked_at_the_subscription_of_a_new_account(
    probe: AzureAccountProbe, azure_cloud: AzureCloud
) -> None:
    """A new subscription has no resource group to ask at: the probe asks at the subscription,
    and the permissions it reads there are the ones the fake refuses by."""
    assert azure_cloud.arm.groups() == []
    azure_cloud.arm.account.deny("Microsoft.Authorization/roleDefinitions/write")
    assert probe.missing_rights() == ["Microsoft.Authorization/roleDefinitions/write"]
    (asked,) = [r for r in azure_cloud.arm.requests if "/permissions" in r]
    # another role that holds it: Azure subtracts a role's NotActions from that role only
    azure_cloud.arm.account.grant("Microsoft.Authorization/roleDefinitions/*")
    assert probe.missing_rights() == [], "the second role's page is read too"
    sub = azure_cloud.subscription
    assert asked.startswith(f"GET /subscriptions/{sub}/providers/Microsoft.Authorization/")


def _jwt(claims: dict) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.sig"


def test_the_chains_link_and_the_principal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real DefaultAzureCredential, asked to use the Azure CLI (AZURE_TOKEN_CREDENTIALS,
    azure-identity's own switch), whose `az` here prints a token as `az account
    get-access-token --output json` does."""
    az = tmp_path / "az"
    answer = {"accessToken": _jwt({"oid": CALLER_OID}), "expires_on": 4102444800}
    az.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    az.chmod(az.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "AzureCliCredential")
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "8f0c9a1e-2b3d-4c5e-9f60-7a8b9c0d1e2f")
    monkeypatch.delenv("CLOUDTRAIN_ARM_ENDPOINT", raising=False)
    monkeypatch.setattr(storage, "_CREDENTIALS", {})
    found = AzureProvider(azure_config("eastus")).account_probe()
    assert found is not None
    source = found.credentials()
    assert source.source == "Azure CLI (az login)"
    assert (source.principal, source.account) == (
        CALLER_OID,
        "8f0c9a1e-2b3d-4c5e-9f60-7a8b9c0d1e2f",
    )
    assert "accessToken" not in repr(source) and answer["accessToken"] not in repr(source)


def test_token_claims_of_other_tokens_are_empty() -> None:
    assert token_claims("cloudtrain-offline-token") == {}
    assert token_claims("a.!!!.c") == {}
    assert token_claims(_jwt({"oid": "x"})) == {"oid": "x"}
