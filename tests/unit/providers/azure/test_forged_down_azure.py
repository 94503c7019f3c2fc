"""`down` never deletes what is not the run's (issue 29), on Azure through the real azure-mgmt
clients on the ARM fake: a name in the run's ledger (a forged or stale record) that is not the
run's resource group, NSG, VNet or controller role assignment is refused, never deleted, while
the run's own are. A group, NSG or VNet must carry the run's `cloudtrain-run` tag (read from ARM
first) under the run's name; a role assignment (no tags) must have the id the run's id derives
at a scope of the run.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import NotTheRuns
from cloudtrain.providers.azure import controller_identity as ctl
from cloudtrain.providers.azure.account import default_container_scope, run_container
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.base import Resource
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azure_config, azurite, azurite_session
from tests.unit.providers.azure.test_azure_compute import GROUP, RUN, STORE, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
REGION = "eastus"
OTHER = "other-def456"
OWNER = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"


@pytest.fixture
def provider(azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch) -> AzureProvider:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", raising=False)
    made = AzureProvider(azure_config(REGION))
    made.store(STORE).ensure_bucket()
    return made


def principal() -> str:
    return str(uuid.uuid4())


def groups(cloud: AzureCloud) -> set[str]:
    return {g["name"] for g in cloud.arm.groups()}


def assignments(cloud: AzureCloud) -> set[str]:
    return {a["id"].lower() for a in cloud.arm.role_assignments()}


def res(kind: str, name: str) -> Resource:
    return Resource("azure", kind, name, REGION, RUN)


def owner_at_subscription(compute: AzureCompute) -> str:
    """A user's Owner assignment at the subscription (a random name, as the portal makes)."""
    scope = f"/subscriptions/{compute.subscription}"
    body = ctl.body(compute.subscription, OWNER, principal(), "x", False)
    body["properties"]["principalType"] = "User"
    del body["properties"]["description"]
    made = compute.clients.authorization.role_assignments.create(scope, str(uuid.uuid4()), body)
    return str(made.id)


def test_teardown_leaves_foreign_groups_and_assignments_its_ledger_names(
    provider: AzureProvider, azure_cloud: AzureCloud, tmp_path: Path
) -> None:
    from cloudtrain.run.teardown import teardown
    from cloudtrain.state.ledger import Ledger

    compute = provider.compute
    assert isinstance(compute, AzureCompute)
    compute.ensure_network(run_info())
    container = default_container_scope(compute.subscription, REGION, run_container(RUN))
    own = ctl.grant(compute.clients, RUN, GROUP, container, principal())
    clients = compute.clients.resource.resource_groups
    clients.create_or_update("prod-rg", {"location": REGION})
    other_group = f"cloudtrain-{OTHER}"
    clients.create_or_update(other_group, {"location": REGION, "tags": {"cloudtrain-run": OTHER}})
    other_container = default_container_scope(compute.subscription, REGION, run_container(OTHER))
    others = ctl.grant(compute.clients, OTHER, other_group, other_container, principal())
    owner = owner_at_subscription(compute)
    foreign = [
        res("resource-group", "prod-rg"),
        res("resource-group", other_group),
        res(ctl.KIND, owner),
        *(res(ctl.KIND, r.id) for r in others),
    ]
    led = Ledger(tmp_path / "ledger.db")
    led.create_run(RUN, "unit", "azure", REGION, None, None, STORE, None)
    for r in [*compute.planned_network(run_info()), *own, *foreign]:
        led.record_intent(r)
    said: list[str] = []
    report = teardown(provider, led, RUN, said.append)

    assert {"prod-rg", other_group} <= groups(azure_cloud), said
    assert GROUP not in groups(azure_cloud)
    held = assignments(azure_cloud)
    assert owner.lower() in held
    assert {r.id.lower() for r in others} <= held, "another run's controller grants"
    assert not {r.id.lower() for r in own} & held, "the run's own controller grants went"
    refused = " ".join(e.message for e in led.events(RUN) if e.kind == "refused")
    for r in foreign:
        assert r.id in refused, (r, refused)
    assert f"resource-group/{GROUP}" in report.resources_deleted
    assert not any("prod-rg" in d for d in report.resources_deleted)
    live = {(r.kind, r.resource_id) for r in led.resources(RUN, live_only=True)}
    assert not live & {(r.kind, r.id) for r in foreign}, "refused rows leave the run's record"
    assert teardown(provider, led, RUN, said.append).resources_deleted == []


