"""`cloudtrain report` of a real run, looked at in a browser: a short local run of the digits
example on two workers (real TensorFlow, the runtime's metrics, the agents' samples; nvidia-smi
is tests/fakes/nvidia_smi on the nodes' PATH, so the GPU plot has samples; local nodes priced, so
the cost rises), then the command, then headless Chromium finds every plot of the page and the
screenshot has each one painted (tests/e2e/browser_kit.py). Chromium must be installed: without
it the test fails, it never skips.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.report_html import PLOT_IDS
from tests.e2e.browser_kit import plot_areas
from tests.e2e.conftest import Env, assert_clean

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
NVIDIA_SMI = Path(__file__).resolve().parents[1] / "fakes" / "nvidia_smi"


def test_the_report_of_a_run_shows_every_plot(ct: Env, tmp_path: Path) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "nvidia-smi").symlink_to(NVIDIA_SMI)
    ct.env["PATH"] = f"{shims}{os.pathsep}{ct.env['PATH']}"
    ct.env["CLOUDTRAIN_LOCAL_PRICE_USD"] = "3.6"
    job = ct.job("digits-multiworker", "python train.py --epochs 2")
    proc = ct.cli("run", str(job))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_id,) = ct.run_ids()
    assert_clean(ct, run_id)

    page = tmp_path / "report.html"
    proc = ct.cli("report", run_id[:12], "--html", str(page))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {page}" in proc.stdout
    text = page.read_text()
    assert "<script" not in text and f"<td>{run_id}</td>" in text

    areas = plot_areas(page, keep=tmp_path)
    assert sorted(areas) == sorted(PLOT_IDS)
    unpainted = {fid: area for fid, area in areas.items() if not area.painted}
    assert unpainted == {}, f"not painted (screenshot {tmp_path / 'page.png'}): {unpainted}"
