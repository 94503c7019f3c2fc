"""The price catalog: which machines each provider offers, where, and what they cost per hour.

The bundled catalog is `cloudtrain/catalog/<provider>.csv` (package data, regenerated with
`python -m cloudtrain.catalog.build`). A file `$CLOUDTRAIN_HOME/catalog/<provider>.csv` replaces the
bundled one for that provider. Stdlib only, so importing this module is fast.

Rows with an empty `instance_type` price a GPU alone. A provider's catalog rules
(`ProviderInfo.catalog_rules`, e.g. providers/gcp/catalog_rules.py) turn them into launchable
offers when the catalog loads: a host machine with N GPUs, priced machine + N x GPU
(`Offer.attached` is true). Accelerator names compare case-insensitively, and aliases are
accepted: `a100-40gb` for `A100`, `nvidia-tesla-v100` for `V100`, and so on.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from cloudtrain.core import env
from cloudtrain.core.errors import CloudtrainError, PlanError
from cloudtrain.core.paths import cloudtrain_home

LOCAL_PRICE_ENV = env.LOCAL_PRICE.name
COLUMNS = (
    "provider",
    "instance_type",
    "accelerator",
    "accelerator_count",
    "vcpus",
    "memory_gib",
    "region",
    "zone",
    "price_hourly_usd",
    "spot_price_hourly_usd",
    "prices_date",
)
_ALIASES = {
    "A100-40GB": "A100",
    "A100_40GB": "A100",
    "A100 40GB": "A100",
    "A100-SXM4-40GB": "A100",
    "A100_80GB": "A100-80GB",
    "A100 80GB": "A100-80GB",
    "H100-80GB": "H100",
    "H100-MEGA-80GB": "H100-MEGA",
    "TESLA-V100": "V100",
    "TESLA-T4": "T4",
}


def canonical_accelerator(name: str) -> str:
    """The catalog's name for an accelerator: `nvidia-tesla-v100` -> `V100`. Pure."""
    key = name.strip().upper()
    for prefix in ("NVIDIA-TESLA-", "NVIDIA-", "NVIDIA ", "TESLA "):
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    return _ALIASES.get(key, key)


def parse_accelerator(request: str) -> tuple[str, int]:
    """Split a request like `"V100:2"` into (`"V100"`, 2); the count defaults to 1. Pure.

    Raises PlanError for an empty name or a count that is not a positive integer.
    """
    name, _, count = request.partition(":")
    try:
        number = int(count) if count.strip() else 1
    except ValueError:
        number = 0
    if not name.strip() or number < 1:
        raise PlanError(
            f"bad accelerator request {request!r}", hint="write NAME or NAME:COUNT, e.g. V100:2"
        )
    return canonical_accelerator(name), number


@dataclass(frozen=True)
class Offer:
    """One machine type in one region/zone with its hourly prices (USD per node-hour)."""

    provider: str
    instance_type: str
    accelerator: str | None
    accelerator_count: int
    vcpus: float | None
    memory_gib: float | None
    region: str
    zone: str | None
    price_hourly: float
    spot_price_hourly: float | None
    prices_date: str
    attached: bool = False
    source: str = ""

    def price(self, spot: bool) -> float | None:
        """The hourly price on spot or on demand; None when there is no spot price. Pure."""
        return self.spot_price_hourly if spot else self.price_hourly

    @property
    def gpu_only(self) -> bool:
        """True for a row that prices a GPU alone (not launchable by itself; a provider's
        catalog rules may attach it to a host)."""
        return not self.instance_type

    def label(self) -> str:
        """A short human description, e.g. `p3.2xlarge (V100 x1)`. Pure."""
        if self.accelerator:
            return f"{self.instance_type} ({self.accelerator} x{self.accelerator_count})"
        return self.instance_type


def catalog_providers() -> tuple[str, ...]:
    """The registered providers in catalog order: the clouds `provider: cheapest` searches
    first, then the others (local), each group in registry order. Imports no SDK."""
    from cloudtrain.providers.registry import infos

    known = infos()
    return tuple(i.name for i in known if i.searched_by_cheapest) + tuple(
        i.name for i in known if not i.searched_by_cheapest
    )


