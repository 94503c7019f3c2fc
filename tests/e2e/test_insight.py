"""The pipeline's success path and issue 18's acceptance, on one real local run of three
MultiWorkerMirrored workers: the outputs, the logs and nothing left; examples/s per node in the
heartbeat, the live view, `status --json` and the summary, each within 15 % of the rate Keras'
own progress lines give; TensorBoard serving the run's epoch losses; the report page with every
plot painted in headless Chromium. The nodes find tests/fakes/nvidia_smi as `nvidia-smi` on
their PATH (local nodes inherit the environment), so GPU use is sampled, and local nodes are
priced, so the cost rises."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain.insight.report_html import PLOT_IDS
from tests.e2e.browser_kit import plot_areas
from tests.e2e.conftest import Env, assert_clean

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
NVIDIA_SMI = Path(__file__).resolve().parents[1] / "fakes" / "nvidia_smi"

WORKERS, EPOCHS, GLOBAL_BATCH = 3, 4, 64
# tf-keras 2.21, verbose=2, at an epoch's end: "24/24 - 1s - loss: 0.6 - ... - 44ms/step"
KERAS_EPOCH = re.compile(r"^(\d+)/(\d+) - .* - (\d+(?:\.\d+)?)(ms|s|us)/step$")
UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass
class Finished:
    ct: Env
    run_id: str
    stdout: str
    logs: dict[str, list[str]]  # node -> its log lines, from the bucket


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    import os

    home = tmp_path_factory.mktemp("insight") / "home"
    shims = home.parent / "bin"
    shims.mkdir(parents=True)
    home.mkdir()
    (shims / "nvidia-smi").symlink_to(NVIDIA_SMI)
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200")
    env.update(PATH=f"{shims}{os.pathsep}{env['PATH']}", CLOUDTRAIN_LOCAL_PRICE_USD="1.8")
    env.pop("CLOUDTRAIN_FAULTS", None)
    ct = Env(home, env)
    job = ct.job(
        "digits-multiworker",
        f"python train.py --epochs {EPOCHS}",
        setup='echo "setup on $CLOUDTRAIN_ROLE"',
    )
    spec = job.read_text().replace("workers: 2", f"workers: {WORKERS}")
    job.write_text(spec)
    proc = ct.cli("run", str(job), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_id,) = ct.run_ids()
    logs = {
        f"worker-{i}": ct.cli("logs", run_id, "--node", f"worker-{i}").stdout.splitlines()
        for i in range(WORKERS)
    }
    yield Finished(ct, run_id, proc.stdout, logs)


def _files(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]


def test_the_run_succeeds_with_its_outputs_and_leaves_nothing(run: Finished) -> None:
    assert f"run {run.run_id}: succeeded" in run.stdout
    assert "[worker-1] setup on worker" in run.stdout
    only = run.ct.cli("logs", run.run_id, "--node", "worker-0").stdout
    assert f"[worker-0] cloudtrain: epoch {EPOCHS}/{EPOCHS} done" in only
    assert "[worker-1]" not in only
    status = json.loads(run.ct.cli("status", run.run_id, "--json").stdout)
    assert status["outcome"] == "succeeded" and status["live_resources"] == []
    prefix = run.ct.bucket / run.run_id
    assert any(f.endswith(".index") for f in _files(prefix / "checkpoints")), "no checkpoint"
    assert "saved_model/saved_model.pb" in _files(prefix / "model")
    chunks = sorted((prefix / "logs" / "worker-1").glob("*.log"))
    assert f"cloudtrain: epoch {EPOCHS}/{EPOCHS} done" in "".join(p.read_text() for p in chunks)
    assert_clean(run.ct, run.run_id)


def keras_rates(lines: list[str]) -> list[float]:
    """This node's examples/s per epoch from Keras' own lines: its share of the global batch
    over Keras' time per step."""
    rates = []
    for line in lines:
        m = KERAS_EPOCH.match(line.split("] ", 1)[-1])
        if m:
            step_s = float(m[3]) * UNIT_S[m[4]]
            rates.append(GLOBAL_BATCH / WORKERS / step_s)
    return rates


