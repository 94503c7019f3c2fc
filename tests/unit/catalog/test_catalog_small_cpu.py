"""The bundled catalog's small CPU machines (cloudtrain/catalog/small_cpu.source.csv, added by
catalog_build): what a managed run's controller node needs (issue 17), in every zone the catalog
covers, priced from the upstream catalogs the other rows cite, and never chosen for a GPU role.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cloudtrain.catalog import build as catalog_build
from cloudtrain.catalog.offers import LOCAL_PRICE_ENV, Catalog
from cloudtrain.core.errors import PlanError
from cloudtrain.managed.controller_offer import MIN_MEMORY_GB, controller_offer
from cloudtrain.providers.gcp.tpu_types import tpu_type

CLOUDS = ("aws", "gcp", "azure")
# the controller's machine per cloud, and the most it may cost per hour anywhere in the catalog
CONTROLLER_TYPE = {"aws": "t3.small", "gcp": "e2-small", "azure": "Standard_B1ms"}
CONTROLLER_MAX_USD = 0.08  # e2-small in me-central2 (Dammam): $0.07915/h upstream
# the source cell of a row copied from an upstream catalog: file @ a full commit id
CITED = re.compile(r"^skypilot-catalog v8 catalogs/v8/(aws|gcp|azure)/vms\.csv@[0-9a-f]{40}$")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))  # no user override files
    monkeypatch.delenv(LOCAL_PRICE_ENV, raising=False)


def _small_rows() -> list[dict[str, str]]:
    return catalog_build.small_cpu_rows()


def _tpu_only_places(cat: Catalog) -> set[tuple[str, str | None]]:
    """The places whose only offers are TPU slices: GCP us-central2-b sells TPU v4 alone, and
    the upstream catalog has no CPU machine there (a managed run there needs --no-controller)."""
    places = {(o.region, o.zone) for o in cat.offers("gcp")}
    return {
        place
        for place in places
        if all(tpu_type(o.instance_type) for o in cat.offers("gcp") if (o.region, o.zone) == place)
    }


def test_every_zone_of_the_catalog_has_a_small_controller_machine() -> None:
    cat = Catalog.bundled()
    assert _tpu_only_places(cat) == {("us-central2", "us-central2-b")}
    for cloud in CLOUDS:
        places = {(o.region, o.zone) for o in cat.offers(cloud)} - _tpu_only_places(cat)
        for region, zone in sorted(places, key=str):
            small = [
                o
                for o in cat.offers(cloud, region=region, zone=zone, cpu_only=True)
                if o.instance_type == CONTROLLER_TYPE[cloud]
            ]
            assert len(small) == 1, (cloud, region, zone)
            assert small[0].price_hourly <= CONTROLLER_MAX_USD, small[0]
            assert (small[0].memory_gib or 0) >= MIN_MEMORY_GB, small[0]


def test_controller_offer_is_the_small_machine_in_every_region() -> None:
    cat = Catalog.bundled()
    for cloud in CLOUDS:
        compared = 0
        tpu_only = {region for region, _ in _tpu_only_places(cat)} if cloud == "gcp" else set()
        for region in tpu_only:
            with pytest.raises(PlanError, match=f"no CPU-only gcp machine .* in region {region}"):
                controller_offer(cloud, region)
        for region in set(cat.regions(cloud)) - tpu_only:
            offer = controller_offer(cloud, region)
            assert offer.instance_type == CONTROLLER_TYPE[cloud], (cloud, region, offer)
            assert offer.hourly_usd <= CONTROLLER_MAX_USD, (cloud, region, offer)
            # a third of the region's 4-vCPU machines or less (the ps machines of the catalog
            # before issue 17); regions the snapshot covers only with GPU hosts and 2-vCPU
            # machines (e.g. GCP europe-west9: a3 and e2-small, no n1) have none to compare
            four_vcpu = [
                o.price_hourly
                for o in cat.offers(cloud, region=region, cpu_only=True)
                if o.vcpus == 4.0
            ]
            if four_vcpu:
                compared += 1
                assert offer.hourly_usd < min(four_vcpu) / 3, (cloud, region)
        assert compared >= 2, cloud


def test_small_rows_are_cited_and_ship_as_written() -> None:
    rows = _small_rows()
    assert {r["provider"] for r in rows} == set(CLOUDS)
    built = catalog_build.build_rows([])
    for row in rows:
        assert CITED.match(row["source"]), row
        assert f"catalogs/v8/{row['provider']}/vms.csv@" in row["source"], row
        assert not row["accelerator"] and not row["accelerator_count"], row
        (out,) = [
            r
            for r in built[row["provider"]]
            if (r["instance_type"], r["region"], r["zone"])
            == (row["instance_type"], row["region"], row["zone"])
        ]
        assert out["price_hourly_usd"] == row["price_hourly_usd"], out  # copied exactly
        assert out["spot_price_hourly_usd"] == row["spot_price_hourly_usd"], out
        assert out["accelerator_count"] == "0" and out["source"] == row["source"], out


def test_a_source_row_wins_over_a_small_cpu_row_for_the_same_offer() -> None:
    line = "aws,t3.small,,,2.0,2.0,us-east-1,use1-az1,0.5,0.25,the source"
    source = [dict(zip(catalog_build.SOURCE_COLUMNS, line.split(","), strict=True))]
    built = catalog_build.build_rows(source)["aws"]
    (t3,) = [r for r in built if (r["instance_type"], r["zone"]) == ("t3.small", "use1-az1")]
    assert (t3["price_hourly_usd"], t3["source"]) == ("0.5", "the source")


def test_a_gpu_job_never_gets_a_small_cpu_machine_for_its_gpu_roles() -> None:
    from types import SimpleNamespace

    from cloudtrain.plan.planner import make_plan

    small = {r["instance_type"] for r in _small_rows()}
    cat = Catalog.bundled()
    for cloud, region, gpu in (
        ("aws", "us-east-1", "T4"),
        ("gcp", "us-central1", "T4"),
        ("azure", "eastus", "T4"),
    ):
        for spot in (False, True):
            cluster = SimpleNamespace(
                strategy="parameter_server",
                accelerator_name=gpu,
                accelerator_count=1,
                instance_type=None,
                spot=spot,
                roles=lambda: {"chief": 1, "worker": 2, "ps": 1},
            )
            spec = SimpleNamespace(
                name="small-cpu",
                provider=cloud,
                region=region,
                zone=None,
                max_hours=2.0,
                max_cost_usd=None,
                max_gpu_hours=None,
                cluster=cluster,
            )
            plan = make_plan(spec, cat)
            for node in plan.nodes:
                if node.role != "ps":
                    assert node.instance_type not in small, (cloud, spot, node)
                    assert node.accelerator == gpu, (cloud, spot, node)
