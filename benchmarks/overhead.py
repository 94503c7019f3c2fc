"""What `cloudtrain run` adds around a short job on local, and where those seconds go (issue 20).

How: the digits-multiworker example at its default length (its job.yaml's entrypoint, `python
train.py --epochs 4`, about 12 s of training on a quiet 2-core machine) with 3 workers
(MultiWorkerMirrored), run in `--repeat` pairs (default 5) whose order alternates (a b, b a, ...):

  a. `cloudtrain run job.yaml --json` (the installed console script) on the local provider. The
     job.yaml is the example's own (its `setup` line included) with `workers: 3`, the example
     folder as workdir, and the entrypoint and the setup line each wrapped in `date` stamps (a few
     ms of bash). Wall time from spawn to exit.
  b. the same job launched by hand (`_common.run_by_hand`): the example copied to a temp folder,
     the same command with the same arguments started once per worker, a hand-written
     TF_CONFIG for 3 workers on free loopback ports, TF_USE_LEGACY_KERAS=1, PYTHONUNBUFFERED=1
     and TF_CPP_MIN_LOG_LEVEL as the agent sets it (1 unless the environment sets it). Wall
     time from the first spawn to the last exit. It does NOT run the job's `setup` line (`python
     -c 'import sklearn' || pip install ...`): a user launching by hand does not re-check that
     sklearn imports. (a) pays for it; its stamps (and the trace's `setup` phase) show what it
     costs, printed apart together with the added seconds without it.

Figures: `overhead_ratio` is the median of the paired ratios a/b (goal <= 1.05) and
`overhead_added_s` the median of the paired differences a - b (goal <= 0.5 s); the two runs of a
pair are neighbours in time, so a drift in the host's load cancels out. From the `date` stamps
(independent of the trace): the medians of (a)'s spawn to the first worker's entrypoint start (plan,
bucket, bundle, boot, rendezvous, setup), the training (first start to last end), the last end to
exit (end detection, teardown), the setup line (the slowest worker's) and a worker's setup end to
its entrypoint start (the agent's wait for the setup process and the launch). From the trace: after
each (a), `cloudtrain status RUN --json`'s "trace" (`cloudtrain/trace_view.to_json`) gives the run's
breakdown into `trace_view.PHASES`; the median seconds of each phase over the runs are printed as
`overhead_phase_<phase>_s` (and the trace's coverage of the wall time). A run whose status has no
trace (before the controller records one) prints "no trace" instead.

`benchmarks/local_vs_plain.py` is the older, longer comparison (2 workers, 40 epochs, target
1.10), kept for the figure the README quotes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    EXAMPLES,
    bench_home,
    cloudtrain_run,
    cloudtrain_status,
    figure,
    info,
    median,
    result,
    run_by_hand,
)

EXAMPLE = EXAMPLES / "digits-multiworker"
GOAL_RATIO = 1.05
GOAL_ADDED_S = 0.5
SETUP_PHASE = "setup"
TRAINING_PHASE = "training"


def example_job() -> dict[str, Any]:
    """The example's job.yaml as a dict (reads the file)."""
    data = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    if not isinstance(data, dict) or not isinstance(data.get("entrypoint"), str):
        raise SystemExit(f"{EXAMPLE / 'job.yaml'} has no entrypoint")
    return data


def command(entrypoint: str, epochs: int | None) -> list[str]:
    """The entrypoint as argv (`--epochs` replaced when `epochs` is given). Pure. SystemExit for
    an entrypoint a hand launch could not run the same way (shell syntax)."""
    argv = shlex.split(entrypoint)
    if any(tok in ("|", "&&", "||", ";", ">", "<") for tok in argv):
        raise SystemExit(f"the example's entrypoint is not a plain command: {entrypoint!r}")
    if epochs is not None:
        if "--epochs" not in argv:
            raise SystemExit(f"--epochs given but the entrypoint has none: {entrypoint!r}")
        argv[argv.index("--epochs") + 1] = str(epochs)
    return argv


