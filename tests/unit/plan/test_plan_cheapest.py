"""Unit tests of `provider: cheapest`: the planner's cross-cloud choice checked against brute force
over every row of every cloud (GCP GPUs attached to their n1 host by the test itself)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cloudtrain.catalog.offers import Catalog, Offer
from cloudtrain.core.errors import PlanError
from cloudtrain.plan.planner import CLOUDS, Plan, make_plan
from cloudtrain.providers.gcp.catalog_rules import GPU_HOST as GCP_GPU_HOST
from cloudtrain.providers.gcp.catalog_rules import N1_GPU_COUNTS
from tests.unit.cli.test_cli import cli, heavy_modules
from tests.unit.plan.test_plan import CATALOG, ROWS, make_spec, row

GPU_ROLES = ("chief", "worker", "evaluator")
PS_CLUSTER = {"chief": 1, "worker": 2, "ps": 1}
Location = tuple[str, str, str | None]  # (cloud, region, zone)


def machines(rows: list[Offer], spot: bool) -> list[tuple[Offer, float]]:
    """Every launchable (machine, $/h) of the clouds: rows with an instance type as they are, and
    each GCP GPU-only row on the n1 host of its zone at host + count x GPU."""

    def price(o: Offer) -> float | None:
        return o.spot_price_hourly if spot else o.price_hourly

    found = [(o, p) for o in rows if o.instance_type and (p := price(o)) is not None]
    for gpu in rows:
        if gpu.provider != "gcp" or gpu.instance_type or gpu.accelerator not in N1_GPU_COUNTS:
            continue
        for host in rows:
            if host.instance_type != GCP_GPU_HOST or where(host) != where(gpu) or host.accelerator:
                continue
            exact = {
                o.accelerator_count
                for o in rows
                if not o.instance_type
                and o.accelerator == gpu.accelerator
                and where(o) == where(gpu)
            }
            for count in N1_GPU_COUNTS[gpu.accelerator]:
                if count == gpu.accelerator_count:
                    factor = 1
                elif gpu.accelerator_count == 1 and count not in exact:
                    factor = count
                else:
                    continue
                host_price, gpu_price = price(host), price(gpu)
                if host_price is None or gpu_price is None:
                    continue
                attached = Offer(
                    "gcp", GCP_GPU_HOST, gpu.accelerator, count, None, None, gpu.region,
                    gpu.zone, 0.0, None, "", attached=True,
                )  # fmt: skip
                found.append((attached, host_price + factor * gpu_price))
    return found


def where(offer: Offer) -> Location:
    return offer.provider, offer.region, offer.zone


def brute_force(
    rows: list[Offer],
    accelerator: str | None,
    count: int,
    spot: bool,
    roles: dict[str, int],
    instance_type: str | None = None,
) -> list[tuple[float, Location]]:
    """Every feasible (cluster $/h, location) over aws, gcp and azure; cheapest first."""
    n_main = sum(n for role, n in roles.items() if role in GPU_ROLES)
    n_ps = roles.get("ps", 0)
    launchable = [(o, p) for o, p in machines(rows, spot) if o.provider in CLOUDS]
    results = []
    for gpu, gpu_price in launchable:
        if instance_type and gpu.instance_type.lower() != instance_type.lower():
            continue
        if accelerator is None and (gpu.attached if instance_type else gpu.accelerator):
            continue
        if accelerator and (gpu.accelerator, gpu.accelerator_count) != (accelerator, count):
            continue
        place = where(gpu)
        cpus = [p for o, p in launchable if not o.accelerator and where(o) == place]
        if n_ps and not cpus:
            continue
        hourly = n_main * gpu_price + (n_ps * min(cpus) if n_ps else 0.0)
        results.append((round(hourly, 6), place))
    return sorted(results)


def assert_brute_force_choice(plan: Plan, choices: list[tuple[float, Location]]) -> None:
    best = choices[0][0]
    assert plan.hourly_usd == pytest.approx(best)
    cheapest_places = {place for hourly, place in choices if hourly == pytest.approx(best)}
    assert (plan.provider, plan.region, plan.zone) in cheapest_places
    assert plan.provider in CLOUDS


@pytest.mark.parametrize("spot", [False, True])
@pytest.mark.parametrize(
    ("accelerator", "count"), [("V100", 1), ("V100", 2), ("V100", 4), ("T4", 1), (None, 0)]
)
@pytest.mark.parametrize("roles", [PS_CLUSTER, {"chief": 1, "worker": 3}, {"chief": 1}])
def test_choice_matches_brute_force_over_all_clouds(
    spot: bool, accelerator: str | None, count: int, roles: dict[str, int]
) -> None:
    spec = make_spec("cheapest", accelerator=accelerator, count=count, spot=spot, roles=roles)
    plan = make_plan(spec, CATALOG)
    assert_brute_force_choice(plan, brute_force(ROWS, accelerator, count, spot, roles))
    assert all((n.region, n.zone, n.spot) == (plan.region, plan.zone, spot) for n in plan.nodes)


@pytest.mark.parametrize("spot", [False, True])
@pytest.mark.parametrize("instance_type", ["P3", "n1-standard-8", "Standard_NC6s_v3", "m5"])
def test_instance_type_choice_matches_brute_force(spot: bool, instance_type: str) -> None:
    spec = make_spec("cheapest", accelerator=None, instance_type=instance_type, spot=spot)
    plan = make_plan(spec, CATALOG)
    choices = brute_force(ROWS, None, 0, spot, PS_CLUSTER, instance_type)
    assert_brute_force_choice(plan, choices)
    assert plan.nodes[0].instance_type.lower() == instance_type.lower()


def test_spot_and_on_demand_pick_different_clouds() -> None:
    on_demand = make_plan(make_spec("cheapest"), CATALOG)
    spot = make_plan(make_spec("cheapest", spot=True), CATALOG)
    # on demand, GCP's n1-standard-8 + V100 (2.86) beats every AWS and Azure V100 machine
    assert (on_demand.provider, on_demand.region) == ("gcp", "us-central1")
    assert on_demand.hourly_usd == pytest.approx(3 * (0.38 + 2.48) + 0.19)
    # on spot, Azure's 0.40 V100 wins
    assert (spot.provider, spot.region, spot.zone) == ("azure", "eastus", None)
    assert spot.hourly_usd == pytest.approx(3 * 0.40 + 0.021)
    assert all(n.spot for n in spot.nodes) and not any(n.spot for n in on_demand.nodes)
    assert on_demand.notes[0] == (
        "provider cheapest: gcp chosen as the cheapest of the clouds (aws, gcp, azure) at "
        "$8.77/h; runner-up aws at $9.25/h"
    )
    assert spot.notes[0] == (
        "provider cheapest: azure chosen as the cheapest of the clouds (aws, gcp, azure) at "
        "$1.221/h; runner-up aws at $2.15/h"
    )


def attach_rows(host_price: float) -> list[Offer]:
    """One V100 machine per cloud; GCP's V100 alone is the cheapest GPU, before its host."""
    return [
        row("aws", "p3", "V100", 1, "us-east-1", "us-east-1a", 2.60, 0.80),
        row("aws", "m5", None, 0, "us-east-1", "us-east-1a", 0.20, 0.06),
        row("gcp", GCP_GPU_HOST, None, 0, "us-central1", "us-central1-a", host_price, 0.05),
        row("gcp", "n1-standard-4", None, 0, "us-central1", "us-central1-a", 0.19, 0.04),
        row("gcp", "", "V100", 1, "us-central1", "us-central1-a", 2.40, 0.70),
        row("azure", "Standard_NC6s_v3", "V100", 1, "eastus", None, 2.70, 0.90),
        row("azure", "Standard_D4s_v5", None, 0, "eastus", None, 0.19, 0.02),
    ]


