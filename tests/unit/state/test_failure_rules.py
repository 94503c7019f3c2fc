"""Lost or failed: the rules (`runrules`), what the nodes' reports say (`failures`, through a real
`RunReader` over a folder bucket), the bootstrap log's agent exit and tail (`bootlog`), and the
spec field `max_restarts_on_errors`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from cloudtrain.core.errors import SpecError
from cloudtrain.core.redact import Redactor
from cloudtrain.jobs.protocol import run_prefix
from cloudtrain.jobspec.job import json_schema, load_spec_text
from cloudtrain.jobspec.runrules import Verdict, agent_exit_verdict, judge_attempt, status_verdict
from cloudtrain.providers.local import LocalStore
from cloudtrain.state import bootlog
from cloudtrain.state.failures import NodeFailure, describe, not_retried, read_reports
from cloudtrain.state.runstate import RunReader, archive_bootstrap_log

RUN = "rules-run"
PREFIX = run_prefix(RUN)
JOB_DOC = Path(__file__).resolve().parents[3] / "docs" / "job-yaml.md"  # moved out of README.md


# --- a node's own status ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        ({"state": "failed", "exit_code": 7}, "failed"),  # the entrypoint exited non-zero
        ({"state": "failed", "exit_code": 1, "reason": "setup failed with exit code 2"}, "failed"),
        ({"state": "failed", "reason": "agent error: FileNotFoundError: x"}, "failed"),
        ({"state": "failed", "exit_code": -6, "signal": int(signal.SIGABRT)}, "failed"),
        ({"state": "failed", "exit_code": -11, "signal": int(signal.SIGSEGV)}, "failed"),
        ({"state": "failed", "exit_code": -9, "signal": int(signal.SIGKILL)}, "lost"),
        ({"state": "failed", "exit_code": -15, "signal": int(signal.SIGTERM)}, "lost"),
        ({"state": "failed", "reason": "rendezvous timeout"}, "lost"),
        ({"state": "running"}, None),
        ({"state": "succeeded", "exit_code": 0}, None),
        ({"state": "stopped", "reason": "control/stop"}, None),
    ],
)
def test_status_verdict(status: dict[str, object], verdict: str | None) -> None:
    assert status_verdict(status) == verdict


@pytest.mark.parametrize(
    ("rc", "verdict"),
    [(0, None), (1, "failed"), (2, "failed"), (134, "failed"), (137, "lost"), (143, "lost")],
)
def test_agent_exit_verdict(rc: int, verdict: str | None) -> None:
    assert agent_exit_verdict(rc) == verdict


# --- judge_attempt ----------------------------------------------------------------------------
def judge(
    gone: set[str] = frozenset(),  # type: ignore[assignment]
    reported: set[str] = frozenset(),  # type: ignore[assignment]
    failed: set[str] = frozenset(),  # type: ignore[assignment]
    since: float | None = None,
    heard: dict[str, float] | None = None,
    now: float = 100.0,
) -> Verdict:
    return judge_attempt(gone, reported, failed, since, heard or {}, now, grace_s=3.0)


def test_nothing_to_judge() -> None:
    assert judge(heard={"worker-0": 99.0, "worker-1": 99.5}) == Verdict("ok")


def test_a_lost_node_restarts_the_attempt() -> None:
    assert judge(gone={"worker-1"}) == Verdict("restart", ("worker-1",))
    assert judge(reported={"worker-1"}).action == "restart"  # a notice, a killed training


def test_a_failed_node_that_is_gone_is_failed_not_lost() -> None:
    # a crashed agent reports, then its node powers itself off
    verdict = judge(gone={"worker-0"}, failed={"worker-0"}, since=90.0, heard={"worker-1": 99.0})
    assert verdict == Verdict("failed", failed=("worker-0",))


def test_a_peer_lost_in_the_attempt_explains_a_failure() -> None:
    # worker-0's training exited 1 because worker-1 died: restart, not a failed run
    verdict = judge(gone={"worker-1"}, failed={"worker-0"}, since=99.0)
    assert verdict == Verdict("restart", ("worker-1",), ("worker-0",))


def test_a_failure_waits_for_the_grace() -> None:
    heard = {"worker-1": 99.9}
    assert judge(failed={"worker-0"}, since=98.0, heard=heard).action == "wait"
    assert judge(failed={"worker-0"}, since=97.0, heard=heard).action == "failed"


def test_a_failure_waits_while_a_peer_is_silent_since() -> None:
    # worker-1 last beat before the failure was seen: it may be dead (the survivor noticed
    # first); the verdict waits until it beats again, or is found lost
    silent = judge(failed={"worker-0"}, since=90.0, heard={"worker-1": 89.0})
    assert silent == Verdict("wait", failed=("worker-0",))
    beat_again = judge(failed={"worker-0"}, since=90.0, heard={"worker-1": 91.0})
    assert beat_again.action == "failed"
    found_lost = judge(gone={"worker-1"}, failed={"worker-0"}, since=90.0, heard={})
    assert found_lost.action == "restart"


def test_a_node_not_heard_in_the_attempt_does_not_hold_the_verdict() -> None:
    # worker-1 is still booting (no heartbeat in this attempt): it cannot have broken worker-0
    assert judge(failed={"worker-0"}, since=90.0, heard={}).action == "failed"


def test_every_failed_node_is_named_and_failed_peers_do_not_hold_each_other() -> None:
    heard = {"worker-0": 80.0, "worker-1": 80.0}  # both stopped beating? they both failed
    verdict = judge(failed={"worker-0", "worker-1"}, since=90.0, heard=heard)
    assert verdict == Verdict("failed", failed=("worker-0", "worker-1"))


# --- reports read from a real bucket ------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    bucket = LocalStore(f"file://{tmp_path / 'bucket'}")
    bucket.ensure_bucket()
    return bucket


def put_json(store: LocalStore, key: str, body: dict[str, object]) -> None:
    store.put(PREFIX + key, json.dumps(body).encode())


def boot_log(node: str, *lines: str) -> bytes:
    """A bootstrap log as jobs/startup.sh.j2 writes it: its own lines, and the agent's output."""
    out = []
    for line in lines:
        if line.startswith("@"):
            out.append(f"2026-11-23T10:00:00Z cloudtrain-bootstrap[{node}]: {line[1:]}")
        else:
            out.append(line)
    return ("\n".join(out) + "\n").encode()


