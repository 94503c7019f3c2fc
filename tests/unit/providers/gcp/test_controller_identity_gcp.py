"""The controller node's identity on GCP (issue 17), on the GCE fake (IAM, Resource Manager's
project policy) and the GCS emulator: what GcpCompute really sends.

The project and service-account policies are taken from the setIamPolicy requests the adapter
sent (the fake records them, refusing a conditional binding below policy version 3 as GCP does);
the bucket binding from the emulator. Each scope is checked on those bodies: instanceAdmin.v1
only under a condition naming this run's instance and disk prefixes, securityAdmin only on the
run's firewall rules, serviceAccountUser on the nodes' account only, objectAdmin on the run's
prefix only. A controller NodeRequest runs as the controller's account, on demand, on the CPU
image; teardown leaves no controller account or member anywhere.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from cloudtrain.core.errors import ProviderError
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from cloudtrain.providers.gcp import controller_identity as ctl
from cloudtrain.providers.gcp import identity
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures, for pytest
REGION = "us-central1"
ZONE = "us-central1-a"
BUCKET = "ct-controller-test"
STORE = f"gs://{BUCKET}/pfx"
RUN = "digits-20250101-abc123"
OTHER = "digits-20250101-def456"


@pytest.fixture
def provider(gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> GcpProvider:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.setattr("cloudtrain.core.retry.backoff_s", lambda *a, **k: 0.01)
    gcp_cloud.gce.operation_polls_to_done = 0
    gcp_cloud.gce.require_known_service_accounts = True
    made = GcpProvider(ProviderConfig(name="gcp", region=REGION, zone=ZONE))
    made.store(STORE).ensure_bucket()
    return made


def run_info(run_id: str = RUN) -> RunInfo:
    return RunInfo(run_id, REGION, ZONE, (2222, 2230), store_uri=STORE, nodes=NODES)


NODES = ("chief-0", "worker-0")


def _ready(provider: GcpProvider) -> tuple[Any, str, list[str], list[Any]]:
    compute = provider.compute
    compute.ensure_network(run_info())
    made = compute.ensure_controller_identity(run_info())
    assert compute.ensure_controller_identity(run_info()) == made  # idempotent: no new write
    email = ctl.controller_email(provider.project, RUN)
    node_sas = [identity.node_email(provider.project, RUN, n) for n in NODES]
    return compute, email, node_sas, made


def _mine(bindings: list[dict[str, Any]], email: str) -> list[dict[str, Any]]:
    return [b for b in bindings if f"serviceAccount:{email}" in b["members"]]


def test_project_grants_as_sent_are_conditioned_on_this_run(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute, email, node_sa, made = _ready(provider)
    project = provider.project
    writes = gcp_cloud.gce.policy_writes()
    (project_write,) = [body for kind, name, body in writes if kind == "project"]
    policy = project_write["policy"]
    assert policy["version"] == 3 and policy["etag"]
    # the project's own binding survives the read-modify-write
    assert {"role": "roles/owner", "members": ["user:owner@example.com"]} in policy["bindings"]
    mine = _mine(policy["bindings"], email)
    assert {b["role"] for b in mine} == {ctl.INSTANCE_ADMIN, ctl.SECURITY_ADMIN}
    assert all(b["members"] == [f"serviceAccount:{email}"] for b in mine)
    # us-central1's 4 zones: 2 instanceAdmin bindings, each within IAM's 12 logical operators
    # (controller_identity.zone_groups); together they name every zone's prefixes once
    admin = [b["condition"]["expression"] for b in mine if b["role"] == ctl.INSTANCE_ADMIN]
    zones = compute.zones()
    assert zones and ZONE in zones and len(admin) == len(ctl.zone_groups(zones)) == 2
    expr = " || ".join(admin)
    for zone in zones:
        for kind in ("instances", "disks"):
            prefix = f"projects/{project}/zones/{zone}/{kind}/ct-{RUN}-"
            assert expr.count(f'resource.name.startsWith("{prefix}")') == 1
    assert OTHER not in expr
    # every startsWith names this run's prefix; instances and disks only under it; the other
    # types (in the first binding only) exclude every type that holds data or launches VMs
    assert expr.count("resource.name.startsWith(") == expr.count(f'/ct-{RUN}-")') == 2 * len(zones)
    for part in admin:
        assert 'resource.type == "compute.googleapis.com/Instance" && (' in part
        assert 'resource.type == "compute.googleapis.com/Disk" && (' in part
    assert sum("resource.type !=" in p for p in admin) == 1
    (others,) = [p.rsplit(") || (", 1)[1] for p in admin if "resource.type !=" in p]
    for guarded in ctl.GUARDED_TYPES:
        assert f'resource.type != "{guarded}"' in others
    assert "startsWith" not in others
    (granted,) = [b for b in mine if b["role"] == ctl.SECURITY_ADMIN]
    fw = granted["condition"]["expression"]
    assert fw == (
        'resource.type == "compute.googleapis.com/Firewall" && ('
        f'resource.name == "projects/{project}/global/firewalls/cloudtrain-{RUN}" || '
        f'resource.name == "projects/{project}/global/firewalls/cloudtrain-{RUN}-ssh")'
    )
    # what the fake holds is what was sent
    held = gcp_cloud.gce.iam_policy("project", project)
    assert held["version"] == 3
    assert {json.dumps(b, sort_keys=True) for b in _mine(held["bindings"], email)} == {
        json.dumps({**b, "members": sorted(b["members"])}, sort_keys=True) for b in mine
    }
    assert (
        {(r.kind, r.id) for r in made}
        == {(r.kind, r.id) for r in compute.planned_controller_identity(run_info())}
        == {
            ("controller-service-account", email),
            ("controller-project-binding", email),
            *(("controller-account-binding", sa) for sa in node_sa),
        }
    )


def test_act_as_the_node_account_only_and_the_bucket_prefix_only(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    _, email, node_sa, _ = _ready(provider)
    account_writes = [
        (name, body) for kind, name, body in gcp_cloud.gce.policy_writes() if kind == "account"
    ]
    # each node's account (a replacement node runs as it), no other account's policy
    assert sorted(name for name, _ in account_writes) == sorted(node_sa)
    for _, body in account_writes:
        assert _mine(body["policy"]["bindings"], email) == [
            {"role": ctl.ACCOUNT_USER, "members": [f"serviceAccount:{email}"]}
        ]
    assert gcp_cloud.gce.iam_policy("account", email)["bindings"] == []  # nothing on itself
    bucket = gcp_cloud.gcs.iam_policy(BUCKET)
    (mine,) = [b for b in bucket["bindings"] if f"serviceAccount:{email}" in b["members"]]
    assert mine["role"] == "roles/storage.objectAdmin"
    assert (
        mine["condition"]["expression"]
        == identity.prefix_condition(BUCKET, "pfx/", RUN)["expression"]
    )
    assert f"cloudtrain/runs/{RUN}/" in mine["condition"]["expression"]


def test_the_fake_refuses_a_conditional_binding_below_version_3(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute, _, _, _ = _ready(provider)
    iam = compute.iam
    base = ctl._crm_base(provider.project)
    policy = iam.call("POST", f"{base}:getIamPolicy", "read", {})  # version 1 asked
    assert policy["version"] == 1 and all("condition" not in b for b in policy["bindings"])
    assert any("_withcond_" in b["role"] for b in policy["bindings"])
    v3 = iam.call(
        "POST", f"{base}:getIamPolicy", "read", {"options": {"requestedPolicyVersion": 3}}
    )
    v3["version"] = 1
    with pytest.raises(ProviderError, match="version 3"):
        iam.call("POST", f"{base}:setIamPolicy", "write", {"policy": v3})


def test_controller_node_runs_as_the_controller_on_demand_on_cpu(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute, email, node_sa, _ = _ready(provider)
    info = run_info()
    ask = dict(zone=ZONE, spot=True, image="dlvm", accelerator="T4", accelerator_count=1)
    compute.create_node(
        info, NodeRequest(RUN, "worker", 0, "n1-standard-4", "#!/bin/bash\n", **ask)
    )
    node = compute.create_node(
        info, NodeRequest(RUN, "controller", 0, "e2-small", "#!/bin/bash\n", **ask)
    )
    held = {i["name"]: i for i in gcp_cloud.gce.instances()}
    ctl_vm, worker = held[f"ct-{RUN}-controller-0"], held[f"ct-{RUN}-worker-0"]
    assert [a["email"] for a in ctl_vm["serviceAccounts"]] == [email]
    assert [a["email"] for a in worker["serviceAccounts"]] == [node_sa[1]]
    assert "provisioningModel" not in ctl_vm["scheduling"] or (
        ctl_vm["scheduling"]["provisioningModel"] != "SPOT"
    )
    assert worker["scheduling"]["provisioningModel"] == "SPOT"
    assert not ctl_vm.get("guestAccelerators")
    image = ctl_vm["disks"][0]["initializeParams"]["sourceImage"]
    assert "ubuntu-os-cloud" in image and "nvidia" not in image
    assert node.role == "controller" and not node.spot
    assert f"ct-{RUN}-controller-0" in {n.name for n in compute.list_nodes(RUN)}


def test_teardown_finds_and_removes_every_controller_resource(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute, email, _, _ = _ready(provider)
    listed = compute.list_resources(RUN)
    kinds = {r.kind for r in listed if r.kind.startswith("controller-")}
    assert kinds == {
        "controller-service-account",
        "controller-project-binding",
        "controller-account-binding",
    }
    assert (RUN, "controller-service-account", email) in {
        (t.run_id, t.kind, t.id) for t in compute.inventory()
    }
    compute.delete_resources(listed)
    compute.delete_resources(listed)  # idempotent
    assert [r for r in compute.list_resources(RUN) if r.kind.startswith("controller-")] == []
    assert email not in {a["email"] for a in gcp_cloud.gce.service_accounts()}
    project = gcp_cloud.gce.iam_policy("project", provider.project)
    assert not [m for b in project["bindings"] for m in b["members"] if email in m]
    assert not [
        m
        for b in gcp_cloud.gcs.iam_policy(BUCKET).get("bindings") or []
        for m in b["members"]
        if email in m
    ]


def test_a_deleted_account_left_in_the_project_policy_is_still_found_and_removed(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute, email, _, _ = _ready(provider)
    compute.iam.delete(email)  # as if the controller deleted its own account and died
    project = gcp_cloud.gce.iam_policy("project", provider.project)
    assert any(
        m.startswith(f"deleted:serviceAccount:{email}?uid=")
        for b in project["bindings"]
        for m in b["members"]
    )
    listed = [r for r in compute.list_resources(RUN) if r.kind.startswith("controller-")]
    assert {r.kind for r in listed} == {"controller-project-binding", "controller-account-binding"}
    compute.delete_resources(listed)
    assert [r for r in compute.list_resources(RUN) if r.kind.startswith("controller-")] == []
    project = gcp_cloud.gce.iam_policy("project", provider.project)
    on_node_sas = [
        gcp_cloud.gce.iam_policy("account", identity.node_email(provider.project, RUN, n))
        for n in NODES
    ]
    for policy in (project, *on_node_sas):
        assert not [m for b in policy["bindings"] for m in b["members"] if email in m]