@pytest.mark.parametrize(
    ("host_price", "spot", "cloud", "gpu_node"),
    [
        (0.10, False, "gcp", 0.10 + 2.40),  # attach wins: 2.50 < aws 2.60
        (0.38, False, "aws", 2.60),  # attach loses: 2.78 > aws 2.60 (the GPU alone is cheaper)
        (0.38, True, "gcp", 0.05 + 0.70),  # spot: 0.75 < aws 0.80
    ],
)
def test_gcp_attach_pricing_wins_or_loses(
    host_price: float, spot: bool, cloud: str, gpu_node: float
) -> None:
    rows = attach_rows(host_price)
    plan = make_plan(make_spec("cheapest", spot=spot), Catalog.from_rows(rows))
    assert_brute_force_choice(plan, brute_force(rows, "V100", 1, spot, PS_CLUSTER))
    assert plan.provider == cloud and plan.price_of("chief") == pytest.approx(gpu_node)
    attached = any("attached to n1-standard-8" in note for note in plan.notes)
    assert attached == (cloud == "gcp")
    gcp = [a for a in plan.alternatives if "on gcp" in a.description]
    assert bool(gcp) == (cloud != "gcp")  # the losing GCP choice is still shown


def test_alternatives_include_the_other_clouds() -> None:
    plan = make_plan(make_spec("cheapest"), CATALOG)
    assert [(a.description, a.hourly_usd) for a in plan.alternatives] == [
        ("p3 (V100 x1) on aws in r-west/west-a", 9.25),
        ("p3 (V100 x1) on aws in r-east/east-a", 9.37),
        ("Standard_NC6s_v3 (V100 x1) on azure in eastus", 9.372),
    ]
    assert all(a.estimate_usd == pytest.approx(a.hourly_usd * 2.0) for a in plan.alternatives)