CRASHED_AGENT = (
    "@phase agent: starting",
    "=== cloudtrain attempt 1 (worker-0) ===",
    "Traceback (most recent call last):",
    '  File "/opt/cloudtrain/venv/lib/python3.10/site-packages/cloudtrain/jobs/agent.py"',
    "ModuleNotFoundError: No module named 'cloudtrain.core.redact'",
    "@phase agent: exited with 1 in 0s",
    "@durations driver=0s python=1s bundle=2s agent=0s",
)


def test_bootlog_reads_the_agents_exit_and_the_lines_before_it() -> None:
    info = bootlog.parse(boot_log("worker-0", *CRASHED_AGENT).decode())
    assert info.agent_exit == 1
    assert info.tail[-1] == "ModuleNotFoundError: No module named 'cloudtrain.core.redact'"
    assert info.tail[0] == "=== cloudtrain attempt 1 (worker-0) ==="
    assert info.phase == "agent: exited with 1 in 0s"
    still = bootlog.parse(boot_log("worker-0", "@phase agent: starting").decode())
    assert still.agent_exit is None


def test_bootlog_tail_ends_at_the_failed_line() -> None:
    text = boot_log("ps-0", "@phase bundle: fetching", "curl: (7) refused", "@FAILED: bundle: x")
    info = bootlog.parse(text.decode())
    assert info.failed == "bundle: x" and info.tail == ["curl: (7) refused"]


def test_reports_of_the_attempt_from_statuses_and_agent_exits(store: LocalStore) -> None:
    tail = ["Traceback (most recent call last):", "ValueError: lr must be positive"]
    failed = {"state": "failed", "attempt": 2, "exit_code": 1, "tail": tail}
    put_json(store, "status/worker-0.json", failed)
    put_json(store, "status/worker-1.json", {"state": "failed", "attempt": 2, "signal": 9})
    put_json(store, "status/worker-2.json", {"state": "failed", "attempt": 1, "exit_code": 3})
    store.put(PREFIX + "bootstrap/chief-0.log", boot_log("chief-0", *CRASHED_AGENT))
    reports = read_reports(RunReader(store, RUN).poll(), attempt=2)
    assert reports.reported_lost == {"worker-1"}  # killed from outside
    assert set(reports.failed) == {"worker-0", "chief-0"}  # worker-2's is an older attempt
    assert reports.failed["worker-0"] == NodeFailure(
        "worker-0", "the training process exited with code 1", tuple(tail)
    )
    chief = reports.failed["chief-0"]
    assert chief.reason == "its agent exited with code 1"
    assert chief.tail[-1] == "ModuleNotFoundError: No module named 'cloudtrain.core.redact'"


