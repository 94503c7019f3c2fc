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
from cloudtrain.run.lease_holder import STOPPED_BY_DOWN
from cloudtrain.run.teardown import request_stop
from cloudtrain.run.view import Outcome, RunResult
from cloudtrain.state.lease import TTL_ENV, Lease
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


class AttachedRun:
    """`api.run(job)` (attached) in a worker thread, started and past its second epoch."""

    def __init__(self, home: Env, name: str) -> None:
        self.home, self.seen, self.started = home, api.SilentObserver(), []
        job = home.tick_job(name, epochs=400, seconds=0.5)
        self.thread = threading.Thread(target=self._start, args=(job,), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not any("epoch 2/400" in x.line for x in self.seen.lines):
            assert time.monotonic() < deadline and self.thread.is_alive(), self.started
            time.sleep(0.2)
        (self.run_id,) = home.run_ids()

    def _start(self, job: Path) -> None:
        try:
            self.started.append(api.run(job, observer=self.seen))
        except BaseException as exc:  # the test reports what escaped
            self.started.append(exc)

    def take_lease(self, owner: str) -> None:
        """Take the run's lease by force as `owner`, signed with the run's key (what
        `cloudtrain down` does first; an unsigned lease is a node's forgery, taken back)."""
        ledger = self.home.ledger()
        rec = ledger.get_run(self.run_id)
        assert rec is not None and rec.store_uri
        store = api.provider("local").store(rec.store_uri)
        key = ledger.run_key(self.run_id)
        assert key is not None
        Lease(store, self.run_id, owner, key=key).acquire(force=True)

    def result(self) -> RunResult:
        """The attached call's result, once it returned (fails the test if it raised)."""
        self.thread.join(timeout=120)
        (handle,) = self.started
        assert isinstance(handle, api.RunHandle), (handle, self.seen.events[-5:])
        return handle.result


def test_an_attached_run_in_a_thread_is_stopped_by_down_and_torn_down(home: Env) -> None:
    """No signal reaches a run off the main thread: `api.down(run_id)` from elsewhere stops
    it; the attached call returns `interrupted` and nothing is left."""
    run = AttachedRun(home, "apistop")
    assert api.NO_SIGNALS_NOTE.format(run_id=run.run_id) in run.seen.events
    api.down(run.run_id)
    result = run.result()
    assert result.outcome is Outcome.INTERRUPTED, result.detail
    assert "cloudtrain down" in result.detail
    assert_clean(home, run.run_id)


def test_a_run_down_took_while_it_stopped_ends_interrupted_and_leaves_the_teardown(
    home: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`down` takes the lease, then writes the stop. When the watch reads the stop before the
    keeper finds the lease gone (here: the keeper does not renew within the test), the run's
    own stop and teardown meet the fence: it stops acting there, still `interrupted`, and
    leaves the teardown to `down` (it raised LeaseLost out of `api.run`, once in CI)."""
    monkeypatch.setenv(TTL_ENV, "3600")
    run = AttachedRun(home, "apifence")
    run.take_lease("down:elsewhere:1")
    request_stop(
        api.provider("local"),
        home.ledger().get_run(run.run_id).store_uri,
        run.run_id,
        "cloudtrain down",
    )
    result = run.result()
    assert (result.outcome, result.detail) == (Outcome.INTERRUPTED, STOPPED_BY_DOWN)
    assert any(e.startswith("stopped acting: ") for e in run.seen.events), run.seen.events
    # it deleted nothing once fenced: its nodes are down's to delete
    assert len(api.provider("local").compute.list_nodes(run.run_id)) == 2
    api.down(run.run_id)
    assert_clean(home, run.run_id)
    rec = home.ledger().get_run(run.run_id)  # the record says what the call returned
    assert rec is not None and (rec.status, rec.outcome) == ("done", "interrupted"), rec


@pytest.mark.parametrize(
    ("owner", "outcome"),
    [("down:elsewhere:1", Outcome.INTERRUPTED), ("laptop:elsewhere:1", Outcome.LEASE_LOST)],
)
def test_a_run_whose_lease_was_taken_stops_acting_and_names_who_took_it(
    home: Env, monkeypatch: pytest.MonkeyPatch, owner: str, outcome: Outcome
) -> None:
    """The keeper finds the lease gone before any stop is read (down writes its stop after
    taking the lease): a run `down` took ends `interrupted`, as when the stop came first;
    one another controller took ends `lease_lost`. Neither deletes anything."""
    monkeypatch.setenv(TTL_ENV, "6")  # renewed every second
    run = AttachedRun(home, "apitaken")
    run.take_lease(owner)
    result = run.result()
    assert result.outcome is outcome, result.detail
    if outcome is Outcome.INTERRUPTED:
        assert result.detail == STOPPED_BY_DOWN
    assert any(e.startswith("stopped acting: ") for e in run.seen.events), run.seen.events
    assert len(api.provider("local").compute.list_nodes(run.run_id)) == 2
    api.down(run.run_id)
    assert_clean(home, run.run_id)
    rec = home.ledger().get_run(run.run_id)
    assert rec is not None and rec.status == "done", rec
    if outcome is Outcome.INTERRUPTED:  # another holder's record is its own to write
        assert rec.outcome == "interrupted", rec
