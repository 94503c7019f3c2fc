"""Getting the GPUs on Azure (issue 30's acceptance, on the Azure box): a stingy subscription
(tests/fakes/azure_account.py) whose cheapest region for the job has no T4 quota and whose next
region is sold out in every zone. `cloudtrain check job.yaml` says so before anything exists,
`cloudtrain run` fails over to the third region and trains to success, leaving nothing in the
first two; the ledger and the summary show the path. A caller missing one right is told by
`check` which, and `run` refuses before creating anything, with the same line.

The box is test_azure_in_a_box's (the ARM fake, Azurite, VMs booted as local sessions).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_azure_in_a_box import JOB, AzureBox, azure
from tests.fakes.azure_cloud import azure_cloud, azurite, azurite_session

__all__ = ["azure", "azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
T4_FAMILY = "standardNCASv3_T4Family"  # Standard_NC4as_T4_v3's quota family


def check(box: AzureBox, *args: str) -> tuple[int, dict[str, Any]]:
    proc = box.run("check", "--provider", "azure", "--json", *args)
    return proc.returncode, json.loads(proc.stdout)


def regions_in_price_order(box: AzureBox) -> list[str]:
    _, report = check(box, str(JOB))
    (cloud,) = report["clouds"]
    return [r["region"] for r in cloud["regions"]]


def test_check_sees_the_quota_and_run_fails_over_to_the_third_region(azure: AzureBox) -> None:
    first, second, third = regions_in_price_order(azure)[:3]
    account = azure.arm.account
    account.set_quota(first, T4_FAMILY, 0)
    account.sell_out(second)

    code, report = check(azure, str(JOB))
    (cloud,) = report["clouds"]
    by_region = {r["region"]: r for r in cloud["regions"]}
    assert not by_region[first]["fits"], by_region[first]
    assert T4_FAMILY in by_region[first]["reason"], by_region[first]["reason"]
    assert by_region[second]["fits"], "capacity is not knowable before a create"
    assert report["launch"]["region"] == second and report["note"], report
    assert cloud["missing_rights"] == [] and code == 0
    assert azure.arm.resources() == [] and azure.arm.groups() == [], "check created nothing"
    plan = azure.run("plan", "--provider", "azure", str(JOB)).stdout
    # the account-aware plan leaves the region without quota, and says why in one line
    assert f"node(s) in {second}:" in plan, plan
    (skipped,) = [line for line in plan.splitlines() if f"skipped azure {first}:" in line]
    assert f"quota {T4_FAMILY} in {first}: limit 0" in skipped, plan

    proc = azure.run("run", "--provider", "azure", str(JOB), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    (run_id,) = azure.ct.run_ids()
    run = azure.ct.ledger().get_run(run_id)
    assert run is not None and run.region == third, (run, proc.stdout[-3000:])
    prefix = f"cloudtrain/runs/{run_id}/"
    assert prefix + "model/saved_model/saved_model.pb" in azure.keys(run_id, prefix)
    assert {vm.group for vm in azure.booted_vms()} == {azure.run_group(run_id)}
    # the path: the summary's place line and the ledger's failover events say each try
    (place,) = [line for line in proc.stdout.splitlines() if line.strip().startswith("place:")]
    assert f"node(s) in {first}:" not in proc.stdout, "the plan skipped the region without quota"
    assert f"azure {second}: capacity: no capacity" in place, place
    assert place.rstrip().endswith(f"landed in azure {third}"), place
    failovers = [e.message for e in azure.ct.ledger().events(run_id) if e.kind == "failover"]
    assert failovers and failovers[-1] in place, (failovers, place)
    # nothing left of the run, in any region: no VM, no group, no assignment, no NIC or disk
    azure.assert_nothing_left(run_id)
    groups = {g["name"] for g in azure.arm.groups()}
    assert groups <= {f"cloudtrain-{r}" for r in (second, third)}, groups  # shared storage only
    assert [r["id"] for r in azure.arm.resources() if r.get("location") == first] == []
    assert [r["id"] for r in azure.arm.resources() if r.get("location") == second] == [] or all(
        r["type"] == "Microsoft.Storage/storageAccounts"
        for r in azure.arm.resources()
        if r.get("location") == second
    ), "only the run's storage account (made before the zones were found full) stays"
    assert azure.arm.resources(kind="virtualMachines") == []


def test_a_caller_missing_a_right_is_told_by_check_and_refused_by_run(azure: AzureBox) -> None:
    right = "Microsoft.Authorization/roleDefinitions/write"  # the subscription's node role
    azure.arm.account.deny(right)
    code, report = check(azure, str(JOB))
    (cloud,) = report["clouds"]
    assert cloud["missing_rights"] == [right] and code != 0, cloud
    told = azure.run("check", "--provider", "azure", str(JOB)).stdout
    (line,) = [t.strip() for t in told.splitlines() if "credentials lack" in t]
    assert right in line, told
    proc = azure.run("run", "--provider", "azure", str(JOB))
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert line in proc.stdout + proc.stderr, (line, proc.stdout[-3000:], proc.stderr[-2000:])
    assert azure.arm.resources() == [] and azure.arm.groups() == [], "nothing created"
    assert azure.harness.booted == []
