"""Unit tests of the preemption-notice pollers (`cloudtrain.jobs.preemption`) against the fake
metadata service of `tests/fakes/metadata_server.py` (real HTTP on 127.0.0.1).

Rate limiting and token refresh run on an injected clock, so no test sleeps for an interval;
the module takes a couple of seconds.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs.preemption import Notice, PreemptionWatcher, cloud_of_store
from cloudtrain.providers.aws.preemption import EC2_ACTION_PATH, EC2_TOKEN_PATH, EC2_TOKEN_TTL_S
from cloudtrain.providers.azure.preemption import AZURE_EVENTS_PATH
from cloudtrain.providers.gcp.preemption import GCE_PREEMPTED_PATH
from tests.fakes.metadata_server import MetadataServer

VM = "ct-run-worker-1"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused
AZURE_PATH = AZURE_EVENTS_PATH.split("?", 1)[0]
REPO = Path(__file__).resolve().parents[3]
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    with MetadataServer(vm_name=VM) as fake:
        yield fake


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def watcher(cloud: str | None, base: str, clock: FakeClock, **kw: Any) -> PreemptionWatcher:
    """A watcher for VM at `base` on the test's clock, with short timeouts."""
    return PreemptionWatcher(cloud, VM, base_url=base, clock=clock, timeout_s=0.5, **kw)


# --- cloud_of_store -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("uri", "cloud"),
    [
        ("s3://bucket/prefix", "aws"),
        ("gs://bucket", "gcp"),
        ("az://account/container", "azure"),
        ("S3://Bucket", "aws"),
        ("file:///tmp/store", None),
        ("/tmp/store", None),
        ("", None),
        ("http://example.com/x", None),
    ],
)
def test_cloud_of_store(uri: str, cloud: str | None) -> None:
    assert cloud_of_store(uri) == cloud


# --- no notice, then a notice -------------------------------------------------------------------
@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_no_notice_then_notice(cloud: str, server: MetadataServer, clock: FakeClock) -> None:
    w = watcher(cloud, server.url, clock)
    assert w.poll() is None
    assert w.enabled
    server.preempt(VM)
    clock.advance(5)
    before = time.time()
    notice = w.poll()
    assert isinstance(notice, Notice)
    assert notice.cloud == cloud
    assert notice.action == {"aws": "terminate", "gcp": "preempt", "azure": "preempt"}[cloud]
    expected = {"aws": 120, "gcp": 30, "azure": 30}[cloud]
    assert before + expected - 3 <= notice.deadline <= time.time() + expected + 1
    assert "\n" not in notice.detail and notice.detail
    # The same notice from now on, with no more HTTP.
    served = sum(server.requests.values())
    clock.advance(60)
    assert w.poll() is notice
    assert w.poll() is notice
    assert sum(server.requests.values()) == served


def test_each_cloud_asks_its_own_path(server: MetadataServer, clock: FakeClock) -> None:
    for cloud in ("aws", "gcp", "azure"):
        watcher(cloud, server.url, clock).poll()
    assert server.requests[EC2_TOKEN_PATH] == 1
    assert server.requests[EC2_ACTION_PATH] == 1
    assert server.requests[GCE_PREEMPTED_PATH] == 1
    assert server.requests[AZURE_PATH] == 1


def test_ec2_hibernate_deadline_is_now(server: MetadataServer, clock: FakeClock) -> None:
    server.preempt(VM, ec2_action="hibernate")
    notice = watcher("aws", server.url, clock).poll()
    assert notice is not None and notice.action == "hibernate"
    assert notice.deadline <= time.time()


def test_notice_visible_only_after_after_s(server: MetadataServer, clock: FakeClock) -> None:
    w = watcher("gcp", server.url, clock, interval_s=0)
    server.preempt(VM, after_s=0.3)
    assert w.poll() is None
    time.sleep(0.4)
    assert w.poll() is not None


# --- Azure specifics ----------------------------------------------------------------------------
def test_azure_ignores_other_vms_and_harmless_events(
    server: MetadataServer, clock: FakeClock
) -> None:
    server.add_azure_event("Preempt", ["ct-run-worker-2"])
    server.add_azure_event("Freeze", [VM])
    server.add_azure_event("Reboot", [VM])
    server.add_azure_event("Redeploy", [VM])
    w = watcher("azure", server.url, clock)
    assert w.poll() is None
    assert w.enabled
    server.add_azure_event("Terminate", [VM.upper(), "ct-run-worker-2"], not_before="")
    clock.advance(5)
    before = time.time()
    notice = w.poll()
    assert notice is not None and notice.action == "terminate"
    assert before + 27 <= notice.deadline <= time.time() + 31  # NotBefore "": now + 30


