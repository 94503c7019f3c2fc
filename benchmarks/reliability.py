"""Run the reliability tests and print their figures as the README's "Reliability" table.

How: runs pytest on the crash-point, preemption (and spot eviction), flaky-cloud and
hostile-input tests (the real CLI against local, moto, the GCE fake + GCS emulator and the ARM
fake + Azurite) with
`$CLOUDTRAIN_RELIABILITY_OUT` pointing at a temp JSON file the tests fill
(tests/e2e/reliability_report.py), and a JUnit XML report for the pass/fail counts. Then prints
one line per figure and a markdown table:

    crash points survived / total, leaks found, ledger-less `down`, preemptions recovered (and
    nodes re-created), throttled calls absorbed, bad inputs rejected.

Exits 1 if any of those tests failed. Takes about 6 minutes on a quiet 2-core machine.
`--only crash preemption flaky hostile` runs a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUITES: dict[str, tuple[str, ...]] = {
    "crash": ("tests/e2e/test_crash_points.py",),
    # spot evictions by each cloud record themselves as preemptions ("<cloud>-spot-evicted")
    "preemption": ("tests/e2e/test_preemption.py", "tests/e2e/test_evict_replace.py"),
    "flaky": ("tests/e2e/test_flaky_clouds.py",),
    "hostile": ("tests/e2e/test_hostile_input.py",),
}


def run_tests(files: list[str], report: Path, junit: Path) -> int:
    """Run pytest on `files` with the report variable set. Returns pytest's exit code."""
    env = dict(os.environ, CLOUDTRAIN_RELIABILITY_OUT=str(report))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    return subprocess.run([*cmd, *files], cwd=REPO, env=env).returncode


def junit_counts(junit: Path, file_part: str) -> tuple[int, int]:
    """(passed, total) of the test cases whose class path names `file_part`."""
    if not junit.exists():
        return 0, 0
    passed = total = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        if file_part not in case.get("classname", ""):
            continue
        if case.find("skipped") is not None:
            continue
        total += 1
        if case.find("failure") is None and case.find("error") is None:
            passed += 1
    return passed, total


def table(data: dict[str, dict[str, Any]], hostile: tuple[int, int]) -> list[tuple[str, str]]:
    """The README rows (figure, value) from the report and the hostile-input counts. Pure."""
    rows: list[tuple[str, str]] = []
    crash = data.get("crash", {})
    if crash:
        survived = sum(int(v["survived"]) for v in crash.values())
        points = sum(int(v["points"]) for v in crash.values())
        each = ", ".join(f"{k} {v['survived']}/{v['points']}" for k, v in sorted(crash.items()))
        rows.append(
            ("crash points survived (SIGKILL, then `down`)", f"{survived}/{points} ({each})")
        )
        rows.append(("leaks found after `down`", str(sum(int(v["leaks"]) for v in crash.values()))))
        ok = sum(1 for v in crash.values() if v.get("ledgerless_down"))
        rows.append(("`down` with the ledger file deleted", f"{ok}/{len(crash)} providers clean"))
    pre = data.get("preemption", {})
    if pre:
        recovered = sum(1 for v in pre.values() if v.get("recovered"))
        new = ", ".join(f"{k} {v.get('new_nodes')}" for k, v in sorted(pre.items()))
        rows.append(("preemptions recovered", f"{recovered}/{len(pre)} (new nodes: {new})"))
    flaky = data.get("flaky", {})
    if "local" in flaky:
        f = flaky["local"]
        rows.append(
            (
                "throttled calls absorbed (20 % injected)",
                f"{f['throttled']} throttled + {f['lost_replies']} lost replies of "
                f"{f['calls']} calls; nodes {f['nodes_created']}/{f['nodes_requested']}",
            )
        )
    if "aws" in flaky:
        f = flaky["aws"]
        rows.append(
            (
                "flaky AWS run: instances made / asked",
                f"{f['nodes_created']}/{f['nodes_requested']}",
            )
        )
    if hostile[1]:
        rows.append(
            ("bad inputs rejected (one line, nothing created)", f"{hostile[0]}/{hostile[1]}")
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the suites, print the figures and the table. Returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(SUITES), default=sorted(SUITES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ct-reliability-") as tmp:
        report, junit = Path(tmp) / "report.json", Path(tmp) / "junit.xml"
        code = run_tests([f for s in args.only for f in SUITES[s]], report, junit)
        data = json.loads(report.read_text()) if report.exists() else {}
        hostile = junit_counts(junit, "test_hostile_input") if "hostile" in args.only else (0, 0)
    print(json.dumps(data, indent=1, sort_keys=True))
    print("\n| figure | value |\n|---|---|")
    for figure, value in table(data, hostile):
        print(f"| {figure} | {value} |")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