def write_job(
    path: Path, base: dict[str, Any], argv: list[str], workers: int, stamps: Path
) -> Path:
    """The example's job with `workers` workers, its folder as workdir, and `argv` wrapped in
    start/end `date` stamps (per worker, in `stamps`) as the entrypoint. Writes `path`."""
    job = dict(base)
    job["name"] = "bench-overhead"
    job["cluster"] = {**base.get("cluster", {}), "workers": workers}
    job["workdir"] = str(EXAMPLE)
    job["entrypoint"] = stamped(shlex.join(argv), stamps, "")
    if base.get("setup"):
        job["setup"] = stamped(str(base["setup"]), stamps, "setup-")
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def stamped(command: str, stamps: Path, prefix: str) -> str:
    """`command` between two `date` stamps, `<stamps>/<prefix>start-<index>` and `...end-...`
    (a few ms of bash), keeping its exit code. Pure."""
    return (
        f"date +%s.%N > {stamps}/{prefix}start-$CLOUDTRAIN_INDEX; {{ {command}; }}; "
        f"rc=$?; date +%s.%N > {stamps}/{prefix}end-$CLOUDTRAIN_INDEX; exit $rc"
    )


def _stamps(stamps: Path, name: str) -> dict[str, float]:
    return {p.name.rsplit("-", 1)[1]: float(p.read_text()) for p in stamps.glob(f"{name}-*")}


def stamp_phases(stamps: Path, t0: float, t1: float) -> dict[str, float] | None:
    """(a)'s phases from the workers' `date` stamps: "to entrypoint" (spawn to the first
    entrypoint start), "training" (to the last end), "after" (to exit), "spread" (how far apart
    the entrypoints started) and, with a setup line, "setup" (the longest of the workers') and
    "setup to launch" (the longest from a worker's setup end to its entrypoint start); None
    without stamps. Removes the stamps."""
    try:
        starts, ends = _stamps(stamps, "start"), _stamps(stamps, "end")
        if not starts or not ends:
            return None
        start, end = min(starts.values()), max(ends.values())
        found = {
            "to entrypoint": start - t0,
            "training": end - start,
            "after": t1 - end,
            "spread": max(starts.values()) - start,
        }
        setup_starts, setup_ends = _stamps(stamps, "setup-start"), _stamps(stamps, "setup-end")
        if setup_ends:
            found["setup"] = max(e - setup_starts.get(i, e) for i, e in setup_ends.items())
            found["setup to launch"] = max(starts.get(i, e) - e for i, e in setup_ends.items())
        return found
    except ValueError:
        return None
    finally:
        for p in stamps.iterdir():
            p.unlink()


def trace_breakdown(status: dict[str, Any]) -> tuple[dict[str, float], float | None] | None:
    """The "trace" of a `status --json` object: ({phase: seconds} in breakdown order, its
    coverage), or None when there is no trace (not recorded yet, or not of that shape). Pure."""
    trace = status.get("trace")
    if not isinstance(trace, dict) or not isinstance(trace.get("breakdown"), list):
        return None
    phases: dict[str, float] = {}
    for row in trace["breakdown"]:
        if not isinstance(row, dict) or not isinstance(row.get("seconds"), (int, float)):
            return None
        phases[str(row.get("phase"))] = float(row["seconds"])
    covered = trace.get("covered")
    if not phases:
        return None
    return phases, float(covered) if isinstance(covered, (int, float)) else None


def slug(phase: str) -> str:
    """A phase name as part of a figure name ("end detection" -> "end_detection"). Pure."""
    return "".join(c if c.isalnum() else "_" for c in phase)


