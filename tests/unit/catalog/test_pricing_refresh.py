"""`cloudtrain.catalog.pricing.refresh` end to end against the local fake of the three price APIs
(boto3
goes to it through AWS_ENDPOINT_URL_PRICING): the user catalog it writes overrides the bundled one,
and nothing is written when a fetch fails."""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from cloudtrain.catalog import build as catalog_build
from cloudtrain.catalog.offers import Catalog
from cloudtrain.catalog.pricing import refresh, refresh_result
from cloudtrain.core.errors import (
    CloudtrainError,
    CredentialsError,
    ProviderError,
    TransientError,
    UsageError,
)
from tests.unit.catalog.test_pricing_http import FakePriceApis, serve_fakes


@pytest.fixture
def price_apis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakePriceApis]:
    yield from serve_fakes(monkeypatch, tmp_path)


def dates_around(call: object) -> tuple[object, set[str]]:
    """`call()`'s result and the dates (local) it may have stamped: the day it started and the
    day it ended, which differ when the call crosses midnight (as a CI run did)."""
    start = dt.date.today().isoformat()
    result = call()  # type: ignore[operator]
    return result, {start, dt.date.today().isoformat()}


def home() -> Path:
    return Path(os.environ["CLOUDTRAIN_HOME"])


def rows_of(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def header_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[0].split(",")


def bundled_header(provider: str) -> list[str]:
    text = (resources.files("cloudtrain") / "catalog" / f"{provider}.csv").read_text()
    return text.splitlines()[0].split(",")


def test_refresh_aws_writes_an_override_the_catalog_uses(price_apis: FakePriceApis) -> None:
    before = Catalog.bundled().offers("aws", "us-east-1", "T4", 1)[0]
    (path, count), today = dates_around(lambda: refresh("aws"))
    assert path == home() / "catalog" / "aws.csv"
    assert header_of(path) == bundled_header("aws") == list(catalog_build.HEADER)
    rows = rows_of(path)
    assert count == len(rows)
    after = Catalog.bundled().offers("aws", "us-east-1", "T4", 1)[0]
    assert (before.price_hourly, after.price_hourly) == (0.526, 0.501)
    assert (after.instance_type, after.zone) == ("g4dn.xlarge", "use1-az1")
    assert after.prices_date in today
    assert after.spot_price_hourly == before.spot_price_hourly
    catalog = Catalog.bundled()
    new = catalog.offers("aws", instance_type="g4dn.2xlarge")
    assert [(o.region, o.zone, o.spot_price_hourly) for o in new] == [("us-east-1", None, None)]
    assert not catalog.offers("aws", instance_type="g4dn.2xlarge", spot=True)
    kept = catalog.offers("aws", "us-west-2", instance_type="g6.xlarge")  # not in the responses
    assert [o.prices_date for o in kept] == ["2026-11-21"]
    assert not any(r["instance_type"].startswith(("g4ad", "g5g")) for r in rows)
    calls = [body for api, _, body in price_apis.requests if api == "aws"]
    assert all(c["ServiceCode"] == "AmazonEC2" and c["FormatVersion"] == "aws_v1" for c in calls)
    gpu_east = [
        c
        for c in calls
        if {"Field": "regionCode", "Type": "TERM_MATCH", "Value": "us-east-1"} in c["Filters"]
        and any(f["Value"] == "GPU instance" for f in c["Filters"])
    ]
    assert len(gpu_east) == 4 and [bool(c.get("NextToken")) for c in gpu_east] == [0, 1, 1, 1]


def test_refresh_gcp_prices_n1_hosts_with_attached_gpus(price_apis: FakePriceApis) -> None:
    result = refresh_result("gcp", today="2026-12-01")
    assert (result.provider, result.prices_date) == ("gcp", "2026-12-01")
    assert result.rows == result.fresh + result.kept and result.kept > 0
    assert header_of(result.path) == bundled_header("gcp")
    offer = Catalog.bundled().offers("gcp", "us-central1", "T4", 2)[0]
    host = 8 * 0.031611 + 30 * 0.004237
    assert offer.attached and offer.instance_type == "n1-standard-8"
    assert offer.price_hourly == pytest.approx(host + 2 * 0.33, abs=1e-6)
    assert offer.spot_price_hourly == pytest.approx(
        8 * 0.00698 + 30 * 0.000935 + 2 * 0.14, abs=1e-6
    )
    assert offer.prices_date == "2026-12-01"
    a3 = Catalog.bundled().offers("gcp", instance_type="a3-highgpu-8g")
    assert a3 and all(o.prices_date == "2026-11-21" for o in a3)  # kept from the bundle
    gcp_calls = [path for api, path, _ in price_apis.requests if api == "gcp"]
    assert len(gcp_calls) == 2 and "pageToken=" in gcp_calls[1] and "key=test-key" in gcp_calls[0]


def test_refresh_azure_follows_next_page_links(price_apis: FakePriceApis) -> None:
    result, today = dates_around(lambda: refresh_result("azure"))
    by_key = {(r["instance_type"], r["region"]): r for r in rows_of(result.path)}
    t4 = by_key[("Standard_NC4as_T4_v3", "eastus")]
    assert (t4["price_hourly_usd"], t4["spot_price_hourly_usd"]) == ("0.5", "0.0627")
    assert t4["prices_date"] in today
    assert by_key[("Standard_ND96asr_v4", "eastus")]["accelerator_count"] == "8"
    assert by_key[("Standard_NC40ads_H100_v5", "eastus")]["prices_date"] == "2026-11-21"
    offer = Catalog.bundled().offers("azure", "eastus", "T4", 1, spot=True)[0]
    assert (offer.price_hourly, offer.spot_price_hourly) == (0.5, 0.0627)
    paths = [path for api, path, _ in price_apis.requests if api == "azure"]
    # one query per bundled region, in name order; eastus's answer has a next page, fetched next
    eastus = [i for i, p in enumerate(paths) if "armRegionName%20eq%20'eastus'" in p]
    assert len(paths) == 9 and len(eastus) == 1 and "$skip" not in paths[eastus[0]]
    assert [i for i, p in enumerate(paths) if "$skip=100" in p] == [eastus[0] + 1]
    assert "armSkuName%20eq%20'Standard_NC4as_T4_v3'" in paths[0]


def test_refresh_regions_argument_limits_the_queries(price_apis: FakePriceApis) -> None:
    result = refresh_result("azure", regions=["westus2"])
    assert result.fresh == 2  # NC4as_T4_v3 and D4s_v5 in westus2
    assert all("westus2" in p for a, p, _ in price_apis.requests if a == "azure")


def _catalog_files(home: Path) -> list[str]:
    folder = home / "catalog"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize(
    ("provider", "fault", "error", "message"),
    [
        ("gcp", (500, b'{"error": {"message": "internal"}}', 1, 99), TransientError, "HTTP 500"),
        ("gcp", (200, b'{"skus": [{"description": ', 1, 1), ProviderError, "malformed JSON"),
        ("azure", (200, b"<html>maintenance</html>", 1, 1), ProviderError, "malformed JSON"),
        ("azure", (200, b'{"Items": [], "NextPageLink": null}', 0, 99), ProviderError, "no usable"),
        ("aws", (200, b'{"PriceList": ["{not json"]}', 0, 1), ProviderError, "not JSON"),
        (
            "aws",
            (400, b'{"__type": "AccessDeniedException", "message": "no pricing"}', 0, 1),
            CredentialsError,
            "AccessDeniedException",
        ),
    ],
)
def test_nothing_is_written_when_a_fetch_fails(
    price_apis: FakePriceApis,
    provider: str,
    fault: tuple[int, bytes, int, int],
    error: type[Exception],
    message: str,
) -> None:
    previous = home() / "catalog" / f"{provider}.csv"
    previous.parent.mkdir(parents=True)
    previous.write_text("a previous refresh\n")
    price_apis.faults[provider] = fault
    with pytest.raises(error, match=message):
        refresh(provider)
    assert previous.read_text() == "a previous refresh\n"
    assert _catalog_files(home()) == [f"{provider}.csv"]  # no temp file left behind


def test_gcp_without_key_or_adc_is_a_credentials_error(
    price_apis: FakePriceApis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CLOUDTRAIN_GCP_PRICING_KEY")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(CredentialsError, match="CLOUDTRAIN_GCP_PRICING_KEY"):
        refresh("gcp")
    assert _catalog_files(home()) == []
    assert not [r for r in price_apis.requests if r[0] == "gcp"]


def test_refresh_rejects_local_and_unknown_providers(tmp_path: Path) -> None:
    for name in ("local", "ibm"):
        with pytest.raises(UsageError, match="no price API"):
            refresh(name, tmp_path)
    assert not (tmp_path / "catalog").exists()


def test_explicit_home_writes_there_only(price_apis: FakePriceApis, tmp_path: Path) -> None:
    path, count = refresh("azure", tmp_path / "elsewhere")
    assert path == tmp_path / "elsewhere" / "catalog" / "azure.csv" and count == len(rows_of(path))
    assert all(float(r["price_hourly_usd"]) > 0 and r["zone"] == "" for r in rows_of(path))
    assert _catalog_files(home()) == []
    assert Catalog.bundled().offers("azure", "eastus", "T4", 1)[0].price_hourly == 0.526


def test_unwritable_home_is_one_clear_error(price_apis: FakePriceApis, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(CloudtrainError, match="cannot write the user catalog"):
        refresh("azure", blocker)
