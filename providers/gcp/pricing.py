"""GCP prices from the Cloud Billing Catalog API (the SKUs of Compute Engine, 6F81-5844-456A).

`fetch(bundled, regions)` blocks on network I/O and writes nothing. It pages through
`GET {base}/v1/services/6F81-5844-456A/skus?currencyCode=USD&pageSize=5000&pageToken=...` until
`nextPageToken` is empty ({base} is `$CLOUDTRAIN_PRICING_GCP_URL`, default
`https://cloudbilling.googleapis.com`). Auth: the API key in `$CLOUDTRAIN_GCP_PRICING_KEY` (query
`key=`), else an Application Default Credentials bearer token through google-auth when installed.

Kept SKUs (by `category.usageType`: OnDemand gives the on-demand price, Preemptible the spot price;
a "Preemptible " or "Spot Preemptible " prefix of the description is ignored):
- GPUs, "Nvidia [Tesla ]<MODEL> GPU running in <place>" (`T4`, `V100`, `A100 80GB` -> A100-80GB,
  `H100 80GB` -> H100, ...), priced per GPU-hour (usageUnit `h`);
- machine cores and memory, "<FAMILY> [Predefined ]Instance Core|Ram running in <place>" (N1, N2,
  A2, A3, G2, ...), per vCPU-hour (`h`) and per GiB-hour (`GiBy.h`).
Each SKU applies to every region in its `serviceRegions`; only the requested regions are kept.
Skipped: commitments and other usage types, other currencies or units, "Virtual Workstation"
GPUs, custom / sole-tenant / memory-optimized cores, and any component whose SKUs give two
different prices for one region (ambiguous: its rows are not priced rather than guessed). The
price is `pricingInfo[0].pricingExpression.tieredRates[-1].unitPrice` = units + nanos / 1e9.

Rows built (vCPUs, memory, GPU model and count from the bundled catalog, which the API lacks):
- GPU-only rows (empty instance_type, count 1) for the GPUs attachable to n1 (T4, V100, P100, P4,
  K80), in the bundled zones of that GPU and region, else with an empty zone;
- a row per bundled machine type, region and zone: vCPUs x core price + GiB x RAM price of its
  family, plus count x the GPU price for machines with built-in GPUs (a2, a3, g2). A spot price
  only when every part has a Preemptible SKU.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from cloudtrain.catalog.offers import Offer, canonical_accelerator
from cloudtrain.catalog.pricing.common import base_url, get_json
from cloudtrain.core import env
from cloudtrain.core.errors import CredentialsError, ProviderError, TransientError
from cloudtrain.providers.gcp.catalog_rules import N1_GPU_COUNTS

API = "GCP Cloud Billing Catalog API"
GCP_URL_ENV = env.PRICING_GCP_URL.name  # test-only: the API's base URL (a fake)
GCP_KEY_ENV = env.GCP_PRICING_KEY.name
SERVICE_ID = "6F81-5844-456A"  # Compute Engine
DEFAULT_BASE = "https://cloudbilling.googleapis.com"
MAX_PAGES = 200
AUTH_HINT = (
    f"set {GCP_KEY_ENV} to an API key of a project with the Cloud Billing API enabled, or run "
    "`gcloud auth application-default login`"
)
_PREFIX = re.compile(r"^(?:Spot Preemptible |Preemptible )")
_GPU = re.compile(r"^Nvidia (?:Tesla )?(?P<model>.+?) GPU running in ")
_MACHINE = re.compile(r"^(?P<family>[A-Z][0-9][A-Z]?) (?:Predefined )?Instance (?P<kind>Core|Ram) ")
_UNITS = {"gpu": "h", "core": "h", "ram": "GiBy.h"}

# (kind, name, region, spot) -> USD per unit-hour; kind is gpu / core / ram, name a GPU or family.
Prices = dict[tuple[str, str, str, bool], float]


def _auth() -> tuple[dict[str, str], dict[str, str]]:
    """(headers, query params) that authenticate a Catalog API call. Reads env; may call ADC."""
    key = env.GCP_PRICING_KEY.text()
    if key:
        return {}, {"key": key}
    try:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests
    except ImportError:
        raise CredentialsError(f"{API}: no API key and no google-auth", hint=AUTH_HINT) from None
    try:
        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
        credentials.refresh(google.auth.transport.requests.Request())
    except google.auth.exceptions.TransportError as exc:
        raise TransientError(f"{API}: cannot refresh the ADC token: {exc}") from None
    except google.auth.exceptions.GoogleAuthError as exc:
        raise CredentialsError(f"{API}: no usable credentials: {exc}", hint=AUTH_HINT) from None
    headers = {"Authorization": f"Bearer {credentials.token}"}
    quota_project = getattr(credentials, "quota_project_id", None)
    if quota_project:
        headers["x-goog-user-project"] = quota_project
    return headers, {}


def fetch_skus() -> list[dict[str, Any]]:
    """Every Compute Engine SKU, all pages. Blocks; raises ProviderError and its subclasses."""
    headers, auth = _auth()
    base = f"{base_url(GCP_URL_ENV, DEFAULT_BASE)}/v1/services/{SERVICE_ID}/skus"
    skus: list[dict[str, Any]] = []
    token = ""
    for _ in range(MAX_PAGES):
        params = {"currencyCode": "USD", "pageSize": "5000", **auth}
        if token:
            params["pageToken"] = token
        page = get_json(
            f"{base}?{urllib.parse.urlencode(params)}",
            api=API,
            headers=headers,
            auth_hint=AUTH_HINT,
        )
        if not isinstance(page, dict):
            raise ProviderError(f"{API}: a page is not a JSON object; nothing was written")
        skus.extend(page.get("skus") or [])
        token = page.get("nextPageToken") or ""
        if not token:
            return skus
    raise ProviderError(f"{API}: still paging after {MAX_PAGES} pages; nothing was written")


def unit_price(sku: dict[str, Any]) -> tuple[float, str] | None:
    """(USD per unit, usageUnit) of the SKU's current price, else None. Pure."""
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    expression = infos[0].get("pricingExpression") or {}
    rates = expression.get("tieredRates") or []
    if not rates:
        return None
    price = rates[-1].get("unitPrice") or {}
    if price.get("currencyCode", "USD") != "USD":
        return None
    value = int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
    return value, str(expression.get("usageUnit", ""))


