"""Unit tests for cloudtrain.catalog.offers (lookups, GCP GPU attach, overrides) and
catalog_build."""

from __future__ import annotations

import csv
import io
from importlib import resources
from pathlib import Path

import pytest

from cloudtrain.catalog import build as catalog_build
from cloudtrain.catalog.offers import (
    LOCAL_PRICE_ENV,
    Catalog,
    Offer,
    canonical_accelerator,
    parse_accelerator,
    read_offers,
)
from cloudtrain.core.errors import PlanError
from cloudtrain.providers.gcp.catalog_rules import GPU_HOST as GCP_GPU_HOST

HEADER = ",".join(catalog_build.HEADER)
REFERENCE = Path("/work/shared/reference/gpu_prices.csv")


def offer(
    provider: str,
    itype: str,
    acc: str | None,
    count: int,
    region: str,
    zone: str | None,
    price: float,
    spot: float | None = None,
) -> Offer:
    return Offer(provider, itype, acc, count, 4.0, 16.0, region, zone, price, spot, "2026-11-21")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.delenv(LOCAL_PRICE_ENV, raising=False)
    return home


def test_bundled_catalog_has_all_clouds_and_local() -> None:
    cat = Catalog.bundled()
    assert cat.providers() == ["aws", "gcp", "azure", "local"]
    for cloud in ("aws", "gcp", "azure"):
        # TPU offers are one-node slices (strategy tpu has no ps): GPUs only here
        offers = cat.offers(cloud)
        gpu = [o for o in offers if o.accelerator and not o.accelerator.startswith("TPU-")]
        cpu = cat.offers(cloud, cpu_only=True)
        assert gpu and cpu, cloud
        # every region with GPUs has a CPU machine for parameter servers
        assert {o.region for o in gpu} <= {o.region for o in cpu}
        assert all(o.prices_date == "2026-11-21" for o in cat.offers(cloud))
        assert all(isinstance(o.accelerator_count, int) for o in cat.offers(cloud))
    assert "V100" in cat.accelerators("aws") and "A100" in cat.accelerators("gcp")


def test_bundled_csvs_are_readable_package_data() -> None:
    folder = resources.files("cloudtrain") / "catalog"
    for name in ("aws", "gcp", "azure", "local"):
        text = (folder / f"{name}.csv").read_text(encoding="utf-8")
        assert text.splitlines()[0] == HEADER
        rows = list(csv.DictReader(io.StringIO(text)))
        assert rows and {row["provider"] for row in rows} == {name}
        assert all(row["accelerator_count"].isdigit() for row in rows)


def test_bundled_local_offer_is_free_this_machine() -> None:
    (local,) = Catalog.bundled().offers("local")
    assert (local.instance_type, local.region, local.price_hourly, local.accelerator) == (
        "local",
        "local",
        0.0,
        None,
    )
    assert local.vcpus and local.vcpus >= 1


def test_local_price_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCAL_PRICE_ENV, "1.25")
    (local,) = Catalog.bundled().offers("local")
    assert local.price_hourly == 1.25 and local.price(spot=True) == 1.25
    monkeypatch.setenv(LOCAL_PRICE_ENV, "cheap")
    with pytest.raises(PlanError, match=LOCAL_PRICE_ENV):
        Catalog.bundled()


def test_override_file_replaces_only_that_provider(_isolated_home: Path) -> None:
    folder = _isolated_home / "catalog"
    folder.mkdir(parents=True)
    (folder / "aws.csv").write_text(
        f"{HEADER}\naws,x1.gpu,V100,2,8,32,mars-1,mars-1a,1.5,,2030-01-01,test\n", encoding="utf-8"
    )
    cat = Catalog.bundled()
    (only,) = cat.offers("aws")
    assert (only.instance_type, only.region, only.accelerator_count, only.spot_price_hourly) == (
        "x1.gpu",
        "mars-1",
        2,
        None,
    )
    assert cat.offers("aws", spot=True) == []  # no spot price: not eligible on spot
    assert cat.offers("gcp") and cat.offers("azure")  # the others are still bundled