def test_other_clouds_stay_among_the_alternatives_when_one_cloud_has_cheaper_regions() -> None:
    rows = [row("aws", "p3", "V100", 1, f"r{i}", f"r{i}-a", 1.0 + i / 10, None) for i in range(4)]
    rows += [
        row("gcp", "a2", "V100", 1, "g1", "g1-a", 2.0, None),
        row("azure", "NC", "V100", 1, "z1", None, 3.0, None),
    ]
    plan = make_plan(make_spec("cheapest", roles={"chief": 1}), Catalog.from_rows(rows))
    assert (plan.provider, plan.region) == ("aws", "r0")
    assert [a.description for a in plan.alternatives] == [
        "p3 (V100 x1) on aws in r1/r1-a",  # the next aws regions (1.2, 1.3) make way for
        "a2 (V100 x1) on gcp in g1/g1-a",  # the best choice of every other cloud
        "NC (V100 x1) on azure in z1",
    ]
    # one cloud alone keeps the plain next-cheapest choices, without the cloud's name
    aws = make_plan(make_spec("aws", roles={"chief": 1}), Catalog.from_rows(rows))
    assert [a.hourly_usd for a in aws.alternatives] == [1.1, 1.2, 1.3]
    assert aws.alternatives[0].description == "p3 (V100 x1) in r1/r1-a"


def test_never_local_and_only_clouds_that_fit() -> None:
    # CPU-only: the free local row would win if it were searched
    cpu = make_plan(make_spec("cheapest", accelerator=None), CATALOG)
    assert cpu.provider in CLOUDS and cpu.hourly_usd > 0
    only_azure = make_plan(
        make_spec("cheapest", accelerator=None, instance_type="standard_nc6s_v3"), CATALOG
    )
    assert only_azure.provider == "azure"
    assert only_azure.notes[0].endswith("at $9.372/h; nothing fits on aws or gcp")
    assert only_azure.alternatives == ()


