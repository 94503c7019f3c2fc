"""Getting the GPUs on GCP, in the box (issue 30's acceptance): a project as stingy as a new one.

The job's three cheapest GCP regions (the plan's price order) are made hard: the cheapest has
no T4 quota (NVIDIA_T4_GPUS 0), every zone of the next is sold out (ZONE_RESOURCE_POOL_EXHAUSTED
until restored), the third has both. `cloudtrain check job.yaml` says so before anything exists
(capacity no cloud tells before a create: check names the second region as the one to launch
in); `cloudtrain run` skips the first for its quota, fails over from the second when every zone
refuses, and trains to success in the third (real TensorFlow, as test_gcp_in_a_box). Nothing is
left anywhere; the ledger's failover events and the summary show the path.

A caller missing one right (the box's policy for its caller: tests/fakes/gcp_account.py) is
told by `check` which, and `run` refuses before creating anything with the same line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import yaml

from cloudtrain.catalog.offers import Catalog
from cloudtrain.jobspec.job import load_spec
from cloudtrain.plan.account_check import candidates
from cloudtrain.plan.planner import make_plan, on_demand_spec
from tests.e2e.test_gcp_in_a_box import JOB, GcpBox, gcp
from tests.fakes.gcp_cloud import gcp_cloud, gcs_emulator, gcs_emulator_session

__all__ = ["gcp", "gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
GPU_QUOTA = "NVIDIA_T4_GPUS"  # the job's accelerator, T4:1 on each of two workers


@dataclass
class MadeIn(GcpBox):
    """The box, its bucket the one the run made in `region` (not the default region's)."""

    region: str = ""

    @property
    def bucket(self) -> str:
        return f"cloudtrain-{self.cloud.project}-{self.region}"


def cheapest_regions(count: int) -> list[str]:
    """The job's `count` cheapest GCP regions, in the plan's price order (the catalog decides)."""
    spec = load_spec(JOB, provider="gcp")
    regions = [c.region for c in candidates(spec, Catalog.bundled(), count)]
    assert len(regions) == count, regions
    return regions


def zone_region(inst_or_op: dict) -> str:
    return inst_or_op["zone"].rsplit("/", 1)[-1].rsplit("-", 1)[0]


def nothing_exists(gcp: GcpBox) -> None:
    assert gcp.cloud.gce.instances() == []
    assert gcp.cloud.gce.firewalls() == []
    assert gcp.cloud.gce.service_accounts() == []
    assert gcp.ct.run_ids() == []


def test_no_quota_then_sold_out_then_the_third_region_trains(gcp: GcpBox) -> None:
    first, second, third = cheapest_regions(3)
    account = gcp.cloud.account
    account.new_project()  # every GPU quota 0, GPUS_ALL_REGIONS 0
    account.set_quota("global", "GPUS_ALL_REGIONS", 8)
    for region in (second, third):
        account.set_quota(region, GPU_QUOTA, 8)
    sold_out = account.sell_out_region(second)

    check = gcp.run("check", "--provider", "gcp", "--json", str(JOB))
    report = json.loads(check.stdout)
    (cloud,) = [c for c in report["clouds"] if c["provider"] == "gcp"]
    assert cloud["usable"] and cloud["missing_rights"] == [], cloud
    by_region = {r["region"]: r for r in cloud["regions"]}
    assert not by_region[first]["fits"]
    assert f"quota {GPU_QUOTA} in {first}: limit 0" in by_region[first]["reason"]
    assert by_region[second]["fits"] and by_region[third]["fits"]
    shown = gcp.run("check", "--provider", "gcp", str(JOB)).stdout
    assert f"quota {GPU_QUOTA} in {first}: limit 0, in use 0, needs 2 GPU" in shown, shown
    nothing_exists(gcp)  # check asked, read-only

    proc = gcp.run("run", "--provider", "gcp", str(JOB), timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_id,) = gcp.ct.run_ids()
    operations = gcp.cloud.gce.operations()
    inserts = [op for op in operations if op["operationType"] == "insert" and "zone" in op]
    tried = [op["zone"].rsplit("/", 1)[-1] for op in inserts if zone_region(op) == second]
    assert set(tried) == set(sold_out), tried  # every zone of the second refused
    assert all(op.get("error") for op in inserts if zone_region(op) == second)
    # the plan skipped the first for its quota, and failover never tries it (Plan.avoided)
    assert not [op for op in inserts if zone_region(op) == first], "no quota: never tried"
    landed = [op for op in inserts if not op.get("error")]
    assert len(landed) == 2 and {zone_region(op) for op in landed} == {third}
    record = gcp.ct.ledger().get_run(run_id)
    assert record is not None and record.region == third
    # the run's store stays where the run made it (the second region's bucket; failover.py)
    box = MadeIn(gcp.ct, gcp.harness, gcp.cloud, gcp.identities, region=second)
    keys = box.keys(f"cloudtrain/runs/{run_id}/")
    assert f"cloudtrain/runs/{run_id}/model/saved_model/saved_model.pb" in keys
    # the path, in the ledger and the summary
    path = [e.message for e in gcp.ct.ledger().events(run_id) if e.kind == "failover"]
    route = next(line for line in path if line.startswith("tried "))
    assert route.startswith(f"tried gcp {second}: capacity:"), route
    assert route.endswith(f"landed in gcp {third}"), route
    assert f"place: tried gcp {second}: capacity" in proc.stdout, proc.stdout[-3000:]
    planned = proc.stdout.split("cloudtrain run ", 1)[0]  # the plan, before anything exists
    assert f"in {second}" in planned  # planned there, saying why not in the first:
    assert f"quota {GPU_QUOTA} in {first}: limit 0" in planned, planned
    box.assert_nothing_left(run_id)
    assert [i for i in gcp.cloud.gce.instances() if zone_region(i) in (first, second)] == []


def test_a_caller_missing_one_right_is_told_by_check_and_run_creates_nothing(
    gcp: GcpBox,
) -> None:
    gcp.cloud.account.deny("iam.serviceAccounts.create")
    check = gcp.run("check", "--provider", "gcp", str(JOB))
    assert check.returncode == 1, check.stdout + check.stderr
    line = "the GCP credentials lack 1 right(s) a run needs: iam.serviceAccounts.create"
    assert line in check.stdout, check.stdout
    proc = gcp.run("run", "--provider", "gcp", str(JOB))
    assert proc.returncode != 0
    assert line in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert gcp.cloud.gce.instances() == [] and gcp.cloud.gce.firewalls() == []
    assert gcp.cloud.gce.service_accounts() == []
    inserts = [r for r in gcp.cloud.gce.requests if r.startswith(("POST", "DELETE"))]
    assert all(":testIamPermissions" in r for r in inserts), inserts  # it only asked
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(credentials=AnonymousCredentials(), project=gcp.cloud.project)
    assert [b.name for b in client.list_buckets()] == [], "no bucket either"


def test_no_spot_capacity_anywhere_goes_on_demand_where_the_spec_allows(gcp: GcpBox) -> None:
    job = gcp.ct.tick_job("spotless", epochs=3, seconds=0.2)
    spec = yaml.safe_load(job.read_text())
    spec["cluster"].update(spot=True, spot_fallback=True)
    job.write_text(yaml.safe_dump(spec))
    on_demand = make_plan(on_demand_spec(load_spec(job, provider="gcp")), Catalog.bundled())
    gcp.cloud.account.sell_out_everywhere(spot_only=True)
    proc = gcp.run("run", "--provider", "gcp", str(job), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_id,) = gcp.ct.run_ids()
    inserts = [
        op for op in gcp.cloud.gce.operations() if op["operationType"] == "insert" and "zone" in op
    ]
    landed = [op for op in inserts if not op.get("error")]
    assert len(landed) == 2 and {zone_region(op) for op in landed} == {on_demand.region}
    assert all(op.get("error") for op in inserts if op not in landed)
    path = [e.message for e in gcp.ct.ledger().events(run_id) if e.kind == "failover"]
    route = next(line for line in path if line.startswith("tried "))
    assert "no spot place left: on-demand from here" in route
    assert route.endswith(f"landed on-demand in gcp {on_demand.region}"), route
    moved = f"moving to gcp {on_demand.region} at ${on_demand.hourly_usd:.2f}/h"
    assert path.count(moved) >= 1, path[-5:]
    assert "place: tried gcp " in proc.stdout
    record = gcp.ct.ledger().get_run(run_id)  # the spot plan's first place made the store
    assert record is not None and record.store_uri
    made_in = record.store_uri.removeprefix(f"gs://cloudtrain-{gcp.cloud.project}-")
    MadeIn(gcp.ct, gcp.harness, gcp.cloud, gcp.identities, region=made_in).assert_nothing_left(
        run_id
    )
