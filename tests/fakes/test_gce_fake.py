"""The GCE fake (tests/fakes/gce_fake.py), driven only through google-cloud-compute's REST clients.

These tests also pin down how the real client exposes the fake's answers, which a GCP adapter
relies on: operations are waited on with `ZoneOperationsClient.wait` / `GlobalOperationsClient.wait`
loops (never `ExtendedOperation.result()`, which polls the real endpoint), a failed insert is an
Operation with `status == DONE`, `error.errors[0].code` and `http_error_status_code`, and request
errors are `google.api_core.exceptions` (NotFound, Conflict, BadRequest).
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

compute_v1 = pytest.importorskip("google.cloud.compute_v1")
from google.api_core import exceptions  # noqa: E402

from tests.fakes.gce_fake import (  # noqa: E402
    GceFake,
    gce_fake,
    matches_filter,
    parse_filter,
    start_gce_fake,
)

__all__ = ["gce_fake"]  # fixture used by this module

PROJECT = "ct-test"
ZONE = "us-central1-a"
OTHER_ZONE = "us-central1-b"
DONE = compute_v1.Operation.Status.DONE


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any name lookup other than loopback, so nothing here can reach Google."""
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", "localhost", b"127.0.0.1"):
            raise AssertionError(f"test tried to reach {host!r}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)


class Clients:
    """The four REST clients, pointed at the fake."""

    def __init__(self, fake: GceFake) -> None:
        kwargs = fake.client_kwargs()
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self.firewalls = compute_v1.FirewallsClient(**kwargs)
        self.global_ops = compute_v1.GlobalOperationsClient(**kwargs)

    def wait_zone(self, name: str, zone: str = ZONE, limit: int = 20) -> Any:
        """Loop over zoneOperations.wait until DONE; the finished Operation."""
        for _ in range(limit):
            op = self.zone_ops.wait(project=PROJECT, zone=zone, operation=name)
            if op.status == DONE:
                return op
        raise AssertionError(f"operation {name} not DONE after {limit} waits")

    def wait_global(self, name: str, limit: int = 20) -> Any:
        """Loop over globalOperations.wait until DONE; the finished Operation."""
        for _ in range(limit):
            op = self.global_ops.wait(project=PROJECT, operation=name)
            if op.status == DONE:
                return op
        raise AssertionError(f"operation {name} not DONE after {limit} waits")

    def insert(self, instance: Any, zone: str = ZONE) -> Any:
        """Insert; the operation's name (never `.result()` on the ExtendedOperation)."""
        ext = self.instances.insert(project=PROJECT, zone=zone, instance_resource=instance)
        return ext.name

    def list_names(self, filter_: str = "", zone: str = ZONE, max_results: int = 0) -> list[str]:
        request = compute_v1.ListInstancesRequest(project=PROJECT, zone=zone, filter=filter_)
        if max_results:
            request.max_results = max_results
        return [i.name for i in self.instances.list(request=request)]


@pytest.fixture
def gce(gce_fake: GceFake) -> Clients:
    return Clients(gce_fake)


def make_instance(name: str, run: str = "run-a", role: str = "worker", **extra: Any) -> Any:
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
        labels={"cloudtrain-run": run, "role": role},
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image="projects/debian-cloud/global/images/family/debian-12",
                    disk_size_gb=100,
                ),
            )
        ],
        network_interfaces=[
            compute_v1.NetworkInterface(
                network="global/networks/default",
                access_configs=[compute_v1.AccessConfig(name="External NAT")],
            )
        ],
        **extra,
    )


def gpu_instance(name: str) -> Any:
    return make_instance(
        name,
        metadata=compute_v1.Metadata(
            items=[
                compute_v1.Items(key="startup-script", value="#!/bin/bash\necho hi\n"),
                compute_v1.Items(key="install-nvidia-driver", value="True"),
            ]
        ),
        guest_accelerators=[
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4",
                accelerator_count=1,
            )
        ],
        scheduling=compute_v1.Scheduling(
            provisioning_model="SPOT",
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
            instance_termination_action="DELETE",
        ),
    )


