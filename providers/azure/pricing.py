"""Azure prices from the Azure Retail Prices API (public, no credentials).

`fetch(bundled, regions)` blocks on network I/O and writes nothing. Per region it pages through
`GET {base}/api/retail/prices?api-version=2023-01-01-preview&$filter=serviceName eq 'Virtual
Machines' and priceType eq 'Consumption' and armRegionName eq '<region>' and (armSkuName eq '...' or
...)`, following `NextPageLink` until it is empty ({base} is `$CLOUDTRAIN_PRICING_AZURE_URL`,
default `https://prices.azure.com`). The sizes asked for are the bundled azure.csv's (NC/ND GPU
sizes and the CPU sizes for parameter servers): the API says nothing about vCPUs, memory or GPUs,
so that comes from the bundled catalog and unknown sizes could not be described anyway.

Kept items: `type` Consumption, `serviceName` Virtual Machines, USD, `unitOfMeasure` "1 Hour",
`retailPrice` > 0, the wanted `armSkuName` and `armRegionName`. An item whose `skuName` or
`meterName` contains "Spot" gives the spot price, any other the on-demand price. Skipped: Windows
(`productName` containing "Windows"), "Low Priority", reservations and DevTest prices, other units,
sizes or regions. When one size and region has several items of a kind, the latest
`effectiveStartDate` wins. Rows have no zone (like the bundled azure.csv); a size without a Spot
item gets no spot price.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from cloudtrain.catalog.offers import Offer
from cloudtrain.catalog.pricing.common import base_url, get_json
from cloudtrain.core import env
from cloudtrain.core.errors import ProviderError

API = "Azure Retail Prices API"
AZURE_URL_ENV = env.PRICING_AZURE_URL.name  # test-only: the API's base URL (a fake)
API_VERSION = "2023-01-01-preview"
DEFAULT_BASE = "https://prices.azure.com"
MAX_PAGES = 100

# (armSkuName, region, spot) -> (effectiveStartDate, USD per hour)
Prices = dict[tuple[str, str, bool], tuple[str, float]]


def price_filter(region: str, sizes: Iterable[str]) -> str:
    """The OData `$filter` for the Linux/Windows consumption prices of `sizes` in `region`. Pure."""
    text = (
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' "
        f"and armRegionName eq '{region}'"
    )
    names = sorted(set(sizes))
    if names:
        text += " and (" + " or ".join(f"armSkuName eq '{n}'" for n in names) + ")"
    return text


def first_url(region: str, sizes: Iterable[str]) -> str:
    """The URL of the first page for `region` (reads the endpoint override env)."""
    query = urllib.parse.quote(price_filter(region, sizes), safe="'()")
    base = base_url(AZURE_URL_ENV, DEFAULT_BASE)
    return f"{base}/api/retail/prices?api-version={API_VERSION}&$filter={query}"


def fetch_items(region: str, sizes: Iterable[str]) -> list[dict[str, Any]]:
    """Every price item for `sizes` in `region`, all pages. Blocks; raises ProviderError & co."""
    url: str | None = first_url(region, sizes)
    items: list[dict[str, Any]] = []
    for _ in range(MAX_PAGES):
        page = get_json(url or "", api=API, auth_hint="the API is public; check a proxy")
        if not isinstance(page, dict) or not isinstance(page.get("Items", []), list):
            raise ProviderError(f"{API}: a page is not an object with Items; nothing was written")
        items.extend(page.get("Items") or [])
        url = page.get("NextPageLink") or None
        if not url:
            return items
    raise ProviderError(f"{API}: still paging after {MAX_PAGES} pages; nothing was written")


def classify(item: dict[str, Any]) -> bool | None:
    """True for a usable Linux spot price item, False for on-demand, None to skip. Pure."""
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    if (
        item.get("type") != "Consumption"
        or item.get("serviceName") != "Virtual Machines"
        or item.get("currencyCode", "USD") != "USD"
        or item.get("unitOfMeasure") != "1 Hour"
        or "Windows" in str(item.get("productName", ""))
        or "Low Priority" in names
        or float(item.get("tierMinimumUnits") or 0) != 0
    ):
        return None
    return "Spot" in names


def parse_items(
    items: Iterable[dict[str, Any]], sizes: Iterable[str], regions: Iterable[str]
) -> Prices:
    """Hourly on-demand and spot prices per (size, region) (rules in the module doc). Pure."""
    wanted_sizes, wanted_regions = set(sizes), set(regions)
    prices: Prices = {}
    for item in items:
        spot = classify(item)
        size, region = item.get("armSkuName", ""), item.get("armRegionName", "")
        if spot is None or size not in wanted_sizes or region not in wanted_regions:
            continue
        price = float(item.get("retailPrice") or 0)
        if price <= 0:
            continue
        key = (size, region, spot)
        start = str(item.get("effectiveStartDate", ""))
        if key not in prices or start > prices[key][0]:
            prices[key] = (start, price)
    return prices


def to_offers(prices: Prices, bundled: Sequence[Offer], regions: Sequence[str]) -> list[Offer]:
    """One row per bundled size and region with an on-demand price (shape from the bundle). Pure."""
    meta: dict[str, Offer] = {}
    for o in bundled:
        meta.setdefault(o.instance_type, o)
    offers = []
    for size, shape in sorted(meta.items()):
        for region in regions:
            on_demand = prices.get((size, region, False))
            if on_demand is None:
                continue
            spot = prices.get((size, region, True))
            offers.append(
                Offer(
                    provider="azure",
                    instance_type=size,
                    accelerator=shape.accelerator,
                    accelerator_count=shape.accelerator_count,
                    vcpus=shape.vcpus,
                    memory_gib=shape.memory_gib,
                    region=region,
                    zone=None,
                    price_hourly=on_demand[1],
                    spot_price_hourly=spot[1] if spot else None,
                    prices_date="",
                    source=f"{API} {API_VERSION}; shape from the bundled catalog",
                )
            )
    return offers


def fetch(bundled: Sequence[Offer], regions: Sequence[str]) -> list[Offer]:
    """Live Azure rows for `regions` (prices_date left empty for the caller to stamp). Blocks."""
    sizes = sorted({o.instance_type for o in bundled if o.instance_type})
    items: list[dict[str, Any]] = []
    for region in regions:
        items.extend(fetch_items(region, sizes))
    return to_offers(parse_items(items, sizes, regions), bundled, regions)
