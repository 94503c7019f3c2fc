"""The reliability table (benchmarks/reliability.py) shows skipped tests: they stay in the total,
never count as passed or survived, and a skipped provider is named."""

from __future__ import annotations

from pathlib import Path

from benchmarks.reliability import TALLIES, Tally, junit_tally, table

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
 <testcase classname="tests.e2e.test_crash_points" name="{crash}[local]"/>
 <testcase classname="tests.e2e.test_crash_points" name="{crash}[aws]"/>
 <testcase classname="tests.e2e.test_crash_points" name="{crash}[azure]">
  <skipped type="pytest.skip" message="Azurite is not installed">skipped</skipped></testcase>
 <testcase classname="tests.e2e.test_crash_points" name="{crash}[gcp]">
  <failure message="boom">boom</failure></testcase>
 <testcase classname="tests.e2e.test_preemption" name="test_local_worker_lost"/>
 <testcase classname="tests.e2e.test_evict_replace" name="test_azure_spot_vm_evicted">
  <skipped message="no Azurite">skipped</skipped></testcase>
 <testcase classname="tests.e2e.test_hostile_input" name="test_refused_with_one_error_line[a]"/>
 <testcase classname="tests.e2e.test_hostile_input" name="test_refused_with_one_error_line[b]"/>
 <testcase classname="tests.e2e.test_hostile_input" name="test_refused_with_one_error_line[c]">
  <skipped message="no fifo">skipped</skipped></testcase>
 <testcase classname="tests.e2e.test_hostile_input" name="test_usage_errors_are_clicks[x]"/>
 <testcase classname="tests.e2e.test_hostile_input" name="test_every_case_goes_through_run"/>
</testsuite></testsuites>
"""
REPORT = {
    "crash": {
        "local": {"points": 11, "survived": 11, "leaks": 0, "ledgerless_down": True},
        "aws": {"points": 14, "survived": 14, "leaks": 0, "ledgerless_down": True},
    },
    "preemption": {"local": {"recovered": True, "new_nodes": 1}},
    "hostile": {"a": {"command": "run"}, "b": {"command": "plan"}, "x": {"command": "run"}},
}


def _tallies(tmp_path: Path) -> dict[str, Tally]:
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT.format(crash="test_a_crash_at_every_point_then_down_leaves_nothing"))
    return {suite: junit_tally(junit, *TALLIES[suite]) for suite in TALLIES}


def test_skips_stay_in_the_total_and_never_pass(tmp_path: Path) -> None:
    tallies = _tallies(tmp_path)
    assert tallies["hostile"].ratio() == "3/4 (1 skipped)"  # the guard test is not a case
    assert tallies["preemption"].ratio() == "1/2 (1 skipped)"
    crash = tallies["crash"]
    assert (len(crash.passed), len(crash.failed), len(crash.skipped)) == (2, 1, 1)


def test_the_table_names_skipped_and_failed_providers(tmp_path: Path) -> None:
    rows = dict(table(REPORT, _tallies(tmp_path)))
    assert rows["crash points survived (SIGKILL, then `down`)"] == (
        "25/25 (aws 14/14, local 11/11, azure skipped, gcp failed)"
    )
    assert rows["leaks found after `down`"] == "0 (1 skipped: azure; 1 failed: gcp)"
    assert rows["`down` with the ledger file deleted"] == (
        "2/4 providers clean (1 skipped; 1 failed)"
    )
    assert rows["preemptions recovered"] == "1/2 (1 skipped) (new nodes: local 1)"
    assert rows["bad inputs rejected (one line, nothing created)"] == (
        "3/4 (1 skipped); 2 of them through `run`"
    )


def test_all_passed_has_no_note() -> None:
    assert Tally(passed=("a", "b")).ratio() == "2/2"