def test_insert_wait_get_round_trip(gce_fake: GceFake, gce: Clients) -> None:
    ext = gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=gpu_instance("ct-a-0"))
    assert ext.status == compute_v1.Operation.Status.PENDING
    assert ext.operation_type == "insert"
    assert ext.target_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/ct-a-0")
    assert ext.zone.endswith(f"/zones/{ZONE}")
    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert got.status == "PROVISIONING"

    first = gce.zone_ops.wait(project=PROJECT, zone=ZONE, operation=ext.name)
    assert first.status == compute_v1.Operation.Status.RUNNING
    op = gce.wait_zone(ext.name)
    assert op.status == DONE and op.progress == 100
    assert not op.error.errors and op.http_error_status_code == 0

    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert got.status == "RUNNING"
    assert got.id > 0 and got.id == op.target_id
    assert got.zone == f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}"
    assert got.self_link.endswith(f"/zones/{ZONE}/instances/ct-a-0")
    assert got.machine_type.endswith(f"/projects/{PROJECT}/zones/{ZONE}/machineTypes/n1-standard-4")
    assert got.creation_timestamp
    assert dict(got.labels) == {"cloudtrain-run": "run-a", "role": "worker"}
    items = {i.key: i.value for i in got.metadata.items}
    assert items == {"startup-script": "#!/bin/bash\necho hi\n", "install-nvidia-driver": "True"}
    (acc,) = got.guest_accelerators
    assert acc.accelerator_count == 1 and acc.accelerator_type.endswith("/nvidia-tesla-t4")
    assert got.scheduling.provisioning_model == "SPOT"
    assert got.scheduling.on_host_maintenance == "TERMINATE"
    assert got.scheduling.automatic_restart is False
    assert got.scheduling.instance_termination_action == "DELETE"
    assert got.disks[0].initialize_params.disk_size_gb == 100
    nic = got.network_interfaces[0]
    assert nic.network_i_p == "10.128.0.2"
    assert nic.access_configs[0].nat_i_p
    assert nic.network.endswith(f"/projects/{PROJECT}/global/networks/default")

    (stored,) = gce_fake.instances(PROJECT)
    assert stored["scheduling"]["provisioningModel"] == "SPOT"
    assert stored["disks"][0]["initializeParams"]["diskSizeGb"] == "100"  # int64 as string


def test_every_request_went_to_the_fake(gce_fake: GceFake, gce: Clients) -> None:
    gce.wait_zone(gce.insert(make_instance("ct-a-0")))
    assert gce_fake.requests[0] == f"POST /compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"
    assert all("/operations/" in r for r in gce_fake.requests[1:])


def test_list_with_label_filter_and_paging(gce_fake: GceFake, gce: Clients) -> None:
    gce_fake.operation_polls_to_done = 0
    for name, run, role in (
        ("ct-a-0", "run-a", "chief"),
        ("ct-a-1", "run-a", "worker"),
        ("ct-b-0", "run-b", "worker"),
    ):
        gce.insert(make_instance(name, run=run, role=role))
    gce.insert(make_instance("ct-a-9", run="run-a"), zone=OTHER_ZONE)

    assert gce.list_names() == ["ct-a-0", "ct-a-1", "ct-b-0"]
    assert gce.list_names('labels.cloudtrain-run = "run-a"') == ["ct-a-0", "ct-a-1"]
    assert gce.list_names("labels.cloudtrain-run=run-b") == ["ct-b-0"]
    both = '(labels.cloudtrain-run = "run-a") AND (labels.role = "worker")'
    assert gce.list_names(both) == ["ct-a-1"]
    assert gce.list_names("labels.cloudtrain-run=run-a labels.role=chief") == ["ct-a-0"]
    assert gce.list_names('labels.cloudtrain-run = "run-c"') == []
    assert gce.list_names("labels.cloudtrain-run=run-a", zone=OTHER_ZONE) == ["ct-a-9"]
    assert gce.list_names(zone="europe-west4-a") == []

    before = len(gce_fake.requests)
    assert gce.list_names(max_results=1) == ["ct-a-0", "ct-a-1", "ct-b-0"]
    pages = gce_fake.requests[before:]
    assert len(pages) == 3 and "pageToken=" in pages[1] and "maxResults=1" in pages[0]

    with pytest.raises(exceptions.BadRequest):
        gce.list_names("labels.role = worker OR labels.role = chief")

    request = compute_v1.AggregatedListInstancesRequest(
        project=PROJECT, filter="labels.cloudtrain-run=run-a"
    )
    by_zone = {
        zone: sorted(i.name for i in scoped.instances)
        for zone, scoped in gce.instances.aggregated_list(request=request)
    }
    assert by_zone == {f"zones/{ZONE}": ["ct-a-0", "ct-a-1"], f"zones/{OTHER_ZONE}": ["ct-a-9"]}