def test_the_runs_group_name_on_a_group_not_tagged_for_it_is_refused(
    provider: AzureProvider, azure_cloud: AzureCloud
) -> None:
    compute = provider.compute
    ops = compute.clients.resource.resource_groups  # type: ignore[attr-defined]
    ops.create_or_update(GROUP, {"location": REGION, "tags": {"cloudtrain-run": OTHER}})
    with pytest.raises(NotTheRuns) as refused:
        compute.delete_resources([res("resource-group", GROUP)])
    assert refused.value.refused == (("resource-group", GROUP),)
    assert OTHER in refused.value.message
    assert GROUP in groups(azure_cloud)
    ops.create_or_update(GROUP, {"location": REGION})  # no tag at all
    with pytest.raises(NotTheRuns):
        compute.delete_resources([res("resource-group", GROUP)])
    assert GROUP in groups(azure_cloud)


def _nsg(compute: Any, group: str, name: str, **tags: str) -> None:
    ops = compute.clients.network.network_security_groups
    ops.begin_create_or_update(group, name, {"location": REGION, "tags": tags}).result()


def _vnet(compute: Any, group: str, name: str, **tags: str) -> None:
    body = {
        "location": REGION,
        "tags": tags,
        "properties": {"addressSpace": {"addressPrefixes": ["10.9.0.0/16"]}},
    }
    compute.clients.network.virtual_networks.begin_create_or_update(group, name, body).result()


def test_in_a_users_group_a_foreign_nsg_vnet_or_the_group_itself_is_refused(
    azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    provider = AzureProvider(azure_config(REGION, resource_group="team-ml"))
    provider.store(STORE).ensure_bucket()
    compute = provider.compute
    compute.clients.resource.resource_groups.create_or_update(  # type: ignore[attr-defined]
        "team-ml", {"location": REGION}
    )
    made = compute.ensure_network(run_info())
    assert sorted(r.kind for r in made) == ["nsg", "vnet"]
    _nsg(compute, "team-ml", "prod-nsg")
    _vnet(compute, "team-ml", "prod-vnet", **{"cloudtrain-run": RUN})  # tagged, not its name
    forged = [
        res("nsg", "prod-nsg"),
        res("vnet", "prod-vnet"),
        res("resource-group", "team-ml"),
        res("resource-group", "prod-rg"),
    ]
    with pytest.raises(NotTheRuns) as refused:
        compute.delete_resources(made + forged)
    assert set(refused.value.refused) == {(r.kind, r.id) for r in forged}
    left = {r["name"] for r in azure_cloud.arm.resources(group="team-ml")}
    assert left == {"prod-nsg", "prod-vnet"}, "the run's own NSG and VNet went"
    assert "team-ml" in groups(azure_cloud)


def test_the_runs_nsg_name_tagged_for_another_run_is_refused(
    azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    compute = AzureProvider(azure_config(REGION, resource_group="team-ml")).compute
    compute.clients.resource.resource_groups.create_or_update(  # type: ignore[attr-defined]
        "team-ml", {"location": REGION}
    )
    _nsg(compute, "team-ml", f"ct-{RUN}-nsg", **{"cloudtrain-run": OTHER})
    _vnet(compute, "team-ml", f"ct-{RUN}-vnet")
    with pytest.raises(NotTheRuns) as refused:
        compute.delete_resources([res("nsg", f"ct-{RUN}-nsg"), res("vnet", f"ct-{RUN}-vnet")])
    assert len(refused.value.refused) == 2
    left = {r["name"] for r in azure_cloud.arm.resources(group="team-ml")}
    assert left == {f"ct-{RUN}-nsg", f"ct-{RUN}-vnet"}
