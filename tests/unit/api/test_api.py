"""cloudtrain.api as a library user meets it: typed results, nothing printed, the errors of
cloudtrain.core.errors (never SystemExit), and stop signals that degrade off the main thread.
A whole local run through the API: tests/e2e/test_api_run.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from cloudtrain import api
from cloudtrain.core.errors import SpecError, UsageError
from cloudtrain.plan.planner import Plan
from cloudtrain.providers.base import Resource
from cloudtrain.run.stop_signals import StopSignals
from cloudtrain.state.ledger import Ledger

EXAMPLES = Path(__file__).resolve().parents[3] / "jobs" / "examples"
RUN = "demo-abc123"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(home))
    monkeypatch.delenv("CLOUDTRAIN_FAULTS", raising=False)
    return home


def test_plan_returns_a_plan_and_prints_nothing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = EXAMPLES / "digits-ps" / "job.yaml"
    plan = api.plan(job)
    assert isinstance(plan, Plan)
    assert plan.provider == "local" and plan.hourly_usd == 0
    assert [n.role for n in plan.nodes] == ["chief", "worker", "worker", "ps"]
    aws = api.plan(str(job), provider="aws")
    assert aws.provider == "aws" and aws.hourly_usd > 0
    assert capsys.readouterr() == ("", "")
    assert not (home / "ledger.db").exists()  # a plan creates nothing


def test_the_api_loads_no_cli_no_tensorflow_and_no_cloud_sdk(tmp_path: Path) -> None:
    """`import cloudtrain.api` and a plan, in a fresh interpreter: no typer, no rich, no
    TensorFlow, no cloud SDK."""
    code = (
        "import json, sys\n"
        "from cloudtrain import api\n"
        f"api.plan({str(EXAMPLES / 'digits-multiworker' / 'job.yaml')!r}, provider='gcp')\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = dict(os.environ, CLOUDTRAIN_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    heavy = ("typer", "rich", "click", "cloudtrain.cli", "tensorflow", "boto3")
    heavy += ("botocore", "google.cloud", "azure")
    assert [m for m in json.loads(proc.stdout) if m.startswith(heavy)] == []


def test_a_bad_spec_raises_spec_error_with_file_line_and_field(home: Path) -> None:
    job = home / "job.yaml"
    job.write_text(
        textwrap.dedent(
            """\
            name: demo
            cluster:
              strategy: multi_worker_mirrored
              wokers: 2
            entrypoint: python train.py
            """
        )
    )
    for call in (api.plan, api.run):
        with pytest.raises(SpecError) as caught:
            call(job)
        assert "job.yaml:4" in str(caught.value) and "cluster.wokers" in str(caught.value)
    assert not (home / "ledger.db").exists() and not (home / "local").exists()


@pytest.mark.parametrize("ref", ["no-such-run-123456", "../etc", "Bad Id"])
def test_an_unknown_or_malformed_run_id_is_a_usage_error(home: Path, ref: str) -> None:
    calls = [
        lambda: api.status(ref),
        lambda: list(api.logs(ref)),
        lambda: api.down(ref),
        lambda: api.cost(ref),
        lambda: api.resume(ref),
    ]
    for call in calls:
        with pytest.raises(UsageError):
            call()


def _a_run(home: Path) -> Ledger:
    """A ledger with run RUN on the local provider: one node billed at $3.60/h, and a bucket
    whose worker-0 reported `running` at epoch 2/5 and printed two lines."""
    ledger = Ledger(home / "ledger.db")
    bucket = home / "buckets" / "local"
    ledger.create_run(RUN, "demo", "local", None, None, None, f"file://{bucket}", None)
    ledger.set_status(RUN, "running")
    node = Resource("local", "node", f"{RUN}-worker-0", None, RUN)
    ledger.record_intent(node, price_hourly=3.6)
    ledger.mark_created(RUN, "node", node.id)
    prefix = bucket / "cloudtrain" / "runs" / RUN
    for rel, text in {
        "status/worker-0.json": json.dumps({"state": "running", "attempt": 1}),
        "heartbeat/worker-0.json": json.dumps({"epoch": 2, "epochs": 5, "log_seq": 0}),
        "status/worker-1.json": json.dumps({"state": "running", "attempt": 1, "log_seq": 0}),
        # chunks as an agent names them (protocol.log_chunk_key): read by number from 0
        "logs/worker-0/00000000.log": "hello\nepoch 2/5\n",
        "logs/worker-1/00000000.log": "other node\n",
    }.items():
        (prefix / rel).parent.mkdir(parents=True, exist_ok=True)
        (prefix / rel).write_text(text)
    return ledger


def test_status_logs_cost_and_list_on_a_ledger_with_a_run(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _a_run(home)
    now = api.status(RUN[:7])  # a unique prefix
    assert isinstance(now, api.RunStatus)
    assert (now.run_id, now.status, now.outcome, now.done) == (RUN, "running", None, False)
    assert now.statuses["worker-0"]["state"] == "running"
    assert now.heartbeats["worker-0"]["epoch"] == 2
    assert now.live_resources == [f"node/{RUN}-worker-0"] and now.store_error is None
    assert now.cost_usd > 0 and now.controller.state == "alive"  # this process made the row
    data = now.to_dict()
    beat = data["nodes"]["worker-0"]["heartbeat"]
    assert (beat["epoch"], beat["epochs"]) == (2, 5)
    assert json.loads(json.dumps(data, default=str))["run_id"] == RUN

    assert [str(x) for x in api.logs(RUN)] == [
        "[worker-0] hello",
        "[worker-0] epoch 2/5",
        "[worker-1] other node",
    ]
    assert [x.line for x in api.logs(RUN, node="worker-1")] == ["other node"]
    with pytest.raises(UsageError, match="not a node name"):
        api.logs(RUN, node="../x")

    (line,) = api.cost()
    assert isinstance(line, api.CostLine) and line.run_id == RUN
    assert line.compute_usd > 0 and line.stored_gb is not None and line.stored_gb > 0
    (listed,) = api.list_runs()
    assert listed.record.run_id == RUN and listed.live == 1 and listed.cost_usd > 0
    assert capsys.readouterr() == ("", "")


def test_down_is_idempotent_and_marks_the_run_done(home: Path) -> None:
    ledger = _a_run(home)
    heard: list[str] = []
    report = api.down(RUN, say=heard.append)
    assert isinstance(report, api.DownReport) and report.run_id == RUN
    assert ledger.get_run(RUN).status == "done"  # type: ignore[union-attr]
    stop = home / "buckets" / "local" / "cloudtrain" / "runs" / RUN / "control" / "stop"
    assert stop.read_text() == "cloudtrain down"
    again = api.down(RUN)
    assert again.nodes_deleted == [] and again.resources_deleted == []
    assert [r.state for r in ledger.resources(RUN)] == ["deleted"]


def test_stop_signals_off_the_main_thread_degrade_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Off the main thread Python cannot install a handler: StopSignals handles nothing, says
    why (`unavailable`, a WARNING) and does not raise; the handler in place stays."""
    before = signal.getsignal(signal.SIGTERM)
    found: list[object] = []

    def body() -> None:
        try:
            with StopSignals(lambda _s: None) as signals:
                found.append((signals.installed, signals.unavailable))
        except BaseException as exc:  # the test reports what escaped
            found.append(exc)

    with caplog.at_level(logging.WARNING, logger="cloudtrain.run.stop_signals"):
        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
    assert found == [([], "not on the main thread")]
    assert "stop signals (Ctrl-C, SIGTERM, SIGHUP) are not handled" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before