def test_delete_then_not_found(gce_fake: GceFake, gce: Clients) -> None:
    gce.wait_zone(gce.insert(make_instance("ct-a-0")))
    ext = gce.instances.delete(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert ext.operation_type == "delete"
    got = gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert got.status == "STOPPING"
    gce.wait_zone(ext.name)
    with pytest.raises(exceptions.NotFound) as info:
        gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert info.value.code == 404
    assert info.value.errors[0]["reason"] == "notFound"
    assert f"projects/{PROJECT}/zones/{ZONE}/instances/ct-a-0" in info.value.message
    assert gce_fake.instances() == []

    with pytest.raises(exceptions.NotFound):
        gce.instances.delete(project=PROJECT, zone=ZONE, instance="ct-a-0")
    with pytest.raises(exceptions.NotFound):
        gce.zone_ops.get(project=PROJECT, zone=ZONE, operation="operation-nope")


def test_duplicate_insert_conflicts(gce: Clients) -> None:
    gce.insert(make_instance("ct-a-0"))
    with pytest.raises(exceptions.Conflict) as info:
        gce.insert(make_instance("ct-a-0"))
    assert info.value.code == 409
    assert info.value.errors[0]["reason"] == "alreadyExists"
    gce.insert(make_instance("ct-a-0"), zone=OTHER_ZONE)  # names are per zone


def test_invalid_instances_are_refused(gce: Clients) -> None:
    with pytest.raises(exceptions.BadRequest) as info:
        gce.insert(make_instance("ct-a-0", run="Run.A"))
    assert info.value.errors[0]["reason"] == "invalid"
    with pytest.raises(exceptions.BadRequest):
        gce.insert(make_instance("CT_A"))
    bare = make_instance("ct-a-0")
    bare.machine_type = "n1-standard-4"  # GCE wants zones/Z/machineTypes/T or a full URL
    with pytest.raises(exceptions.BadRequest):
        gce.insert(bare)


def test_concurrent_inserts(gce_fake: GceFake) -> None:
    gce_fake.operation_polls_to_done = 0

    def insert(index: int) -> None:
        Clients(gce_fake).insert(make_instance(f"ct-a-{index}"))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(insert, range(16)))
    stored = gce_fake.instances()
    assert len(stored) == 16 and {i["status"] for i in stored} == {"RUNNING"}
    ips = {i["networkInterfaces"][0]["networkIP"] for i in stored}
    assert len(ips) == 16 and len({i["id"] for i in stored}) == 16


