"""The GCP controller's project grant for a whole region (issue 30): however many zones the
region has, every instanceAdmin.v1 condition stays within IAM's limits and, taken together, the
bindings grant exactly what the single condition meant: this run's instances and disks in those
zones, the types that hold no run's data, and nothing else.

IAM's limits ("Overview of IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview,
"Limitations"): at most 12 logical operators in one condition, and at most 20 conditional
bindings of one role and one principal. `GcpCompute.ensure_controller_identity` passes every zone
of the run's region; most regions have 3 or 4 ("Regions and zones",
https://cloud.google.com/compute/docs/regions-zones).

The conditions are parsed by authz_reference_gcp.py (the documented CEL subset) and evaluated
here on sample resources, so a split that drops a zone, grants another run's VM or lets an
image through is seen, not only a count.
"""

from __future__ import annotations

from typing import Any

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.gcp import controller_identity as ctl
from tests.unit import authz_reference_gcp as ref

GCE = "compute.googleapis.com"
PROJECT, RUN, OTHER_RUN = "my-project", "train-abc123", "train-def456"
EMAIL = "cc-train-abc123-0123abcd@my-project.iam.gserviceaccount.com"
RULES = [f"cloudtrain-{RUN}", f"cloudtrain-{RUN}-ssh"]
INSTANCE, DISK = f"{GCE}/Instance", f"{GCE}/Disk"
SUBNET = f"{GCE}/Subnetwork"


def zones_of(count: int) -> list[str]:
    return [f"us-central1-{chr(ord('a') + i)}" for i in range(count)]


def bindings(zones: list[str], run_id: str = RUN) -> list[dict[str, Any]]:
    return ctl.project_bindings(PROJECT, zones, run_id, EMAIL, RULES)


def instance_admin(zones: list[str]) -> list[dict[str, Any]]:
    return [b for b in bindings(zones) if b["role"] == ctl.INSTANCE_ADMIN]


def evaluate(node: Any, rtype: str, name: str) -> bool:
    """A parsed condition (ref.parse) on a resource of type `rtype` named `name`."""
    kind = node[0]
    if kind == "or":
        return any(evaluate(n, rtype, name) for n in node[1])
    if kind == "and":
        return all(evaluate(n, rtype, name) for n in node[1])
    if kind == "not":
        return not evaluate(node[1], rtype, name)
    _, (_, attribute), fn, literal = node
    value = {"resource.type": rtype, "resource.name": name}[attribute]
    return {
        "==": value == literal,
        "!=": value != literal,
        "startsWith": value.startswith(literal),
        "endsWith": value.endswith(literal),
    }[fn]


def granted(zones: list[str], rtype: str, name: str) -> bool:
    """Some instanceAdmin.v1 binding of the controller holds for this resource."""
    return any(
        evaluate(ref.parse(b["condition"]["expression"]), rtype, name)
        for b in instance_admin(zones)
    )


def vm(zone: str, run_id: str = RUN, kind: str = "instances") -> str:
    return f"projects/{PROJECT}/zones/{zone}/{kind}/ct-{run_id}-worker-3"


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8, 12])
def test_every_condition_of_a_region_is_documented_and_within_the_limits(count: int) -> None:
    mine = instance_admin(zones_of(count))
    assert mine
    for binding in mine:
        assert ref.problems(binding["condition"]["expression"], GCE) == []
        assert binding["members"] == [f"serviceAccount:{EMAIL}"]
    # one principal, one role: at most 20 conditional bindings; each its own condition
    assert len(mine) <= 20
    titles = [b["condition"]["title"] for b in mine]
    assert len(set(titles)) == len(titles) and all(0 < len(t) <= 100 for t in titles)
    assert all(len(b["condition"]["description"]) <= 256 for b in mine)


@pytest.mark.parametrize("count", [1, 2])
def test_a_region_of_one_or_two_zones_keeps_one_instance_binding(count: int) -> None:
    assert len(instance_admin(zones_of(count))) == 1  # no conditional binding to spare


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8, 12])
def test_together_they_grant_this_runs_vms_in_every_zone_and_nothing_else(count: int) -> None:
    zones = zones_of(count)
    for zone in zones:
        assert granted(zones, INSTANCE, vm(zone))
        assert granted(zones, DISK, vm(zone, kind="disks"))  # the boot disk: its VM's name
        # another run's VM and disk, in the same zone: never
        assert not granted(zones, INSTANCE, vm(zone, OTHER_RUN))
        assert not granted(zones, DISK, vm(zone, OTHER_RUN, kind="disks"))
        # a name of the wrong kind under the type: never
        assert not granted(zones, INSTANCE, vm(zone, kind="disks"))
    outside = f"us-central1-{chr(ord('a') + count)}"
    assert not granted(zones, INSTANCE, vm(outside))
    assert not granted(zones, INSTANCE, f"projects/other-project/zones/{zones[0]}/instances/x")
    # the types the VM's create also touches, and that hold no run's data: granted
    assert granted(zones, SUBNET, f"projects/{PROJECT}/regions/us-central1/subnetworks/default")
    # the types that hold data or launch VMs: only the run's instances and disks, ever
    for guarded in ctl.GUARDED_TYPES[2:]:
        assert not granted(zones, guarded, vm(zones[0]))
        assert not granted(zones, guarded, f"projects/{PROJECT}/global/images/ct-{RUN}-x")


def test_the_zones_are_taken_once_and_in_order() -> None:
    zones = zones_of(4)
    shuffled = [zones[2], zones[0], zones[3], zones[1], zones[0]]
    assert bindings(shuffled) == bindings(zones)


def test_the_firewall_binding_is_unchanged_by_the_zones() -> None:
    (fw3,) = [b for b in bindings(zones_of(3)) if b["role"] == ctl.SECURITY_ADMIN]
    (fw1,) = [b for b in bindings(zones_of(1)) if b["role"] == ctl.SECURITY_ADMIN]
    assert fw3 == fw1 and ref.problems(fw3["condition"]["expression"], GCE) == []


def test_past_twenty_bindings_of_one_role_nothing_is_built() -> None:
    assert len(instance_admin(zones_of(2) + [f"z{i:03}" for i in range(95)])) == 20
    with pytest.raises(ProviderError, match="over IAM's 20 per role and principal"):
        bindings(zones_of(2) + [f"z{i:03}" for i in range(96)])