def test_stop_signals_degrade_when_python_refuses_the_handler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A thread that passes for the main one (as in an embedded interpreter) still gets
    ValueError from signal.signal: the same degraded mode, nothing left half-installed."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    found: list[object] = []

    def body() -> None:
        monkeypatch.setattr(threading, "main_thread", threading.current_thread)
        try:
            with StopSignals(lambda _s: None) as signals:
                found.append((signals.installed, signals.unavailable))
        except BaseException as exc:  # the test reports what escaped
            found.append(exc)

    with caplog.at_level(logging.WARNING, logger="cloudtrain.run.stop_signals"):
        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
    ((installed, why),) = found  # type: ignore[misc]
    assert installed == [] and "main thread" in str(why)
    assert "are not handled" in caplog.text
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_provider_with_no_spec_or_record_takes_config_yaml_options(home: Path) -> None:
    """`down` of an unrecorded run and `gc` build their provider from config.yaml's options
    (as for a run recorded before options were kept), wrapped once by the retry layer."""
    (home / "config.yaml").write_text(f"providers:\n  local:\n    root: {home / 'nodes'}\n")
    prov = api.provider("local")
    assert prov.config.option("root") == str(home / "nodes")
    assert type(prov).__name__ == "RetryingProvider"
    with pytest.raises(UsageError, match="unknown provider 'openstack'"):
        api.provider("openstack")