@pytest.mark.parametrize(
    ("reason", "http_status", "detail"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", 503, "does not have enough resources"),
        ("QUOTA_EXCEEDED", 403, "Quota 'NVIDIA_T4_GPUS' exceeded"),
    ],
)
def test_scripted_insert_failure_shows_in_the_operation(
    gce_fake: GceFake, gce: Clients, reason: str, http_status: int, detail: str
) -> None:
    gce_fake.fail_next_insert(ZONE, reason=reason)
    ext = gce.instances.insert(project=PROJECT, zone=ZONE, instance_resource=gpu_instance("ct-a-0"))
    assert ext.status == compute_v1.Operation.Status.PENDING  # the insert itself succeeds
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0").status == (
        "PROVISIONING"
    )
    op = gce.wait_zone(ext.name)
    assert op.status == DONE
    assert op.error.errors[0].code == reason
    assert detail in op.error.errors[0].message
    assert op.http_error_status_code == http_status
    assert op.http_error_message
    if reason == "QUOTA_EXCEEDED":
        quota = op.error.errors[0].error_details[0].quota_info
        assert quota.metric_name == "compute.googleapis.com/nvidia_t4_gpus"
        assert dict(quota.dimensions) == {"region": "us-central1"}
    with pytest.raises(exceptions.NotFound):  # the instance vanished, as on GCE
        gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0")

    # One failure was scripted: the retry succeeds; other zones were never affected.
    op = gce.wait_zone(gce.insert(make_instance("ct-a-0")))
    assert not op.error.errors
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0").status == "RUNNING"


def test_fail_count_and_zone(gce_fake: GceFake, gce: Clients) -> None:
    gce_fake.operation_polls_to_done = 0
    gce_fake.fail_next_insert(ZONE, count=2)
    ext = gce.instances.insert(
        project=PROJECT, zone=OTHER_ZONE, instance_resource=make_instance("ct-x")
    )
    assert ext.status == DONE and not ext.error.errors
    codes = []
    for name in ("ct-a-0", "ct-a-1", "ct-a-2"):
        ext = gce.instances.insert(
            project=PROJECT, zone=ZONE, instance_resource=make_instance(name)
        )
        assert ext.status == DONE  # polls_to_done = 0: the insert's answer is final
        codes.append(ext.error.errors[0].code if ext.error.errors else "")
    assert codes == ["ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED", ""]
    assert [i["name"] for i in gce_fake.instances(zone=ZONE)] == ["ct-a-2"]


def test_operation_polls_to_done(gce_fake: GceFake, gce: Clients) -> None:
    gce_fake.operation_polls_to_done = 3
    name = gce.insert(make_instance("ct-a-0"))
    statuses = [gce.zone_ops.get(project=PROJECT, zone=ZONE, operation=name).status]
    statuses += [
        gce.zone_ops.wait(project=PROJECT, zone=ZONE, operation=name).status for _ in range(3)
    ]
    s = compute_v1.Operation.Status
    assert statuses == [s.RUNNING, s.RUNNING, s.DONE, s.DONE]


