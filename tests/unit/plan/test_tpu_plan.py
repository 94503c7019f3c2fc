"""Planning a TPU job (cloudtrain/plan/tpu_plan.py, issue 32): the plan shows the TPU type, its
chips, the zone, the on-demand or spot price and the runtime with its TensorFlow; a region that
does not sell the type is a plan error naming the regions that do; `scale` refuses it; and
`plan` of a TPU job loads no cloud SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.api.scale import sized_spec
from cloudtrain.catalog.offers import Catalog
from cloudtrain.core.errors import PlanError, UsageError
from cloudtrain.jobspec.job import JobSpec, load_spec_text
from cloudtrain.jobspec.provider_config import read_once
from cloudtrain.plan.planner import make_plan, placements

HEAD = "name: t\nentrypoint: python train.py\nprovider: gcp\n"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path / "home"))  # no config.yaml, no catalog


def tpu_spec(tmp_path: Path, accelerator: str = "v5litepod-8", extra: str = "") -> JobSpec:
    cluster = f"cluster:\n  strategy: tpu\n  accelerator: {accelerator}\n"
    return load_spec_text(HEAD + cluster + extra, "job.yaml", tmp_path)


def test_the_plan_is_the_cheapest_zone_of_the_tpu_type_on_demand(tmp_path: Path) -> None:
    plan = make_plan(tpu_spec(tmp_path), Catalog.bundled())
    (node,) = plan.nodes
    assert (node.role, node.instance_type, node.accelerator, node.accelerator_count) == (
        "chief",
        "v5litepod-8",
        "TPU-V5E",
        8,
    )
    assert (plan.region, plan.zone, node.spot, node.price_hourly) == (
        "us-central1",
        "us-central1-a",
        False,
        9.6,  # 8 chips x $1.20 per chip-hour
    )
    assert plan.hourly_usd == 9.6 and plan.strategy == "tpu"
    assert (
        "TPU v5litepod-8: 8 chips of TPU v5e on one host; runtime tpu-vm-tf-2.16.1-pjrt (the"
        " default of its generation) ships TensorFlow 2.16.1, which the node runs"
    ) in plan.notes
    assert plan.alternatives[0].description.startswith("v5litepod-8 (TPU-V5E x8)")


def test_spot_takes_the_spot_price(tmp_path: Path) -> None:
    plan = make_plan(tpu_spec(tmp_path, "v6e-4", "  spot: true\n"), Catalog.bundled())
    (node,) = plan.nodes
    assert node.spot and (plan.zone, node.price_hourly) == ("us-central1-b", 2.17683)
    on_demand = make_plan(tpu_spec(tmp_path, "v6e-4"), Catalog.bundled())
    assert on_demand.nodes[0].price_hourly == 10.8  # 4 x $2.70


def test_a_region_that_does_not_sell_the_type_names_the_regions_that_do(tmp_path: Path) -> None:
    spec = tpu_spec(tmp_path, extra="region: europe-west4\n")  # GPUs there, no v5e in the list
    with pytest.raises(PlanError) as caught:
        make_plan(spec, Catalog.bundled())
    assert str(caught.value).startswith(
        "TPU v5litepod-8 is not sold in europe-west4; regions that sell it: us-central1,"
        " us-south1, us-west1 and us-west4"
    )
    v6e = "regions that sell it: europe-west4, us-central1, us-east1 and us-east5"
    with pytest.raises(PlanError, match=v6e):
        placements(tpu_spec(tmp_path, "v6e-8", "region: us-west4\n"), Catalog.bundled())
    zone = tpu_spec(tmp_path, "v5p-8", "region: us-east5\nzone: us-east5-b\n")
    with pytest.raises(PlanError, match="not sold in zone us-east5-b; zones that sell it: us-ea"):
        make_plan(zone, Catalog.bundled())
    pinned = make_plan(tpu_spec(tmp_path, "v4-8", "region: us-central2\n"), Catalog.bundled())
    assert (pinned.zone, pinned.nodes[0].price_hourly) == ("us-central2-b", 12.88)


def test_the_runtime_of_config_yaml_is_checked_against_the_type(tmp_path: Path) -> None:
    config = tmp_path / "home" / "config.yaml"
    config.parent.mkdir()
    config.write_text("providers:\n  gcp:\n    tpu_runtime: tpu-vm-tf-2.15.0-se\n")
    with read_once(), pytest.raises(PlanError, match="does not run on TPU v5e; v5litepod-8 takes"):
        make_plan(tpu_spec(tmp_path), Catalog.bundled())
    config.write_text("providers:\n  gcp:\n    tpu_runtime: tpu-vm-tf-2.15.1-pjrt\n")
    with read_once():
        notes = make_plan(tpu_spec(tmp_path), Catalog.bundled()).notes
    assert any("runtime tpu-vm-tf-2.15.1-pjrt ships TensorFlow 2.15.1" in n for n in notes), notes


def test_a_gpu_job_is_planned_as_before(tmp_path: Path) -> None:
    text = HEAD + "cluster:\n  strategy: mirrored\n  accelerator: T4\n"
    plan = make_plan(load_spec_text(text, "job.yaml", tmp_path), Catalog.bundled())
    assert plan.nodes[0].accelerator == "T4"
    assert not [n for n in plan.notes if n.startswith("TPU ")]


def test_scale_refuses_a_tpu_job(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="strategy 'tpu' runs on one node"):
        sized_spec(tpu_spec(tmp_path), 2, 10)


def test_plan_of_a_tpu_job_loads_no_sdk_and_prints_the_tpu(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(HEAD + "cluster:\n  strategy: tpu\n  accelerator: v5litepod-4\n  spot: true\n")
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    code = (
        "import json, sys\n"
        "from cloudtrain.cli.main import main\n"
        f"sys.argv = ['cloudtrain', 'plan', {str(job)!r}]\n"
        "try:\n    main()\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stderr.strip().splitlines()[-1])
    sdks = ("google.cloud", "google.api_core", "boto", "azure", "tensorflow")
    assert not [m for m in loaded if m.startswith(sdks)]
    out = " ".join(proc.stdout.split())
    assert "v5litepod-4" in out and "TPU-V5Ex4" in out and "us-central1-a" in out, out
    assert "0.9797" in out and "yes" in out  # the spot price per node-hour
    assert "runtime tpu-vm-tf-2.16.1-pjrt" in out and "TensorFlow 2.16.1" in out, out