def _attach_gpus(offers: list[Offer]) -> list[Offer]:
    """Launchable offers: every row but the GPU-only ones, then what each provider's catalog
    rules (`attach`) make of its GPU-only rows. Pure (imports the rules, stdlib only)."""
    from cloudtrain.providers.registry import info, load

    result = [o for o in offers if not o.gpu_only]
    for provider in dict.fromkeys(o.provider for o in offers if o.gpu_only):
        try:
            ref = info(provider).catalog_rules
        except CloudtrainError:  # a provider this version does not know: its rows stay out
            continue
        attach = getattr(load(ref), "attach", None) if ref else None
        if attach is not None:
            result.extend(attach(offers))
    return result


class Catalog:
    """An immutable set of launchable offers with lookups. Construction is pure.

    Build one with `Catalog.bundled()` (reads files) or `Catalog.from_rows(offers)` (tests).
    """

    def __init__(self, offers: Iterable[Offer]) -> None:
        rows = []
        for offer in offers:
            accelerator = canonical_accelerator(offer.accelerator) if offer.accelerator else None
            count = offer.accelerator_count if accelerator else 0
            if accelerator != offer.accelerator or count != offer.accelerator_count:
                offer = replace(offer, accelerator=accelerator, accelerator_count=count)
            rows.append(offer)
        self._offers = tuple(_attach_gpus(rows))

    @classmethod
    def from_rows(cls, rows: Iterable[Offer]) -> Catalog:
        """A catalog of the given rows (GPU-only rows attached by their provider's rules). Pure."""
        return cls(rows)

    @classmethod
    def bundled(cls) -> Catalog:
        """The bundled catalog, with user overrides and the local price override applied.

        I/O: reads `cloudtrain/catalog/<provider>.csv` through importlib.resources, or
        `$CLOUDTRAIN_HOME/catalog/<provider>.csv` instead when that file exists; reads the env
        variable CLOUDTRAIN_LOCAL_PRICE_USD; fills the local row's empty vcpus/memory from this
        machine. Raises PlanError for an unreadable or malformed file or a bad env value.
        """
        offers: list[Offer] = []
        package = resources.files("cloudtrain") / "catalog"
        for provider in catalog_providers():
            override = user_catalog_dir() / f"{provider}.csv"
            where = str(override)
            try:
                if override.is_file():
                    text = override.read_text(encoding="utf-8")
                else:
                    entry = package / f"{provider}.csv"
                    where = f"bundled catalog/{provider}.csv"
                    if not entry.is_file():
                        continue
                    text = entry.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PlanError(f"cannot read the price catalog {where}: {exc}") from None
            offers.extend(read_offers(text, where, provider=provider))
        return cls(_local_overrides(offers))

    def offers(
        self,
        provider: str | None = None,
        region: str | None = None,
        accelerator: str | None = None,
        count: int | None = None,
        spot: bool = False,
        *,
        zone: str | None = None,
        instance_type: str | None = None,
        cpu_only: bool = False,
    ) -> list[Offer]:
        """Offers matching every given filter, cheapest first (on spot prices when `spot`). Pure.

        With `spot`, offers without a spot price are left out. `accelerator` matches names and
        aliases case-insensitively; `count` is the exact GPU count per node; `instance_type`
        matches case-insensitively; `cpu_only` keeps offers without an accelerator.
        """
        wanted = canonical_accelerator(accelerator) if accelerator else None
        itype = instance_type.lower() if instance_type else None
        found = [
            o
            for o in self._offers
            if (provider is None or o.provider == provider)
            and (region is None or o.region == region)
            and (zone is None or o.zone == zone)
            and (wanted is None or o.accelerator == wanted)
            and (count is None or o.accelerator_count == count)
            and (itype is None or o.instance_type.lower() == itype)
            and not (cpu_only and o.accelerator)
            and o.price(spot) is not None
        ]
        return sorted(found, key=lambda o: (o.price(spot), *_order_key(o)))

    def providers(self) -> list[str]:
        """Providers with at least one offer, in `catalog_providers()` order (then any other,
        sorted). Pure."""
        present = {o.provider for o in self._offers}
        order = catalog_providers()
        return [p for p in order if p in present] + sorted(present - set(order))

    def regions(self, provider: str | None = None) -> list[str]:
        """Sorted regions with offers (for `provider`, or for all providers). Pure."""
        return sorted({o.region for o in self._offers if provider in (None, o.provider)})

    def zones(self, provider: str, region: str) -> list[str]:
        """Sorted zones with offers in `region` (empty for providers without zones). Pure."""
        return sorted(
            {
                o.zone
                for o in self._offers
                if o.provider == provider and o.region == region and o.zone
            }
        )

    def accelerators(self, provider: str | None = None) -> list[str]:
        """Sorted accelerator names offered (by `provider`, or by any provider). Pure."""
        return sorted(
            {
                o.accelerator
                for o in self._offers
                if o.accelerator and provider in (None, o.provider)
            }
        )

    def __len__(self) -> int:
        return len(self._offers)


