"""`cloudtrain catalog`: show the price catalog; `catalog refresh` pulls it from the price APIs.

`catalog_app` is a typer sub-app (registered in cli.py with `app.add_typer(catalog_app,
name="catalog")`). With no subcommand it prints the launchable offers cheapest first (a rich table,
or JSON with `--json`), reading only the catalog files. `catalog refresh --provider NAME` blocks
while it queries that cloud's public price API, then writes
`$CLOUDTRAIN_HOME/catalog/<provider>.csv` (see `cloudtrain.catalog.pricing`). Module imports are
typer
and the provider registry's INFO objects (for the help text; no SDK); rich, the catalog and the
pricing code load when a command runs. Errors are CloudtrainErrors, which `cloudtrain.cli.main.main`
prints as one line.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cloudtrain.catalog.offers import catalog_providers
from cloudtrain.catalog.pricing import priced_providers

if TYPE_CHECKING:
    from cloudtrain.catalog.offers import Offer

catalog_app = typer.Typer(
    invoke_without_command=True,
    help="The price catalog: list offers cheapest first, or refresh prices from a cloud's API.",
)



def _listed(names: tuple[str, ...]) -> str:
    """`a, b or c`, for help text. Pure."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


COLUMNS = (
    "provider",
    "instance type",
    "accelerator",
    "count",
    "vCPUs",
    "memory GiB",
    "region",
    "zone",
    "$/h on-demand",
    "$/h spot",
    "price date",
)


def offer_dict(offer: Offer) -> dict[str, Any]:
    """The JSON form of one catalog offer (catalog column names). Pure."""
    return {
        "provider": offer.provider,
        "instance_type": offer.instance_type,
        "accelerator": offer.accelerator,
        "accelerator_count": offer.accelerator_count,
        "vcpus": offer.vcpus,
        "memory_gib": offer.memory_gib,
        "region": offer.region,
        "zone": offer.zone,
        "price_hourly_usd": offer.price_hourly,
        "spot_price_hourly_usd": offer.spot_price_hourly,
        "prices_date": offer.prices_date,
        "attached": offer.attached,
        "source": offer.source,
    }


def _number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _price(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def select_offers(
    accelerator: str | None, provider: str | None, region: str | None, spot: bool
) -> list[Offer]:
    """Offers of the catalog (with user overrides) matching the filters, cheapest first.

    Reads the catalog files. `accelerator` is NAME or NAME:COUNT (count per node); without a count
    every count matches. Raises UsageError for an unknown provider, PlanError for a bad request.
    """
    from cloudtrain.catalog.offers import Catalog, parse_accelerator
    from cloudtrain.core.errors import UsageError

    known = catalog_providers()
    if provider is not None and provider not in known:
        raise UsageError(f"unknown provider {provider!r}", hint=f"use one of {', '.join(known)}")
    name: str | None = None
    count: int | None = None
    if accelerator:
        name, count = parse_accelerator(accelerator)
        if ":" not in accelerator:
            count = None
    return Catalog.bundled().offers(provider, region, name, count, spot)


@catalog_app.callback()
def show(
    ctx: typer.Context,
    accelerator: Annotated[
        str | None,
        typer.Option("--accelerator", "-a", help="NAME or NAME:COUNT per node, e.g. V100:2."),
    ] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", "-p", help=_listed(catalog_providers()) + ".")
    ] = None,
    region: Annotated[str | None, typer.Option("--region", help="Only this region.")] = None,
    spot: Annotated[
        bool, typer.Option("--spot", help="Sort by spot price; hide offers without one.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the catalog's offers, cheapest first (on spot prices with --spot)."""
    if ctx.invoked_subcommand is not None:
        return
    offers = select_offers(accelerator, provider, region, spot)
    if as_json:
        sys.stdout.write(json.dumps([offer_dict(o) for o in offers], indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    if not offers:
        wanted = ", ".join(
            f"{k} {v}"
            for k, v in (("accelerator", accelerator), ("provider", provider), ("region", region))
            if v
        )
        console.print(
            f"no offers match{' ' + wanted if wanted else ''}{' on spot' if spot else ''}"
        )
        return
    table = Table(*COLUMNS)
    for o in offers:
        table.add_row(
            o.provider,
            o.instance_type,
            o.accelerator or "",
            str(o.accelerator_count) if o.accelerator else "",
            _number(o.vcpus),
            _number(o.memory_gib),
            o.region,
            o.zone or "",
            _price(o.price_hourly),
            _price(o.spot_price_hourly),
            o.prices_date,
        )
    console.print(table)


@catalog_app.command()
def refresh(
    provider: Annotated[
        str, typer.Option(
            "--provider", "-p", help=_listed(priced_providers()) + ".", show_default=False
        )
    ],
    region: Annotated[
        list[str] | None,
        typer.Option("--region", help="Price this region (repeatable); default: the bundled ones."),
    ] = None,
) -> None:
    """Pull live prices from the cloud's price API into a user catalog that overrides the bundled
    one for that provider. Blocks while the API is queried; writes nothing on any failure."""
    from rich.console import Console

    from cloudtrain.catalog.pricing import refresh_result

    result = refresh_result(provider, regions=list(region) if region else None)
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"wrote {result.rows} rows to {result.path} (prices of {result.prices_date}); "
        f"they now override the bundled catalog for {result.provider}",
        markup=False,
    )
    if result.kept:
        console.print(
            f"{result.kept} of them the API did not price: kept from the bundled catalog with "
            "their older prices_date",
            markup=False,
        )
