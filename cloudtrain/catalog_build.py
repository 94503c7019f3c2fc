"""Regenerate the bundled price catalog (`cloudtrain/catalog/*.csv`) from a reference price CSV.

Usage: `python -m cloudtrain.catalog_build SRC_CSV [--out DIR] [--prices-date YYYY-MM-DD]`.

SRC_CSV has the columns `provider,instance_type,accelerator,accelerator_count,vcpus,memory_gib,
region,zone,price_hourly_usd,spot_price_hourly_usd,source` (the layout of `gpu_prices.csv`). The
build:

- normalises counts to ints and vcpus/memory to floats; prices are copied exactly as written;
- adds `SUPPLEMENT_CSV` rows: CPU machines (for parameter servers) in zones the source lacks, and
  the GCP accelerator-only rows needed below, all copied from the same upstream catalog commits;
- turns GCP `a2-*`, `a3-*` and `g2-*` rows into whole-VM prices. The upstream catalog lists only the
  host part (vCPU + memory) for these machine types and prices the built-in GPUs as separate
  accelerator-only rows, so the VM costs host + the accelerator-only row for its GPU count;
- drops machines their cloud has retired (`cloudtrain.pricing.retired`, e.g. Azure NCv3);
- keeps GCP accelerator-only rows for GPUs that attach to n1 machines (T4, V100, ...): the catalog
  module combines them with an n1 host at load time. Other accelerator-only rows are dropped;
- writes `aws.csv`, `gcp.csv`, `azure.csv` and `local.csv`, sorted, with the catalog header.

Everything here is I/O on the named files only; `build_rows` is pure.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from cloudtrain.catalog import COLUMNS
from cloudtrain.pricing.retired import is_retired

PRICES_DATE = "2026-11-21"
CLOUDS = ("aws", "gcp", "azure")
HEADER = (*COLUMNS, "source")
# GPUs that GCP attaches to n1 machines (kept as accelerator-only rows; see cloudtrain.catalog).
N1_ATTACHABLE = frozenset({"T4", "V100", "P100", "P4", "K80"})
# GCP machine families whose upstream price is the host part only (their GPUs are built in).
GCP_BUILT_IN_GPU_PREFIXES = ("a2-", "a3-", "g2-")

_AWS_SRC = "skypilot-catalog v8 catalogs/v8/aws/vms.csv@00148f2af3672e2229b4f7bf8157d5a3f36e3c35"
_GCP_SRC = "skypilot-catalog v8 catalogs/v8/gcp/vms.csv@006059e0f18acb1341e22a27751e9f80df6ba92f"

# Rows the reference file lacks, copied verbatim from the same upstream files and commits: CPU
# machines for `ps` nodes in every zone that has GPU rows, and the accelerator-only rows for the
# GPUs built into a2 (A100 40GB) and a3 (H100) machines. Columns as in the source, `source` last.
SUPPLEMENT_CSV = f"""\
aws,m5.xlarge,,,4.0,16.0,eu-west-1,euw1-az2,0.214,0.100500,{_AWS_SRC}
gcp,n1-standard-4,,,4.0,15.0,us-central1,us-central1-a,0.19,0.05223,{_GCP_SRC}
gcp,n1-standard-4,,,4.0,15.0,us-east1,us-east1-b,0.19,0.05223,{_GCP_SRC}
gcp,n1-standard-4,,,4.0,15.0,europe-west4,europe-west4-a,0.20917,0.08367,{_GCP_SRC}
gcp,n1-standard-4,,,4.0,15.0,europe-west4,europe-west4-b,0.20917,0.08367,{_GCP_SRC}
gcp,,A100,1,,,us-central1,us-central1-a,2.93391,1.4341,{_GCP_SRC}
gcp,,A100,1,,,us-east1,us-east1-b,2.93391,1.4341,{_GCP_SRC}
gcp,,A100,1,,,europe-west4,europe-west4-a,1.61365,1.1691,{_GCP_SRC}
gcp,,A100,8,,,us-central1,us-central1-a,23.47126,11.4728,{_GCP_SRC}
gcp,,A100,8,,,us-east1,us-east1-b,23.47126,11.4728,{_GCP_SRC}
gcp,,A100,8,,,europe-west4,europe-west4-a,12.90919,9.3528,{_GCP_SRC}
gcp,,H100,8,,,us-central1,us-central1-a,33.60609,23.9408,{_GCP_SRC}
gcp,,H100,8,,,europe-west4,europe-west4-b,101.88413,23.2896,{_GCP_SRC}
"""
SOURCE_COLUMNS = (*HEADER[:10], "source")

LOCAL_ROW: dict[str, str] = {
    "provider": "local",
    "instance_type": "local",
    "accelerator": "",
    "accelerator_count": "0",
    "vcpus": "",  # empty: detected from this machine when the catalog loads
    "memory_gib": "",
    "region": "local",
    "zone": "local",
    "price_hourly_usd": "0",
    "spot_price_hourly_usd": "0",
    "prices_date": PRICES_DATE,
    "source": "this machine (override with CLOUDTRAIN_LOCAL_PRICE_USD)",
}


class BuildError(Exception):
    """The source CSV cannot be turned into a catalog (the message names the row)."""


def _int_text(value: str) -> str:
    value = value.strip()
    return str(int(float(value))) if value else ""


def _float_text(value: str) -> str:
    value = value.strip()
    return repr(float(value)) if value else ""


def _money(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _normalise(raw: dict[str, str], prices_date: str) -> dict[str, str]:
    row = {key: (raw.get(key) or "").strip() for key in HEADER}
    row["provider"] = row["provider"].lower()
    row["accelerator_count"] = _int_text(row["accelerator_count"])
    if row["accelerator"] and not row["accelerator_count"]:
        row["accelerator_count"] = "1"
    if not row["accelerator"]:
        row["accelerator_count"] = "0"
    row["vcpus"] = _float_text(row["vcpus"])
    row["memory_gib"] = _float_text(row["memory_gib"])
    float(row["price_hourly_usd"])  # must be a number
    if row["spot_price_hourly_usd"]:
        float(row["spot_price_hourly_usd"])
    row["prices_date"] = row["prices_date"] or prices_date
    return row


def _compose_gcp_built_in(row: dict[str, str], gpu_rows: dict[tuple[str, ...], dict]) -> dict:
    """Whole-VM price of an a2/a3/g2 row = host row + accelerator-only row for its GPU count."""
    count = int(row["accelerator_count"])
    key = (row["region"], row["zone"], row["accelerator"])
    by_count = gpu_rows.get(key, {})
    if count in by_count:
        gpu, factor = by_count[count], 1
    elif 1 in by_count:
        gpu, factor = by_count[1], count
    else:
        raise BuildError(
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


def build_rows(
    source_rows: Iterable[dict[str, str]], prices_date: str = PRICES_DATE
) -> dict[str, list[dict[str, str]]]:
    """Turn source rows (plus `SUPPLEMENT_CSV`) into catalog rows per cloud. Pure.

    Raises BuildError for an unusable row (unknown provider, bad number, missing GPU price).
    """
    rows: list[dict[str, str]] = []
    supplement = csv.DictReader(io.StringIO(SUPPLEMENT_CSV), fieldnames=SOURCE_COLUMNS)
    for number, raw in enumerate([*source_rows, *supplement], start=2):
        try:
            row = _normalise(raw, prices_date)
        except ValueError as exc:
            raise BuildError(f"row {number}: {exc}") from None
        if row["provider"] not in CLOUDS:
            raise BuildError(f"row {number}: unknown provider {row['provider']!r}")
        if not is_retired(row["provider"], row["instance_type"]):
            rows.append(row)

    seen: set[tuple[str, ...]] = set()
    unique: list[dict[str, str]] = []
    for row in rows:  # the source wins over a supplement row for the same offer
        key = tuple(row[k] for k in ("provider", "instance_type", "accelerator", "region", "zone"))
        key += (row["accelerator_count"],)
        if key not in seen:
            seen.add(key)
            unique.append(row)

    gpu_rows: dict[tuple[str, ...], dict[int, dict[str, str]]] = {}
    for row in unique:
        if row["provider"] == "gcp" and not row["instance_type"]:
            key = (row["region"], row["zone"], row["accelerator"])
            gpu_rows.setdefault(key, {})[int(row["accelerator_count"])] = row

    out: dict[str, list[dict[str, str]]] = {cloud: [] for cloud in CLOUDS}
    for row in unique:
        if row["provider"] == "gcp":
            if not row["instance_type"]:
                if row["accelerator"] not in N1_ATTACHABLE:
                    continue  # consumed by the a2/a3/g2 composition, not attachable to n1
            elif row["instance_type"].startswith(GCP_BUILT_IN_GPU_PREFIXES) and row["accelerator"]:
                row = _compose_gcp_built_in(row, gpu_rows)
        out[row["provider"]].append(row)
    for cloud_rows in out.values():
        cloud_rows.sort(
            key=lambda r: (
                r["instance_type"],
                r["accelerator"],
                int(r["accelerator_count"] or 0),
                r["region"],
                r["zone"],
            )
        )
    return out


def write_csv(path: Path, rows: Sequence[dict[str, str]]) -> None:
    """Write `rows` with the catalog header to `path` (I/O: creates or replaces the file)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=HEADER, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: read SRC_CSV, write the catalog files into --out. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m cloudtrain.catalog_build", description=__doc__)
    parser.add_argument("source", type=Path, metavar="SRC_CSV")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("catalog"))
    parser.add_argument("--prices-date", default=PRICES_DATE)
    args = parser.parse_args(argv)
    try:
        with args.source.open(newline="", encoding="utf-8") as handle:
            per_cloud = build_rows(csv.DictReader(handle), args.prices_date)
    except (OSError, BuildError) as exc:
        print(f"catalog_build: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for cloud, rows in per_cloud.items():
        write_csv(args.out / f"{cloud}.csv", rows)
        print(f"{cloud}.csv: {len(rows)} rows")
    write_csv(args.out / "local.csv", [{**LOCAL_ROW, "prices_date": args.prices_date}])
    print("local.csv: 1 row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
