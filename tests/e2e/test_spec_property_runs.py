"""The spec's contract through the real CLI, by property: `cloudtrain run --provider local` of a
tiny job (no TensorFlow) whose env value and entrypoint argument are generated (control bytes,
odd Unicode, YAML edge forms, large sizes). Either ONE `error:` line with `job.yaml:LINE` and
nothing created, or a run that succeeds and whose job received exactly those bytes: its
entrypoint writes `$V` and its argument into the model folder, read back from the bucket."""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import Env
from tests.e2e.nothing_created import assert_nothing_created, snapshot
from tests.e2e.test_hostile_input import assert_one_error
from tests.unit.jobspec.test_spec_properties import EDGE_FORMS, ODD, is_plain, quoted

pytestmark = pytest.mark.e2e

values = st.one_of(
    st.text(st.sampled_from(ODD) | st.characters(codec="utf-8"), max_size=12),
    st.sampled_from(EDGE_FORMS),
    st.sampled_from(["x" * 131_069, "x" * 131_070, "é" * 70_000]),
)
styles = st.sampled_from(["quoted", "plain"])
_CLOUD_ENV_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCE_", "CLOUDSDK_", "CLOUDTRAIN_")


def _scalar(value: str, style: str) -> str:
    """A plain scalar when YAML reads `value` plainly as itself, else double-quoted."""
    return value if style == "plain" and is_plain(value) else quoted(value)


def _run(value: str, arg: str, style: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home, job = Path(tmp) / "home", Path(tmp) / "job"
        home.mkdir()
        job.mkdir()
        (job / "README").write_text("a job with no code: its entrypoint is in job.yaml\n")
        entrypoint = (
            'mkdir -p "$CLOUDTRAIN_MODEL_DIR"; printf %s "$V" > "$CLOUDTRAIN_MODEL_DIR/v"; '
            "printf %s " + shlex.quote(arg) + ' > "$CLOUDTRAIN_MODEL_DIR/a"'
        )
        text = (
            "name: prop\ncluster:\n  strategy: one_device\nmax_hours: 0.1\n"
            f"entrypoint: {quoted(entrypoint)}\nenv:\n  V: {_scalar(value, style)}\n"
        )
        try:
            (job / "job.yaml").write_text(text, encoding="utf-8")
        except UnicodeEncodeError:
            (job / "job.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        env = {k: v for k, v in os.environ.items() if not k.startswith(_CLOUD_ENV_PREFIXES)}
        env.update(CLOUDTRAIN_HOME=str(home), COLUMNS="200")
        env.pop("STORAGE_EMULATOR_HOST", None)
        ct = Env(home, env)
        before = snapshot(home)
        proc = ct.cli("run", "--quiet", "--provider", "local", str(job / "job.yaml"), timeout=120)
        if proc.returncode != 0 and proc.stderr.startswith("error: ") and ":" in proc.stderr:
            assert_one_error(proc, r"^error: \S*job\.yaml:\d+: ")
            assert_nothing_created(before)
            return
        assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        (run_id,) = ct.run_ids()
        model = ct.bucket / run_id / "model"
        assert (model / "v").read_bytes() == value.encode("utf-8")
        assert (model / "a").read_bytes() == arg.encode("utf-8")
        assert ct.live_processes() == []


RUNTIMES: list[float] = []


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(value=values, arg=st.text(st.sampled_from(ODD) | st.characters(), max_size=8), style=styles)
def test_a_generated_value_runs_exactly_or_is_one_error_line(
    value: str, arg: str, style: str
) -> None:
    started = time.monotonic()
    _run(value, arg, style)
    RUNTIMES.append(time.monotonic() - started)
