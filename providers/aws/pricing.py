"""AWS on-demand prices from the Price List Query API (boto3 `pricing`, served from us-east-1).

`fetch(bundled, regions)` blocks on network I/O and writes nothing. Per region it pages through
`GetProducts(ServiceCode="AmazonEC2")` with TERM_MATCH filters on `regionCode`, Linux, Shared
tenancy, no pre-installed software and capacitystatus `Used`: once for `instanceFamily` "GPU
instance", then once per bundled instance type of that region still unpriced (the CPU machines such
as m5.xlarge, and any bundled GPU type the family query did not return). boto3 is imported here
only; `AWS_ENDPOINT_URL_PRICING` / `AWS_ENDPOINT_URL` point it elsewhere (tests). The Price List
API needs AWS credentials (any identity allowed `pricing:GetProducts`).

Kept: "Compute Instance" products of the GPU families g4dn, g5, g6, p3, p4d, p5 and of the bundled
instance types, whose attributes match the filters again client-side (also `operation`
RunInstances, `marketoption` OnDemand and `locationType` "AWS Region" when present) and whose single
OnDemand term has a positive USD per `Hrs` price. Skipped: other families (g4ad, g5g, ...), Windows,
dedicated or reserved capacity, Local Zones, capacity blocks, zero prices, and a second product for
an (instance type, region) already priced.

vCPUs, memory and GPU count come from the attributes (`vcpu`, `memory` "16 GiB", `gpu`). The price
list has no GPU model attribute: it comes from the bundled catalog, else from the family (g4dn T4,
g5 A10G, g6 L4, p3 V100, p4d A100, p5 H100).

Spot: the price list has no spot prices, and `ec2.describe_spot_price_history` needs an account,
a call per region and is not reproducible offline. So an (instance type, region) that the bundled
catalog has gets one row per bundled zone ID with that zone's bundled spot price; any other gets
one row with an empty zone and no spot price (it is then not used for `spot: true`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.catalog.offers import Offer
from cloudtrain.core.errors import ProviderError, UsageError

API = "AWS Price List Query API"
PRICING_REGION = "us-east-1"
GPU_FAMILIES: dict[str, str] = {
    "g4dn": "T4",
    "g5": "A10G",
    "g6": "L4",
    "p3": "V100",
    "p4d": "A100",
    "p5": "H100",
}
BASE_FILTERS: dict[str, str] = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}
# Attributes that, when present, must have one of these values (a second, client-side filter).
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "operation": ("RunInstances",),
    "marketoption": ("OnDemand",),
    "locationType": ("AWS Region",),
    "licenseModel": ("No License required",),
}
_NUMBER = re.compile(r"^\s*([0-9][0-9,]*(?:\.[0-9]+)?)")


@dataclass(frozen=True)
class Product:
    """One priced EC2 product: an instance type's Linux on-demand price in one region."""

    sku: str
    instance_type: str
    region: str
    vcpus: float | None
    memory_gib: float | None
    gpus: int
    price: float


