"""Regenerate the bundled price catalog (`cloudtrain/catalog/*.csv`) from a source price CSV.

Usage: `python -m cloudtrain.catalog.build [SRC_CSV] [--out DIR] [--prices-date YYYY-MM-DD]`.

SRC_CSV (default: DEFAULT_SOURCE, the snapshot `cloudtrain/catalog/source/skypilot_v8.csv`, which
the package does not ship) has the columns `provider,instance_type,accelerator,accelerator_count,
vcpus,memory_gib,region,zone,price_hourly_usd,spot_price_hourly_usd,source` (the layout of
`gpu_prices.csv`). The build:

- normalises counts to ints and vcpus/memory to floats; prices are copied exactly as written;
- keeps GPU rows only for the catalog's accelerators (CATALOG_ACCELERATORS, plus those a
  provider's catalog rules add as `ACCELERATORS`, e.g. GCP's TPU types) and drops the others;
- adds each provider's supplement rows (`SUPPLEMENT_CSV` of its catalog rules,
  `ProviderInfo.catalog_rules`): rows the source lacks, copied from the same upstream commits;
- adds the small CPU machines of `catalog/small_cpu.source.csv` (SMALL_CPU_FILE, below) in every
  zone the catalog covers: what a run's controller node needs
  (`cloudtrain.managed.controller_offer`);
- drops machines their cloud has retired (`cloudtrain.catalog.retired`);
- applies each provider's `build` rule to its rows (e.g. providers/gcp/catalog_rules.py prices
  machines with built-in GPUs as whole VMs, and keeps only the GPU-only rows the catalog
  attaches to a host at load time);
- keeps a CPU-only row only in a place (region and zone) where its cloud has a GPU offer
  (`cpu_where_gpus`): the CPU machines a GPU run's `ps` role and controller node use there, no
  more, so the files stay small (the source holds the CPU machines of every zone);
- writes one `<provider>.csv` per priced provider and `local.csv`, sorted, with the catalog
  header. The same source gives byte-identical files (idempotent).

Everything here is I/O on the named files only; `build_rows` is pure.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from cloudtrain.catalog.offers import COLUMNS, canonical_accelerator
from cloudtrain.catalog.retired import is_retired

PRICES_DATE = "2026-11-21"
# The source snapshot the bundled files are built from: rows copied from SkyPilot's catalogs
# (each row's `source` cell names its upstream file and commit; cloudtrain/catalog/README.md).
DEFAULT_SOURCE = Path(__file__).parent / "source" / "skypilot_v8.csv"
# The GPUs the bundled catalog prices (canonical names,
# `cloudtrain.catalog.offers.canonical_accelerator`);
# a source row with any other accelerator is dropped. CPU-only rows have none and are kept.
CATALOG_ACCELERATORS = frozenset({"T4", "L4", "A10G", "V100", "A100", "A100-80GB", "H100"})
HEADER = (*COLUMNS, "source")
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


# The small general-purpose CPU machines a managed run's controller node needs (issue 17): the
# source (a GPU price reference) holds only 4-vCPU CPU rows, so the controller would cost ~$0.19/h.
# SMALL_CPU_FILE (cloudtrain/catalog/small_cpu.source.csv, the source's columns) holds rows copied
# verbatim (prices as written) from the upstream catalogs the source itself cites, at the same
# commits (its NOTES: AWS and GCP from skypilot-org/skypilot-catalog, Azure from the
# coopslarhette/skypilot-catalog fork), one row per zone the bundled catalog covers (the
# controller VM goes to the run's region and zone):
# - AWS t3.small/t3.medium (burstable, 2 vCPU, 2/4 GiB) and m5.large (2 vCPU, 8 GiB);
# - GCP e2-small/e2-medium (shared-core, 2 GiB/4 GiB). Upstream prices them as 2 whole vCPUs
#   + memory, while GCP bills them at 0.5/1 vCPU (as opencost/opencost#318 prices them), so these
#   prices overstate the bill (e2-small: $0.049/h here): a controller's cost is never understated;
# - Azure Standard_B1ms/B2s (burstable; Azure has no spot price for B-series v1, so the upstream
#   spot cell is empty) and Standard_D2s_v5 (2 vCPU, 8 GiB).
# A row of the source or of a provider's supplement for the same offer wins over one of these.
# The file is data (package data, like the catalog): code outside providers/ names no cloud.
SMALL_CPU_FILE = "small_cpu.source.csv"


class BuildError(Exception):
    """The source CSV cannot be turned into a catalog (the message names the row)."""


def _int_text(value: str) -> str:
    value = value.strip()
    return str(int(float(value))) if value else ""


def _float_text(value: str) -> str:
    value = value.strip()
    return repr(float(value)) if value else ""


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


def clouds() -> tuple[str, ...]:
    """The providers whose catalog is built from the source: those with a price client
    (`ProviderInfo.pricing`), in registry order. Imports no SDK."""
    from cloudtrain.providers.registry import infos

    return tuple(i.name for i in infos() if i.pricing is not None)


def _rules(provider: str) -> Any:
    """The provider's catalog rules module, or None."""
    from cloudtrain.providers.registry import info, load

    ref = info(provider).catalog_rules
    return load(ref) if ref else None


