"""`Compute.inventory()` (what `cloudtrain gc` lists) against every provider in conftest's `CASES`:
it finds every run's nodes and network/identity resources, exactly as `list_nodes` and
`list_resources` report them per run, with the cloud's creation time where the cloud (or its
offline stand-in) gives one, and forgets a run once it is torn down. Names that only look like
cloudtrain's are not taken for a run's."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cloudtrain.providers.base import RunInfo, Tagged
from cloudtrain.run.teardown import teardown
from tests.providers.test_contract import requests_for, run_info

if TYPE_CHECKING:
    from tests.providers.conftest import Harness

# resource kinds whose creation time each cloud reports (nodes: every provider)
TIMED_KINDS: dict[str, set[str]] = {
    "local": set(),
    "memory": {"firewall"},
    "aws": {"iam-role", "instance-profile"},  # EC2 gives security groups no creation time
    "gcp": {"firewall"},
    "azure": set(),  # ARM gives resource groups (and NSGs/VNets) none
    "slurm": set(),  # a run folder: no creation time (its jobs give the nodes theirs)
}


def keys(items: list[Tagged], run_id: str) -> set[tuple[str, str]]:
    return {(t.kind, t.id) for t in items if t.run_id == run_id}


def test_inventory_finds_every_run_and_forgets_a_torn_down_one(provider: Harness) -> None:
    compute = provider.compute
    started = time.time()
    runs = [provider.run_id(), provider.run_id()]
    for run_id in runs:
        run = run_info(run_id, provider)
        compute.ensure_network(run)
        compute.create_nodes(run, requests_for(run_id)[:2])

    found = compute.inventory()
    for run_id in runs:
        expected = {("node", n.name) for n in compute.list_nodes(run_id)}
        assert len(expected) == 2
        expected |= {(r.kind, r.id) for r in compute.list_resources(run_id)}
        assert keys(found, run_id) == expected, "the same nodes and resources as per run"
        mine = [t for t in found if t.run_id == run_id]
        for item in mine:
            if item.kind == "node" or item.kind in TIMED_KINDS[provider.name]:
                assert item.created is not None, f"{item.kind} {item.id} has no creation time"
            if item.created is not None:
                assert started - 600 < item.created < time.time() + 600, item
        nodes = [t for t in mine if t.kind == "node"]
        assert {t.instance_type for t in nodes} == {"small"}
        assert all(t.region for t in nodes), "a node is in a region"

    teardown(provider.provider, None, runs[0])
    after = compute.inventory()
    assert keys(after, runs[0]) == set(), "a torn-down run is gone from the inventory"
    assert keys(after, runs[1]) == keys(found, runs[1])


def test_inventory_ignores_look_alikes(provider: Harness) -> None:
    """A user's own `cloudtrain-...` IAM role or firewall rule is not a run's."""
    if provider.name not in ("aws", "gcp"):
        pytest.skip(f"{provider.name}: every listing there is by tag")
    compute = provider.compute
    if provider.name == "aws":
        iam = compute.iam  # type: ignore[attr-defined]
        iam.create_role(RoleName="cloudtrain-admin", AssumeRolePolicyDocument="{}")
        iam.create_role(
            RoleName="cloudtrain-x1",
            AssumeRolePolicyDocument="{}",
            Tags=[{"Key": "cloudtrain:run", "Value": "other"}],
        )
        iam.create_instance_profile(InstanceProfileName="cloudtrain-admin")
    else:
        from google.cloud import compute_v1

        from cloudtrain.providers.gcp.clients import operation_name, wait_global_operation

        clients = compute.clients  # type: ignore[attr-defined]
        body = {
            "name": "cloudtrain-web",
            "network": f"projects/{clients.auth.project}/global/networks/default",
            "allowed": [{"IPProtocol": "tcp", "ports": ["80"]}],
            "sourceRanges": ["10.0.0.0/8"],
            "targetTags": ["cloudtrain-web"],
            "description": "the user's own rule",
        }
        op = clients.firewalls.insert(
            project=clients.auth.project,
            firewall_resource=compute_v1.Firewall.from_json(json.dumps(body)),
        )
        wait_global_operation(clients, operation_name(op), "insert the user's firewall")
    assert compute.inventory() == []


def test_azure_inventory_in_a_users_group(
    azure_cloud: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the `resource_group` option the runs share that group: their VMs, NSGs and
    VNets are found by tag and name, and the group itself is never a run's."""
    from cloudtrain.providers.azure.provider import AzureProvider
    from tests.fakes.azure_cloud import azure_config

    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    provider = AzureProvider(azure_config("eastus", resource_group="team-ml"))
    compute = provider.compute
    compute.clients.resource.resource_groups.create_or_update("team-ml", {"location": "eastus"})
    store_uri = f"az://devstoreaccount1/ct-test-{uuid.uuid4().hex[:12]}/pfx"
    provider.store(store_uri).ensure_bucket()
    runs = [f"ct{uuid.uuid4().hex[:10]}" for _ in range(2)]
    try:
        for run_id in runs:
            run = RunInfo(run_id, "eastus", None, (2222, 2230), store_uri=store_uri)
            compute.ensure_network(run)
            compute.create_nodes(run, requests_for(run_id)[:1])
        found = compute.inventory()
        for run_id in runs:
            assert keys(found, run_id) == {
                ("node", f"ct-{run_id}-chief-0"),
                ("nsg", f"ct-{run_id}-nsg"),
                ("vnet", f"ct-{run_id}-vnet"),
            }
        assert {t.run_id for t in found} == set(runs)
        teardown(provider, None, runs[0])
        assert {t.run_id for t in compute.inventory()} == {runs[1]}
    finally:
        for run_id in runs:
            teardown(provider, None, run_id)


class _Pages:
    """A paginator over one page (what `get_paginator(...).paginate()` gives)."""

    def __init__(self, page: dict[str, Any]) -> None:
        self.page = page

    def paginate(self) -> list[dict[str, Any]]:
        return [self.page]


class _Iam:
    """IAM as AWS answers its listings: without tags (reads carry them)."""

    def __init__(self) -> None:
        made = datetime(2025, 1, 2, tzinfo=UTC)
        self.tags = {
            "cloudtrain-r-1": [{"Key": "cloudtrain:run", "Value": "r-1"}],
            "cloudtrain-admin": [],
        }
        self.listed = {
            "list_roles": {"Roles": [{"RoleName": n, "CreateDate": made} for n in self.tags]},
            "list_instance_profiles": {
                "InstanceProfiles": [
                    {"InstanceProfileName": n, "CreateDate": made, "Roles": []}
                    for n in [*self.tags, "other-profile"]
                ]
            },
        }

    def get_paginator(self, name: str) -> _Pages:
        return _Pages(self.listed[name])

    def get_role(self, RoleName: str) -> dict[str, Any]:
        return {"Role": {"RoleName": RoleName, "Tags": self.tags[RoleName]}}

    def get_instance_profile(self, InstanceProfileName: str) -> dict[str, Any]:
        tags = self.tags[InstanceProfileName]
        return {"InstanceProfile": {"InstanceProfileName": InstanceProfileName, "Tags": tags}}


def test_aws_identities_are_read_for_their_tags_when_listings_omit_them() -> None:
    pytest.importorskip("boto3")
    from cloudtrain.providers.aws.identity import tagged_identities

    made = datetime(2025, 1, 2, tzinfo=UTC).timestamp()
    assert tagged_identities(_Iam()) == [
        Tagged("r-1", "iam-role", "cloudtrain-r-1", made, None, None),
        Tagged("r-1", "instance-profile", "cloudtrain-r-1", made, None, None),
    ]
