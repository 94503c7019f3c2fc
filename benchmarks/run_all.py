"""Run every benchmark and print a markdown table of the figures for the README.

How: runs each benchmark script in turn as `python benchmarks/<name>.py` (its own process, its
own temp CLOUDTRAIN_HOME), echoing its output, then parses the result lines it printed:

    <figure> <stat>=<value> (n=<n>, target <op> <target>) PASS|FAIL   a figure with a target
    <figure> <stat>=<value> (n=<n>)                                    a supporting figure

and prints one table (figure, value, target, result). Exits 1 if any figure failed or any
script exited abnormally. `--only help_time plan_time` runs a subset; `--repeat N` is passed to
local_vs_plain and overhead (the paired runs, the longest). The whole run takes about 8 minutes
on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS: tuple[str, ...] = (
    "help_time",
    "plan_time",
    "fanout",
    "gce_fanout",
    "azure_fanout",
    "teardown_lag",
    "unit_timings",
    "ckpt_sync",
    "local_vs_plain",
    "overhead",
    "long_run",
    "slurm_ssh",
)
# long_run's old-design poll of the three-day run lists 413 pages (over 10 minutes on moto): run_all
# measures the current design only; `python benchmarks/long_run.py` measures both
EXTRA: dict[str, list[str]] = {"long_run": ["--old-polls", "0"]}
TIMEOUT_S = 900
PAIRED = ("local_vs_plain", "overhead")  # the scripts `--repeat` sets the pairs of

LINE_RE = re.compile(
    r"^(?P<figure>[A-Za-z0-9_.]+) (?P<stat>\w+)=(?P<value>\S+)"
    r"(?: \((?:n=(?P<n>\d+))?(?:, )?(?:target (?P<op><=|>=|==) (?P<target>\S+))?\))?"
    r"(?: (?P<verdict>PASS|FAIL))?$"
)


@dataclass
class Row:
    """One figure from one script."""

    script: str
    figure: str
    stat: str
    value: str
    n: str | None
    target: str | None
    verdict: str | None


def parse(script: str, output: str) -> list[Row]:
    """The figure lines of a script's output (indented lines are commentary)."""
    rows = []
    for line in output.splitlines():
        m = LINE_RE.match(line)
        if m:
            target = f"{m['op']} {m['target']}" if m["op"] else None
            rows.append(
                Row(script, m["figure"], m["stat"], m["value"], m["n"], target, m["verdict"])
            )
    return rows


def run(script: str, extra: list[str]) -> tuple[int, str, float]:
    """Run one benchmark, echoing its output: (exit code, output, seconds)."""
    print(f"\n## {script}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / f"{script}.py"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=HERE.parent,
    )
    assert proc.stdout is not None
    # on timeout, SIGINT (not SIGKILL) so the script's cleanup still stops what it started
    timer = threading.Timer(TIMEOUT_S, proc.send_signal, args=(signal.SIGINT,))
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
    return code, "".join(lines), time.perf_counter() - t0


def unit(figure: str) -> str:
    """The unit suffix implied by a figure's name."""
    return " s" if figure.endswith("_s") else ""


def table(rows: list[Row]) -> str:
    """The markdown table."""
    out = ["| figure | value | target | result |", "|---|---|---|---|"]
    for r in rows:
        n = f" (n={r.n})" if r.n else ""
        value = f"{r.value}{unit(r.figure)}{n}" if r.stat != "count" else r.value
        target = f"{r.target}{unit(r.figure)}" if r.target else "-"
        out.append(f"| `{r.figure}` {r.stat} | {value} | {target} | {r.verdict or '-'} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, help="run only these")
    parser.add_argument(
        "--repeat", type=int, default=None, help=f"pairs of runs for {' and '.join(PAIRED)}"
    )
    args = parser.parse_args()

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    rows: list[Row] = []
    broken: list[str] = []
    for script in args.only or SCRIPTS:
        extra = ["--repeat", str(args.repeat)] if args.repeat and script in PAIRED else []
        extra += EXTRA.get(script, [])
        code, output, seconds = run(script, extra)
        found = parse(script, output)
        print(f"({script}: {seconds:.1f} s, exit {code})", flush=True)
        rows += found
        if code != 0 and not any(r.verdict == "FAIL" for r in found):
            broken.append(f"{script} (exit {code})")
    total = time.perf_counter() - started
    load_after = os.getloadavg()[0]

    print("\n" + table(rows))
    failed = [r.figure for r in rows if r.verdict == "FAIL"]
    print(
        f"\n{len(rows)} figures, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
        f"{total:.0f} s in all; load average {load_before:.2f} before, {load_after:.2f} after "
        f"({len(os.sched_getaffinity(0))} CPUs)"
    )
    if broken:
        print(f"scripts that did not finish cleanly: {', '.join(broken)}")
    return 1 if failed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
