"""GCP's TPU offers in the bundled catalog (providers/gcp/tpu_offers.py through the build): one
per TPU type and zone that tpu_types lists, priced per slice as Google's per chip-hour price
times its chips, never mixed into a GPU or CPU request."""

from __future__ import annotations

import pytest

from cloudtrain.catalog import build as catalog_build
from cloudtrain.catalog.offers import Catalog
from cloudtrain.providers.gcp import tpu_offers
from cloudtrain.providers.gcp.tpu_types import TPU_TYPES, default_runtime, tpu_type

SRC = "skypilot-catalog v8 catalogs/v8/gcp/vms.csv@006059e0f18acb1341e22a27751e9f80df6ba92f"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))  # no user override files


def _tpu_offers() -> list:  # type: ignore[type-arg]
    return [o for o in Catalog.bundled().offers("gcp") if tpu_type(o.instance_type)]


def _source(*lines: str) -> list[dict[str, str]]:
    columns = catalog_build.SOURCE_COLUMNS
    return [dict(zip(columns, f"{line},{SRC}".split(","), strict=True)) for line in lines]


def test_every_tpu_type_is_offered_in_every_zone_it_lists_and_nowhere_else() -> None:
    offered = {(o.instance_type, o.zone) for o in _tpu_offers()}
    listed = {(t.name, zone) for t in TPU_TYPES.values() for zone in t.zones}
    assert offered == listed
    for offer in _tpu_offers():
        tpu = TPU_TYPES[offer.instance_type]
        assert offer.accelerator == f"TPU-{tpu.generation}".upper()  # the catalog's canonical
        assert offer.accelerator_count == tpu.chips
        assert offer.region == offer.zone.rsplit("-", 1)[0]  # type: ignore[union-attr]
        assert offer.spot_price_hourly is not None and offer.spot_price_hourly < offer.price_hourly
        assert default_runtime(tpu)  # its image: a runtime of its generation
        assert SRC in offer.source and tpu_offers.UPSTREAM_PREFIX in offer.source


def test_a_slice_costs_its_chips_times_one_chip_hour() -> None:
    # the per chip-hour prices (upstream's, from Cloud Billing's TPU SKUs) in the home region
    per_chip = {"v5e": 1.20, "v6e": 2.70, "v5p": 4.20, "v4": 3.22}
    home = {"v5e": "us-central1", "v6e": "us-central1", "v5p": "us-central1", "v4": "us-central2"}
    for offer in _tpu_offers():
        tpu = TPU_TYPES[offer.instance_type]
        if offer.region == home[tpu.generation]:
            assert offer.price_hourly == pytest.approx(per_chip[tpu.generation] * tpu.chips)
    # and in every zone, one chip-hour is one price whatever the slice (a mistyped row fails)
    by_zone: dict[tuple[str, str | None, bool], set[float]] = {}
    for offer in _tpu_offers():
        tpu = TPU_TYPES[offer.instance_type]
        for spot in (False, True):
            chip_hour = round(float(offer.price(spot) or 0) / tpu.chips, 4)
            by_zone.setdefault((tpu.generation, offer.zone, spot), set()).add(chip_hour)
    assert all(len(prices) == 1 for prices in by_zone.values()), by_zone


def test_the_build_turns_upstream_tpu_rows_into_offers() -> None:
    out = catalog_build.build_rows(
        _source(
            "gcp,,tpu-v5litepod-8,1,,,us-west4,us-west4-a,9.6,3.84",
            "gcp,,tpu-v5litepod-8,1,,,europe-west4,europe-west4-b,12.48,3.55986",  # not listed
            "gcp,,tpu-v5p-32,1,,,us-central1,us-central1-a,67.2,13.37122",  # not a known type
            "gcp,,tpu-v2-8,1,,,us-central1,us-central1-b,4.5,1.35",  # not a known type
        )
    )
    tpus = [r for r in out["gcp"] if r["accelerator"].startswith("TPU-")]
    assert [(r["instance_type"], r["accelerator"], r["accelerator_count"]) for r in tpus] == [
        ("v5litepod-8", "TPU-v5e", "8")
    ]
    assert (tpus[0]["zone"], tpus[0]["price_hourly_usd"], tpus[0]["spot_price_hourly_usd"]) == (
        "us-west4-a",
        "9.6",
        "3.84",
    )
    assert not [r for r in out["gcp"] if not r["instance_type"]]  # no raw upstream row stays


def test_a_tpu_row_of_more_than_one_slice_is_refused() -> None:
    src = _source("gcp,,tpu-v6e-8,2,,,us-east1,us-east1-d,43.2,8.70733")
    with pytest.raises(catalog_build.BuildError, match="a TPU row prices one slice"):
        catalog_build.build_rows(src)


def test_tpu_offers_never_answer_a_gpu_or_cpu_request() -> None:
    cat = Catalog.bundled()
    zone = "us-central1-a"  # v5e, v5p and GPUs are all sold there
    cpu = cat.offers("gcp", zone=zone, cpu_only=True)
    assert cpu and not [o for o in cpu if tpu_type(o.instance_type)]
    gpus = [o for o in cat.offers("gcp", zone=zone) if o.accelerator in {"T4", "A100", "V100"}]
    assert gpus and not [o for o in gpus if tpu_type(o.instance_type)]
    tpus = cat.offers("gcp", zone=zone, accelerator="TPU-v5e", count=8)
    assert [o.instance_type for o in tpus] == ["v5litepod-8"]


def test_catalog_refresh_keeps_the_snapshot_tpu_prices() -> None:
    from cloudtrain.catalog.pricing.common import bundled_offers, merge
    from cloudtrain.providers.gcp.pricing import to_offers

    bundled = bundled_offers("gcp")
    tpus = [o for o in bundled if tpu_type(o.instance_type)]
    # even Compute Engine "core"/"ram"/"gpu" prices under a TPU type's names price no TPU row:
    # the slice has no vCPU or memory figure to multiply
    prices = {
        (kind, name, "us-central1", spot): 1.0
        for kind, name in (("core", "v5litepod"), ("ram", "v5litepod"), ("gpu", "TPU-v5e"))
        for spot in (False, True)
    }
    fresh = to_offers(prices, bundled, ["us-central1"])
    assert not [o for o in fresh if tpu_type(o.instance_type)]
    merged = merge(fresh, bundled)
    assert {o for o in merged if tpu_type(o.instance_type)} == set(tpus)
