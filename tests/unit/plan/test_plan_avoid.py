"""Unit tests of the plan's failover contracts: `make_plan(..., avoid=)`, `placements`, and the
spot fallback's prices (`cluster.spot_fallback`), on a small catalog of the test's own regions."""

from __future__ import annotations

import json

import pytest

from cloudtrain.catalog.offers import Catalog
from cloudtrain.core.errors import PlanError
from cloudtrain.plan.planner import Plan, make_plan, on_demand_spec, placements
from tests.unit.plan.test_plan import make_spec, row

ROWS = [  # V100 x1 and a CPU machine per region; cheapest first: a, b, c on aws, then gcp's g
    row("aws", "p3", "V100", 1, "reg-a", "reg-a-1", 1.00, 0.30),
    row("aws", "m5", None, 0, "reg-a", "reg-a-1", 0.10, 0.03),
    row("aws", "p3", "V100", 1, "reg-b", "reg-b-1", 2.00, 0.60),
    row("aws", "m5", None, 0, "reg-b", "reg-b-1", 0.10, 0.03),
    row("aws", "p3", "V100", 1, "reg-c", "reg-c-1", 3.00, 0.90),
    row("aws", "m5", None, 0, "reg-c", "reg-c-1", 0.10, 0.03),
    row("gcp", "a2", "V100", 1, "reg-g", "reg-g-1", 4.00, 1.20),
    row("gcp", "n2", None, 0, "reg-g", "reg-g-1", 0.10, 0.03),
]
CATALOG = Catalog.from_rows(ROWS)
ONE = {"chief": 1}


def test_avoid_takes_the_next_cheapest_region_and_notes_the_skipped() -> None:
    avoid = {("aws", "reg-a"): "no quota for V100", ("aws", "reg-b"): "no capacity"}
    plan = make_plan(make_spec(roles=ONE), CATALOG, avoid=avoid)
    assert plan.place == ("aws", "reg-c")
    assert "skipped aws reg-a: no quota for V100" in plan.notes
    assert "skipped aws reg-b: no capacity" in plan.notes
    assert plan.avoided_places() == avoid  # kept: failover goes on avoiding them
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    # a place avoided that is dearer than the choice is not said
    plan = make_plan(make_spec(roles=ONE), CATALOG, avoid={("aws", "reg-c"): "x"})
    assert plan.place == ("aws", "reg-a")
    assert not [n for n in plan.notes if n.startswith("skipped")]


def test_everything_avoided_is_a_plan_error_with_every_reason() -> None:
    avoid = {("aws", r): f"why {r}" for r in ("reg-a", "reg-b", "reg-c")}
    with pytest.raises(PlanError) as info:
        make_plan(make_spec(roles=ONE), CATALOG, avoid=avoid)
    assert all(f"aws {r}: why {r}" in info.value.message for r in ("reg-a", "reg-b", "reg-c"))


def test_a_pinned_region_or_zone_is_never_left() -> None:
    avoid = {("aws", "reg-a"): "no quota for V100"}
    with pytest.raises(PlanError) as info:
        make_plan(make_spec(roles=ONE, region="reg-a"), CATALOG, avoid=avoid)
    assert "pins region reg-a" in info.value.message and "no quota" in info.value.message
    with pytest.raises(PlanError) as info:
        make_plan(make_spec(roles=ONE, zone="reg-a-1"), CATALOG, avoid=avoid)
    assert "pins zone reg-a-1" in info.value.message
    # not avoided: the pinned region as before
    assert make_plan(make_spec(roles=ONE, region="reg-b"), CATALOG, avoid=avoid).region == "reg-b"


def test_cheapest_moves_to_the_next_cloud() -> None:
    avoid = {("aws", r): "no capacity" for r in ("reg-a", "reg-b", "reg-c")}
    plan = make_plan(make_spec("cheapest", roles=ONE), CATALOG, avoid=avoid)
    assert plan.place == ("gcp", "reg-g")
    assert "skipped aws reg-a, reg-b and reg-c: no capacity" in plan.notes  # one line a reason


def test_placements_are_every_feasible_place_in_price_order() -> None:
    got = [p.place for p in placements(make_spec("cheapest", roles=ONE), CATALOG)]
    assert got == [("aws", "reg-a"), ("aws", "reg-b"), ("aws", "reg-c"), ("gcp", "reg-g")]
    got = [p.place for p in placements(make_spec("aws", roles=ONE), CATALOG)]
    assert got == [("aws", "reg-a"), ("aws", "reg-b"), ("aws", "reg-c")]
    one = placements(make_spec("aws", roles=ONE, region="reg-b"), CATALOG)
    assert [(p.place, p.hourly_usd) for p in one] == [(("aws", "reg-b"), 2.0)]


def test_spot_fallback_plan_shows_both_prices() -> None:
    spec = make_spec(roles={"chief": 1, "ps": 1}, spot=True)
    assert make_plan(spec, CATALOG).on_demand_hourly_usd is None  # no fallback asked
    spec.cluster.spot_fallback = True
    plan = make_plan(spec, CATALOG)
    assert plan.hourly_usd == pytest.approx(0.33) and plan.on_demand_hourly_usd == 1.1
    assert any("on-demand at $1.10/h ($2.20 for 2.0 h)" in n for n in plan.notes)
    assert Plan.from_dict(plan.to_dict()) == plan
    fallback = make_plan(on_demand_spec(spec), CATALOG)
    assert fallback.hourly_usd == 1.1 and not any(n.spot for n in fallback.nodes)
    assert spec.cluster.spot  # the spec itself unchanged
    spec.max_cost_usd = 1.0  # spot affords 2 h, on-demand does not
    assert any("would not be taken" in n for n in make_plan(spec, CATALOG).notes)
