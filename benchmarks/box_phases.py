"""Where a run's time goes on local and on each cloud box, phase by phase (issue 20's README
table), with the fakes' latency that shaped each box's figures.

How: one run of the digits-multiworker example's own job.yaml (2 workers, `python train.py
--epochs 4`, its `setup` line included) in each place:

  local: `cloudtrain run job.yaml --json` (the installed console script) on the local provider,
     then `cloudtrain status RUN --json`'s "trace";
  aws / gcp / azure box: the boxes' main end-to-end test (`test_run_on_<cloud>_trains_for_real_
     and_leaves_nothing`: the real CLI against moto, the GCE fake + GCS emulator, the ARM fake +
     Azurite, with the VMs booted as local process sessions by tests/fakes/boot_harness.py),
     through pytest with `$CLOUDTRAIN_PHASES_OUT` set: each test checks its run's trace
     (tests/e2e/trace_kit.assert_traced) and writes its breakdown and its fakes' settings there
     (tests/e2e/phases_report.py). Each box test's plan first meets a full zone (scripted), so
     its provisioning includes one failed zone.

Prints one table, phase x (local, aws box, gcp box, azure box) in seconds (the breakdown of
cloudtrain/insight/trace_view.py: its phases add up to the traced wall time, the CLI's start to its
teardown's end), with the CLI's wall time as seen from outside, the trace's coverage and the
1-minute load average when each run ended; then one line per box stating its fakes' latency. A
figure line per place and phase (`box_phases_<place>_<phase>_s value=...`, no target: these
are descriptions, the local budgets are `overhead.py`'s). A box whose test failed or skipped
shows so in its column; the script exits 1 if a test failed.

One run per place: the figures move with the machine's load (each column states its own).
About 3 minutes on a quiet 2-core machine. `--only local aws gcp azure` runs a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from _common import EXAMPLES, REPO, bench_home, cloudtrain_run, cloudtrain_status, figure, info

sys.path.insert(0, str(REPO))

from cloudtrain.insight.trace_view import PHASES
from tests.e2e.phases_report import PHASES_ENV, SECTION, compact

PLACES = ("local", "aws", "gcp", "azure")
JOB = EXAMPLES / "digits-multiworker" / "job.yaml"
BOOT_STEPS = ("driver", "python", "bundle")  # the startup script's phases (jobs/trace.py)


def box_test(cloud: str) -> str:
    """The pytest node id of a box's main end-to-end run. Pure."""
    return (
        f"tests/e2e/test_{cloud}_in_a_box.py::"
        f"test_run_on_{cloud}_trains_for_real_and_leaves_nothing"
    )


def run_local(tmp: Path) -> dict[str, Any]:
    """One local run of the job; its row as phases_report writes a box's. Blocks."""
    from cloudtrain.jobspec.run_options import RunOptions

    spawned = time.time()
    _, data = cloudtrain_run(JOB, tmp / "local.log")
    exited = time.time()
    run_id = str(data.get("run_id") or "")
    trace = cloudtrain_status(run_id, tmp / "status.log").get("trace") or {}
    if not trace.get("breakdown"):
        raise SystemExit(f"local run {run_id or '?'}: `status --json` has no trace")
    (root,) = [s for s in trace["spans"] if s["name"] == "run" and not s["node"]]
    return {
        "breakdown": {p["phase"]: p["seconds"] for p in trace["breakdown"]},
        "wall_s": trace["wall_s"],
        "cli_s": round(exited - spawned, 3),
        "head_s": round(root["start"] - spawned, 3),
        "tail_s": round(exited - root["end"], 3),
        "covered": trace["covered"],
        "load": round(os.getloadavg()[0], 2),
        "spans": compact(trace["spans"]),
        "fakes": {
            "nodes": "process sessions on this machine, no cloud and no fake",
            "controller_poll_s": RunOptions.for_provider("local").poll_s,
        },
    }


def run_boxes(clouds: list[str], tmp: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Run the boxes' main tests through pytest with the phases file set: (their rows by cloud,
    the outcome of each test: passed, failed or skipped). Blocks."""
    out, junit = tmp / "phases.json", tmp / "junit.xml"
    env = dict(os.environ, **{PHASES_ENV: str(out)})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    proc = subprocess.run(
        [*cmd, *map(box_test, clouds)], cwd=REPO, env=env, capture_output=True, text=True
    )
    outcomes = junit_outcomes(junit, clouds)
    if proc.returncode not in (0, 1):  # 1: a test failed (reported per column)
        info(proc.stdout[-3000:] + proc.stderr[-2000:])
    for cloud, outcome in outcomes.items():
        if outcome == "failed":
            info(f"{cloud} box test failed:\n{proc.stdout[-4000:]}")
            break
    rows = json.loads(out.read_text()).get(SECTION, {}) if out.exists() else {}
    return {c: rows[f"{c} box"] for c in clouds if f"{c} box" in rows}, outcomes


def junit_outcomes(junit: Path, clouds: list[str]) -> dict[str, str]:
    """Each cloud's test outcome from the JUnit report ("missing" if it has none). Read-only."""
    found = {c: "missing" for c in clouds}
    if not junit.exists():
        return found
    for case in ET.parse(junit).getroot().iter("testcase"):
        for cloud in clouds:
            if f"test_{cloud}_in_a_box" in case.get("classname", "") and case.get(
                "name", ""
            ).startswith("test_run_on_"):
                bad = case.find("failure") is not None or case.find("error") is not None
                skipped = case.find("skipped") is not None
                found[cloud] = "failed" if bad else "skipped" if skipped else "passed"
    return found