def make_client() -> Any:
    """A boto3 `pricing` client in us-east-1 (honours AWS_ENDPOINT_URL_PRICING). Imports boto3."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise UsageError(
            "refreshing AWS prices needs boto3", hint="pip install 'cloudtrain[aws]'"
        ) from None
    config = Config(
        retries={"mode": "standard", "max_attempts": 4}, connect_timeout=10, read_timeout=60
    )
    return boto3.client("pricing", region_name=PRICING_REGION, config=config)


def term_filters(**fields: str) -> list[dict[str, str]]:
    """GetProducts filters: TERM_MATCH on each field, the base filters first. Pure."""
    merged = {**BASE_FILTERS, **fields}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in merged.items()]


def get_products(client: Any, filters: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Every price list document matching `filters`, all pages, decoded. Blocks.

    Raises the cloudtrain error for an SDK error (CredentialsError, TransientError, ...) and
    ProviderError for a PriceList entry that is not JSON.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from cloudtrain.providers.aws.errors import translate

    what = f"{API} GetProducts ({', '.join(f['Value'] for f in filters[len(BASE_FILTERS) :])})"
    docs: list[dict[str, Any]] = []
    try:
        pages = client.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2",
            Filters=filters,
            FormatVersion="aws_v1",
            PaginationConfig={"PageSize": 100},
        )
        for page in pages:
            for item in page.get("PriceList", []):
                docs.append(json.loads(item) if isinstance(item, str) else item)
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, what) from exc
    except ValueError:
        raise ProviderError(
            f"{what}: a PriceList entry is not JSON", hint="retry later; report it if it persists"
        ) from None
    return docs


def _number(text: str | None) -> float | None:
    """16 from "16 GiB", 1152 from "1,152 GiB", None from "NA" or nothing. Pure."""
    match = _NUMBER.match(text or "")
    return float(match.group(1).replace(",", "")) if match else None


def on_demand_price(doc: dict[str, Any]) -> float | None:
    """The single USD per-hour OnDemand price of a price list document, else None. Pure."""
    prices = set()
    for term in (doc.get("terms", {}).get("OnDemand") or {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            if dimension.get("unit") != "Hrs":
                continue
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None:
                prices.add(float(usd))
    return prices.pop() if len(prices) == 1 else None


def parse_product(doc: dict[str, Any]) -> Product | None:
    """The product of a price list document, or None when it is not a usable Linux on-demand
    instance price (see the module docstring for the rules). Pure."""
    product = doc.get("product") or {}
    attrs: dict[str, str] = product.get("attributes") or {}
    if not str(product.get("productFamily", "")).startswith("Compute Instance"):
        return None
    if any(attrs.get(k) != v for k, v in BASE_FILTERS.items()):
        return None
    if any(k in attrs and attrs[k] not in ok for k, ok in _OPTIONAL.items()):
        return None
    itype, region = attrs.get("instanceType", ""), attrs.get("regionCode", "")
    price = on_demand_price(doc)
    if not itype or not region or price is None or price <= 0:
        return None
    gpus = _number(attrs.get("gpu"))
    return Product(
        sku=str(product.get("sku", "")),
        instance_type=itype,
        region=region,
        vcpus=_number(attrs.get("vcpu")),
        memory_gib=_number(attrs.get("memory")),
        gpus=int(gpus or 0),
        price=price,
    )


def family(instance_type: str) -> str:
    """`g4dn` for `g4dn.xlarge`. Pure."""
    return instance_type.split(".", 1)[0]


def to_offers(products: Sequence[Product], bundled: Sequence[Offer]) -> list[Offer]:
    """Catalog rows for the products of interest, zones and spot prices from `bundled`. Pure."""
    by_place: dict[tuple[str, str], list[Offer]] = {}
    meta: dict[str, Offer] = {}
    for o in bundled:
        by_place.setdefault((o.instance_type, o.region), []).append(o)
        meta.setdefault(o.instance_type, o)
    offers: list[Offer] = []
    seen: set[tuple[str, str]] = set()
    for p in products:
        known = meta.get(p.instance_type)
        gpu_model = known.accelerator if known else GPU_FAMILIES.get(family(p.instance_type))
        if known is None and gpu_model is None:
            continue  # neither a GPU family of interest nor a bundled CPU type
        if (p.instance_type, p.region) in seen:
            continue
        count = p.gpus or (known.accelerator_count if known else 0)
        if gpu_model and count < 1:
            continue  # a GPU type without a GPU count: not a row we can price per GPU
        seen.add((p.instance_type, p.region))
        places = by_place.get((p.instance_type, p.region)) or [None]
        for place in places:
            offers.append(
                Offer(
                    provider="aws",
                    instance_type=p.instance_type,
                    accelerator=gpu_model or None,
                    accelerator_count=count if gpu_model else 0,
                    vcpus=p.vcpus if p.vcpus is not None else (known.vcpus if known else None),
                    memory_gib=p.memory_gib
                    if p.memory_gib is not None
                    else (known.memory_gib if known else None),
                    region=p.region,
                    zone=place.zone if place else None,
                    price_hourly=p.price,
                    spot_price_hourly=place.spot_price_hourly if place else None,
                    prices_date="",
                    source=f"{API} sku {p.sku}"
                    + ("; spot and zone from the bundled catalog" if place else ""),
                )
            )
    return offers


def fetch(bundled: Sequence[Offer], regions: Sequence[str], client: Any = None) -> list[Offer]:
    """Live AWS rows for `regions` (prices_date left empty for the caller to stamp). Blocks."""
    client = client if client is not None else make_client()
    cpu_types = {o.instance_type for o in bundled if not o.accelerator}
    products: list[Product] = []
    for region in regions:
        found: list[Product] = []
        for doc in get_products(
            client, term_filters(instanceFamily="GPU instance", regionCode=region)
        ):
            parsed = parse_product(doc)
            if parsed and parsed.region == region:
                found.append(parsed)
        wanted = {o.instance_type for o in bundled if o.region == region} | cpu_types
        for itype in sorted(wanted - {p.instance_type for p in found}):
            for doc in get_products(client, term_filters(instanceType=itype, regionCode=region)):
                parsed = parse_product(doc)
                if parsed and parsed.region == region and parsed.instance_type == itype:
                    found.append(parsed)
        products.extend(found)
    return to_offers(products, bundled)
