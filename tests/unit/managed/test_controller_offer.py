"""cloudtrain.managed.controller_offer: the controller node's machine (issue 17).

The cheapest on-demand CPU-only offer with >= 2 GB in the run's region, from the catalog the
planner reads (bundled, or $CLOUDTRAIN_HOME/catalog/<provider>.csv), never a GPU machine, never a
spot price; `local` is a fixed $0 offer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.catalog import build as catalog_build
from cloudtrain.catalog.offers import LOCAL_PRICE_ENV, Catalog
from cloudtrain.core.errors import PlanError, UsageError
from cloudtrain.jobs.strategies import STRATEGIES
from cloudtrain.managed.controller_offer import (
    MIN_MEMORY_GB,
    ControllerOffer,
    check_hand_off,
    controller_offer,
)
from cloudtrain.providers.gcp.tpu_types import tpu_type

HEADER = ",".join(catalog_build.HEADER)

# A catalog override for "aws" in which each wrong rule would pick a cheaper row than the right
# one (t3.small, $0.0208/h on demand):
# - t3.micro has 1 GiB: cheaper, skipped by the memory cut-off;
# - g4dn.xlarge is a GPU machine at a (made-up) lower price: skipped as not CPU-only;
# - m5.large has a spot price of $0.01 but $0.096 on demand: never chosen on its spot price;
# - t3.nano in another region is cheaper still: the region filter holds.
OVERRIDE = f"""{HEADER}
aws,t3.micro,,0,2.0,1.0,us-east-1,use1-az1,0.0104,0.0031,2026-11-21,test
aws,t3.small,,0,2.0,2.0,us-east-1,use1-az1,0.0208,0.0062,2026-11-21,test
aws,t3.small,,0,2.0,2.0,us-east-1,use1-az2,0.0208,0.0063,2026-11-21,test
aws,g4dn.xlarge,T4,1,4.0,16.0,us-east-1,use1-az1,0.0150,0.0100,2026-11-21,test
aws,m5.large,,0,2.0,8.0,us-east-1,use1-az1,0.0960,0.0100,2026-11-21,test
aws,t3.nano,,0,2.0,2.0,eu-west-1,euw1-az1,0.0050,0.0020,2026-11-21,test
aws,c5.large,,0,2.0,4.0,ap-south-1,aps1-az1,0.0850,,2026-11-21,test
aws,t3.micro,,0,2.0,1.0,ap-south-1,aps1-az1,0.0110,,2026-11-21,test
"""


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.delenv(LOCAL_PRICE_ENV, raising=False)
    return home


@pytest.fixture
def aws_override(_isolated_home: Path) -> Path:
    folder = _isolated_home / "catalog"
    folder.mkdir(parents=True)
    path = folder / "aws.csv"
    path.write_text(OVERRIDE, encoding="utf-8")
    return path


def test_cheapest_with_enough_memory_skips_smaller_gpu_and_spot(aws_override: Path) -> None:
    cat = Catalog.bundled()
    # the cut-off matters: a cheaper CPU machine under 2 GB exists in this region
    cheaper_small = [
        o
        for o in cat.offers("aws", region="us-east-1", cpu_only=True)
        if o.memory_gib is not None and o.memory_gib < MIN_MEMORY_GB
    ]
    assert [o.instance_type for o in cheaper_small] == ["t3.micro"]
    offer = controller_offer("aws", "us-east-1")
    assert offer == ControllerOffer("t3.small", 0.0208, 2.0, 2.0)
    assert cheaper_small[0].price_hourly < offer.hourly_usd
    # the GPU row and the cheap spot price are cheaper than the answer too
    assert min(o.price_hourly for o in cat.offers("aws", region="us-east-1")) < offer.hourly_usd
    assert min(o.price(True) or 9 for o in cat.offers("aws", "us-east-1", spot=True)) < 0.0208


def test_region_is_respected_and_an_on_demand_only_row_counts(aws_override: Path) -> None:
    assert controller_offer("aws", "eu-west-1").instance_type == "t3.nano"
    # c5.large has no spot price: on-demand is all the controller needs
    assert controller_offer("aws", "ap-south-1") == ControllerOffer("c5.large", 0.085, 4.0, 2.0)


def test_no_fitting_machine_is_a_plan_error(aws_override: Path) -> None:
    folder = aws_override.parent
    (folder / "aws.csv").write_text(
        f"{HEADER}\naws,t3.micro,,0,2.0,1.0,us-east-1,use1-az1,0.0104,,2026-11-21,test\n"
        "aws,g4dn.xlarge,T4,1,4.0,16.0,us-east-1,use1-az1,0.5,,2026-11-21,test\n",
        encoding="utf-8",
    )
    with pytest.raises(PlanError, match=r"aws machine with at least 2 GB .* us-east-1"):
        controller_offer("aws", "us-east-1")
    with pytest.raises(PlanError, match="region nowhere-1"):
        controller_offer("aws", "nowhere-1")


def test_bundled_catalog_every_cloud_region_gets_a_cpu_on_demand_offer() -> None:
    cat = Catalog.bundled()
    for cloud in ("aws", "gcp", "azure"):
        for region in cat.regions(cloud):
            if all(tpu_type(o.instance_type) for o in cat.offers(cloud, region=region)):
                # GCP us-central2 sells TPU v4 slices alone: no machine for a controller
                with pytest.raises(PlanError, match=f"no CPU-only {cloud} machine"):
                    controller_offer(cloud, region)
                continue
            offer = controller_offer(cloud, region)
            fitting = [
                o
                for o in cat.offers(cloud, region=region)
                if not o.accelerator and (o.memory_gib or 0) >= MIN_MEMORY_GB
            ]
            assert offer.hourly_usd == min(o.price_hourly for o in fitting), (cloud, region)
            chosen = [o for o in fitting if o.instance_type == offer.instance_type]
            assert chosen and all(o.accelerator is None for o in chosen)
            assert offer.hourly_usd in {o.price_hourly for o in chosen}  # on-demand, not spot
            assert (offer.memory_gb or 0) >= MIN_MEMORY_GB


def test_local_is_fixed_and_free() -> None:
    assert controller_offer("local", None) == ControllerOffer("local", 0.0, None, None)


def test_import_stays_light() -> None:
    code = (
        "import sys, cloudtrain.managed.controller_offer as m\n"
        "m.controller_offer('aws', 'us-east-1')\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in "
        "('boto3', 'botocore', 'google', 'azure', 'tensorflow', 'pydantic')]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_only_a_tpu_run_is_refused_a_controller_node() -> None:
    refused = []
    for info in STRATEGIES.values():
        try:
            check_hand_off(info)
        except UsageError as exc:
            refused.append(info.name)
            assert "--no-controller" in str(exc.hint)
    assert refused == [i.name for i in STRATEGIES.values() if i.on_tpu] != []