def supplement_csv(providers: Sequence[str]) -> str:
    """The supplement rows of `providers`' catalog rules, in that order. Imports the rules."""
    texts = [getattr(_rules(p), "SUPPLEMENT_CSV", "") for p in providers]
    return "".join(t if t.endswith("\n") or not t else t + "\n" for t in texts)


def small_cpu_rows() -> list[dict[str, str]]:
    """The rows of SMALL_CPU_FILE (package data next to the catalog), as source rows. Reads the
    file; raises BuildError when its header is not the source's columns."""
    text = (resources.files("cloudtrain") / "catalog" / SMALL_CPU_FILE).read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != SOURCE_COLUMNS:
        raise BuildError(f"{SMALL_CPU_FILE}: the header is not {','.join(SOURCE_COLUMNS)}")
    return list(reader)


def build_rows(
    source_rows: Iterable[dict[str, str]], prices_date: str = PRICES_DATE
) -> dict[str, list[dict[str, str]]]:
    """Turn source rows (plus the providers' supplement rows and the small CPU rows of
    SMALL_CPU_FILE) into catalog rows per cloud. Pure but for importing the providers' catalog
    rules and reading SMALL_CPU_FILE.

    Raises BuildError for an unusable row (unknown provider, bad number, missing GPU price).
    """
    known = clouds()
    kept = {c: CATALOG_ACCELERATORS | getattr(_rules(c), "ACCELERATORS", set()) for c in known}
    rows: list[dict[str, str]] = []
    supplement = csv.DictReader(io.StringIO(supplement_csv(known)), fieldnames=SOURCE_COLUMNS)
    for number, raw in enumerate([*source_rows, *supplement, *small_cpu_rows()], start=2):
        try:
            row = _normalise(raw, prices_date)
        except ValueError as exc:
            raise BuildError(f"row {number}: {exc}") from None
        if row["provider"] not in known:
            raise BuildError(f"row {number}: unknown provider {row['provider']!r}")
        if row["accelerator"] and canonical_accelerator(row["accelerator"]) not in (
            kept[row["provider"]]
        ):
            continue
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

    out: dict[str, list[dict[str, str]]] = {}
    for cloud in known:
        mine = [row for row in unique if row["provider"] == cloud]
        build = getattr(_rules(cloud), "build", None)
        try:
            out[cloud] = build(mine) if build is not None else mine
        except ValueError as exc:
            raise BuildError(str(exc)) from None
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


def cpu_where_gpus(per_cloud: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    """The same rows (order kept) less each CPU-only row whose place (region, zone) has no GPU row
    of its cloud: a GPU run's `ps` and controller machines stay beside its GPUs. Pure."""
    out: dict[str, list[dict[str, str]]] = {}
    for cloud, rows in per_cloud.items():
        gpu_places = {(r["region"], r["zone"]) for r in rows if r["accelerator"]}
        out[cloud] = [r for r in rows if r["accelerator"] or (r["region"], r["zone"]) in gpu_places]
    return out


def write_csv(path: Path, rows: Sequence[dict[str, str]]) -> None:
    """Write `rows` with the catalog header to `path` (I/O: creates or replaces the file)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=HEADER, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: read SRC_CSV, write the catalog files into --out. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m cloudtrain.catalog.build", description=__doc__)
    parser.add_argument("source", type=Path, metavar="SRC_CSV", nargs="?", default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--prices-date", default=PRICES_DATE)
    args = parser.parse_args(argv)
    try:
        with args.source.open(newline="", encoding="utf-8") as handle:
            per_cloud = cpu_where_gpus(build_rows(csv.DictReader(handle), args.prices_date))
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
