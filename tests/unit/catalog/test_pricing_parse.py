"""The price API parsers on the recorded responses in tests/fixtures/pricing/: what each keeps and
skips, and the catalog rows built from it (pure functions; no server, no SDK call)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cloudtrain.catalog.pricing.common import bundled_offers
from cloudtrain.providers.aws import pricing as aws
from cloudtrain.providers.azure import pricing as azure
from cloudtrain.providers.gcp import pricing as gcp
from tests.unit.catalog.test_pricing_http import load

GCP_REGIONS = ["europe-west4", "us-central1", "us-east1"]


def aws_docs() -> list[dict[str, Any]]:
    return load("aws_products.json")


def gcp_skus() -> list[dict[str, Any]]:
    return load("gcp_skus_page1.json")["skus"] + load("gcp_skus_page2.json")["skus"]


def azure_items() -> list[dict[str, Any]]:
    names = ("azure_eastus_page1.json", "azure_eastus_page2.json", "azure_westus2_page1.json")
    return [item for name in names for item in load(name)["Items"]]


def by_place(offers: list[Any]) -> dict[tuple[str, str, str | None], Any]:
    return {(o.instance_type or o.accelerator, o.region, o.zone): o for o in offers}


# --- AWS -------------------------------------------------------------------------------------


def test_aws_parse_product_keeps_linux_shared_on_demand_only() -> None:
    parsed = [aws.parse_product(d) for d in aws_docs()]
    kept = [(p.instance_type, p.region, p.price) for p in parsed if p]
    # Windows, Dedicated, UnusedCapacityReservation, SQL Web and a zero price are skipped
    assert len(kept) == len(aws_docs()) - 5
    assert kept.count(("g4dn.xlarge", "us-east-1", 0.501)) == 1
    assert ("p3.16xlarge", "us-east-1", 0.0) not in kept
    p4d = next(p for p in parsed if p and p.instance_type == "p4d.24xlarge")
    assert (p4d.vcpus, p4d.memory_gib, p4d.gpus, p4d.price) == (96.0, 1152.0, 8, 21.9576)
    m5 = next(p for p in parsed if p and p.instance_type == "m5.xlarge")
    assert (m5.vcpus, m5.memory_gib, m5.gpus) == (4.0, 16.0, 0)


def test_aws_parse_product_rejects_local_zones_and_ambiguous_terms() -> None:
    doc = aws_docs()[0]
    assert aws.parse_product(doc) is not None  # its Reserved term is ignored
    local = copy.deepcopy(doc)
    local["product"]["attributes"]["locationType"] = "AWS Local Zone"
    assert aws.parse_product(local) is None
    block = copy.deepcopy(doc)
    block["product"]["attributes"]["marketoption"] = "CapacityBlock"
    assert aws.parse_product(block) is None
    two = copy.deepcopy(doc)
    (term,) = two["terms"]["OnDemand"].values()
    term["priceDimensions"]["extra"] = {"unit": "Hrs", "pricePerUnit": {"USD": "9.0"}}
    assert aws.parse_product(two) is None
    assert aws._number("1,152 GiB") == 1152.0 and aws._number("NA") is None


def test_aws_rows_keep_bundled_zones_and_spot() -> None:
    products = [p for d in aws_docs() if (p := aws.parse_product(d))]
    rows = by_place(aws.to_offers(products, bundled_offers("aws")))
    g4 = rows[("g4dn.xlarge", "us-east-1", "use1-az1")]
    assert (g4.accelerator, g4.accelerator_count, g4.price_hourly) == ("T4", 1, 0.501)
    assert g4.spot_price_hourly == 0.2158  # the bundled spot price of that zone
    new = rows[("g4dn.2xlarge", "us-east-1", None)]  # not in the bundled catalog
    assert (new.accelerator, new.vcpus, new.memory_gib, new.spot_price_hourly) == (
        "T4",
        8.0,
        32.0,
        None,
    )
    assert rows[("p5.48xlarge", "us-east-1", "use1-az1")].accelerator == "H100"
    assert rows[("g5.xlarge", "us-east-1", "use1-az1")].accelerator == "A10G"
    m5 = [o for k, o in rows.items() if k[:2] == ("m5.xlarge", "eu-west-1")]
    assert sorted(o.zone for o in m5) == ["euw1-az1", "euw1-az2"]
    assert all(o.accelerator is None and o.price_hourly == 0.214 for o in m5)
    assert not any(k[0].startswith(("g4ad.", "g5g.")) for k in rows)  # other families


def test_aws_filters_are_term_matches_with_the_base_filters() -> None:
    filters = aws.term_filters(instanceType="m5.xlarge", regionCode="eu-west-1")
    assert {f["Type"] for f in filters} == {"TERM_MATCH"}
    fields = {f["Field"]: f["Value"] for f in filters}
    assert fields == {
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "instanceType": "m5.xlarge",
        "regionCode": "eu-west-1",
    }


# --- GCP -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("Nvidia Tesla T4 GPU running in Americas", ("gpu", "T4")),
        ("Spot Preemptible Nvidia Tesla V100 GPU running in EMEA", ("gpu", "V100")),
        ("Nvidia Tesla A100 80GB GPU running in Americas", ("gpu", "A100-80GB")),
        ("Nvidia H100 80GB GPU running in Americas", ("gpu", "H100")),
        ("Nvidia L4 GPU running in Netherlands", ("gpu", "L4")),
        ("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", None),
        ("N1 Predefined Instance Core running in Americas", ("core", "n1")),
        ("Preemptible N1 Predefined Instance Ram running in Netherlands", ("ram", "n1")),
        ("A2 Instance Ram running in Americas", ("ram", "a2")),
        ("Custom Instance Core running in Americas", None),
        ("Commitment v1: Nvidia Tesla T4 GPU in Americas for 1 Year", None),
        ("Network Internet Egress from Americas to Americas", None),
    ],
)
def test_gcp_classify(description: str, expected: tuple[str, str] | None) -> None:
    assert gcp.classify(description) == expected


def test_gcp_parse_skus_per_region() -> None:
    prices = gcp.parse_skus(gcp_skus(), GCP_REGIONS)
    assert prices[("gpu", "T4", "us-central1", False)] == 0.33
    assert prices[("gpu", "T4", "us-east1", True)] == 0.14
    assert prices[("gpu", "T4", "europe-west4", False)] == 0.3675
    assert prices[("core", "n1", "europe-west4", False)] == pytest.approx(0.034802)
    assert prices[("ram", "n1", "us-east1", True)] == pytest.approx(0.000935)
    assert ("gpu", "T4", "us-west1", False) not in prices  # not a requested region
    assert {k[0] for k in prices} == {"gpu", "core", "ram"}  # egress, storage, licences skipped
    assert prices[("gpu", "T4", "us-central1", False)] != 0.22  # not the commitment price
    assert gcp.unit_price(gcp_skus()[11]) == (0.12, "GiBy")  # the last tier of the egress SKU


def test_gcp_ambiguous_component_is_not_priced() -> None:
    skus = gcp_skus()
    clash = copy.deepcopy(skus[0])  # T4 in Americas, another price
    clash["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] = 1
    same = copy.deepcopy(skus[0])
    prices = gcp.parse_skus([*skus, same], GCP_REGIONS)
    assert prices[("gpu", "T4", "us-east1", False)] == 0.33
    prices = gcp.parse_skus([*skus, clash], GCP_REGIONS)
    assert ("gpu", "T4", "us-east1", False) not in prices
    assert ("gpu", "T4", "europe-west4", False) in prices


def test_gcp_rows_price_machines_from_core_and_ram() -> None:
    prices = gcp.parse_skus(gcp_skus(), GCP_REGIONS)
    rows = by_place(gcp.to_offers(prices, bundled_offers("gcp"), GCP_REGIONS))
    n1 = rows[("n1-standard-4", "us-central1", "us-central1-a")]
    assert n1.price_hourly == pytest.approx(4 * 0.031611 + 15 * 0.004237)
    assert n1.spot_price_hourly == pytest.approx(4 * 0.00698 + 15 * 0.000935)
    assert (n1.vcpus, n1.memory_gib, n1.accelerator) == (4.0, 15.0, None)
    ew4 = [o for k, o in rows.items() if k[:2] == ("n1-standard-4", "europe-west4")]
    assert sorted(o.zone for o in ew4) == ["europe-west4-a", "europe-west4-b"]
    assert ew4[0].spot_price_hourly is None  # no preemptible N1 SKU for Netherlands recorded
    a2 = rows[("a2-highgpu-1g", "us-east1", "us-east1-b")]
    assert a2.price_hourly == pytest.approx(12 * 0.031611 + 85 * 0.004237 + 2.933908, abs=1e-6)
    assert (a2.accelerator, a2.accelerator_count, a2.spot_price_hourly) == ("A100", 1, None)
    t4 = rows[("T4", "us-central1", "us-central1-a")]
    assert (t4.instance_type, t4.accelerator_count, t4.price_hourly, t4.spot_price_hourly) == (
        "",
        1,
        0.33,
        0.14,
    )
    assert rows[("P100", "us-east1", None)].spot_price_hourly == 0.584  # zone not known
    missing = {"a3-highgpu-8g", "g2-standard-8"}  # no A3/G2/L4/H100 SKUs recorded
    assert not any(k[0] in missing for k in rows)
    assert ("a2-highgpu-1g", "europe-west4", "europe-west4-a") not in rows


# --- Azure -----------------------------------------------------------------------------------


def test_azure_classify_and_parse() -> None:
    items = azure_items()
    kinds = [azure.classify(i) for i in items]
    assert kinds.count(None) == 5  # 2 Windows, Low Priority, Reservation, DevTest
    sizes = {o.instance_type for o in bundled_offers("azure")}
    prices = azure.parse_items(items, sizes, ["eastus", "westus2"])
    assert prices[("Standard_NC4as_T4_v3", "eastus", False)][1] == 0.5  # newest of 0.5 / 0.526
    assert prices[("Standard_NC4as_T4_v3", "eastus", True)][1] == 0.0627
    assert ("Standard_D4s_v5", "westus2", True) not in prices  # a zero spot price
    assert not any(k[0] == "Standard_E4s_v5" for k in prices)  # not a size of the catalog


def test_azure_rows_take_the_shape_from_the_bundle() -> None:
    bundled = bundled_offers("azure")
    sizes = {o.instance_type for o in bundled}
    prices = azure.parse_items(azure_items(), sizes, ["eastus", "westus2"])
    rows = by_place(azure.to_offers(prices, bundled, ["eastus", "westus2"]))
    t4 = rows[("Standard_NC4as_T4_v3", "eastus", None)]
    assert (t4.accelerator, t4.accelerator_count, t4.vcpus, t4.memory_gib) == ("T4", 1, 4.0, 28.0)
    assert (t4.price_hourly, t4.spot_price_hourly) == (0.5, 0.0627)
    assert ("Standard_NC24s_v3", "eastus", None) not in rows  # retired (NCv3): not in the bundle
    assert rows[("Standard_D4s_v5", "westus2", None)].spot_price_hourly is None
    assert ("Standard_NC64as_T4_v3", "eastus", None) not in rows  # not in the responses


def test_azure_filter_names_region_and_sizes() -> None:
    text = azure.price_filter("eastus", ["Standard_NC6s_v3", "Standard_D4s_v5"])
    assert text == (
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq "
        "'eastus' and (armSkuName eq 'Standard_D4s_v5' or armSkuName eq 'Standard_NC6s_v3')"
    )
    url = azure.first_url("eastus", ["Standard_NC6s_v3"])
    assert "api-version=2023-01-01-preview&$filter=serviceName%20eq%20'Virtual%20Machines'" in url
