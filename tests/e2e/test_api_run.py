"""A local run driven through the Python API (cloudtrain.api), in this process: an attached run
that trains with real TensorFlow and leaves nothing, and a detached run started from a worker
thread (where stop signals cannot be handled: it says so) followed with `logs(follow=True)`,
`status()` and `down()`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cloudtrain import api
from cloudtrain.runtypes import Outcome
from tests.e2e.conftest import Env, assert_clean

pytestmark = pytest.mark.e2e


@pytest.fixture
def home(ct: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    """`ct`'s home for this process (the API reads $CLOUDTRAIN_HOME on every call)."""
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(ct.home))
    monkeypatch.delenv("CLOUDTRAIN_FAULTS", raising=False)
    return ct


def test_an_attached_run_trains_returns_its_result_and_leaves_nothing(
    home: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    job = home.job("digits-multiworker", "python train.py --epochs 2")
    seen = api.SilentObserver()
    handle = api.run(job, observer=seen)
    result = handle.result
    assert result.outcome is Outcome.SUCCEEDED, result.detail
    assert result.model_uri.endswith(f"{handle.run_id}/model/")
    model = Path(result.model_uri.removeprefix("file://"))
    assert (model / "saved_model" / "saved_model.pb").is_file()
    assert handle.run_id in home.run_ids() and handle.plan.provider == "local"
    assert f"run {handle.run_id} on local" in seen.events
    assert any("epoch 2/2 done" in x.line for x in seen.lines)
    assert api.provider("local").compute.list_nodes(handle.run_id) == []
    now = handle.status()
    assert now.done and now.outcome == "succeeded" and now.live_resources == []
    assert handle.wait(timeout_s=1).done  # an attached run is over already
    assert_clean(home, handle.run_id)
    assert capsys.readouterr().out == ""  # the API prints nothing


def test_a_detached_run_from_a_thread_then_logs_status_and_down(home: Env) -> None:
    job = home.tick_job("apidetach", epochs=3, seconds=0.5)
    seen = api.SilentObserver()
    started: list[object] = []

    def start() -> None:  # off the main thread, as a notebook's or a pipeline's worker
        try:
            started.append(api.run(job, detach=True, observer=seen))
        except BaseException as exc:  # the test reports what escaped
            started.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(timeout=120)
    (handle,) = started
    assert isinstance(handle, api.RunHandle), handle
    assert handle.detached and handle.result.outcome is Outcome.DETACHED
    assert api.NO_SIGNALS_NOTE.format(run_id=handle.run_id) in seen.events
    stream = handle.logs(follow=True)
    lines = [str(x) for x in stream]
    assert "[worker-0] cloudtrain: epoch 3/3 done" in lines, lines
    assert stream.end is not None and stream.end.reason == "done" and stream.end.code == 0
    now = handle.wait(timeout_s=60, poll_s=0.5)
    assert now.statuses["worker-0"]["state"] == "succeeded"
    report = handle.down()
    assert report.run_id == handle.run_id
    assert api.provider("local").compute.list_nodes(handle.run_id) == []
    assert api.status(handle.run_id).done
    assert handle.down().nodes_deleted == []  # idempotent
    assert_clean(home, handle.run_id)


def test_an_attached_run_in_a_thread_is_stopped_by_down_and_torn_down(home: Env) -> None:
    """No signal reaches a run off the main thread: `api.down(run_id)` from elsewhere stops
    it; the attached call returns `interrupted` and nothing is left."""
    job = home.tick_job("apistop", epochs=400, seconds=0.5)
    seen = api.SilentObserver()
    started: list[object] = []

    def start() -> None:
        try:
            started.append(api.run(job, observer=seen))
        except BaseException as exc:  # the test reports what escaped
            started.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not any("epoch 2/400" in x.line for x in seen.lines):
        assert time.monotonic() < deadline and thread.is_alive(), (started, seen.events)
        time.sleep(0.2)
    (run_id,) = home.run_ids()
    assert api.NO_SIGNALS_NOTE.format(run_id=run_id) in seen.events
    api.down(run_id)
    thread.join(timeout=120)
    (handle,) = started
    assert isinstance(handle, api.RunHandle), handle
    assert handle.result.outcome is Outcome.INTERRUPTED, handle.result.detail
    assert "cloudtrain down" in handle.result.detail
    assert_clean(home, run_id)
