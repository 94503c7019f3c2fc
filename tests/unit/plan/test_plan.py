"""Unit tests for cloudtrain.plan.planner: the planner's choices checked against brute force."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cloudtrain.catalog.offers import LOCAL_PRICE_ENV, Catalog, Offer
from cloudtrain.core.errors import PlanError
from cloudtrain.plan.planner import LOCAL_GPU_NOTE, Plan, make_plan
from cloudtrain.providers.gcp.catalog_rules import GPU_HOST as GCP_GPU_HOST

GPU_ROLES = ("chief", "worker", "evaluator")


def row(
    provider: str,
    itype: str,
    acc: str | None,
    count: int,
    region: str,
    zone: str | None,
    price: float,
    spot: float | None,
) -> Offer:
    return Offer(provider, itype, acc, count, 8.0, 32.0, region, zone, price, spot, "2026-11-21")


ROWS = [
    row("aws", "p3", "V100", 1, "r-east", "east-a", 3.06, 0.90),
    row("aws", "p3x4", "V100", 4, "r-east", "east-a", 12.24, 1.44),
    row("aws", "g4", "T4", 1, "r-east", "east-a", 0.53, 0.22),
    row("aws", "m5", None, 0, "r-east", "east-a", 0.19, 0.06),
    row("aws", "p3", "V100", 1, "r-west", "west-a", 3.00, 1.20),
    row("aws", "m5", None, 0, "r-west", "west-a", 0.25, 0.07),
    row("aws", "p3", "V100", 1, "r-west", "west-b", 3.10, 0.70),
    row("aws", "m5", None, 0, "r-west", "west-b", 0.20, 0.05),
    row("aws", "p4", "A100", 8, "r-west", "west-a", 20.0, 8.0),
    row("aws", "p3", "V100", 1, "r-eu", "eu-a", 2.90, None),  # no CPU machine, no spot price
    row("gcp", GCP_GPU_HOST, None, 0, "us-central1", "us-central1-a", 0.38, 0.10),
    row("gcp", "n1-standard-4", None, 0, "us-central1", "us-central1-a", 0.19, 0.05),
    row("gcp", "", "V100", 1, "us-central1", "us-central1-a", 2.48, 1.09),
    row("gcp", GCP_GPU_HOST, None, 0, "europe-west4", "europe-west4-a", 0.42, 0.17),
    row("gcp", "", "V100", 1, "europe-west4", "europe-west4-a", 2.60, 1.04),
    row("azure", "Standard_NC6s_v3", "V100", 1, "eastus", None, 3.06, 0.40),
    row("azure", "Standard_D4s_v5", None, 0, "eastus", None, 0.192, 0.021),
    row("local", "local", None, 0, "local", "local", 0.0, 0.0),
]
CATALOG = Catalog.from_rows(ROWS)


def make_spec(
    provider: str = "aws",
    *,
    region: str | None = None,
    zone: str | None = None,
    accelerator: str | None = "V100",
    count: int = 1,
    instance_type: str | None = None,
    spot: bool = False,
    roles: dict[str, int] | None = None,
    max_hours: float = 2.0,
    max_cost_usd: float | None = None,
    max_gpu_hours: float | None = None,
) -> Any:
    """A stand-in for cloudtrain.jobspec.job's job spec with only the attributes the planner
    reads."""
    role_counts = roles if roles is not None else {"chief": 1, "worker": 2, "ps": 1}
    cluster = SimpleNamespace(
        strategy="parameter_server",
        accelerator_name=accelerator,
        accelerator_count=count if accelerator else 0,
        instance_type=instance_type,
        spot=spot,
        roles=lambda: dict(role_counts),
    )
    return SimpleNamespace(
        name="test-run",
        provider=provider,
        region=region,
        zone=zone,
        max_hours=max_hours,
        max_cost_usd=max_cost_usd,
        max_gpu_hours=max_gpu_hours,
        cluster=cluster,
    )


def brute_force(
    rows: list[Offer],
    provider: str,
    region: str | None,
    accelerator: str | None,
    count: int,
    spot: bool,
    roles: dict[str, int],
) -> list[tuple[float, str, str | None]]:
    """Every feasible (cluster $/h, region, zone), enumerated from the raw rows; cheapest first."""
    n_main = sum(n for role, n in roles.items() if role in GPU_ROLES)
    n_ps = roles.get("ps", 0)

    def price(o: Offer) -> float | None:
        return o.spot_price_hourly if spot else o.price_hourly

    results = []
    for gpu in rows:
        if gpu.provider != provider or (region and gpu.region != region) or price(gpu) is None:
            continue
        if not gpu.instance_type or gpu.accelerator != accelerator:
            continue
        if accelerator and gpu.accelerator_count != count:
            continue
        cpus = [
            p
            for o in rows
            if o.provider == provider
            and (o.region, o.zone) == (gpu.region, gpu.zone)
            and o.accelerator is None
            and o.instance_type
            and (p := price(o)) is not None
        ]
        if n_ps and not cpus:
            continue
        hourly = n_main * (price(gpu) or 0.0) + (n_ps * min(cpus) if n_ps else 0.0)
        results.append((round(hourly, 6), gpu.region, gpu.zone))
    return sorted(results)


@pytest.mark.parametrize("spot", [False, True])
@pytest.mark.parametrize("region", [None, "r-east", "r-west"])
@pytest.mark.parametrize("roles", [{"chief": 1, "worker": 2, "ps": 1}, {"chief": 1, "worker": 3}])
def test_choice_matches_brute_force(spot: bool, region: str | None, roles: dict[str, int]) -> None:
    plan = make_plan(make_spec(region=region, spot=spot, roles=roles), CATALOG)
    best = brute_force(ROWS, "aws", region, "V100", 1, spot, roles)[0]
    assert (plan.hourly_usd, plan.region, plan.zone) == pytest.approx(best)
    assert plan.estimate_usd == pytest.approx(plan.hourly_usd * 2.0)
    assert all((n.region, n.zone, n.spot) == (plan.region, plan.zone, spot) for n in plan.nodes)


def test_single_region_choice() -> None:
    plan = make_plan(make_spec(region="r-east"), CATALOG)
    assert (plan.region, plan.zone) == ("r-east", "east-a")
    assert plan.hourly_usd == pytest.approx(3 * 3.06 + 0.19)


def test_cheapest_region_when_region_not_given() -> None:
    # r-eu has the cheapest V100 but no CPU machine for ps; r-west/west-a is next
    plan = make_plan(make_spec(), CATALOG)
    assert (plan.region, plan.zone, plan.hourly_usd) == ("r-west", "west-a", pytest.approx(9.25))
    no_ps = make_plan(make_spec(roles={"chief": 1, "worker": 2}), CATALOG)
    assert (no_ps.region, no_ps.hourly_usd) == ("r-eu", pytest.approx(8.7))


def test_spot_picks_spot_prices_and_skips_offers_without_one() -> None:
    on_demand = make_plan(make_spec(roles={"chief": 1}), CATALOG)
    spot = make_plan(make_spec(roles={"chief": 1}, spot=True), CATALOG)
    assert (on_demand.region, on_demand.price_of("chief")) == ("r-eu", 2.90)
    assert (spot.region, spot.zone, spot.price_of("chief")) == ("r-west", "west-b", 0.70)
    assert spot.nodes[0].spot and not on_demand.nodes[0].spot
    assert any("preempted" in note for note in spot.notes)


def test_ps_runs_on_the_cheapest_cpu_machine() -> None:
    plan = make_plan(make_spec(region="r-west", zone="west-b"), CATALOG)
    (ps,) = [n for n in plan.nodes if n.role == "ps"]
    assert (ps.instance_type, ps.accelerator, ps.accelerator_count) == ("m5", None, 0)
    assert plan.price_of("ps") == 0.20 and plan.price_of("chief") == 3.10


def test_ps_never_gets_a_controller_size_machine() -> None:
    """The catalog's 2 GB machines are for the controller node: a parameter server (TensorFlow)
    gets the cheapest CPU machine with at least 8 GB."""
    small = Offer("aws", "t3s", None, 0, 2.0, 2.0, "r-west", "west-b", 0.02, 0.01, "2026-11-21")
    catalog = Catalog.from_rows([*ROWS, small])
    plan = make_plan(make_spec(region="r-west", zone="west-b"), catalog)
    (ps,) = [n for n in plan.nodes if n.role == "ps"]
    assert (ps.instance_type, plan.price_of("ps")) == ("m5", 0.20)


def test_nodes_ordered_by_role_with_indexes() -> None:
    roles = {"evaluator": 1, "ps": 2, "worker": 2, "chief": 1}
    plan = make_plan(make_spec(region="r-east", roles=roles), CATALOG)
    names = ["chief-0", "worker-0", "worker-1", "ps-0", "ps-1", "evaluator-0"]
    assert [n.name for n in plan.nodes] == names
    assert plan.roles() == {"chief": 1, "worker": 2, "ps": 2, "evaluator": 1}
    assert plan.node_count == 6
    assert plan.nodes[-1].accelerator == "V100"  # the evaluator is a GPU role


def test_gcp_gpu_attached_to_n1_host() -> None:
    plan = make_plan(make_spec("gcp", count=2), CATALOG)
    chief = plan.nodes[0]
    assert (chief.instance_type, chief.accelerator, chief.accelerator_count) == (
        GCP_GPU_HOST,
        "V100",
        2,
    )
    assert (plan.region, plan.zone) == ("us-central1", "us-central1-a")
    assert chief.price_hourly == pytest.approx(0.38 + 2 * 2.48)
    assert plan.price_of("ps") == 0.19
    assert plan.hourly_usd == pytest.approx(3 * (0.38 + 2 * 2.48) + 0.19)
    assert any("attached to n1-standard-8" in note for note in plan.notes)


def test_instance_type_given() -> None:
    plan = make_plan(make_spec(accelerator=None, instance_type="P3X4"), CATALOG)
    assert {n.instance_type for n in plan.nodes if n.role != "ps"} == {"p3x4"}
    assert plan.nodes[0].accelerator_count == 4 and plan.region == "r-east"


def test_cpu_only_cluster_when_no_accelerator() -> None:
    plan = make_plan(make_spec(accelerator=None, region="r-east"), CATALOG)
    assert {(n.instance_type, n.accelerator) for n in plan.nodes} == {("m5", None)}
    assert plan.hourly_usd == pytest.approx(4 * 0.19)


def test_azure_has_no_zone() -> None:
    plan = make_plan(make_spec("azure", zone="1"), CATALOG)
    assert (plan.region, plan.zone) == ("eastus", None)
    assert any("zone 1 ignored" in note for note in plan.notes)


def test_zone_given() -> None:
    assert make_plan(make_spec(zone="west-b"), CATALOG).zone == "west-b"
    forced = make_plan(make_spec(region="r-east", zone="east-z"), CATALOG)
    assert forced.zone == "east-z" and all(n.zone == "east-z" for n in forced.nodes)
    assert any("east-z is not in the price catalog" in note for note in forced.notes)
    with pytest.raises(PlanError, match="east-z"):
        make_plan(make_spec(zone="east-z"), CATALOG)


def test_alternatives_are_the_next_cheapest_distinct_choices() -> None:
    plan = make_plan(make_spec(roles={"chief": 1, "worker": 1}), CATALOG)
    choices = brute_force(ROWS, "aws", None, "V100", 1, False, {"chief": 1, "worker": 1})
    best_per_region: dict[str, float] = {}
    for hourly, region, _ in choices:  # cheapest first: distinct (region, offer) choices
        best_per_region.setdefault(region, hourly)
    expected = sorted(best_per_region.values())
    assert plan.hourly_usd == expected[0]
    assert [a.hourly_usd for a in plan.alternatives] == expected[1:4] == [6.0, 6.12]
    assert all(a.estimate_usd == pytest.approx(a.hourly_usd * 2.0) for a in plan.alternatives)
    assert plan.alternatives[0].description == "p3 (V100 x1) in r-west/west-a"


def test_local_plan_is_free_and_notes_gpus() -> None:
    plan = make_plan(make_spec("local", spot=True), CATALOG)
    assert (plan.provider, plan.region, plan.zone) == ("local", "local", "local")
    assert plan.hourly_usd == 0 and plan.estimate_usd == 0
    assert LOCAL_GPU_NOTE in plan.notes
    assert all(n.instance_type == "local" and not n.spot for n in plan.nodes)
    assert LOCAL_GPU_NOTE not in make_plan(make_spec("local", accelerator=None), CATALOG).notes


def test_local_price_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    monkeypatch.setenv(LOCAL_PRICE_ENV, "0.5")
    plan = make_plan(make_spec("local", max_hours=3.0), Catalog.bundled())
    assert plan.hourly_usd == pytest.approx(4 * 0.5) and plan.estimate_usd == pytest.approx(6.0)
    with pytest.raises(PlanError, match=r"affords 2\.5 h"):
        make_plan(make_spec("local", max_hours=3.0, max_cost_usd=5.0), Catalog.bundled())


def test_over_budget_names_estimate_budget_and_affordable_hours() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec(region="r-east", max_cost_usd=5.0), CATALOG)
    error = caught.value
    assert error.message == (
        "estimated $18.74 for 2.0 h exceeds max_cost_usd $5.00; "
        "that budget affords 0.5 h at $9.37/h"
    )
    assert error.hint and "lower max_hours" in error.hint and "spot: true" in error.hint
    # within budget: no error
    assert make_plan(make_spec(region="r-east", max_cost_usd=18.74), CATALOG).estimate_usd == 18.74


def test_over_a_gpu_hour_budget_names_the_gpu_hours_and_affordable_hours() -> None:
    # chief and 2 workers with a V100 each (the ps has none): 3 GPUs for 2 h
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec(region="r-east", max_gpu_hours=4.5), CATALOG)
    assert caught.value.message == (
        "3 GPU(s) for 2.0 h is 6 GPU-hours, over max_gpu_hours 4.5; that budget affords 1.5 h "
        "on them"
    )
    assert caught.value.hint and "raise max_gpu_hours" in caught.value.hint
    assert make_plan(make_spec(region="r-east", max_gpu_hours=6), CATALOG).hourly_usd > 0


def test_infeasible_gpu_in_region_names_alternatives() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec(region="r-east", accelerator="A100", count=8), CATALOG)
    message = caught.value.message
    assert message.startswith("no aws offer with A100 x8 per node in r-east")
    assert "p4 (A100 x8) in r-west/west-a at $20.00/h" in message  # other region
    assert "p3x4 (V100 x4) in r-east/east-a at $12.24/h" in message  # another GPU in the region


def test_infeasible_count_names_other_counts() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec(region="r-east", count=2), CATALOG)
    message = caught.value.message
    assert "V100 x2 per node in r-east" in message
    assert "p3x4 (V100 x4)" in message and "p3 (V100 x1)" in message


def test_unknown_accelerator_and_region() -> None:
    with pytest.raises(PlanError, match="aws offers no Z100"):
        make_plan(make_spec(accelerator="Z100"), CATALOG)
    with pytest.raises(PlanError, match="region 'mars' is not in the aws price catalog"):
        make_plan(make_spec(region="mars"), CATALOG)


def test_bad_cluster_or_hours() -> None:
    with pytest.raises(PlanError, match="no nodes"):
        make_plan(make_spec(roles={"chief": 0}), CATALOG)
    with pytest.raises(PlanError, match="max_hours"):
        make_plan(make_spec(max_hours=0), CATALOG)


def test_to_dict_is_json_serialisable_and_round_trips() -> None:
    plan = make_plan(make_spec("gcp", spot=True), CATALOG)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["node_count"] == 4 and data["roles"] == {"chief": 1, "worker": 2, "ps": 1}
    assert data["nodes"][0]["instance_type"] == GCP_GPU_HOST
    assert Plan.from_dict(data) == plan


def test_bundled_catalog_plans_every_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    catalog = Catalog.bundled()
    for provider in ("aws", "gcp", "azure"):
        for spot in (False, True):
            # T4: the GPU all three bundled catalogs hold (Azure's V100s, NCv3, are retired)
            plan = make_plan(make_spec(provider, accelerator="T4", spot=spot), catalog)
            assert plan.hourly_usd > 0 and plan.nodes[0].accelerator == "T4"
            assert plan.nodes[3].role == "ps" and plan.nodes[3].accelerator is None
