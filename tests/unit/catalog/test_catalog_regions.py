"""The bundled catalog covers every region where the clouds sell its GPUs (issue 30): rebuilt from
the source snapshot (cloudtrain/catalog/source/skypilot_v8.csv) by catalog_build, which keeps the
catalog's accelerators only and CPU machines only beside GPUs, and listed by `cloudtrain catalog`.
"""

from __future__ import annotations

import csv
import io
import json

from typer.testing import CliRunner

from cloudtrain.catalog import build as catalog_build
from cloudtrain.catalog.offers import Catalog
from cloudtrain.cli.main import app
from cloudtrain.providers.azure import catalog_rules as azure_rules
from tests.unit.catalog.test_catalog_small_cpu import _isolated_home  # noqa: F401 (autouse: no overrides)

# The regions of the snapshot's 8 x H100 machines: AWS p5.48xlarge and GCP a3-highgpu-8g at
# skypilot-catalog@00148f2a / @006059e0 (first availability zone of each region).
H100_8_REGIONS = {
    "aws": {
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-south-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ca-central-1",
        "eu-north-1",
        "eu-west-2",
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
    },
    "gcp": {
        "asia-east1",
        "asia-northeast1",
        "asia-south1",
        "asia-south2",
        "asia-southeast1",
        "australia-southeast1",
        "europe-north1",
        "europe-west1",
        "europe-west3",
        "europe-west4",
        "europe-west9",
        "us-central1",
        "us-east4",
        "us-east5",
        "us-west1",
        "us-west4",
    },
}


def _source(*lines: str) -> list[dict[str, str]]:
    return [dict(zip(catalog_build.SOURCE_COLUMNS, line.split(","), strict=True)) for line in lines]


def _snapshot() -> list[dict[str, str]]:
    text = catalog_build.DEFAULT_SOURCE.read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def test_catalog_h100_8_lists_every_region_of_each_cloud_that_sells_it() -> None:
    result = CliRunner().invoke(app, ["catalog", "--accelerator", "H100:8", "--json"])
    assert result.exit_code == 0, result.output
    offers = json.loads(result.stdout)
    listed: dict[str, set[str]] = {}
    for o in offers:
        assert (o["accelerator"], o["accelerator_count"]) == ("H100", 8), o
        listed.setdefault(o["provider"], set()).add(o["region"])
    assert listed["aws"] == H100_8_REGIONS["aws"]
    assert listed["gcp"] == H100_8_REGIONS["gcp"]
    # Azure sells 8 x H100 as Standard_ND96isr_H100_v5 (eastus, eastus2, westus in the snapshot);
    # it is listed once the Azure adapter can boot it (azure catalog_rules.AWAITING_IMAGE)
    azure = {r["region"] for r in _snapshot() if r["instance_type"] == "Standard_ND96isr_H100_v5"}
    assert azure == {"eastus", "eastus2", "westus"}
    held = "Standard_ND96isr_H100_v5" in azure_rules.AWAITING_IMAGE
    assert listed.get("azure", set()) == (set() if held else azure)


def test_every_snapshot_gpu_region_is_in_the_catalog() -> None:
    cat = Catalog.bundled()
    for cloud in ("aws", "gcp", "azure"):
        sold = {
            r["region"]
            for r in _snapshot()
            if r["provider"] == cloud
            and r["accelerator"] in catalog_build.CATALOG_ACCELERATORS
            and r["instance_type"]  # GCP's accelerator-only rows price a GPU, not a machine
            and r["instance_type"] not in azure_rules.AWAITING_IMAGE
        }
        gpu = {o.region for o in cat.offers(cloud) if o.accelerator}
        assert sold and sold <= gpu, (cloud, sold - gpu)
    # a user in Tokyo, Sao Paulo or Frankfurt can plan without `catalog refresh`
    assert {"ap-northeast-1", "eu-central-1"} <= set(cat.regions("aws"))
    assert {"asia-northeast1", "southamerica-east1", "europe-west3"} <= set(cat.regions("gcp"))


def test_the_build_keeps_only_the_catalog_accelerators() -> None:
    src = _source(
        "aws,p2.xlarge,K80,1,4,61,us-east-1,use1-az1,0.9,0.3,s",
        "aws,g4dn.xlarge,T4,1,4,16,us-east-1,use1-az1,0.526,0.2,s",
        "aws,p3dn.24xlarge,V100-32GB,8,96,768,us-east-1,use1-az1,31.2,8.2,s",
    )
    kept = {r["instance_type"] for r in catalog_build.build_rows(src)["aws"] if r["accelerator"]}
    assert kept == {"g4dn.xlarge"}


def test_cpu_machines_stay_only_beside_gpus() -> None:
    rows = catalog_build.build_rows(
        _source(
            "aws,g4dn.xlarge,T4,1,4,16,af-south-1,afs1-az2,0.698,0.1399,s",
            "aws,t3.small,,,2,2,af-south-1,afs1-az2,0.0271,0.0055,s",
            "aws,t3.small,,,2,2,af-south-1,afs1-az1,0.0271,0.0046,s",
            "azure,Standard_B1ms,,,1,2,westcentralus,,0.025,,s",
        )
    )
    kept = catalog_build.cpu_where_gpus(rows)
    places = {(r["instance_type"], r["zone"]) for r in kept["aws"] if r["region"] == "af-south-1"}
    assert places == {("g4dn.xlarge", "afs1-az2"), ("t3.small", "afs1-az2")}
    assert not [r for r in kept["azure"] if r["region"] == "westcentralus"]  # no GPU there
    # the supplement and small CPU rows of zones without a GPU here go too; the order is kept
    beside = [r for r in rows["aws"] if r["accelerator"] or r["zone"] == "afs1-az2"]
    assert kept["aws"] == beside


def test_azure_rules_correct_the_h100_v5_gpu_count() -> None:
    row = dict(zip(catalog_build.HEADER, [""] * len(catalog_build.HEADER), strict=True))
    row.update(
        provider="azure",
        instance_type="Standard_ND96isr_H100_v5",
        accelerator="H100",
        accelerator_count="12",  # as the upstream snapshot writes it
        source="snap",
    )
    held = dict(azure_rules.AWAITING_IMAGE)
    try:
        azure_rules.AWAITING_IMAGE.clear()
        (fixed,) = azure_rules.build([row])
    finally:
        azure_rules.AWAITING_IMAGE.update(held)
    assert fixed["accelerator_count"] == "8" and "GPU count 8, not 12" in fixed["source"]
    if held:
        assert azure_rules.build([row]) == []
