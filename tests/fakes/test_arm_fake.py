"""The ARM fake (tests/fakes/arm_fake.py), driven only through the real azure-mgmt clients.

These tests also pin down how the SDKs expose the fake's answers, which an Azure adapter relies
on: LROs complete with `begin_...(polling_interval=0).result()`, errors are
`azure.core.exceptions.HttpResponseError` (ResourceNotFoundError for 404, ResourceExistsError
for 409) with `.error.code`, and a resource group delete takes its resources with it. This file
covers transport, resource groups and LROs; test_arm_fake_network.py networking and role
assignments; test_arm_fake_compute.py VMs and their scripted failures;
test_arm_fake_extras.py boot diagnostics, extensions and storage.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("azure.mgmt.compute")
pytest.importorskip("trustme")
from azure.core import PipelineClient
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.core.rest import HttpRequest
from azure.mgmt.resource.resources import ResourceManagementClient

from tests.fakes.arm_fake import ArmFake, arm_fake, start_arm_fake
from tests.fakes.arm_testkit import LOCATION, SUB, ArmClients, az, az0, build_network, loopback_only

__all__ = ["arm_fake", "az", "az0", "loopback_only"]  # fixtures used by this module
pytestmark = pytest.mark.usefixtures("loopback_only")

RG = "ct-run-1"


# -- transport ---------------------------------------------------------------------------------


def test_https_with_a_ca_of_its_own_removed_on_stop() -> None:
    fake = start_arm_fake()
    try:
        assert fake.url.startswith("https://127.0.0.1:")
        with open(fake.ca_path) as pem:
            assert pem.read().startswith("-----BEGIN CERTIFICATE-----")
        token = fake.credential().get_token("https://management.azure.com/.default")
        assert token.token and token.expires_on > 0
        untrusting = ResourceManagementClient(
            fake.credential(), SUB, base_url=fake.url, retry_total=0
        )
        with pytest.raises(ServiceRequestError):
            list(untrusting.resource_groups.list())
        assert list(ArmClients(fake).resource.resource_groups.list()) == []
    finally:
        fake.stop()
    assert not os.path.exists(fake.ca_path)


def test_api_version_and_bearer_token_are_required(arm_fake: ArmFake, az0: ArmClients) -> None:
    answer = az0.resource.send_request(
        HttpRequest("GET", f"{arm_fake.url}/subscriptions/{SUB}/resourcegroups")
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "MissingApiVersionParameter"
    answer = az0.resource.send_request(
        HttpRequest("GET", f"{arm_fake.url}/subscriptions/{SUB}/resourcegroups?api-version=latest")
    )
    assert answer.json()["error"]["code"] == "InvalidApiVersionParameter"
    anonymous = PipelineClient(arm_fake.url, connection_verify=arm_fake.ca_path)
    request = HttpRequest(
        "GET", f"{arm_fake.url}/subscriptions/{SUB}/resourcegroups?api-version=2025-04-01"
    )
    answer = anonymous.send_request(request)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "AuthenticationFailed"
    anonymous.close()


def test_unknown_paths_answer_in_arms_shape(az0: ArmClients) -> None:
    with pytest.raises(HttpResponseError) as caught:
        list(az0.compute.virtual_machine_scale_sets.list_all())
    assert caught.value.status_code == 404
    assert caught.value.error.code == "InvalidResourceType"


def test_throttling_is_retried_or_surfaces_with_retry_after(
    arm_fake: ArmFake, az: ArmClients, az0: ArmClients
) -> None:
    az.group(RG)
    arm_fake.throttle_next(1)
    assert az.resource.resource_groups.get(RG).name == RG  # retried at once (Retry-After: 0)
    arm_fake.throttle_next(1, status=503)
    with pytest.raises(HttpResponseError) as caught:
        az0.resource.resource_groups.get(RG)
    assert caught.value.status_code == 503
    assert caught.value.error.code == "ServiceUnavailable"
    assert caught.value.response.headers["Retry-After"] == "0"
    arm_fake.throttle_next(1)
    with pytest.raises(HttpResponseError) as caught:
        az0.resource.resource_groups.get(RG)
    assert caught.value.status_code == 429
    assert caught.value.error.code == "TooManyRequests"


# -- resource groups ---------------------------------------------------------------------------


def test_group_create_get_update_and_head(az: ArmClients, az0: ArmClients) -> None:
    created = az.group(RG, **{"cloudtrain-run": "run-1"})
    assert created.id == f"/subscriptions/{SUB}/resourceGroups/{RG}"
    assert created.location == LOCATION
    assert created.properties.provisioning_state == "Succeeded"
    az.group(RG, **{"cloudtrain-run": "run-1", "owner": "me"})
    got = az.resource.resource_groups.get(RG.upper())  # names are case-insensitive
    assert got.name == RG and got.tags == {"cloudtrain-run": "run-1", "owner": "me"}
    patched = az.resource.resource_groups.update(RG, {"tags": {"owner": "you"}})
    assert patched.tags == {"owner": "you"} and patched.location == LOCATION
    assert az.resource.resource_groups.check_existence(RG) is True
    assert az.resource.resource_groups.check_existence("nope") is False
    with pytest.raises(ResourceNotFoundError) as caught:
        az0.resource.resource_groups.get("nope")
    assert caught.value.error.code == "ResourceGroupNotFound"
    with pytest.raises(ResourceExistsError) as caught:
        az0.group(RG, location="westus2")
    assert caught.value.error.code == "InvalidResourceGroupLocation"
    with pytest.raises(HttpResponseError) as caught:
        az0.resource.resource_groups.create_or_update("g2", {"tags": {}})
    assert caught.value.status_code == 400
    assert caught.value.error.code == "LocationRequired"


def test_groups_filtered_by_tag(arm_fake: ArmFake, az: ArmClients, az0: ArmClients) -> None:
    az.group("ct-a", **{"cloudtrain-run": "a"})
    az.group("ct-b", **{"cloudtrain-run": "b"})
    az.group("other")
    groups = az.resource.resource_groups

    def names(flt: str) -> list[str]:
        return [g.name for g in groups.list(filter=flt)]

    assert names("tagName eq 'cloudtrain-run' and tagValue eq 'b'") == ["ct-b"]
    assert names("tagName eq 'cloudtrain-run'") == ["ct-a", "ct-b"]
    assert [g.name for g in groups.list()] == ["ct-a", "ct-b", "other"]
    assert "tagName eq 'cloudtrain-run'" in arm_fake.requests[-2].replace("%20", " ").replace(
        "%27", "'"
    )
    with pytest.raises(HttpResponseError) as caught:
        list(az0.resource.resource_groups.list(filter="location eq 'eastus'"))
    assert caught.value.error.code == "InvalidFilterInQueryString"


def test_generic_resource_lists_filter_by_tag_and_type(az: ArmClients) -> None:
    build_network(az, RG)
    az.group("ct-other")
    every = [r.type for r in az.resource.resources.list_by_resource_group(RG)]
    assert "Microsoft.Network/networkInterfaces" in every and len(every) == 4
    nics = az.resource.resources.list(
        filter="resourceType eq 'Microsoft.Network/networkInterfaces'"
    )
    assert [r.name for r in nics] == ["nic-0"]
    tagged = az.resource.resources.list(filter="tagName eq 'cloudtrain-run'")
    assert list(tagged) == []


def test_group_delete_is_a_location_lro_that_takes_everything(
    arm_fake: ArmFake, az: ArmClients
) -> None:
    build_network(az, RG)
    scope = f"/subscriptions/{SUB}/resourceGroups/{RG}"
    az.auth.role_assignments.create(
        scope,
        "7d3b2c1a-0f9e-4d8c-b7a6-5e4d3c2b1a09",
        {
            "properties": {
                "roleDefinitionId": az.role_definition(),
                "principalId": "4f6e8d0c-1b3a-4c5e-8f7a-9b0c1d2e3f40",
            }
        },
    )
    az.group("keep")
    arm_fake.lro_polls = 2
    poller = az.resource.resource_groups.begin_delete(RG, polling=False)
    assert az.resource.resource_groups.get(RG).properties.provisioning_state == "Deleting"
    assert len(arm_fake.resources(group=RG)) == 4
    with pytest.raises(HttpResponseError) as caught:
        ArmClients(arm_fake, retry_total=0).group(RG)
    assert caught.value.error.code == "ResourceGroupBeingDeleted"
    assert poller.done()  # polling=False: nothing waited
    az.resource.resource_groups.begin_delete(RG).result()
    assert [g["name"] for g in arm_fake.groups()] == ["keep"]
    assert arm_fake.resources() == [] and arm_fake.role_assignments() == []
    polls = [r for r in arm_fake.requests if "/operationresults/" in r]
    assert len(polls) >= 3  # InProgress twice (202), then 200
    with pytest.raises(ResourceNotFoundError):
        ArmClients(arm_fake, retry_total=0).resource.resource_groups.begin_delete(RG)


# -- LROs ----------------------------------------------------------------------------------------


def test_put_is_an_async_operation_lro(arm_fake: ArmFake, az: ArmClients) -> None:
    az.group(RG)
    arm_fake.lro_polls = 3
    body = {"location": LOCATION, "properties": {"publicIPAllocationMethod": "Static"}}
    pip = az.network.public_ip_addresses.begin_create_or_update(RG, "ip", body).result()
    assert pip.provisioning_state == "Succeeded"
    assert pip.ip_address.startswith("203.0.113.")
    log = arm_fake.requests
    polls = [r for r in log if "/providers/Microsoft.Network/locations/eastus/operations/" in r]
    assert len(polls) == 4  # 3 x InProgress, then Succeeded
    assert log[1].startswith(f"PUT /subscriptions/{SUB}/resourceGroups/{RG}/providers/")
    assert log[-1].startswith("GET ") and "/publicIPAddresses/ip?" in log[-1]
    arm_fake.lro_polls = 0
    arm_fake.reset()
    assert arm_fake.requests == [] and arm_fake.lro_polls == 1


def test_no_polling_leaves_the_resource_in_its_transitional_state(
    arm_fake: ArmFake, az: ArmClients
) -> None:
    az.group(RG)
    body = {
        "location": LOCATION,
        "properties": {"addressSpace": {"addressPrefixes": ["10.1.0.0/16"]}},
    }
    az.network.virtual_networks.begin_create_or_update(RG, "v", body, polling=False).result()
    assert az.network.virtual_networks.get(RG, "v").provisioning_state == "Updating"
    az.network.virtual_networks.begin_delete(RG, "v", polling=False).result()
    assert az.network.virtual_networks.get(RG, "v").provisioning_state == "Deleting"
    az.network.virtual_networks.begin_delete(RG, "v").result()
    assert arm_fake.resources("virtualNetworks") == []
