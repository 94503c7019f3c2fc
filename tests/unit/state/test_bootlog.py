"""The bootstrap log as the controller reads it: the current phase, the failure, the durations;
and RunReader carrying them into each poll's snapshot."""

from __future__ import annotations

from pathlib import Path

from cloudtrain.jobs.protocol import run_prefix
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.bootlog import durations_text, parse
from cloudtrain.state.runstate import RunReader

LOG = """\
2026-11-21T08:00:00Z cloudtrain-bootstrap[worker-0]: start (deadline 2026-11-21T09:00:00Z)
2026-11-21T08:00:00Z cloudtrain-bootstrap[worker-0]: driver: checking
Reading package lists...
2026-11-21T08:00:01Z cloudtrain-bootstrap[worker-0]: phase driver: done
2026-11-21T08:00:01Z cloudtrain-bootstrap[worker-0]: python: installing tensorflow 2.21.0
"""


def test_phase_failure_and_durations() -> None:
    info = parse(LOG)
    assert info.phase == "python: installing tensorflow 2.21.0" and info.failed is None
    done = LOG + (
        "2026-11-21T08:01:40Z cloudtrain-bootstrap[worker-0]: FAILED: tensorflow sees 0 GPUs\n"
        "2026-11-21T08:01:40Z cloudtrain-bootstrap[worker-0]: durations driver=1s python=99s\n"
    )
    info = parse(done)
    assert info.failed == "tensorflow sees 0 GPUs"
    assert info.durations == {"driver": 1.0, "python": 99.0}
    assert durations_text(info.durations) == "driver 1s, python 99s"
    assert parse("no bootstrap lines here\n").phase == ""


def test_run_reader_reports_phases(tmp_path: Path) -> None:
    store = LocalStore(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    reader = RunReader(store, "r1")
    store.put(run_prefix("r1") + "bootstrap/worker-0.log", LOG.encode())
    snap = reader.poll()
    assert snap.bootstrap_phases == {"worker-0": "python: installing tensorflow 2.21.0"}
    assert snap.bootstrap_failures == {}


def test_run_reader_carries_the_python_steps(tmp_path: Path) -> None:
    """A bare image's apt/venv/fetch/pip seconds reach the snapshot (status --json), beside the
    phases."""
    store = LocalStore(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    at = "2026-11-21T08:01:40Z cloudtrain-bootstrap[worker-0]:"
    log = LOG + (
        f"{at} steps python: apt=12s venv=3s pip=80s\n"
        f"{at} phase python: done in 95s\n"
        f"{at} durations driver=1s python=95s\n"
    )
    store.put(run_prefix("r1") + "bootstrap/worker-0.log", log.encode())
    snap = RunReader(store, "r1").poll()
    assert snap.bootstrap_durations["worker-0"] == {
        "driver": 1.0,
        "python": 95.0,
        "python.apt": 12.0,
        "python.venv": 3.0,
        "python.pip": 80.0,
    }
