"""The run knobs the environment sets ($CLOUDTRAIN_HEARTBEAT_TIMEOUT_S): taken over the
provider's defaults, beaten by explicit options, and a bad value is one clear line from
`cloudtrain run`, before anything exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.core.errors import UsageError
from cloudtrain.jobspec.run_options import HEARTBEAT_TIMEOUT_ENV, RunOptions

EXAMPLE = Path(__file__).resolve().parents[3] / "jobs" / "examples" / "digits-multiworker"


def test_the_defaults_without_the_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HEARTBEAT_TIMEOUT_ENV, raising=False)
    assert RunOptions.for_provider("local").heartbeat_timeout_s == 60.0
    assert RunOptions.for_provider("aws").heartbeat_timeout_s == 180.0


def test_the_knob_beats_the_defaults_and_an_explicit_option_beats_the_knob(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(HEARTBEAT_TIMEOUT_ENV, " 15 ")
    assert RunOptions.for_provider("local").heartbeat_timeout_s == 15.0
    assert RunOptions.for_provider("gcp").heartbeat_timeout_s == 15.0
    assert RunOptions.for_provider("local").boot_timeout_s == 120.0, "the rest stays local's"
    assert RunOptions.for_provider("local", heartbeat_timeout_s=30).heartbeat_timeout_s == 30


@pytest.mark.parametrize("value", ["abc", "9.5", "-20", "inf", "nan"])
def test_a_bad_value_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(HEARTBEAT_TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=HEARTBEAT_TIMEOUT_ENV) as raised:
        RunOptions.for_provider("local")
    assert ">= 10" in str(raised.value)


def test_run_refuses_a_bad_value_in_one_line_before_anything_exists(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), **{HEARTBEAT_TIMEOUT_ENV: "soon"})
    proc = subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", "run", str(EXAMPLE / "job.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {HEARTBEAT_TIMEOUT_ENV}='soon' is not a heartbeat timeout "
        "(set it to a number of seconds >= 10, or unset it)"
    ], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(home.glob("local/runs/*")), "no node was started"
