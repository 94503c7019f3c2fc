"""`cloudtrain catalog` (table, --json, filters) and `catalog refresh`, through a small typer app
that mounts `catalog_app` the way cli.py does; refresh runs against the local price API fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cloudtrain.cli.catalog import catalog_app
from cloudtrain.core.errors import PlanError, UsageError
from tests.unit.catalog.test_pricing_http import FakePriceApis, serve_fakes


@pytest.fixture
def price_apis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakePriceApis]:
    yield from serve_fakes(monkeypatch, tmp_path)


app = typer.Typer()
app.add_typer(catalog_app, name="catalog")


@app.callback()
def _root() -> None:
    """The test app's root."""


@pytest.fixture(autouse=True)
def _own_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))  # the fake's home too
    monkeypatch.delenv("CLOUDTRAIN_LOCAL_PRICE_USD", raising=False)


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["catalog", *args], env={"COLUMNS": "250"})


def listing(*args: str) -> list[dict[str, Any]]:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_lists_every_provider_cheapest_first() -> None:
    rows = listing()
    assert {r["provider"] for r in rows} == {"aws", "gcp", "azure", "local"}
    prices = [r["price_hourly_usd"] for r in rows]
    assert prices == sorted(prices)
    assert set(rows[0]) >= {"instance_type", "accelerator_count", "zone", "prices_date"}
    assert not any(r["instance_type"] == "" for r in rows)  # GCP GPU-only rows are attached


def test_accelerator_filter_with_and_without_count() -> None:
    two = listing("--accelerator", "V100:2")
    assert two and {(r["accelerator"], r["accelerator_count"]) for r in two} == {("V100", 2)}
    assert {r["provider"] for r in two} == {"gcp"}  # n1-standard-8 + 2 x V100 only
    assert all(r["attached"] for r in two)
    any_count = listing("--accelerator", "nvidia-tesla-v100", "--provider", "aws")
    assert {r["accelerator_count"] for r in any_count} == {1, 4}


def test_region_and_spot_filters() -> None:
    rows = listing("--provider", "azure", "--region", "westus2", "--spot")
    assert rows and all(r["region"] == "westus2" for r in rows)
    spots = [r["spot_price_hourly_usd"] for r in rows]
    assert None not in spots and spots == sorted(spots)
    all_aws = listing("--provider", "aws")
    spot_aws = listing("--provider", "aws", "--spot")
    assert len(spot_aws) == len([r for r in all_aws if r["spot_price_hourly_usd"] is not None])


def test_table_has_the_columns_and_rows() -> None:
    result = run("--provider", "azure", "--region", "eastus", "--accelerator", "T4")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[1]
    for column in ("provider", "instance type", "accelerator", "count", "vCPUs", "memory GiB"):
        assert column in header
    for column in ("region", "zone", "$/h on-demand", "$/h spot", "price date"):
        assert column in header
    body = result.stdout
    assert "Standard_NC4as_T4_v3" in body and "0.5260" in body and "2026-11-21" in body
    assert body.index("Standard_NC4as_T4_v3") < body.index("Standard_NC64as_T4_v3")
    assert "Standard_NC6s_v3" not in body


def test_no_match_and_bad_filters() -> None:
    result = run("--accelerator", "TPU-V9")
    assert result.exit_code == 0 and "no offers match accelerator TPU-V9" in result.stdout
    bad = run("--provider", "ibm")
    assert isinstance(bad.exception, UsageError) and "unknown provider 'ibm'" in str(bad.exception)
    assert isinstance(run("--accelerator", "V100:0").exception, PlanError)


def test_refresh_then_list_shows_the_new_prices(price_apis: FakePriceApis) -> None:
    result = run("refresh", "--provider", "azure")
    assert result.exit_code == 0, result.output
    path = Path(os.environ["CLOUDTRAIN_HOME"]) / "catalog" / "azure.csv"
    count = len(path.read_text().splitlines()) - 1
    from datetime import date

    assert (
        f"wrote {count} rows to {path} (prices of {date.today().isoformat()}); they now "
        "override the bundled catalog for azure"
    ) in " ".join(result.stdout.split())
    assert "kept from the bundled catalog" in result.stdout
    rows = listing("--provider", "azure", "--region", "eastus", "--accelerator", "T4:1")
    assert (rows[0]["price_hourly_usd"], rows[0]["prices_date"]) == (0.5, date.today().isoformat())


def test_refresh_errors_propagate_and_write_nothing(price_apis: FakePriceApis) -> None:
    price_apis.faults["gcp"] = (500, b"{}", 0, 99)
    result = run("refresh", "--provider", "gcp")
    assert result.exit_code != 0 and "HTTP 500" in str(result.exception)
    assert not (Path(os.environ["CLOUDTRAIN_HOME"]) / "catalog").exists()
    assert isinstance(run("refresh", "--provider", "local").exception, UsageError)
    assert run("refresh").exit_code == 2  # --provider is required


def test_importing_the_cli_module_loads_no_cloud_sdk() -> None:
    code = (
        "import sys, cloudtrain.cli.catalog, cloudtrain.catalog.pricing\n"
        "heavy = ('boto3', 'botocore', 'google', 'azure', 'tensorflow', 'rich.table')\n"
        "loaded = callable(cloudtrain.cli.catalog.catalog_app)\n"
        "print(loaded, [m for m in sys.modules if m.startswith(heavy)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # exit 0 and the `True` first: an import that crashes loads nothing heavy either
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True []", out.stdout + out.stderr
