"""Failover across regions and clouds (cloudtrain/run/failover.py) with the real Orchestrator over
memory providers posing as clouds (tests/fakes/memory_provider.py `MemoryClouds`): each region
is scripted as a new account is (zones, capacity per zone, spot capacity, a quota), the plans
come from the test's own small catalog, and a node's "agent" is a hook that reports the chief
done as soon as the chief exists, so a run lands, succeeds and is torn down in a second."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloudtrain.catalog.offers import Catalog
from cloudtrain.jobs.protocol import NodeState, NodeStatus, run_prefix, status_key
from cloudtrain.jobspec.job import load_spec
from cloudtrain.jobspec.run_options import RunOptions
from cloudtrain.plan.planner import Plan, make_plan, on_demand_spec
from cloudtrain.providers.base import Node, RunInfo
from cloudtrain.run.failover import Places, Route, places_for
from cloudtrain.run.orchestrator import Orchestrator
from cloudtrain.run.teardown import teardown
from cloudtrain.state.ledger import Ledger
from tests.fakes.memory_provider import MemoryClouds
from tests.unit.plan.test_plan import row
from tests.unit.security_kit import QuietObserver

# V100 x1 per node and a CPU machine per region; by price: aws a < b < c, then gcp g
ROWS = [
    row("aws", "p3", "V100", 1, "reg-a", "reg-a-1", 1.00, 0.30),
    row("aws", "p3", "V100", 1, "reg-b", "reg-b-1", 2.00, 0.60),
    row("aws", "p3", "V100", 1, "reg-c", "reg-c-1", 3.00, 0.90),
    row("gcp", "a2", "V100", 1, "reg-g", "reg-g-1", 4.00, 1.20),
]
CATALOG = Catalog.from_rows(ROWS)
ZONES = {r: [f"{r}-1", f"{r}-2"] for r in ("reg-a", "reg-b", "reg-c", "reg-g")}
FAST = RunOptions(poll_s=0.05, list_nodes_s=0.05, settle_s=0.2, stop_grace_s=1.0)


class World:
    """The clouds of a test, a ledger, and what each region saw."""

    def __init__(self, tmp_path: Path) -> None:
        self.clouds = MemoryClouds()
        self.ledger = Ledger(tmp_path / "ledger.db")
        # (cloud, region, the nodes of every region) at each node made
        self.seen: list[tuple[str, str, int]] = []
        for (cloud, region) in (("aws", "reg-a"), ("aws", "reg-b"), ("aws", "reg-c"),
                                ("gcp", "reg-g")):  # fmt: skip
            compute = self.clouds.compute(cloud, region, ZONES[region])
            compute.on_create = self._agent(cloud, region)

    def _agent(self, cloud: str, region: str) -> Any:
        def report(run: RunInfo, node: Node) -> None:
            everywhere = sum(len(c.nodes) for c in self.clouds.computes.values())
            self.seen.append((cloud, region, everywhere))
            if node.role == "chief":  # the job: done at once, in the run's store
                store = self.clouds.provider(cloud, region).store(run.store_uri)
                done = NodeStatus(state=NodeState.SUCCEEDED, attempt=1)
                store.put(status_key(run.run_id, "chief-0"), done.to_json())

        return report

    def places(self, spec: Any) -> Places:
        def replan(avoid: Mapping[tuple[str, str], str], on_demand: bool) -> Plan:
            return make_plan(on_demand_spec(spec) if on_demand else spec, CATALOG, avoid=avoid)

        return Places(replan, lambda p: self.clouds.provider(p.provider, p.region, p.zone))

    def run(self, spec: Any, places: bool = True) -> tuple[Orchestrator, Any]:
        plan = make_plan(spec, CATALOG)
        first = self.clouds.provider(plan.provider, plan.region, plan.zone)
        orch = Orchestrator(
            spec, plan, first, self.ledger, QuietObserver(), FAST,
            places=self.places(spec) if places else None,
        )  # fmt: skip
        return orch, orch.run()

    def live(self, cloud: str, region: str) -> list[str]:
        """What is left in a region: its nodes and network."""
        compute = self.clouds.compute(cloud, region)
        return sorted(compute.nodes) + sorted(r.id for rs in compute.networks.values() for r in rs)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))
    return World(tmp_path)


def job(tmp_path: Path, provider: str = "aws", **fields: Any) -> Any:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text("print('hi')\n")
    cluster = {"strategy": "multi_worker_mirrored", "chief": 1, "workers": 2,
               "accelerator": "V100", **fields.pop("cluster", {})}  # fmt: skip
    doc = {"name": "fo", "provider": provider, "workdir": ".", "entrypoint": "python train.py",
           "max_hours": 1, "cluster": cluster, **fields}  # fmt: skip
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_spec(path)


def failover_events(world: World, run_id: str) -> list[str]:
    return [e.message for e in world.ledger.events(run_id) if e.kind == "failover"]


def test_quota_then_no_capacity_then_lands_in_the_third_region(
    world: World, tmp_path: Path
) -> None:
    world.clouds.compute("aws", "reg-a").quota = 0
    reg_b = world.clouds.compute("aws", "reg-b")
    reg_b.capacity = {"reg-b-1": 1, "reg-b-2": 2}  # some nodes made in each zone, never all 3
    orch, result = world.run(job(tmp_path))
    assert result.outcome == "succeeded", (result.detail, orch.observer.lines)
    # nothing left in the first two; the third torn down at the end
    assert world.live("aws", "reg-a") == world.live("aws", "reg-b") == []
    assert world.live("aws", "reg-c") == []
    # reg-b's partial nodes were gone before reg-c's first create
    first_c = next(i for i, s in enumerate(world.seen) if s[1] == "reg-c")
    assert world.seen[first_c][2] == 1 and not [s for s in world.seen[first_c:] if s[1] != "reg-c"]
    events = failover_events(world, orch.run_id)
    assert events[0].startswith("aws reg-a: quota: ")
    assert any(e.startswith("aws reg-b: capacity: ") for e in events)
    assert "moving to aws reg-c at $9.00/h" in events
    assert any("stays in reg-a: the nodes in reg-c reach it across regions" in e for e in events)
    assert result.route.startswith("tried aws reg-a: quota: ")
    assert result.route.endswith("landed in aws reg-c")
    rec = world.ledger.get_run(orch.run_id)
    assert (rec.provider, rec.region, rec.zone) == ("aws", "reg-c", "reg-c-1")
    assert rec.plan["region"] == "reg-c"
    rows = world.ledger.resources(orch.run_id)
    assert {r.region for r in rows if r.kind == "node"} == {"reg-c"} and not [
        r for r in rows if r.live
    ]
    # every network made was recorded in its region, then deleted
    assert world.clouds.compute("aws", "reg-a").calls["delete_resources"] >= 1
    assert world.clouds.compute("aws", "reg-b").calls["delete_resources"] >= 1


def test_a_pinned_region_is_never_left(world: World, tmp_path: Path) -> None:
    world.clouds.compute("aws", "reg-a").quota = 0
    _, result = world.run(job(tmp_path, region="reg-a"))
    assert result.outcome == "failed" and "quota" in result.detail
    assert not world.clouds.compute("aws", "reg-b").calls["create_node"]
    assert world.live("aws", "reg-a") == []
    world.clouds.compute("aws", "reg-b").capacity = {"reg-b-1": 0}  # reg-b-2 has room
    _, result = world.run(job(tmp_path, zone="reg-b-1"))  # a pinned zone: not even reg-b-2
    assert result.outcome == "failed" and "no capacity" in result.detail
    assert not world.clouds.compute("aws", "reg-c").calls["create_node"]
    assert not [s for s in world.seen if s[1] == "reg-b"]  # no node made in reg-b-2


def test_without_places_the_run_stays(world: World, tmp_path: Path) -> None:
    world.clouds.compute("aws", "reg-a").quota = 0
    _, result = world.run(job(tmp_path), places=False)
    assert result.outcome == "failed" and not world.clouds.compute("aws", "reg-b").calls


def test_a_capacity_failure_is_retried_after_the_others_and_quota_never(
    world: World, tmp_path: Path
) -> None:
    reg_a = world.clouds.compute("aws", "reg-a")
    reg_a.capacity = {"reg-a-1": 0, "reg-a-2": 0}
    world.clouds.compute("aws", "reg-b").quota = 0
    world.clouds.compute("aws", "reg-c").capacity = {"reg-c-1": 0, "reg-c-2": 0}
    # reg-c is tried: capacity frees up in reg-a meanwhile
    world.clouds.compute("aws", "reg-c").create_hook = reg_a.capacity.clear
    orch, result = world.run(job(tmp_path))
    assert result.outcome == "succeeded", (result.detail, orch.observer.lines)
    route = result.route
    assert route.index("aws reg-a: capacity") < route.index("aws reg-b: quota")
    assert route.index("aws reg-b: quota") < route.index("aws reg-c: capacity")
    assert route.endswith("landed in aws reg-a") and "reg-b (again)" not in route
    assert world.clouds.compute("aws", "reg-b").calls["create_node"] <= 3  # tried once


def test_cheapest_moves_to_the_next_cloud_and_its_store(world: World, tmp_path: Path) -> None:
    for region in ("reg-a", "reg-b", "reg-c"):
        world.clouds.compute("aws", region).quota = 0
    orch, result = world.run(job(tmp_path, provider="cheapest"))
    assert result.outcome == "succeeded", (result.detail, orch.observer.lines)
    assert result.route.endswith("landed in gcp reg-g")
    rec = world.ledger.get_run(orch.run_id)
    assert (rec.provider, rec.region, rec.account) == ("gcp", "reg-g", "gcp-account")
    # the aws store holds nothing of the run; the gcp one its whole record
    prefix = run_prefix(orch.run_id)
    old = world.clouds.objects("aws", f"mem://ct-{orch.run_id}")
    assert not [k for k in old if k.startswith(prefix)]
    new = world.clouds.objects("gcp", rec.store_uri)
    assert f"{prefix}control/key" in new and f"{prefix}control/lease" in new
    assert any(k.startswith(f"{prefix}ledger/") for k in new)
    assert any(
        "control objects deleted from mem://" in e for e in failover_events(world, orch.run_id)
    )


def test_spot_falls_back_to_on_demand_only_where_allowed(world: World, tmp_path: Path) -> None:
    for region in ("reg-a", "reg-b", "reg-c"):
        world.clouds.compute("aws", region).spot_capacity = {z: 0 for z in ZONES[region]}
    _, refused = world.run(job(tmp_path, cluster={"spot": True}))
    assert refused.outcome == "failed" and "no place could hold the run" in refused.detail
    assert "on-demand from here" not in refused.detail and "spot_fallback: true" in refused.detail
    spec = job(tmp_path, cluster={"spot": True, "spot_fallback": True})
    orch, result = world.run(spec)
    assert result.outcome == "succeeded", (result.detail, orch.observer.lines)
    assert "no spot place left: on-demand from here" in result.route
    assert result.route.endswith("landed on-demand in aws reg-a")
    assert orch.plan.hourly_usd == 3.0 and not any(n.spot for n in orch.plan.nodes)
    prices = {r.price_hourly for r in world.ledger.resources(orch.run_id) if r.kind == "node"}
    assert prices == {1.0}  # the ledger bills the on-demand price
    assert result.cost_usd > 0


def test_route_rounds() -> None:
    route = Route(fallback=True)
    route.failed(("aws", "a"), "capacity", "full")
    route.failed(("aws", "b"), "quota", "none")
    assert set(route.avoid()) == {("aws", "a"), ("aws", "b")}
    assert route.next_round() and route.round == 2
    assert route.avoid() == {("aws", "b"): "quota: none"}  # a again, b never
    route.failed(("aws", "a"), "capacity", "still full")
    assert route.next_round() and route.on_demand and route.avoid() == {}
    route.failed(("aws", "a"), "quota", "none on-demand")
    assert not route.next_round()


def test_a_stop_during_failover_leaves_nothing_and_the_record_names_the_place(
    world: World, tmp_path: Path
) -> None:
    world.clouds.compute("aws", "reg-a").quota = 1  # one node made, then QuotaError

    def interrupt() -> None:  # Ctrl-C at reg-b's first create
        raise KeyboardInterrupt

    world.clouds.compute("aws", "reg-b").create_hook = interrupt
    orch, result = world.run(job(tmp_path))
    assert result.outcome == "interrupted"
    assert all(world.live(*place) == [] for place in world.clouds.computes)
    rec = world.ledger.get_run(orch.run_id)
    assert (rec.provider, rec.region) == ("aws", "reg-b")
    assert not [r for r in world.ledger.resources(orch.run_id) if r.live]


def test_after_a_crash_mid_failover_the_record_s_place_holds_all_that_is_left(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller killed in reg-b (no teardown of its own): what `down` does from the
    record (its provider and region) finds everything; reg-a was emptied before the move."""
    world.clouds.compute("aws", "reg-a").quota = 2

    def crash() -> None:
        raise SystemExit("killed")

    world.clouds.compute("aws", "reg-b").on_create = lambda run, node: crash()
    monkeypatch.setattr(Orchestrator, "_finish", lambda self, outcome, detail: None)
    with pytest.raises(SystemExit):
        world.run(job(tmp_path))
    (rec,) = world.ledger.list_runs()
    assert world.live("aws", "reg-a") == [] and world.live("aws", "reg-b")
    live = [r for r in world.ledger.resources(rec.run_id) if r.live]
    assert live and {(r.provider, r.region) for r in live} == {("aws", "reg-b")}
    teardown(world.clouds.provider(rec.provider, rec.region), world.ledger, rec.run_id)
    assert all(world.live(*place) == [] for place in world.clouds.computes)
    assert not [r for r in world.ledger.resources(rec.run_id) if r.live]


