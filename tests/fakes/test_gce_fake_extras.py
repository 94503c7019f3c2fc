"""The GCE fake's regions and zones, list filters, `requestId` and insert field checks, driven
through google-cloud-compute's REST clients like tests/fakes/test_gce_fake.py (never `.result()`
or `.done()` on an ExtendedOperation: operations are waited on with the operations clients).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

compute_v1 = pytest.importorskip("google.cloud.compute_v1")
from google.api_core import exceptions  # noqa: E402

from tests.fakes.gce_fake import GceFake, default_service_account, gce_fake  # noqa: E402
from tests.fakes.test_gce_fake import (  # noqa: E402
    DONE,
    OTHER_ZONE,
    PROJECT,
    ZONE,
    Clients,
    gce,
    gpu_instance,
    loopback_only,
    make_instance,
)

__all__ = ["gce", "gce_fake", "loopback_only"]  # fixtures used by this module

API = "https://www.googleapis.com/compute/v1"


def zone_urls(*zones: str, project: str = PROJECT) -> list[str]:
    return [f"{API}/projects/{project}/zones/{z}" for z in zones]


# -- regions and zones ---------------------------------------------------------------------


def test_region_get_defaults(gce_fake: GceFake) -> None:
    regions = compute_v1.RegionsClient(**gce_fake.client_kwargs())
    region = regions.get(project=PROJECT, region="us-central1")
    assert region.name == "us-central1" and region.status == "UP"
    assert region.self_link == f"{API}/projects/{PROJECT}/regions/us-central1"
    assert list(region.zones) == zone_urls(*(f"us-central1-{s}" for s in "abcf"))
    assert region.kind == "compute#region" and region.id > 0
    assert region.creation_timestamp and region.description
    other = regions.get(project="other-project", region="europe-west4")
    assert list(other.zones) == zone_urls(
        "europe-west4-a", "europe-west4-b", "europe-west4-c", project="other-project"
    )
    assert other.id != region.id
    assert gce_fake.requests[0] == f"GET /compute/v1/projects/{PROJECT}/regions/us-central1"


@pytest.mark.parametrize("name", ["uscentral1", "us-central", "US-CENTRAL1", "us-central1-a"])
def test_region_unknown_format_is_not_found(gce_fake: GceFake, name: str) -> None:
    regions = compute_v1.RegionsClient(**gce_fake.client_kwargs())
    with pytest.raises(exceptions.NotFound) as info:
        regions.get(project=PROJECT, region=name)
    assert info.value.code == 404 and info.value.errors[0]["reason"] == "notFound"
    assert f"projects/{PROJECT}/regions/{name}" in info.value.message


def test_set_region_zones(gce_fake: GceFake) -> None:
    regions = compute_v1.RegionsClient(**gce_fake.client_kwargs())
    gce_fake.set_region_zones("us-east1", ["us-east1-b", "us-east1-c", "us-east1-d"])
    region = regions.get(project=PROJECT, region="us-east1")
    assert list(region.zones) == zone_urls("us-east1-b", "us-east1-c", "us-east1-d")
    gce_fake.set_region_zones("us-east1", [])
    assert list(regions.get(project=PROJECT, region="us-east1").zones) == []
    gce_fake.set_region_zones("us-east1", None)  # back to the defaults
    assert len(regions.get(project=PROJECT, region="us-east1").zones) == 3
    gce_fake.set_region_zones("us-east1", ["us-east1-d"])
    gce_fake.reset()  # forgets scripted zones too
    assert len(regions.get(project=PROJECT, region="us-east1").zones) == 3
    with pytest.raises(ValueError):
        gce_fake.set_region_zones("nowhere", ["nowhere-a"])


def test_zones_list_with_filter(gce_fake: GceFake) -> None:
    zones = compute_v1.ZonesClient(**gce_fake.client_kwargs())
    gce_fake.set_region_zones("me-central2", ["me-central2-a"])

    def names(filter_: str = "") -> list[str]:
        request = compute_v1.ListZonesRequest(project=PROJECT, filter=filter_)
        return [z.name for z in zones.list(request=request)]

    everything = names()
    assert {"us-central1-f", "europe-west4-a", "me-central2-a"} <= set(everything)
    assert names('name eq "us-central1-.*"') == [f"us-central1-{s}" for s in "abcf"]
    assert names(f'region = "{API}/projects/{PROJECT}/regions/me-central2"') == ["me-central2-a"]
    assert names("status != UP") == []
    assert names("name=us-central1-z") == []
    request = compute_v1.ListZonesRequest(project=PROJECT, filter="name = us-central1-b")
    (found,) = list(zones.list(request=request))
    assert found.status == "UP" and found.region.endswith("/regions/us-central1")
    assert found.self_link == zone_urls("us-central1-b")[0]


# -- list filters --------------------------------------------------------------------------


def firewall(name: str, tag: str) -> Any:
    return compute_v1.Firewall(
        name=name,
        network="global/networks/default",
        source_ranges=["203.0.113.7/32"],
        target_tags=[tag],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
    )


def test_firewall_list_filters(gce_fake: GceFake, gce: Clients) -> None:
    gce_fake.operation_polls_to_done = 0
    for name in ("cloudtrain-abc-ssh", "cloudtrain-abc-tb", "cloudtrain-xyz-ssh", "default-ssh"):
        gce.firewalls.insert(project=PROJECT, firewall_resource=firewall(name, name[:14]))

    def names(filter_: str) -> list[str]:
        request = compute_v1.ListFirewallsRequest(project=PROJECT, filter=filter_)
        return [r.name for r in gce.firewalls.list(request=request)]

    assert names('name eq "cloudtrain-abc-.*"') == ["cloudtrain-abc-ssh", "cloudtrain-abc-tb"]
    assert names('name = "cloudtrain-xyz-ssh"') == ["cloudtrain-xyz-ssh"]
    assert names("name = cloudtrain-abc") == []  # `=` is exact
    assert names('name ne "cloudtrain-.*"') == ["default-ssh"]
    assert names('name eq "cloudtrain-.*" AND targetTags = cloudtrain-xyz') == [
        "cloudtrain-xyz-ssh"
    ]
    assert any("filter=name" in r for r in gce_fake.requests)
    with pytest.raises(exceptions.BadRequest):
        names("name = a OR name = b")


def test_zonal_instance_list_filters(gce_fake: GceFake, gce: Clients) -> None:
    gce_fake.operation_polls_to_done = 0
    for name in ("cloudtrain-abc-0", "cloudtrain-abc-1", "cloudtrain-xyz-0"):
        gce.insert(make_instance(name))
    gce.insert(make_instance("cloudtrain-abc-9"), zone=OTHER_ZONE)
    gce_fake.set_instance_status("cloudtrain-abc-1", "TERMINATED")

    assert gce.list_names('name eq "cloudtrain-abc-.*"') == ["cloudtrain-abc-0", "cloudtrain-abc-1"]
    assert gce.list_names('name = "cloudtrain-xyz-0"') == ["cloudtrain-xyz-0"]
    assert gce.list_names("status = RUNNING") == ["cloudtrain-abc-0", "cloudtrain-xyz-0"]
    assert gce.list_names('name eq "cloudtrain-abc-.*" status != TERMINATED') == [
        "cloudtrain-abc-0"
    ]
    assert gce.list_names('name eq "cloudtrain-abc-.*"', zone=OTHER_ZONE) == ["cloudtrain-abc-9"]


# -- requestId -----------------------------------------------------------------------------


def insert_with_id(gce: Clients, inst: Any, rid: str, project: str = PROJECT) -> Any:
    request = compute_v1.InsertInstanceRequest(
        project=project, zone=ZONE, instance_resource=inst, request_id=rid
    )
    return gce.instances.insert(request=request)


def delete_with_id(gce: Clients, name: str, rid: str) -> Any:
    request = compute_v1.DeleteInstanceRequest(
        project=PROJECT, zone=ZONE, instance=name, request_id=rid
    )
    return gce.instances.delete(request=request)


def insert_rule_with_id(gce: Clients, rule: Any, rid: str) -> Any:
    request = compute_v1.InsertFirewallRequest(
        project=PROJECT, firewall_resource=rule, request_id=rid
    )
    return gce.firewalls.insert(request=request)


def delete_rule_with_id(gce: Clients, name: str, rid: str) -> Any:
    request = compute_v1.DeleteFirewallRequest(project=PROJECT, firewall=name, request_id=rid)
    return gce.firewalls.delete(request=request)


def test_instance_insert_request_id_is_idempotent(gce_fake: GceFake, gce: Clients) -> None:
    rid = str(uuid.uuid4())
    first = insert_with_id(gce, make_instance("ct-a-0"), rid)
    assert f"requestId={rid}" in gce_fake.requests[-1]
    again = insert_with_id(gce, make_instance("ct-a-0"), rid)
    assert again.name == first.name and again.status == first.status  # no 409, no new op
    done = gce.wait_zone(first.name)
    # A late retry answers the operation as it stands now, and acts no more, whatever its body.
    late = insert_with_id(gce, make_instance("ct-a-1"), rid)
    assert late.name == first.name and late.status == DONE and late.target_id == done.target_id
    assert [i["name"] for i in gce_fake.instances()] == ["ct-a-0"]
    assert len(gce_fake.operations()) == 1

    # Another request id acts (and conflicts); the same id in another project is another request.
    with pytest.raises(exceptions.Conflict):
        insert_with_id(gce, make_instance("ct-a-0"), str(uuid.uuid4()))
    other = insert_with_id(gce, make_instance("ct-a-0"), rid, project="other-project")
    assert other.name != first.name
    assert len(gce_fake.instances("other-project")) == 1


def test_instance_delete_request_id_is_idempotent(gce_fake: GceFake, gce: Clients) -> None:
    gce.wait_zone(gce.insert(make_instance("ct-a-0")))
    rid = str(uuid.uuid4())
    first = delete_with_id(gce, "ct-a-0", rid)
    assert f"requestId={rid}" in gce_fake.requests[-1]
    gce.wait_zone(first.name)
    assert gce_fake.instances() == []
    again = delete_with_id(gce, "ct-a-0", rid)
    assert again.name == first.name and again.status == DONE  # not a 404
    assert again.operation_type == "delete"
    with pytest.raises(exceptions.NotFound):  # without the id, the instance is gone
        gce.instances.delete(project=PROJECT, zone=ZONE, instance="ct-a-0")


def test_firewall_request_id_is_idempotent(gce_fake: GceFake, gce: Clients) -> None:
    rid, delete_rid = str(uuid.uuid4()), str(uuid.uuid4())
    rule = firewall("cloudtrain-abc-ssh", "cloudtrain-abc")
    first = insert_rule_with_id(gce, rule, rid)
    assert f"requestId={rid}" in gce_fake.requests[-1]
    again = insert_rule_with_id(gce, rule, rid)
    assert again.name == first.name and not again.zone
    assert gce.wait_global(first.name).status == DONE
    assert len(gce_fake.firewalls()) == 1 and len(gce_fake.operations()) == 1

    gone = delete_rule_with_id(gce, rule.name, delete_rid)
    assert f"requestId={delete_rid}" in gce_fake.requests[-1]
    gce.wait_global(gone.name)
    again = delete_rule_with_id(gce, rule.name, delete_rid)
    assert again.name == gone.name and again.status == DONE
    assert gce_fake.firewalls() == []
    # The insert's id still answers the insert's operation: the rule is not recreated.
    assert insert_rule_with_id(gce, rule, rid).name == first.name
    assert gce_fake.firewalls() == []


@pytest.mark.parametrize("rid", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_malformed_request_id_is_refused(gce_fake: GceFake, gce: Clients, rid: str) -> None:
    with pytest.raises(exceptions.BadRequest) as info:
        insert_with_id(gce, make_instance("ct-a-0"), rid)
    assert "requestId" in info.value.message
    assert gce_fake.instances() == []


def test_request_ids_are_forgotten_on_reset(gce_fake: GceFake, gce: Clients) -> None:
    rid = str(uuid.uuid4())
    rule = firewall("cloudtrain-abc-ssh", "cloudtrain-abc")
    first = insert_rule_with_id(gce, rule, rid)
    gce_fake.reset()
    again = insert_rule_with_id(gce, rule, rid)
    assert again.name != first.name and len(gce_fake.firewalls()) == 1


# -- instance insert fields ----------------------------------------------------------------

SCOPES = [
    "https://www.googleapis.com/auth/devstorage.read_write",
    "https://www.googleapis.com/auth/logging.write",
]


def full_instance(name: str) -> Any:
    inst = gpu_instance(name)
    inst.scheduling.max_run_duration = compute_v1.Duration(seconds=3600)
    inst.service_accounts = [compute_v1.ServiceAccount(email="default", scopes=SCOPES)]
    inst.tags = compute_v1.Tags(items=["cloudtrain-abc", "cloudtrain"])
    inst.disks[0].initialize_params.disk_type = f"zones/{ZONE}/diskTypes/pd-ssd"
    return inst


def test_insert_fields_round_trip(gce_fake: GceFake, gce: Clients) -> None:
    gce.wait_zone(gce.insert(full_instance("ct-a-0")))
    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")
    sched = got.scheduling
    assert sched.provisioning_model == "SPOT" and sched.instance_termination_action == "DELETE"
    assert sched.on_host_maintenance == "TERMINATE" and sched.automatic_restart is False
    assert sched.max_run_duration.seconds == 3600
    (account,) = got.service_accounts
    assert account.email == default_service_account(PROJECT)
    assert account.email.endswith("-compute@developer.gserviceaccount.com")
    assert list(account.scopes) == SCOPES
    assert list(got.tags.items) == ["cloudtrain-abc", "cloudtrain"] and got.tags.fingerprint
    disk = got.disks[0]
    params = disk.initialize_params
    assert params.disk_type == f"{API}/projects/{PROJECT}/zones/{ZONE}/diskTypes/pd-ssd"
    assert params.source_image == f"{API}/projects/debian-cloud/global/images/family/debian-12"
    assert params.disk_size_gb == 100 and disk.disk_size_gb == 100
    assert disk.boot and disk.auto_delete and disk.type_ == "PERSISTENT"

    (stored,) = gce_fake.instances()
    assert stored["scheduling"]["maxRunDuration"] == {"seconds": "3600"}  # int64 as string
    assert stored["tags"]["items"] == ["cloudtrain-abc", "cloudtrain"]
    # Tags can be filtered on, as on GCE.
    assert gce.list_names("tags.items = cloudtrain-abc") == ["ct-a-0"]


def test_insert_answers_gce_defaults(gce: Clients) -> None:
    gce.wait_zone(gce.insert(make_instance("ct-a-0")))
    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert got.scheduling.on_host_maintenance == "MIGRATE"
    assert got.scheduling.automatic_restart is True
    assert got.scheduling.provisioning_model == "STANDARD"
    assert got.tags.fingerprint and not got.tags.items
    spot = make_instance("ct-a-1", scheduling=compute_v1.Scheduling(provisioning_model="SPOT"))
    spot.scheduling.instance_termination_action = "STOP"
    spot.guest_accelerators = gpu_instance("x").guest_accelerators  # SPOT defaults to TERMINATE
    gce.wait_zone(gce.insert(spot))
    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-1")
    assert got.scheduling.on_host_maintenance == "TERMINATE"
    assert got.scheduling.automatic_restart is False


def _spot_without_action(inst: Any) -> None:
    inst.scheduling = compute_v1.Scheduling(
        provisioning_model="SPOT", on_host_maintenance="TERMINATE", automatic_restart=False
    )


def _duration_without_action(inst: Any) -> None:
    inst.scheduling = compute_v1.Scheduling(max_run_duration=compute_v1.Duration(seconds=600))
    inst.guest_accelerators = []


def _gpu_migrate(inst: Any) -> None:
    inst.scheduling = compute_v1.Scheduling(on_host_maintenance="MIGRATE")


def _gpu_default_maintenance(inst: Any) -> None:
    inst.scheduling = compute_v1.Scheduling(automatic_restart=True)


def _bad_tag(inst: Any) -> None:
    inst.tags = compute_v1.Tags(items=["ok-tag", "Bad_Tag"])


def _long_tag(inst: Any) -> None:
    inst.tags = compute_v1.Tags(items=["t" * 64])


def _spot_migrate(inst: Any) -> None:
    inst.scheduling.on_host_maintenance = "MIGRATE"
    inst.guest_accelerators = []


def _spot_restart(inst: Any) -> None:
    inst.scheduling.automatic_restart = True


def _short_duration(inst: Any) -> None:
    inst.scheduling.max_run_duration = compute_v1.Duration(seconds=10)


def _bare_disk_type(inst: Any) -> None:
    inst.disks[0].initialize_params.disk_type = "pd-ssd"


def _bad_enum(inst: Any) -> None:
    inst.scheduling.instance_termination_action = "Delete"


@pytest.mark.parametrize(
    ("mutate", "field", "text"),
    [
        (_spot_without_action, "scheduling.instanceTerminationAction", "SPOT"),
        (_duration_without_action, "scheduling.instanceTerminationAction", "maxRunDuration"),
        (_gpu_migrate, "scheduling.onHostMaintenance", "do not support live migration"),
        (_gpu_default_maintenance, "scheduling.onHostMaintenance", "do not support live"),
        (_bad_tag, "tags.items[1]", "Must be a match of regex"),
        (_long_tag, "tags.items[0]", "Must be a match of regex"),
        (_spot_migrate, "scheduling.onHostMaintenance", "preemptible"),
        (_spot_restart, "scheduling.automaticRestart", "cannot be automatically restarted"),
        (_short_duration, "scheduling.maxRunDuration.seconds", "Must be in"),
        (_bare_disk_type, "disks[0].initializeParams.diskType", "malformed"),
        (_bad_enum, "scheduling.instanceTerminationAction", "Must be one of"),
    ],
)
def test_insert_refuses_what_gce_refuses(
    gce_fake: GceFake, gce: Clients, mutate: Any, field: str, text: str
) -> None:
    inst = gpu_instance("ct-a-0")
    mutate(inst)
    with pytest.raises(exceptions.BadRequest) as info:
        gce.insert(inst)
    assert info.value.code == 400 and info.value.errors[0]["reason"] == "invalid"
    assert f"'resource.{field}'" in info.value.message and text in info.value.message
    assert gce_fake.instances() == [] and gce_fake.operations() == []
    gce.insert(gpu_instance("ct-a-0"))  # the unmutated instance is fine
