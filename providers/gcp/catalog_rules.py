"""GCP's catalog rules (`INFO.catalog_rules`): how its price rows become launchable offers.

Read by the catalog (`cloudtrain.catalog.offers`, when it loads) and by its build
(`cloudtrain.catalog.build`).
Standard library only, no SDK: `cloudtrain plan` reads it.

- GCP rows with an empty `instance_type` price a GPU alone. The catalog attaches such a GPU to the
  `n1-standard-8` host (GPU_HOST) in the same zone: the offer is that machine with N GPUs, priced
  machine + N x GPU (`Offer.attached` is true), for the counts N1 machines allow (`attach`).
- The upstream catalog lists only the host part (vCPU + memory) of the `a2-*`, `a3-*` and `g2-*`
  machine types and prices their built-in GPUs as separate accelerator-only rows, so the build
  prices such a VM as host + the accelerator-only row for its GPU count, and keeps the
  accelerator-only rows only for GPUs that attach to n1 machines (`build`).
- TPU slices: the source's TPU rows (accelerator `tpu-<type>`, one slice's price) become TPU
  offers (`tpu_offers.tpu_rows`: instance type the TPU type, accelerator `TPU-<generation>`,
  count its chips), kept past the build's GPU filter by `ACCELERATORS`.
- SUPPLEMENT_CSV: rows the reference file lacks, copied verbatim from the same upstream commit:
  CPU machines for `ps` nodes, and the accelerator-only rows for the GPUs built into a2
  (A100 40GB) and a3 (H100) machines. Columns as in the build's source, `source` last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cloudtrain.providers.gcp import tpu_offers

# cloudtrain.catalog.offers's Offer: a provider imports nothing of the controller (pyproject's
# layers)
Offer = Any

PROVIDER = "gcp"
GPU_HOST = "n1-standard-8"
# GPUs GCP attaches to n1 machines, with the GPU counts per VM it allows.
N1_GPU_COUNTS: dict[str, tuple[int, ...]] = {
    "T4": (1, 2, 4),
    "V100": (1, 2, 4, 8),
    "P100": (1, 2, 4),
    "P4": (1, 2, 4),
    "K80": (1, 2, 4, 8),
}
# GPUs kept as accelerator-only rows by the build (the catalog attaches them to an n1 host).
N1_ATTACHABLE = frozenset(N1_GPU_COUNTS)
# machine families whose upstream price is the host part only (their GPUs are built in)
BUILT_IN_GPU_PREFIXES = ("a2-", "a3-", "g2-")
# accelerators the build keeps beside its GPUs (canonical, upper-case): the TPU types
ACCELERATORS = tpu_offers.ACCELERATORS

_SRC = "skypilot-catalog v8 catalogs/v8/gcp/vms.csv@006059e0f18acb1341e22a27751e9f80df6ba92f"
SUPPLEMENT_CSV = f"""\
gcp,n1-standard-4,,,4.0,15.0,us-central1,us-central1-a,0.19,0.05223,{_SRC}
gcp,n1-standard-4,,,4.0,15.0,us-east1,us-east1-b,0.19,0.05223,{_SRC}
gcp,n1-standard-4,,,4.0,15.0,europe-west4,europe-west4-a,0.20917,0.08367,{_SRC}
gcp,n1-standard-4,,,4.0,15.0,europe-west4,europe-west4-b,0.20917,0.08367,{_SRC}
gcp,,A100,1,,,us-central1,us-central1-a,2.93391,1.4341,{_SRC}
gcp,,A100,1,,,us-east1,us-east1-b,2.93391,1.4341,{_SRC}
gcp,,A100,1,,,europe-west4,europe-west4-a,1.61365,1.1691,{_SRC}
gcp,,A100,8,,,us-central1,us-central1-a,23.47126,11.4728,{_SRC}
gcp,,A100,8,,,us-east1,us-east1-b,23.47126,11.4728,{_SRC}
gcp,,A100,8,,,europe-west4,europe-west4-a,12.90919,9.3528,{_SRC}
gcp,,H100,8,,,us-central1,us-central1-a,33.60609,23.9408,{_SRC}
gcp,,H100,8,,,europe-west4,europe-west4-b,101.88413,23.2896,{_SRC}
"""


def attach(offers: Sequence[Offer]) -> list[Offer]:
    """Launchable offers made from GCP's GPU-only rows in `offers`, each combined with the n1
    host in the same zone (other rows are ignored, and not returned). Pure."""
    hosts = {
        (o.region, o.zone): o
        for o in offers
        if o.provider == PROVIDER and o.instance_type == GPU_HOST and not o.accelerator
    }
    gpus: dict[tuple[str, str | None, str], dict[int, Offer]] = {}
    for offer in offers:
        if offer.gpu_only and offer.provider == PROVIDER and offer.accelerator in N1_GPU_COUNTS:
            key = (offer.region, offer.zone, offer.accelerator)
            gpus.setdefault(key, {})[offer.accelerator_count] = offer
    result = []
    for (region, zone, accelerator), by_count in gpus.items():
        host = hosts.get((region, zone))
        if host is None:
            continue
        for count in N1_GPU_COUNTS[accelerator]:
            if count in by_count:
                gpu, factor = by_count[count], 1
            elif 1 in by_count:
                gpu, factor = by_count[1], count
            else:
                continue
            spot = None
            if host.spot_price_hourly is not None and gpu.spot_price_hourly is not None:
                spot = round(host.spot_price_hourly + factor * gpu.spot_price_hourly, 6)
            result.append(
                replace(
                    host,
                    accelerator=accelerator,
                    accelerator_count=count,
                    price_hourly=round(host.price_hourly + factor * gpu.price_hourly, 6),
                    spot_price_hourly=spot,
                    prices_date=min(host.prices_date, gpu.prices_date),
                    attached=True,
                    source=f"{host.instance_type} + {count} x {accelerator}",
                )
            )
    return result


def _money(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _compose_built_in(row: dict[str, str], gpu_rows: dict[tuple[str, ...], dict]) -> dict:
    """Whole-VM price of an a2/a3/g2 row = host row + accelerator-only row for its GPU count.
    Raises ValueError when the source has no such accelerator-only row."""
    count = int(row["accelerator_count"])
    key = (row["region"], row["zone"], row["accelerator"])
    by_count = gpu_rows.get(key, {})
    if count in by_count:
        gpu, factor = by_count[count], 1
    elif 1 in by_count:
        gpu, factor = by_count[1], count
    else:
        raise ValueError(
            f"gcp {row['instance_type']} in {row['zone']}: the source prices only the host part "
            f"and has no accelerator-only {row['accelerator']} row for that zone to add"
        )
    price = float(row["price_hourly_usd"]) + factor * float(gpu["price_hourly_usd"])
    spot = None
    if row["spot_price_hourly_usd"] and gpu["spot_price_hourly_usd"]:
        spot = float(row["spot_price_hourly_usd"]) + factor * float(gpu["spot_price_hourly_usd"])
    return {
        **row,
        "price_hourly_usd": _money(price),
        "spot_price_hourly_usd": _money(spot) if spot is not None else "",
        "source": f"{row['source']} (host row + accelerator-only {row['accelerator']} row)",
    }


def build(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """GCP's catalog rows from its normalised source rows (in order): a2/a3/g2 rows priced as
    whole VMs, accelerator-only rows kept only for GPUs that attach to n1, then the TPU offers
    of the TPU rows (`tpu_offers.tpu_rows`). Pure; raises ValueError for a built-in-GPU machine
    without its accelerator-only row, or a TPU row tpu_offers refuses."""
    gpu_rows: dict[tuple[str, ...], dict[int, dict[str, str]]] = {}
    for row in rows:
        if not row["instance_type"]:
            key = (row["region"], row["zone"], row["accelerator"])
            gpu_rows.setdefault(key, {})[int(row["accelerator_count"])] = row
    out = []
    for row in rows:
        if tpu_offers.is_tpu_row(row):
            continue  # a TPU slice, not a GPU: made an offer below
        if not row["instance_type"]:
            if row["accelerator"] not in N1_ATTACHABLE:
                continue  # consumed by the a2/a3/g2 composition, not attachable to n1
        elif row["instance_type"].startswith(BUILT_IN_GPU_PREFIXES) and row["accelerator"]:
            row = _compose_built_in(row, gpu_rows)
        out.append(row)
    return out + tpu_offers.tpu_rows(rows)