def test_the_deadline_counts_the_time_spent_failing_over(world: World, tmp_path: Path) -> None:
    world.clouds.compute("aws", "reg-a").quota = 0
    world.clouds.compute("aws", "reg-a").create_hook = lambda: time.sleep(0.5)
    _, result = world.run(job(tmp_path, max_hours=0.0001))  # 0.36 s from the run's start
    assert result.outcome == "deadline"
    assert not world.clouds.compute("aws", "reg-b").calls["create_node"]


def test_places_for_keeps_avoiding_what_the_plan_avoided(tmp_path: Path) -> None:
    spec = job(tmp_path, cluster={"spot": True, "spot_fallback": True})
    ruled_out = {("aws", "reg-b"): "quota: G vCPUs 0 of 4"}  # the account check's
    places = places_for(spec, CATALOG, make_plan(spec, CATALOG, avoid=ruled_out).avoided_places())
    tried = {("aws", "reg-a"): "capacity: full"}
    assert places.replan(tried, False).place == ("aws", "reg-c")
    on_demand = places.replan(tried, True)
    assert on_demand.place == ("aws", "reg-c") and not any(n.spot for n in on_demand.nodes)


def test_the_summary_shows_the_path(world: World, tmp_path: Path) -> None:
    from rich.console import Console

    from cloudtrain.cli.ui import summary

    world.clouds.compute("aws", "reg-a").quota = 0
    _, result = world.run(job(tmp_path))
    console = Console(width=400, record=True)
    console.print(summary(result))
    line = next(x for x in console.export_text().splitlines() if x.strip().startswith("place:"))
    assert "tried aws reg-a: quota: " in line and line.endswith("landed in aws reg-b")