def test_serial_port_output(gce_fake: GceFake, gce: Clients) -> None:
    gce.wait_zone(gce.insert(make_instance("ct-a-0")))
    out = gce.instances.get_serial_port_output(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert out.contents == "" and out.next_ == 0
    text = "boot\nstartup-script: ok ✓\n"
    gce_fake.set_serial("ct-a-0", text)
    out = gce.instances.get_serial_port_output(project=PROJECT, zone=ZONE, instance="ct-a-0")
    assert out.contents == text and out.next_ == len(text.encode())  # a byte offset
    gce_fake.append_serial("ct-a-0", "done\n")
    request = compute_v1.GetSerialPortOutputInstanceRequest(
        project=PROJECT, zone=ZONE, instance="ct-a-0", start=out.next_, port=1
    )
    more = gce.instances.get_serial_port_output(request=request)
    assert more.contents == "done\n" and more.next_ == out.next_ + 5
    with pytest.raises(exceptions.NotFound):
        gce.instances.get_serial_port_output(project=PROJECT, zone=ZONE, instance="ct-zz")


def test_firewall_lifecycle(gce_fake: GceFake, gce: Clients) -> None:
    rule = compute_v1.Firewall(
        name="ct-run-a-ssh",
        network="global/networks/default",
        direction="INGRESS",
        source_ranges=["203.0.113.7/32"],
        target_tags=["ct-run-a"],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
    )
    ext = gce.firewalls.insert(project=PROJECT, firewall_resource=rule)
    assert ext.status == compute_v1.Operation.Status.PENDING and not ext.zone
    op = gce.wait_global(ext.name)
    assert op.status == DONE and op.self_link.endswith(f"/global/operations/{ext.name}")
    with pytest.raises(exceptions.Conflict):
        gce.firewalls.insert(project=PROJECT, firewall_resource=rule)

    other = compute_v1.Firewall(
        name="ct-run-b-ssh",
        target_tags=["ct-run-b"],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp")],
    )
    gce.wait_global(gce.firewalls.insert(project=PROJECT, firewall_resource=other).name)

    def names(filter_: str = "") -> list[str]:
        request = compute_v1.ListFirewallsRequest(project=PROJECT, filter=filter_)
        return [r.name for r in gce.firewalls.list(request=request)]

    assert names() == ["ct-run-a-ssh", "ct-run-b-ssh"]
    assert names('name = "ct-run-a-ssh"') == ["ct-run-a-ssh"]
    assert names("targetTags = ct-run-b") == ["ct-run-b-ssh"]
    assert names("name eq ct-run-.*") == ["ct-run-a-ssh", "ct-run-b-ssh"]

    got = gce.firewalls.get(project=PROJECT, firewall="ct-run-a-ssh")
    assert got.allowed[0].I_p_protocol == "tcp" and list(got.allowed[0].ports) == ["22"]
    assert list(got.source_ranges) == ["203.0.113.7/32"] and got.priority == 1000
    assert got.network.endswith(f"/projects/{PROJECT}/global/networks/default")

    ext = gce.firewalls.delete(project=PROJECT, firewall="ct-run-a-ssh")
    gce.wait_global(ext.name)
    with pytest.raises(exceptions.NotFound):
        gce.firewalls.get(project=PROJECT, firewall="ct-run-a-ssh")
    with pytest.raises(exceptions.NotFound):
        gce.firewalls.delete(project=PROJECT, firewall="ct-run-a-ssh")
    assert [r["name"] for r in gce_fake.firewalls()] == ["ct-run-b-ssh"]


def test_reset_and_inspection(gce_fake: GceFake, gce: Clients) -> None:
    gce_fake.operation_polls_to_done = 5
    gce_fake.fail_next_insert(ZONE)
    gce.insert(make_instance("ct-a-0"))
    assert len(gce_fake.operations(PROJECT)) == 1 and gce_fake.instances("other-project") == []
    gce_fake.set_instance_status("ct-a-0", "TERMINATED")
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance="ct-a-0").status == "TERMINATED"
    gce_fake.reset()
    assert gce_fake.instances() == [] and gce_fake.operations() == [] and gce_fake.requests == []
    assert gce_fake.operation_polls_to_done == 2
    op = gce.wait_zone(gce.insert(make_instance("ct-a-0")))  # the scripted fault is gone too
    assert not op.error.errors


def test_start_and_stop_without_the_fixture() -> None:
    fake = start_gce_fake()
    try:
        clients = Clients(fake)
        assert clients.list_names() == []
    finally:
        fake.stop()
    fake.stop()  # idempotent


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('labels.run = "a"', True),
        ("labels.run=a", True),
        ("labels.run = a AND labels.role = chief", True),
        ("(labels.run = a) (labels.role = worker)", False),
        ("labels.run != b", True),
        ("labels.run:*", True),
        ("labels.missing:*", False),
        ("name eq ct-.*-0", True),
        ("name ne ct-.*", False),
        ("tags.items = gpu", True),
        ("scheduling.preemptible = true", True),
    ],
)
def test_filter_parser(text: str, expected: bool) -> None:
    resource = {
        "name": "ct-a-0",
        "labels": {"run": "a", "role": "chief"},
        "tags": {"items": ["ct", "gpu"]},
        "scheduling": {"preemptible": True},
    }
    assert matches_filter(resource, parse_filter(text)) is expected


def test_fixture_is_function_scoped(gce_fake: GceFake) -> None:
    assert gce_fake.url.startswith("http://127.0.0.1:") and gce_fake.instances() == []
