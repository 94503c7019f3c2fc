"""Run the reliability tests and print their figures as the README's "Reliability" table.

How: runs pytest on the crash-point, preemption (and spot eviction), flaky-cloud and
hostile-input tests (the real CLI against local, moto, the GCE fake + GCS emulator and the ARM
fake + Azurite) with
`$CLOUDTRAIN_RELIABILITY_OUT` pointing at a temp JSON file the tests fill
(tests/e2e/reliability_report.py), and a JUnit XML report for the pass/fail/skip counts. Then
prints one line per figure and a markdown table:

    crash points survived / total, leaks found, ledger-less `down`, preemptions recovered (and
    nodes re-created), throttled calls absorbed, bad inputs rejected (the corpus size, and how
    many of its cases go through `run`, as each case records its command).

A skipped test stays in its total and never counts as passed or survived: "52/53 (1 skipped)",
and a skipped provider is named ("azure skipped").

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUITES: dict[str, tuple[str, ...]] = {
    "crash": ("tests/e2e/test_crash_points.py",),
    # spot evictions by each cloud record themselves as preemptions ("<cloud>-spot-evicted")
    "preemption": ("tests/e2e/test_preemption.py", "tests/e2e/test_evict_replace.py"),
    "flaky": ("tests/e2e/test_flaky_clouds.py",),
    # the corpus, and the proof that its "nothing created" check catches what a run creates
    "hostile": ("tests/e2e/test_hostile_input.py", "tests/e2e/test_nothing_created_check.py"),
}
# per suite, the JUnit test cases that make its figure: (file name parts, test name prefixes)
TALLIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "crash": (("test_crash_points",), ("test_a_crash_at_every_point",)),
    "preemption": (("test_preemption", "test_evict_replace"), ("",)),
    "flaky": (("test_flaky_clouds",), ("",)),
    # the corpus: every bad input and every usage error (not the corpus's own guard test)
    "hostile": (("test_hostile_input",), ("test_refused_with_one_error_line", "test_usage_errors")),
}


def run_tests(files: list[str], report: Path, junit: Path) -> int:
    """Run pytest on `files` with the report variable set. Returns pytest's exit code."""
    env = dict(os.environ, CLOUDTRAIN_RELIABILITY_OUT=str(report))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    return subprocess.run([*cmd, *files], cwd=REPO, env=env).returncode


@dataclass(frozen=True)
class Tally:
    """The outcomes of a group of test cases, as JUnit reports them (skips kept apart)."""

    passed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()  # failures and errors
    skipped: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Every case of the group, skipped ones included."""
        return len(self.passed) + len(self.failed) + len(self.skipped)

    def ratio(self) -> str:
        """'passed/total', then what did not pass: '52/53 (1 skipped)'. Pure."""
        return f"{len(self.passed)}/{self.total}{self.note()}"

    def note(self, names: bool = False) -> str:
        """' (1 skipped, 2 failed)', naming them when `names`; '' when all passed. Pure."""
        parts = []
        for word, group in (("skipped", self.skipped), ("failed", self.failed)):
            if group:
                parts.append(f"{len(group)} {word}" + (f": {', '.join(group)}" if names else ""))
        return f" ({'; '.join(parts)})" if parts else ""


def junit_tally(junit: Path, files: tuple[str, ...], prefixes: tuple[str, ...] = ("",)) -> Tally:
    """The outcomes of the test cases whose class path names one of `files` and whose name
    starts with one of `prefixes`, by test name. A skipped case counts in the total, never as
    passed. Read-only."""
    passed: list[str] = []
    failed: list[str] = []
    skipped: list[str] = []
    if not junit.exists():
        return Tally()
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        if not any(f in classname for f in files) or not name.startswith(prefixes):
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif case.find("skipped") is not None:
            skipped.append(name)
        else:
            passed.append(name)
    return Tally(tuple(passed), tuple(failed), tuple(skipped))


def _param(name: str) -> str:
    """The parameter id of a test name: 'test_x[azure]' -> 'azure'. Pure."""
    return name[name.index("[") + 1 : -1] if "[" in name else name


def crash_rows(crash: dict[str, Any], tests: Tally) -> list[tuple[str, str]]:
    """The crash-point rows. A provider whose test was skipped, or failed before recording its
    points, shows by name; its points are counted in no survived figure. Pure."""
    if not crash and not tests.total:
        return []
    missing = Tally(
        failed=tuple(p for p in map(_param, tests.failed) if p not in crash),
        skipped=tuple(map(_param, tests.skipped)),
    )
    survived = sum(int(v["survived"]) for v in crash.values())
    points = sum(int(v["points"]) for v in crash.values())
    each = ", ".join(f"{k} {v['survived']}/{v['points']}" for k, v in sorted(crash.items()))
    each += "".join(f", {p} skipped" for p in missing.skipped)
    each += "".join(f", {p} failed" for p in missing.failed)
    rows = [("crash points survived (SIGKILL, then `down`)", f"{survived}/{points} ({each})")]
    leaks = sum(int(v["leaks"]) for v in crash.values())
    rows.append(("leaks found after `down`", f"{leaks}{missing.note(names=True)}"))
    ok = sum(1 for v in crash.values() if v.get("ledgerless_down"))
    n = len(crash) + len(missing.skipped) + len(missing.failed)
    rows.append(
        ("`down` with the ledger file deleted", f"{ok}/{n} providers clean{missing.note()}")
    )
    return rows


def table(
    data: dict[str, dict[str, Any]], tallies: dict[str, Tally] | None = None
) -> list[tuple[str, str]]:
    """The README rows (figure, value) from the report and the JUnit tallies per suite
    ("crash", "preemption", "flaky", "hostile"). Skipped tests show, and never as passed. Pure."""
    tallies = tallies or {}
    rows: list[tuple[str, str]] = crash_rows(data.get("crash", {}), tallies.get("crash", Tally()))
    pre = data.get("preemption", {})
    pre_tests = tallies.get("preemption", Tally())
    if pre or pre_tests.total:
        recovered = sum(1 for v in pre.values() if v.get("recovered"))
        total = max(pre_tests.total, len(pre))
        new = ", ".join(f"{k} {v.get('new_nodes')}" for k, v in sorted(pre.items()))
        rows.append(
            (
                "preemptions recovered",
                f"{recovered}/{total}{pre_tests.note()} (new nodes: {new})",
            )
        )
    flaky = data.get("flaky", {})
    flaky_note = tallies.get("flaky", Tally()).note(names=True)
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
    if flaky_note:
        rows.append(("flaky-cloud tests not passed", flaky_note.strip(" ()")))
    hostile = tallies.get("hostile", Tally())
    if hostile.total:
        cases = data.get("hostile", {})
        through_run = sum(1 for v in cases.values() if v.get("command") == "run")
        rows.append(
            (
                "bad inputs rejected (one line, nothing created)",
                f"{hostile.ratio()}; {through_run} of them through `run`",
            )
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
        tallies = {
            suite: junit_tally(junit, files, prefixes)
            for suite, (files, prefixes) in TALLIES.items()
            if suite in args.only
        }
    print(json.dumps(data, indent=1, sort_keys=True))
    for suite, tally in tallies.items():
        print(f"{suite}: {len(tally.passed)}/{tally.total}{tally.note(names=True)}")
    print("\n| figure | value |\n|---|---|")
    for figure, value in table(data, tallies):
        print(f"| {figure} | {value} |")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