def boot_step(row: dict[str, Any], step: str) -> float | None:
    """The slowest node's seconds in the startup script's phase `step`. Pure."""
    found = [sp[5] for sp in row.get("spans", []) if sp[0] and sp[1] == "boot" and sp[2] == step]
    return max(found) if found else None


def chief_step(row: dict[str, Any], step: str) -> float | None:
    """The chief's (worker-0's) seconds in its last attempt's `step` span. Pure."""
    found = [sp for sp in row.get("spans", []) if sp[0] == "worker-0" and sp[2] == step]
    return max(found, key=lambda sp: sp[3])[5] if found else None


def failed_zones(row: dict[str, Any]) -> float | None:
    """Seconds of the controller's "create" phase before its first recorded create call: the
    zones that had no room (their failed creates record no span, so the breakdown counts
    them in "start"). Pure."""
    spans = row.get("spans", [])
    top = [sp[4] for sp in spans if not sp[0] and sp[1] == "run" and sp[2] == "create"]
    calls = [sp[4] for sp in spans if not sp[0] and sp[1] == "create"]
    return max(0.0, min(calls) - min(top)) if top and calls else None


def _cell(row: dict[str, Any] | None, value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if row is None or value is None else fmt.format(value)


def table(rows: dict[str, dict[str, Any] | None], outcomes: dict[str, str]) -> list[str]:
    """The markdown table: a row per phase, then the traced and outside wall times, the
    coverage and the load; a column per place (a failed or skipped box says so). Pure."""
    places = [p for p in PLACES if p in rows or p in outcomes]
    heads = ["local" if p == "local" else f"{p} box" for p in places]
    lines = ["| phase (s) | " + " | ".join(heads) + " |", "|---" * (len(places) + 1) + "|"]

    def line(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def cells(get: Any, fmt: str = "{:.2f}") -> list[str]:
        out = []
        for p in places:
            row = rows.get(p)
            if row is None:
                out.append(outcomes.get(p, "-"))
            else:
                out.append(_cell(row, get(row), fmt))
        return out

    for name in PHASES:
        line(name, cells(lambda r, n=name: r["breakdown"].get(n)))
    for step in BOOT_STEPS:
        line(f"of boot: {step} (slowest node)", cells(lambda r, x=step: boot_step(r, x)))
    for step in ("first step", "after last step"):
        line(f"of training: {step} (chief)", cells(lambda r, x=step: chief_step(r, x)))
    line(
        "of start: create phase before its first create call (on a box: a full zone)",
        cells(lambda r: failed_zones(r)),
    )
    line("**traced wall** (CLI start to teardown end)", cells(lambda r: r["wall_s"]))
    line("CLI spawn to exit, as the test saw it", cells(lambda r: r.get("cli_s")))
    line("of which before the trace (to the process start)", cells(lambda r: r.get("head_s")))
    line("of which after the trace (summary, exit)", cells(lambda r: r.get("tail_s")))
    line("traced / spawn to exit", cells(lambda r: r["wall_s"] / r["cli_s"], "{:.1%}"))
    line("load average (1 min) at the end", cells(lambda r: r.get("load")))
    return lines


def fakes_line(place: str, fakes: dict[str, Any]) -> str:
    """'aws box: moto ...; harness_poll_s 0.3; ...' from a row's fakes settings. Pure."""
    said = [v for v in fakes.values() if isinstance(v, str)]  # descriptions, then the knobs
    parts = said + [f"{k} {v}" for k, v in fakes.items() if not isinstance(v, str)]
    return f"{place}: " + "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=PLACES, default=list(PLACES))
    args = parser.parse_args()
    rows: dict[str, dict[str, Any] | None] = {}
    outcomes: dict[str, str] = {}
    with bench_home("box-phases") as tmp:
        if "local" in args.only:
            info(f"local: cloudtrain run {JOB.relative_to(REPO)}")
            rows["local"] = run_local(tmp)
        clouds = [p for p in args.only if p != "local"]
        if clouds:
            info(f"boxes: pytest {' '.join(box_test(c).split('::')[1] for c in clouds)}")
            found, outcomes = run_boxes(clouds, tmp)
            rows.update({c: found.get(c) for c in clouds})
        info(f"load average at the end {os.getloadavg()[0]:.2f}")
    for place, row in rows.items():
        if row is None:
            continue
        figure(f"box_phases_{place}_wall_s", float(row["wall_s"]), stat="value")
        for name in PHASES:
            key = name.replace(" ", "_")
            figure(f"box_phases_{place}_{key}_s", float(row["breakdown"][name]), stat="value")
    print()
    print("\n".join(table(rows, outcomes)))
    print()
    for place, row in rows.items():
        if row is not None:
            print("- " + fakes_line("local" if place == "local" else f"{place} box", row["fakes"]))
    failed = [c for c, o in outcomes.items() if o in ("failed", "missing")]
    if failed:
        print(f"box test(s) failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