def test_override_file_errors_name_file_and_line(_isolated_home: Path) -> None:
    folder = _isolated_home / "catalog"
    folder.mkdir(parents=True)
    path = folder / "gcp.csv"
    path.write_text(f"{HEADER}\ngcp,n1-standard-8,,0,8,30,r,r-a,lots,,d,s\n", encoding="utf-8")
    with pytest.raises(PlanError, match=r"gcp\.csv:2: price_hourly_usd 'lots' is not a number"):
        Catalog.bundled()
    path.write_text("provider,instance_type\ngcp,x\n", encoding="utf-8")
    with pytest.raises(PlanError, match="missing column"):
        Catalog.bundled()


def test_offers_filter_and_sort_by_price() -> None:
    rows = [
        offer("aws", "big", "V100", 4, "r1", "r1a", 12.0, 1.0),
        offer("aws", "small", "V100", 1, "r1", "r1a", 3.0, 0.9),
        offer("aws", "small", "V100", 1, "r2", "r2a", 2.5, None),
        offer("aws", "cpu", None, 0, "r1", "r1a", 0.2, 0.05),
    ]
    cat = Catalog.from_rows(rows)
    assert [o.price_hourly for o in cat.offers("aws")] == [0.2, 2.5, 3.0, 12.0]
    assert [o.region for o in cat.offers(accelerator="v100", count=1)] == ["r2", "r1"]
    # spot: sorted by spot price, the offer without one is left out
    assert [o.instance_type for o in cat.offers(accelerator="V100", spot=True)] == ["small", "big"]
    assert [o.instance_type for o in cat.offers(cpu_only=True)] == ["cpu"]
    assert cat.regions("aws") == ["r1", "r2"] and cat.zones("aws", "r1") == ["r1a"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v100", "V100"),
        ("nvidia-tesla-v100", "V100"),
        ("NVIDIA-TESLA-T4", "T4"),
        ("nvidia-l4", "L4"),
        ("a100", "A100"),
        ("A100-40GB", "A100"),
        ("nvidia-tesla-a100", "A100"),
        ("nvidia-a100-80gb", "A100-80GB"),
        ("nvidia-h100-80gb", "H100"),
    ],
)
def test_accelerator_aliases(name: str, expected: str) -> None:
    assert canonical_accelerator(name) == expected


def test_accelerator_lookup_uses_aliases() -> None:
    cat = Catalog.from_rows([offer("aws", "p4d", "A100", 8, "r", "z", 20.0)])
    assert cat.offers(accelerator="a100-40gb") == cat.offers(accelerator="nvidia-tesla-a100")
    assert len(cat.offers(accelerator="A100")) == 1


def test_parse_accelerator() -> None:
    assert parse_accelerator("V100:2") == ("V100", 2)
    assert parse_accelerator("nvidia-tesla-t4") == ("T4", 1)
    for bad in ("", "V100:0", "V100:x", ":2"):
        with pytest.raises(PlanError):
            parse_accelerator(bad)


def test_gcp_gpu_attaches_to_n1_host() -> None:
    host = offer("gcp", GCP_GPU_HOST, None, 0, "us-central1", "us-central1-a", 0.38, 0.1)
    rows = [
        host,
        offer("gcp", "", "V100", 1, "us-central1", "us-central1-a", 2.48, 1.0),
        offer("gcp", "", "L4", 1, "us-central1", "us-central1-a", 0.56, 0.2),  # g2 only
        offer("gcp", "", "T4", 1, "us-east1", "us-east1-b", 0.35, 0.17),  # no host there
    ]
    cat = Catalog.from_rows(rows)
    attached = cat.offers("gcp", accelerator="V100")
    assert [o.accelerator_count for o in attached] == [1, 2, 4, 8]
    for o in attached:
        assert o.attached and o.instance_type == GCP_GPU_HOST and o.zone == "us-central1-a"
        assert o.price_hourly == pytest.approx(0.38 + o.accelerator_count * 2.48)
        assert o.spot_price_hourly == pytest.approx(0.1 + o.accelerator_count * 1.0)
    assert cat.offers(accelerator="L4") == [] and cat.offers(accelerator="T4") == []
    assert all(o.instance_type for o in cat.offers())  # GPU-only rows are not launchable