def test_infeasible_across_all_clouds_names_the_nearest() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec("cheapest", accelerator="A100", count=2), CATALOG)
    error = caught.value
    assert error.message.startswith(
        "no aws, gcp or azure offer with A100 x2 per node in any region; nearest: "
        "p4 (A100 x8) on aws in r-west/west-a at $20.00/h"
    )
    assert error.hint and "region" not in error.hint
    with pytest.raises(PlanError, match=r"^no cloud \(aws, gcp or azure\) offers Z100"):
        make_plan(make_spec("cheapest", accelerator="Z100"), CATALOG)
    with pytest.raises(PlanError, match="no aws, gcp or azure spot offer with V100 x3") as spot:
        make_plan(make_spec("cheapest", count=3, spot=True), CATALOG)
    assert "p3x4 (V100 x4) on aws in r-east/east-a at $1.44/h" in spot.value.message
    assert "n1-standard-8 (V100 x2) on gcp" in spot.value.message
    assert spot.value.hint and "spot: false" in spot.value.hint


def test_infeasible_when_no_cloud_has_a_cpu_machine_for_ps() -> None:
    rows = [
        row("aws", "p3", "V100", 1, "r-eu", "eu-a", 2.90, None),
        row("azure", "NC", "V100", 1, "eastus", None, 3.0, None),
    ]
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec("cheapest"), Catalog.from_rows(rows))
    assert caught.value.message == (
        "no CPU-only machine for the ps role where V100 x1 per node is offered "
        "(aws r-eu/eu-a, azure eastus)"
    )
    local_only = Catalog.from_rows([row("local", "local", None, 0, "local", "local", 0.0, 0.0)])
    with pytest.raises(PlanError, match="no aws, gcp or azure offers"):
        make_plan(make_spec("cheapest"), local_only)


@pytest.mark.parametrize(("region", "zone"), [("r-east", None), (None, "east-a")])
def test_region_or_zone_with_cheapest_is_refused(region: str | None, zone: str | None) -> None:
    field, value = ("region", region) if region else ("zone", zone)
    with pytest.raises(PlanError) as caught:
        make_plan(make_spec("cheapest", region=region, zone=zone), CATALOG)
    assert caught.value.message == (
        f"{field} {value!r} cannot be used with provider 'cheapest': a {field} belongs to one cloud"
    )
    assert caught.value.hint == f"remove {field}, or set provider to aws, gcp or azure"


def test_budget_is_checked_on_the_cheapest_cloud() -> None:
    with pytest.raises(PlanError, match=r"affords 0\.2 h at \$8\.77/h"):
        make_plan(make_spec("cheapest", max_cost_usd=2.0), CATALOG)


@pytest.mark.parametrize("spot", [False, True])
def test_to_dict_round_trips_with_the_chosen_cloud(spot: bool) -> None:
    plan = make_plan(make_spec("cheapest", spot=spot), CATALOG)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["provider"] == ("azure" if spot else "gcp")
    assert data["alternatives"] and data["notes"][0].startswith("provider cheapest: ")
    assert Plan.from_dict(data) == plan


def test_bundled_catalog_plans_cheapest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    catalog = Catalog.bundled()
    for spot in (False, True):
        # T4: the GPU all three bundled catalogs hold (Azure's V100s, NCv3, are retired)
        plan = make_plan(make_spec("cheapest", accelerator="T4", spot=spot), catalog)
        per_cloud = [
            make_plan(make_spec(cloud, accelerator="T4", spot=spot), catalog) for cloud in CLOUDS
        ]
        assert plan.hourly_usd == pytest.approx(min(p.hourly_usd for p in per_cloud))
        assert plan.provider in CLOUDS and plan.nodes[0].accelerator == "T4"
        assert {a.description.split(" on ")[1].split()[0] for a in plan.alternatives} >= (
            set(CLOUDS) - {plan.provider}
        )


def test_cli_plan_on_cheapest_is_light(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        textwrap.dedent(
            """\
            name: cheap
            provider: cheapest
            cluster:
              strategy: multi_worker_mirrored
              workers: 2
              accelerator: "T4:1"
            entrypoint: python train.py
            max_hours: 0.5
            """
        )
    )
    home = tmp_path / "home"
    assert heavy_modules(home, "plan", str(job), expect="plan for cheap on ") == []
    proc = cli(home, "plan", str(job), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["provider"] in CLOUDS and data["nodes"][0]["accelerator"] == "T4"