def user_catalog_dir() -> Path:
    """Where user override files live: `$CLOUDTRAIN_HOME/catalog`. Pure path arithmetic."""
    return cloudtrain_home() / "catalog"


def _order_key(offer: Offer) -> tuple[str, str, str, str]:
    return (offer.provider, offer.region, offer.zone or "", offer.instance_type)


def _cell_float(value: str, column: str, where: str, line: int) -> float | None:
    value = value.strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise PlanError(f"{where}:{line}: {column} {value!r} is not a number") from None
    if number < 0:
        raise PlanError(f"{where}:{line}: {column} {value!r} is negative")
    return number


def read_offers(text: str, where: str, provider: str | None = None) -> list[Offer]:
    """Parse catalog CSV text into offers (rows of other providers are skipped). Pure.

    `where` names the file in errors. Raises PlanError (with file:line) for a missing column, a bad
    number or a row without a price.
    """
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise PlanError(f"{where}: missing column(s) {', '.join(missing)}")
    offers = []
    for line, row in enumerate(reader, start=2):
        cells = {key: (value or "").strip() for key, value in row.items() if key}
        if provider is not None and cells["provider"] != provider:
            continue
        price = _cell_float(cells["price_hourly_usd"], "price_hourly_usd", where, line)
        if price is None:
            raise PlanError(f"{where}:{line}: price_hourly_usd is empty")
        count = _cell_float(cells["accelerator_count"], "accelerator_count", where, line) or 0.0
        if count != int(count):
            raise PlanError(f"{where}:{line}: accelerator_count {count} is not a whole number")
        offers.append(
            Offer(
                provider=cells["provider"],
                instance_type=cells["instance_type"],
                accelerator=cells["accelerator"] or None,
                accelerator_count=int(count),
                vcpus=_cell_float(cells["vcpus"], "vcpus", where, line),
                memory_gib=_cell_float(cells["memory_gib"], "memory_gib", where, line),
                region=cells["region"],
                zone=cells["zone"] or None,
                price_hourly=price,
                spot_price_hourly=_cell_float(
                    cells["spot_price_hourly_usd"], "spot_price_hourly_usd", where, line
                ),
                prices_date=cells["prices_date"],
                source=cells.get("source", ""),
            )
        )
    return offers


def local_price_override() -> float | None:
    """$CLOUDTRAIN_LOCAL_PRICE_USD as a float, or None when unset. Reads the environment.

    Raises PlanError when it is set but not a non-negative number.
    """
    value = env.LOCAL_PRICE.text()
    if not value:
        return None
    try:
        price = float(value)
    except ValueError:
        price = -1.0
    if not price >= 0 or price == float("inf"):
        raise PlanError(
            f"{LOCAL_PRICE_ENV}={value!r} is not a price",
            hint="set it to a non-negative number of USD per node-hour, or unset it",
        )
    return price


def _machine_size() -> tuple[float | None, float | None]:
    """(vCPUs, memory GiB) of this machine, None where unknown. Reads OS information."""
    cpus = float(os.cpu_count() or 0) or None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):
        memory = None
    return cpus, round(memory, 1) if memory else None


def _local_overrides(offers: list[Offer]) -> list[Offer]:
    """Apply CLOUDTRAIN_LOCAL_PRICE_USD and this machine's size to local offers (reads env/OS)."""
    from cloudtrain.providers.registry import infos

    price = local_price_override()
    size: tuple[float | None, float | None] | None = None
    here = {i.name for i in infos() if i.on_this_machine}
    result = []
    for offer in offers:
        if offer.provider in here:
            if offer.vcpus is None or offer.memory_gib is None:
                size = size or _machine_size()
                offer = replace(
                    offer, vcpus=offer.vcpus or size[0], memory_gib=offer.memory_gib or size[1]
                )
            if price is not None:
                offer = replace(offer, price_hourly=price, spot_price_hourly=price)
        result.append(offer)
    return result