def test_azure_not_before_is_the_deadline(server: MetadataServer, clock: FakeClock) -> None:
    server.add_azure_event("Preempt", [VM], not_before="Mon, 19 Sep 2016 18:29:47 GMT")
    notice = watcher("azure", server.url, clock).poll()
    assert notice is not None
    assert notice.deadline == 1474309787.0
    assert "Started" in notice.detail  # the fake marks an event past its NotBefore as started


def test_azure_earliest_of_several_notices(server: MetadataServer, clock: FakeClock) -> None:
    server.add_azure_event("Terminate", [VM], not_before="Tue, 20 Sep 2016 18:00:00 GMT")
    server.add_azure_event("Preempt", [VM], not_before="Mon, 19 Sep 2016 18:29:47 GMT")
    notice = watcher("azure", server.url, clock).poll()
    assert notice is not None and notice.action == "preempt"


def test_fake_azure_requires_its_header(server: MetadataServer) -> None:
    req = urllib.request.Request(server.url + AZURE_EVENTS_PATH)
    with pytest.raises(urllib.error.HTTPError) as err:
        DIRECT.open(req, timeout=2)
    assert err.value.code == 400


# --- rate limiting ------------------------------------------------------------------------------
def test_rate_limited_by_interval(server: MetadataServer, clock: FakeClock) -> None:
    w = watcher("gcp", server.url, clock, interval_s=5.0)
    assert w.poll() is None
    for _ in range(8):
        clock.advance(0.5)
        assert w.poll() is None
    assert server.requests[GCE_PREEMPTED_PATH] == 1  # 4 s later: still the first check
    clock.advance(1.0)
    server.preempt(VM)
    assert w.poll() is not None
    assert server.requests[GCE_PREEMPTED_PATH] == 2


def test_rate_limited_notice_waits_for_next_check(server: MetadataServer, clock: FakeClock) -> None:
    w = watcher("azure", server.url, clock, interval_s=5.0)
    assert w.poll() is None
    server.preempt(VM)
    clock.advance(1)
    assert w.poll() is None  # between checks: not asked
    clock.advance(4)
    assert w.poll() is not None


# --- the EC2 token ------------------------------------------------------------------------------
def test_ec2_token_reused_across_polls(server: MetadataServer, clock: FakeClock) -> None:
    w = watcher("aws", server.url, clock)
    for _ in range(5):
        assert w.poll() is None
        clock.advance(5)
    assert server.requests[EC2_ACTION_PATH] == 5
    assert server.requests[EC2_TOKEN_PATH] == 1


def _notice_after_a_revoked_token(
    server: MetadataServer, clock: FakeClock
) -> tuple[PreemptionWatcher, Notice | None]:
    """An AWS watcher that polled once, then met a revoked token and a notice."""
    w = watcher("aws", server.url, clock)
    assert w.poll() is None
    server.expire_tokens()
    server.preempt(VM)
    clock.advance(5)
    return w, w.poll()


def test_ec2_token_fetched_again_after_401(server: MetadataServer, clock: FakeClock) -> None:
    w, notice = _notice_after_a_revoked_token(server, clock)
    assert notice is not None and notice.action == "terminate"
    assert server.requests[EC2_TOKEN_PATH] == 2
    assert server.requests[EC2_ACTION_PATH] == 3  # ok, 401, ok with the new token
    assert w.enabled


def test_ec2_token_refreshed_before_expiry(server: MetadataServer, clock: FakeClock) -> None:
    w = watcher("aws", server.url, clock)
    assert w.poll() is None
    clock.advance(EC2_TOKEN_TTL_S - 600)
    assert w.poll() is None
    assert server.requests[EC2_TOKEN_PATH] == 1
    clock.advance(400)  # within the refresh margin of the 6 h TTL
    assert w.poll() is None
    assert server.requests[EC2_TOKEN_PATH] == 2
    assert server.requests[EC2_ACTION_PATH] == 3  # never a 401 on the way