def report_trace(traces: list[tuple[dict[str, float], float | None]], runs: int) -> None:
    """Print the median seconds per breakdown phase over the traced runs (or "no trace")."""
    if not traces:
        info(f"trace breakdown: no trace (`cloudtrain status RUN --json` of 0/{runs} runs had one)")
        return
    order: list[str] = []
    for phases, _ in traces:
        order += [p for p in phases if p not in order]
    medians = {p: median([t[p] for t, _ in traces if p in t]) for p in order}
    info(
        f"trace breakdown, median of {len(traces)}/{runs} runs: "
        + ", ".join(f"{p} {s:.2f} s" for p, s in medians.items())
    )
    outside = sum(s for p, s in medians.items() if p != TRAINING_PHASE)
    info(f"outside the training phase (sum of medians): {outside:.2f} s")
    for p, s in medians.items():
        figure(f"overhead_phase_{slug(p)}_s", s, n=len(traces))
    coverage = [c for _, c in traces if c is not None]
    if coverage:
        info(f"spans cover {100 * median(coverage):.1f} % of the run's wall time (median)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="pairs of runs")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--epochs", type=int, default=None, help="override the example's entrypoint's --epochs"
    )
    args = parser.parse_args()

    base = example_job()
    argv = command(base["entrypoint"], args.epochs)
    info(f"job: {shlex.join(argv)}, {args.workers} workers; setup (a only): {base.get('setup')!r}")
    with bench_home("overhead") as tmp:
        stamps = tmp / "stamps"
        stamps.mkdir()
        job = write_job(tmp / "job.yaml", base, argv, args.workers, stamps)
        a_times: list[float] = []
        b_times: list[float] = []
        splits: list[dict[str, float]] = []
        traces: list[tuple[dict[str, float], float | None]] = []
        for i in range(args.repeat):
            # alternate which goes first, so a drift in the host's load favours neither
            plain_first = i % 2 == 1
            if plain_first:
                b_times.append(run_by_hand(tmp / f"plain-{i}", EXAMPLE, argv, args.workers))
            t0 = time.time()
            wall, data = cloudtrain_run(job, tmp / "cloudtrain.log")
            a_times.append(wall)
            split = stamp_phases(stamps, t0, t0 + wall)
            if not plain_first:
                b_times.append(run_by_hand(tmp / f"plain-{i}", EXAMPLE, argv, args.workers))
            run_id = str(data.get("run_id") or "")
            status = cloudtrain_status(run_id, tmp / "status.log") if run_id else {}
            trace = trace_breakdown(status)
            if split:
                splits.append(split)
            shown = ", ".join(f"{k} {v:.2f} s" for k, v in split.items()) if split else "no stamps"
            if trace:
                traced = ", ".join(f"{k} {v:.2f}" for k, v in trace[0].items())
            else:
                traced = "no trace" if status else "no trace (`status --json` failed)"
            first = "b first" if plain_first else "a first"
            info(
                f"pair {i + 1} ({first}): a cloudtrain {wall:.2f} s ({shown}); "
                f"b by hand {b_times[-1]:.2f} s; added {wall - b_times[-1]:+.2f} s"
            )
            info(f"  run {run_id or '?'} trace: {traced}")
            if trace:
                traces.append(trace)

        a, b = median(a_times), median(b_times)
        added = median([x - y for x, y in zip(a_times, b_times, strict=True)])
        ratio = median([x / y for x, y in zip(a_times, b_times, strict=True)])
        info(f"median a={a:.2f} s, b={b:.2f} s")
        figure("overhead_local_wall_s", a, n=len(a_times))
        figure("overhead_by_hand_wall_s", b, n=len(b_times))
        for key in ("to entrypoint", "training", "after", "setup", "setup to launch"):
            values = [s[key] for s in splits if key in s]
            if values:
                figure(f"overhead_stamp_{slug(key)}_s", median(values), n=len(values))
        if not splits:
            info("date stamps: none found (the entrypoint's stamps were not written)")
        stamped_setups = [s["setup"] for s in splits if "setup" in s]
        if stamped_setups:
            setup = median(stamped_setups)
            info(
                f"the job's setup line, which (b) skips, takes {setup:.2f} s by its stamps "
                f"(the slowest worker's); added seconds without it: {added - setup:.2f} s"
            )
        report_trace(traces, len(a_times))
        setups = [t[SETUP_PHASE] for t, _ in traces if SETUP_PHASE in t]
        if setups:
            setup = median(setups)
            figure("overhead_setup_s", setup, n=len(setups))
            info(
                f"the trace's setup phase (the job's setup line, which (b) skips, and the "
                f"launch) takes {setup:.2f} s; added seconds without it: {added - setup:.2f} s"
            )
        ok = result(
            "overhead_ratio", ratio, GOAL_RATIO, stat="paired_median", n=args.repeat, digits=3
        )
        ok = (
            result("overhead_added_s", added, GOAL_ADDED_S, stat="paired_median", n=args.repeat)
            and ok
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