def test_every_node_reports_examples_per_second_that_keras_agrees_with(run: Finished) -> None:
    status = json.loads(run.ct.cli("status", run.run_id, "--json").stdout)
    tp = status["throughput"]
    assert set(tp["nodes"]) == {f"worker-{i}" for i in range(WORKERS)}
    for node, lines in run.logs.items():
        from_logs = keras_rates(lines)
        assert len(from_logs) == EPOCHS, lines[-20:]
        beat = status["nodes"][node]["heartbeat"]["metrics"]
        reported = beat["examples_per_s"]
        assert tp["nodes"][node]["examples_per_s"] == reported
        assert beat["gpu_util_percent"] == 50.0  # the shim's two GPUs at 40 % and 60 %
        # the heartbeat's last figure is the last epoch's
        assert reported == pytest.approx(from_logs[-1], rel=0.15), (node, from_logs, beat)
        # the live view (plain: one line per node and epoch) showed each epoch's rate
        shown = re.findall(rf"{node}: epoch (\d+)/{EPOCHS}, ([\d,.]+)/s", run.stdout)
        assert shown, run.stdout[-3000:]  # a beat every 2 s: not every epoch is seen
        for epoch, rate in shown:  # while epoch N runs, the figure is epoch N-1's (or N's)
            near = from_logs[max(0, int(epoch) - 2) : int(epoch)]
            value = float(rate.replace(",", ""))
            assert any(abs(value - r) <= 0.15 * r for r in near), (node, epoch, rate, near)
        # and the summary's table gives the same figure as the heartbeat
        row = re.search(rf"^\s*{node}\s+([\d,.]+)/s\s", run.stdout, re.M)
        assert row and float(row[1].replace(",", "")) == pytest.approx(reported, rel=0.01)
    assert tp["cluster_examples_per_s"] == pytest.approx(
        sum(n["examples_per_s"] for n in tp["nodes"].values())
    )
    assert tp["usd_per_epoch"] is not None and tp["usd_per_million_examples"] is not None
    assert "throughput: cluster" in run.stdout
    assert_clean(run.ct, run.run_id)


def test_tensorboard_serves_the_epoch_losses_the_logs_show(run: Finished) -> None:
    losses = [
        float(m[1])
        for line in run.logs["worker-0"]
        if (m := re.search(r"cloudtrain: epoch \d+/\d+ done loss=([\d.]+)", line))
    ]
    assert len(losses) == EPOCHS
    server = run.ct.start("tensorboard", run.run_id, "--port", "0", log=run.ct.home / "tb.log")
    try:
        url = None
        for _ in range(600):
            m = re.search(r"(http://127\.0\.0\.1:\d+)", (run.ct.home / "tb.log").read_text())
            if m:
                url = m[1]
                break
            assert server.poll() is None, (run.ct.home / "tb.log").read_text()
            import time

            time.sleep(0.1)
        assert url, (run.ct.home / "tb.log").read_text()
        query = "/data/plugin/scalars/scalars?run=train&tag=epoch_loss"
        with urllib.request.urlopen(url + query, timeout=30) as reply:
            points = json.loads(reply.read())
        assert [step for _, step, _ in points] == list(range(EPOCHS))
        assert [round(v, 4) for _, _, v in points] == pytest.approx(losses, abs=1e-4)
    finally:
        server.terminate()
        assert server.wait(timeout=30) is not None


def test_the_report_page_paints_every_plot(run: Finished, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    proc = run.ct.cli("report", run.run_id[:12], "--html", str(page))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"wrote {page}" in proc.stdout
    text = page.read_text()
    assert "<script" not in text and f"<td>{run.run_id}</td>" in text
    areas = plot_areas(page, keep=tmp_path)
    assert sorted(areas) == sorted(PLOT_IDS)
    unpainted = {fid: area for fid, area in areas.items() if not area.painted}
    assert unpainted == {}, f"not painted (screenshot {tmp_path / 'page.png'}): {unpainted}"