def classify(description: str) -> tuple[str, str] | None:
    """("gpu", "T4") / ("core", "n1") / ("ram", "a2") for a SKU description, else None. Pure."""
    text = _PREFIX.sub("", description.strip())
    gpu = _GPU.match(text)
    if gpu:
        model = gpu.group("model")
        if "Workstation" in model:
            return None
        return "gpu", canonical_accelerator(model.replace(" ", "-"))
    machine = _MACHINE.match(text)
    if machine and " running in " in text:
        return machine.group("kind").lower(), machine.group("family").lower()
    return None


def parse_skus(skus: Iterable[dict[str, Any]], regions: Sequence[str]) -> Prices:
    """Per-region unit prices of the GPU, core and RAM SKUs (rules in the module doc). Pure."""
    wanted = set(regions)
    prices: Prices = {}
    ambiguous: set[tuple[str, str, str, bool]] = set()
    for sku in skus:
        usage = (sku.get("category") or {}).get("usageType")
        if usage not in ("OnDemand", "Preemptible"):
            continue
        kind_name = classify(str(sku.get("description", "")))
        priced = unit_price(sku)
        if kind_name is None or priced is None or priced[0] <= 0:
            continue
        kind, name = kind_name
        if priced[1] != _UNITS[kind]:
            continue
        for region in wanted.intersection(sku.get("serviceRegions") or ()):
            key = (kind, name, region, usage == "Preemptible")
            if key in prices and abs(prices[key] - priced[0]) > 1e-12:
                ambiguous.add(key)
            prices.setdefault(key, priced[0])
    for key in ambiguous:
        del prices[key]
    return prices


def _machine_price(offer: Offer, region: str, prices: Prices, spot: bool) -> float | None:
    family = offer.instance_type.split("-", 1)[0]
    parts = [
        (prices.get(("core", family, region, spot)), offer.vcpus),
        (prices.get(("ram", family, region, spot)), offer.memory_gib),
    ]
    if offer.accelerator:
        parts.append(
            (prices.get(("gpu", offer.accelerator, region, spot)), offer.accelerator_count)
        )
    if any(price is None or not amount for price, amount in parts):
        return None
    return round(sum(price * amount for price, amount in parts if price and amount), 6)


def to_offers(prices: Prices, bundled: Sequence[Offer], regions: Sequence[str]) -> list[Offer]:
    """GPU-only rows and bundled machine types priced from `prices` (see module doc). Pure."""
    offers: list[Offer] = []
    gpu_zones: dict[tuple[str, str], list[str | None]] = {}
    machines: dict[str, Offer] = {}
    machine_zones: dict[tuple[str, str], list[str | None]] = {}
    for o in bundled:
        if not o.instance_type and o.accelerator:
            gpu_zones.setdefault((o.accelerator, o.region), []).append(o.zone)
        elif o.instance_type:
            machines.setdefault(o.instance_type, o)
            machine_zones.setdefault((o.instance_type, o.region), []).append(o.zone)
    for (kind, name, region, spot), price in sorted(prices.items()):
        if kind != "gpu" or spot or name not in N1_GPU_COUNTS:
            continue
        for zone in sorted(set(gpu_zones.get((name, region)) or [None]), key=str):
            offers.append(
                Offer(
                    provider="gcp",
                    instance_type="",
                    accelerator=name,
                    accelerator_count=1,
                    vcpus=None,
                    memory_gib=None,
                    region=region,
                    zone=zone,
                    price_hourly=price,
                    spot_price_hourly=prices.get((kind, name, region, True)),
                    prices_date="",
                    source=f"{API}: {name} GPU SKU",
                )
            )
    for itype, meta in sorted(machines.items()):
        for region in regions:
            price = _machine_price(meta, region, prices, spot=False)
            if price is None:
                continue
            spot = _machine_price(meta, region, prices, spot=True)
            parts = "core + RAM" + (f" + {meta.accelerator} GPU" if meta.accelerator else "")
            for zone in sorted(set(machine_zones.get((itype, region)) or [None]), key=str):
                offers.append(
                    Offer(
                        provider="gcp",
                        instance_type=itype,
                        accelerator=meta.accelerator,
                        accelerator_count=meta.accelerator_count,
                        vcpus=meta.vcpus,
                        memory_gib=meta.memory_gib,
                        region=region,
                        zone=zone,
                        price_hourly=price,
                        spot_price_hourly=spot,
                        prices_date="",
                        source=f"{API}: {parts} SKUs; shape from the bundled catalog",
                    )
                )
    return offers


def fetch(bundled: Sequence[Offer], regions: Sequence[str]) -> list[Offer]:
    """Live GCP rows for `regions` (prices_date left empty for the caller to stamp). Blocks."""
    return to_offers(parse_skus(fetch_skus(), regions), bundled, regions)
