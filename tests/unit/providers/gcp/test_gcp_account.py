"""GCP's account probe and the stingy box, through the real SDKs against the GCE fake.

The probe (providers/gcp/account.py) reads the fake's region and project quotas with
google-cloud-compute, its caller's rights with Resource Manager's testIamPermissions and its
APIs with Service Usage (google-auth's AuthorizedSession); the adapter's real create is refused
by the same rules (tests/fakes/gcp_account.py): over a quota with QUOTA_EXCEEDED, in a sold-out
zone with ZONE_RESOURCE_POOL_EXHAUSTED until restored, without a permission with GCE's 403.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from cloudtrain.core.errors import CredentialsError, NoCapacityError, ProviderError, QuotaError
from cloudtrain.providers.account import QuotaNeed
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from cloudtrain.providers.gcp.account import RUN_APIS, GcpAccountProbe
from cloudtrain.providers.gcp.compute import GcpCompute
from cloudtrain.providers.gcp.controller_identity import RUN_PERMISSIONS
from cloudtrain.providers.gcp.errors import denied_permission
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes.gce_fake import GceFake, gce_fake
from tests.fakes.gcp_account import GcpAccount

__all__ = ["gce_fake"]  # fixture, for pytest
PROJECT = "ct-account-project"
REGION, ZONE = "us-east1", "us-east1-b"
RUN = "acct-abc123"
NODES = ("worker-0", "worker-1")


@pytest.fixture
def box(gce_fake: GceFake, monkeypatch: pytest.MonkeyPatch) -> Iterator[GceFake]:
    for env in ("CLOUDTRAIN_GCE_ENDPOINT", "CLOUDTRAIN_IAM_ENDPOINT"):
        monkeypatch.setenv(env, gce_fake.url)
    for env in (
        "CLOUDTRAIN_CRM_ENDPOINT",
        "CLOUDTRAIN_SERVICEUSAGE_ENDPOINT",
        "CLOUDTRAIN_SSH_CIDR",
    ):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("CLOUDTRAIN_GCP_SERVICE_ACCOUNT", raising=False)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    gce_fake.operation_polls_to_done = 1
    gce_fake.require_known_service_accounts = True
    yield gce_fake


@pytest.fixture
def compute(box: GceFake) -> GcpCompute:
    return GcpProvider(ProviderConfig(name="gcp", region=REGION, zone=ZONE)).compute


def probe() -> GcpAccountProbe:
    probe = GcpProvider(ProviderConfig(name="gcp", region=REGION)).account_probe()
    assert isinstance(probe, GcpAccountProbe)
    return probe


def info() -> RunInfo:
    return RunInfo(RUN, REGION, ZONE, (2222, 2232), nodes=NODES)


def node(index: int = 0, spot: bool = False, zone: str = ZONE, gpus: int = 1) -> NodeRequest:
    return NodeRequest(
        RUN,
        "worker",
        index,
        "n1-standard-8",
        "#!/bin/bash\necho boot\n",
        zone=zone,
        spot=spot,
        disk_gb=120,
        accelerator="T4",
        accelerator_count=gpus,
    )


def t4_need(nodes: int = 1, spot: bool = False) -> QuotaNeed:
    return QuotaNeed("n1-standard-8", "T4", 1, 8, nodes, spot)


# --- quotas -------------------------------------------------------------------------------------


def test_a_new_project_reads_gpu_quota_zero_and_the_usage_of_what_runs(
    box: GceFake, compute: GcpCompute
) -> None:
    account = GcpAccount(box)
    compute.ensure_network(info())
    compute.create_node(info(), node(0))  # one T4 VM, before the project turns stingy
    account.new_project()
    account.set_quota(REGION, "NVIDIA_T4_GPUS", 4)
    account.add_usage(REGION, "NVIDIA_T4_GPUS", 2)  # VMs the fake does not hold
    lines = {q.quota: q for q in probe().quotas(REGION, [t4_need(nodes=2)])}
    t4, every, cpus = lines["NVIDIA_T4_GPUS"], lines["GPUS_ALL_REGIONS"], lines["CPUS"]
    assert (t4.region, t4.unit, t4.limit, t4.usage, t4.need) == (REGION, "GPU", 4, 3, 2)
    assert not t4.fits, "2 more T4s do not fit in 4 with 3 used"
    assert (every.region, every.limit, every.usage, every.need) == ("global", 0, 1, 2)
    assert (cpus.unit, cpus.usage, cpus.need) == ("vCPU", 8, 16) and cpus.fits
    assert set(lines) == {"NVIDIA_T4_GPUS", "GPUS_ALL_REGIONS", "CPUS"}
    other = {q.quota: q for q in probe().quotas("europe-west4", [t4_need()])}
    assert other["NVIDIA_T4_GPUS"].limit == 0 and other["NVIDIA_T4_GPUS"].usage == 0


def test_spot_counts_against_preemptible_quota_only_where_granted(box: GceFake) -> None:
    account = GcpAccount(box)
    account.new_project()
    names = {q.quota for q in probe().quotas(REGION, [t4_need(spot=True)])}
    assert "NVIDIA_T4_GPUS" in names and "CPUS" in names, "not granted: the regular quotas"
    account.set_quota(REGION, "PREEMPTIBLE_NVIDIA_T4_GPUS", 8)
    account.set_quota(REGION, "PREEMPTIBLE_CPUS", 64)
    lines = {q.quota: q for q in probe().quotas(REGION, [t4_need(spot=True), t4_need(nodes=2)])}
    assert lines["PREEMPTIBLE_NVIDIA_T4_GPUS"].need == 1 and lines["PREEMPTIBLE_CPUS"].need == 8
    assert lines["NVIDIA_T4_GPUS"].need == 2 and lines["GPUS_ALL_REGIONS"].need == 3


def test_an_insert_over_a_regional_quota_fails_with_quota_exceeded_naming_it(
    box: GceFake, compute: GcpCompute
) -> None:
    account = GcpAccount(box)
    compute.ensure_network(info())
    account.set_quota(REGION, "NVIDIA_T4_GPUS", 1)
    compute.create_node(info(), node(0))
    with pytest.raises(QuotaError, match=r"NVIDIA_T4_GPUS.*us-east1") as err:
        compute.create_node(info(), node(1))
    assert "NVIDIA_T4_GPUS" in str(err.value.hint)
    failed = [o for o in box.operations(PROJECT) if o.get("error")][-1]
    assert failed["httpErrorStatusCode"] == 403
    quota = failed["error"]["errors"][0]
    assert quota["code"] == "QUOTA_EXCEEDED"
    assert quota["errorDetails"][0]["quotaInfo"] == {
        "metricName": "compute.googleapis.com/nvidia_t4_gpus",
        "limitName": "NVIDIA-T4-GPUS-per-project-region",
        "dimensions": {"region": REGION},
        "limit": 1.0,
    }
    assert [i["name"] for i in box.instances(PROJECT)] == [node(0).name], "the refused one is gone"


def test_gpus_all_regions_zero_refuses_any_gpu_globally(box: GceFake, compute: GcpCompute) -> None:
    compute.ensure_network(info())
    GcpAccount(box).set_quota("global", "GPUS_ALL_REGIONS", 0)
    with pytest.raises(QuotaError, match=r"GPUS_ALL_REGIONS.*globally"):
        compute.create_node(info(), node(0))
    assert box.instances(PROJECT) == []


# --- capacity -----------------------------------------------------------------------------------


def test_a_sold_out_zone_refuses_every_insert_until_restored(
    box: GceFake, compute: GcpCompute
) -> None:
    account = GcpAccount(box)
    compute.ensure_network(info())
    account.sell_out(ZONE)
    for _ in range(3):
        with pytest.raises(NoCapacityError) as err:
            compute.create_node(info(), node(0))
        assert err.value.zone == ZONE and ZONE in str(err.value)
    assert box.instances(PROJECT) == []
    compute.create_node(info(), node(0, zone="us-east1-c"))  # the region's other zone has room
    account.restore(ZONE)
    compute.create_node(info(), node(1))
    assert len(box.instances(PROJECT)) == 2


def test_a_zone_sold_out_of_spot_still_sells_on_demand(box: GceFake, compute: GcpCompute) -> None:
    compute.ensure_network(info())
    GcpAccount(box).sell_out(ZONE, spot_only=True)
    with pytest.raises(NoCapacityError):
        compute.create_node(info(), node(0, spot=True))
    compute.create_node(info(), node(0))
    assert len(box.instances(PROJECT)) == 1


def test_spot_sold_out_everywhere_until_restored(box: GceFake, compute: GcpCompute) -> None:
    account = GcpAccount(box)
    compute.ensure_network(info())
    account.sell_out_everywhere(spot_only=True)
    for zone in (ZONE, "us-east1-c", "europe-west4-a"):
        with pytest.raises(NoCapacityError):
            compute.create_node(info(), node(0, spot=True, zone=zone))
    compute.create_node(info(), node(0))  # on demand still sells
    account.restore("*")
    compute.create_node(info(), node(1, spot=True))
    assert len(box.instances(PROJECT)) == 2


# --- the caller's rights and the APIs -----------------------------------------------------------


def test_a_narrow_caller_is_told_the_missing_right_and_the_create_is_refused_naming_it(
    box: GceFake, compute: GcpCompute
) -> None:
    assert probe().missing_rights() == []
    compute.ensure_network(info())
    GcpAccount(box).deny("compute.instances.create")
    assert probe().missing_rights() == ["compute.instances.create"]
    with pytest.raises(ProviderError, match=r"compute\.instances\.create") as err:
        compute.create_node(info(), node(0))
    assert "compute.instances.create" in str(err.value.hint)
    assert box.instances(PROJECT) == []
    raw = requests.post(
        f"{box.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances",
        json={"name": "n1", "machineType": f"zones/{ZONE}/machineTypes/n1-standard-1"},
        timeout=10,
    )
    assert raw.status_code == 403
    assert raw.json()["error"]["errors"][0] == {
        "domain": "global",
        "reason": "forbidden",
        "message": f"Required 'compute.instances.create' permission for "
        f"'projects/{PROJECT}/zones/{ZONE}/instances/n1'",
    }


def test_a_caller_without_the_right_to_create_accounts_is_refused_by_iam(
    box: GceFake, compute: GcpCompute
) -> None:
    GcpAccount(box).deny("iam.serviceAccounts.create")
    assert probe().missing_rights() == ["iam.serviceAccounts.create"]
    with pytest.raises(CredentialsError, match=r"Permission 'iam\.serviceAccounts\.create' denied"):
        compute.ensure_network(info())
    assert box.service_accounts(PROJECT) == []


def test_missing_rights_asks_for_every_right_a_run_uses(box: GceFake) -> None:
    probe().missing_rights()
    asked = [r for r in box.requests if ":testIamPermissions" in r]
    assert asked == [f"POST /v1/projects/{PROJECT}:testIamPermissions"]
    account = GcpAccount(box)
    for right in ("compute.firewalls.create", "iam.serviceAccounts.actAs"):
        account.deny(right)
    assert probe().missing_rights() == ["compute.firewalls.create", "iam.serviceAccounts.actAs"]
    assert "storage.objects.create" in RUN_PERMISSIONS
    with pytest.raises(ValueError, match="does not enforce"):
        account.deny("storage.objects.create")


def test_a_disabled_api_is_reported_and_refuses_its_calls(
    box: GceFake, compute: GcpCompute
) -> None:
    assert all(a.ok for a in probe().apis())
    GcpAccount(box).disable("compute.googleapis.com")
    states = {a.name: a for a in probe().apis()}
    assert not states["compute.googleapis.com"].ok
    assert (
        "gcloud services enable compute.googleapis.com" in states["compute.googleapis.com"].detail
    )
    assert states["iam.googleapis.com"].ok
    with pytest.raises(ProviderError, match="has not been used in project") as err:
        probe().quotas(REGION, [t4_need()])
    assert err.value.hint == "enable the API: `gcloud services enable compute.googleapis.com`"


def test_the_probe_on_the_box_is_anonymous_and_names_the_project(box: GceFake) -> None:
    source = probe().credentials()
    assert source.account == PROJECT and source.principal == ""
    assert "anonymous" in source.source and box.url in source.source


def test_apis_say_when_service_usage_itself_refuses(box: GceFake) -> None:
    GcpAccount(box).deny("serviceusage.services.get")
    states = probe().apis()
    assert [s.name for s in states] == list(RUN_APIS)
    assert all(not s.ok and "serviceusage.services.get" in s.detail for s in states), states


def test_iams_refusal_has_iams_shape_naming_the_permission(box: GceFake) -> None:
    GcpAccount(box).deny("iam.serviceAccounts.create")
    raw = requests.post(
        f"{box.url}/v1/projects/{PROJECT}/serviceAccounts",
        json={"accountId": "someone-new"},
        timeout=10,
    )
    assert raw.status_code == 403
    error = raw.json()["error"]
    assert error["status"] == "PERMISSION_DENIED" and error["code"] == 403
    assert error["message"] == (
        "Permission 'iam.serviceAccounts.create' denied on resource (or it may not exist)."
    )
    assert error["details"][0]["reason"] == "IAM_PERMISSION_DENIED"
    assert error["details"][0]["metadata"] == {"permission": "iam.serviceAccounts.create"}


@pytest.mark.parametrize(
    ("message", "permission"),
    [
        (
            "Required 'compute.instances.create' permission for 'projects/p/zones/z/instances/n'",
            "compute.instances.create",
        ),
        (
            "Permission 'iam.serviceAccounts.create' denied on resource (or it may not exist).",
            "iam.serviceAccounts.create",
        ),
        (
            "Permission iam.serviceAccounts.create is required to perform this operation on "
            "project projects/p.",
            "iam.serviceAccounts.create",
        ),
        (
            "ct@p.iam.gserviceaccount.com does not have storage.buckets.create access to the "
            "Google Cloud project.",
            "storage.buckets.create",
        ),
        ("Request had insufficient authentication scopes.", None),
    ],
)
def test_an_access_denied_message_names_its_permission(
    message: str, permission: str | None
) -> None:
    assert denied_permission(message) == permission
