"""A region or zone means nothing to `local` (its nodes run on this machine): `plan` says it is
ignored, as it does for the other spec fields local ignores, whether job.yaml sets it (with its
line) or the command line's `--region` / `--zone` does (issue 29). Never silently."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cloudtrain.catalog.offers import Catalog
from cloudtrain.jobspec.job import load_spec, load_spec_text
from cloudtrain.plan.planner import make_plan

HEAD = "name: place\nentrypoint: python train.py\n"
REGION_NOTE = "region ignored by provider local: local nodes run on this machine"
ZONE_NOTE = "zone ignored by provider local: local nodes run on this machine"


def test_a_region_and_zone_in_the_spec_are_noted_with_their_line(tmp_path: Path) -> None:
    spec = load_spec_text(HEAD + "region: us-east-1\nzone: us-east-1a\n", "job.yaml", tmp_path)
    notes = make_plan(spec, Catalog.bundled()).notes
    assert f"job.yaml:3: {REGION_NOTE}" in notes, notes
    assert f"job.yaml:4: {ZONE_NOTE}" in notes, notes


def test_the_region_flag_on_local_is_noted(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(HEAD)
    spec = load_spec(tmp_path / "job.yaml", region="us-east-1", zone="us-east-1a")
    notes = make_plan(spec, Catalog.bundled()).notes
    assert REGION_NOTE in notes and ZONE_NOTE in notes, notes
    plain = make_plan(load_spec(tmp_path / "job.yaml"), Catalog.bundled()).notes
    assert not any("ignored by provider" in n for n in plain), plain


def test_cloudtrain_plan_prints_the_note_for_region_on_local(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(HEAD)
    env = {**os.environ, "CLOUDTRAIN_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    args = ["plan", str(tmp_path / "job.yaml"), "--region", "us-east-1"]
    proc = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert REGION_NOTE in " ".join((proc.stdout + proc.stderr).split()), proc.stdout