def test_a_status_report_wins_over_the_agents_exit(store: LocalStore) -> None:
    reason = "agent error: KeyError: 'roles'"
    put_json(store, "status/worker-0.json", {"state": "failed", "attempt": 1, "reason": reason})
    store.put(PREFIX + "bootstrap/worker-0.log", boot_log("worker-0", *CRASHED_AGENT))
    reports = read_reports(RunReader(store, RUN).poll(), attempt=1)
    assert reports.failed["worker-0"].reason == "agent error: KeyError: 'roles'"


def test_an_archived_bootstrap_log_no_longer_speaks_for_the_node(store: LocalStore) -> None:
    store.put(PREFIX + "bootstrap/worker-0.log", boot_log("worker-0", *CRASHED_AGENT))
    reader = RunReader(store, RUN)
    assert "worker-0" in read_reports(reader.poll(), attempt=1).failed
    archive_bootstrap_log(store, RUN, "worker-0", 1)
    archive_bootstrap_log(store, RUN, "worker-0", 1)  # idempotent
    snap = reader.poll()
    assert read_reports(snap, attempt=2).failed == {}
    assert "worker-0" not in snap.agent_exits and "worker-0" not in snap.bootstrap_phases
    kept = store.get(PREFIX + "attempt-1/bootstrap/worker-0.log").decode()
    assert "exited with 1" in kept
    assert reader.bootstrap_nodes() == []


def test_heartbeats_are_stamped_when_read(store: LocalStore) -> None:
    reader = RunReader(store, RUN)
    put_json(store, "heartbeat/worker-0.json", {"time": 1.0, "attempt": 1})
    first = reader.poll().heartbeat_seen["worker-0"]
    again = reader.poll().heartbeat_seen["worker-0"]
    assert again == first  # unchanged object: not a new beat
    put_json(store, "heartbeat/worker-0.json", {"time": 3.0, "attempt": 1, "epoch": 2})
    assert reader.poll().heartbeat_seen["worker-0"] > first


def test_describe_quotes_the_tail_and_redacts_secrets() -> None:
    failure = NodeFailure("worker-0", "exited with code 1", ("token=s3cr3t-value", "", "boom"))
    text = describe([failure], Redactor(["s3cr3t-value"]))
    assert text.splitlines() == [
        "worker-0 failed: exited with code 1",
        "  the last lines of worker-0:",
        "    token=***",
        "    boom",
    ]
    assert "max_restarts_on_errors: 0" in not_retried(0, RUN)
    assert "failed again after 1 retry" in not_retried(1, RUN)


# --- the spec field ---------------------------------------------------------------------------
HEAD = "name: demo\nentrypoint: python train.py\n"


def test_max_restarts_on_errors_defaults_to_no_retry() -> None:
    spec = load_spec_text(HEAD, "job.yaml")
    assert spec.max_restarts_on_errors == 0
    assert load_spec_text(HEAD + "max_restarts_on_errors: 3\n").max_restarts_on_errors == 3


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("-1", "must be at least 0 (got -1)"),
        ("21", "must be at most 20 (got 21)"),
        ('"1"', "must be a whole number (got '1')"),
        ("1.5", "must be a whole number"),
        ("true", "must be a whole number"),
    ],
)
def test_max_restarts_on_errors_is_validated(value: str, problem: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec_text(HEAD + f"max_restarts_on_errors: {value}\n", "job.yaml")
    assert str(err.value).startswith(f"job.yaml:3: max_restarts_on_errors: {problem}"), err.value


def test_the_schema_and_the_readme_know_the_field() -> None:
    field = json_schema()["properties"]["max_restarts_on_errors"]
    assert field["type"] == "integer" and field["minimum"] == 0 and field["default"] == 0
    block = JOB_DOC.read_text().split("# job.yaml", 1)[1].split("```yaml", 1)[1].split("```")[0]
    assert "\nmax_restarts_on_errors: 0 " in block