def test_bundled_gcp_prices_include_built_in_gpus() -> None:
    cat = Catalog.bundled()
    (a2,) = cat.offers("gcp", region="us-central1", instance_type="a2-highgpu-1g")
    assert a2.price_hourly == pytest.approx(0.73948 + 2.93391)  # host + A100 accelerator row
    (v100,) = cat.offers("gcp", region="us-central1", accelerator="V100", count=2)
    assert v100.attached and v100.price_hourly == pytest.approx(0.38 + 2 * 2.48)


def test_read_offers_normalises_cells() -> None:
    text = f"{HEADER}\naws,g,T4,1.0,4.0,16,r,,0.5,,d,s\nazure,x,,,2,8,r,,0.1,0.01,d,s\n"
    g, x = read_offers(text, "test.csv")
    assert (g.accelerator_count, g.zone, g.spot_price_hourly, g.memory_gib) == (1, None, None, 16.0)
    assert (x.accelerator, x.accelerator_count, x.spot_price_hourly) == (None, 0, 0.01)


def test_build_rows_composes_and_normalises() -> None:
    columns = catalog_build.SOURCE_COLUMNS
    src = [
        dict(zip(columns, line.split(","), strict=True))
        for line in (
            "aws,p3,V100,1.0,8,61,r,z,3.06,,s",
            "gcp,g2-standard-8,L4,1,8.0,32.0,us-central1,us-central1-a,0.29358,0.11747,s",
            "gcp,,L4,1,,,us-central1,us-central1-a,0.56004,0.2231,s",
        )
    ]
    out = catalog_build.build_rows(src)
    (p3,) = [r for r in out["aws"] if r["instance_type"] == "p3"]
    assert (p3["accelerator_count"], p3["vcpus"], p3["price_hourly_usd"]) == ("1", "8.0", "3.06")
    assert p3["prices_date"] == catalog_build.PRICES_DATE
    (g2,) = [r for r in out["gcp"] if r["instance_type"] == "g2-standard-8"]
    assert (g2["price_hourly_usd"], g2["spot_price_hourly_usd"]) == ("0.85362", "0.34057")
    assert not [r for r in out["gcp"] if r["accelerator"] == "L4" and not r["instance_type"]]


def test_build_rows_rejects_a_built_in_gpu_without_its_price() -> None:
    line = "gcp,g2-standard-8,L4,1,8,32,asia-east1,asia-east1-a,0.3,,s"
    src = [dict(zip(catalog_build.SOURCE_COLUMNS, line.split(","), strict=True))]
    with pytest.raises(catalog_build.BuildError, match="accelerator-only L4"):
        catalog_build.build_rows(src)


def test_bundled_files_are_rebuilt_byte_for_byte_from_the_snapshot(tmp_path: Path) -> None:
    # the default source is the snapshot; two builds of it give the bundled bytes (idempotent)
    folder = resources.files("cloudtrain") / "catalog"
    for out in (tmp_path / "one", tmp_path / "two"):
        assert catalog_build.main(["--out", str(out)]) == 0
        for name in ("aws", "gcp", "azure", "local"):
            built = (out / f"{name}.csv").read_text(encoding="utf-8")
            assert built == (folder / f"{name}.csv").read_text(encoding="utf-8"), name


@pytest.mark.skipif(not REFERENCE.is_file(), reason="reference price file not present")
def test_the_snapshot_holds_every_reference_row_as_written() -> None:
    def key(row: dict[str, str]) -> tuple[str, ...]:
        return tuple(row[c] for c in ("provider", "instance_type", "accelerator", "region", "zone"))

    text = catalog_build.DEFAULT_SOURCE.read_text(encoding="utf-8")
    snapshot = {key(r): r for r in csv.DictReader(io.StringIO(text))}
    with REFERENCE.open(encoding="utf-8") as handle:
        for ref in csv.DictReader(handle):
            row = snapshot[key(ref)]
            assert row == ref, (row, ref)  # copied exactly, price cells included