def test_token_never_in_notice_or_logs(
    server: MetadataServer, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cloudtrain.jobs.preemption")
    w, notice = _notice_after_a_revoked_token(server, clock)
    assert notice is not None
    assert len(server.tokens_issued) == 2
    for token in server.tokens_issued:
        assert token not in repr(notice)
        assert token not in repr(w)
        assert token not in caplog.text
    assert "EC2 spot interruption: terminate at 20" in notice.detail


# --- no metadata service ------------------------------------------------------------------------
@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_closed_port_disables_after_three_failures(cloud: str, clock: FakeClock) -> None:
    w = PreemptionWatcher(cloud, VM, base_url=CLOSED, clock=clock, timeout_s=20, interval_s=0)
    started = time.monotonic()
    for _ in range(3):
        assert w.enabled
        assert w.poll() is None
    assert not w.enabled
    assert w.poll() is None
    # refused at once: waiting out the 20 s timeout of each poll would take a minute or more
    assert time.monotonic() - started < 30


def test_disabled_watcher_makes_no_more_requests(server: MetadataServer, clock: FakeClock) -> None:
    w = watcher("gcp", CLOSED, clock, interval_s=0, give_up_after=1)
    assert w.poll() is None
    assert not w.enabled
    w.base_url = server.url  # even with a service there now: no more checks
    server.preempt(VM)
    assert w.poll() is None
    assert sum(server.requests.values()) == 0


def test_a_no_notice_answer_resets_the_failure_count(
    server: MetadataServer, clock: FakeClock
) -> None:
    w = watcher("gcp", CLOSED, clock, interval_s=0)
    assert w.poll() is None
    assert w.poll() is None  # two failures
    w.base_url = server.url
    assert w.poll() is None  # FALSE: success
    w.base_url = CLOSED
    assert w.poll() is None
    assert w.poll() is None
    assert w.enabled  # two failures again, not four


def test_slow_answers_do_not_disable(server: MetadataServer, clock: FakeClock) -> None:
    # Azure's first Scheduled Events call can take minutes: a service that is there but slow
    # is not "no service".
    server.delay_s = 0.3
    w = PreemptionWatcher("azure", VM, base_url=server.url, clock=clock, timeout_s=0.1)
    for _ in range(4):
        assert w.poll() is None
        clock.advance(5)
    assert w.enabled
    server.delay_s = 0
    server.preempt(VM)
    assert w.poll() is not None


def test_http_errors_are_no_notice_but_keep_polling(
    server: MetadataServer, clock: FakeClock
) -> None:
    w = watcher("gcp", server.url + "/nowhere", clock, interval_s=0)  # 404 on every path
    for _ in range(5):
        assert w.poll() is None
    assert w.enabled


def test_cloud_none_is_disabled_and_silent(server: MetadataServer, clock: FakeClock) -> None:
    w = PreemptionWatcher(None, VM, base_url=server.url, clock=clock)
    assert not w.enabled
    assert w.poll() is None
    assert sum(server.requests.values()) == 0


def test_unknown_cloud_is_refused() -> None:
    with pytest.raises(ValueError):
        PreemptionWatcher("local", VM)


def test_base_url_defaults(monkeypatch: pytest.MonkeyPatch, server: MetadataServer) -> None:
    monkeypatch.delenv("CLOUDTRAIN_METADATA_URL", raising=False)
    assert PreemptionWatcher("aws", VM).base_url == "http://169.254.169.254"
    assert PreemptionWatcher("gcp", VM).base_url == "http://metadata.google.internal"
    assert PreemptionWatcher("azure", VM).base_url == "http://169.254.169.254"
    monkeypatch.setenv("CLOUDTRAIN_METADATA_URL", server.url + "/")
    w = PreemptionWatcher("gcp", VM)
    assert w.base_url == server.url
    server.preempt()
    assert w.poll() is not None


# --- the fake as a separate process -------------------------------------------------------------
def test_fake_runs_as_a_script_and_preempts_over_http(clock: FakeClock) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.metadata_server", "--port", "0", "--vm-name", VM],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        w = watcher("azure", url, clock, interval_s=0)
        assert w.poll() is None
        req = urllib.request.Request(f"{url}/_fake/preempt?vm={VM}", data=b"", method="POST")
        with DIRECT.open(req, timeout=2) as resp:
            assert resp.status == 200
        notice = w.poll()
        assert notice is not None and notice.cloud == "azure" and notice.action == "preempt"
    finally:
        proc.terminate()
        proc.wait(timeout=5)
