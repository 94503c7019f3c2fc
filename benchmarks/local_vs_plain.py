"""Measure what `cloudtrain run` (local provider) costs over launching the same training by hand.

How: the digits-multiworker example (`train.py --epochs N`, 2 workers, MultiWorkerMirrored) is
run in two ways, in pairs (a b, b a, a b, ...), `--repeat` pairs (default 5):

  a. `cloudtrain run job.yaml --json` (the installed console script) on the local provider, with
     a job.yaml written to the temp dir whose workdir is the example folder. Wall time from
     spawn to exit: plan, bucket, bundle, node boot, rendezvous, training, teardown.
  b. a plain launcher (`_common.run_by_hand`): copy the example folder, pick two free loopback
     ports, start `python train.py --epochs N` twice with a hand-written TF_CONFIG, plus
     TF_USE_LEGACY_KERAS=1, TF_CPP_MIN_LOG_LEVEL=1 (the agent's default too) and
     CLOUDTRAIN_CHECKPOINT_DIR / CLOUDTRAIN_MODEL_DIR pointing at per-worker temp folders, and
     wait for both. Wall time from the first spawn to the last exit.

The figure is the median over pairs of a/b (target <= 1.10): the two runs of a pair are
neighbours in time, so a drift in the host's load (on a shared 2-vCPU VM one run of the same job
varies by 30%) cancels out; the medians of a and b are printed too. For (a) the entrypoint is
wrapped in `date` stamps, so each run also prints its phases: spawn to entrypoint start (plan,
bucket, bundle, boot, rendezvous), the training itself, and entrypoint end to exit (chief
detection, teardown); `local_fixed_overhead_s` is the median of before + after, the time
cloudtrain adds around a job of any length. The default `--epochs` (40) makes one run last about
30 s on a quiet 2-core machine.

`benchmarks/overhead.py` is issue 20's measurement: 3 workers, the example's default length,
the paired added seconds and the trace's breakdown.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import (
    EXAMPLES,
    bench_home,
    cloudtrain_run,
    figure,
    info,
    median,
    result,
    run_by_hand,
    write_job,
)

TARGET_RATIO = 1.10
EXAMPLE = EXAMPLES / "digits-multiworker"


def stamped(epochs: int, stamps: Path) -> str:
    """The entrypoint for (a): train.py wrapped in start/end timestamps (a few ms of bash)."""
    return (
        f"date +%s.%N > {stamps}/start-$CLOUDTRAIN_INDEX; python train.py --epochs {epochs}; "
        f"rc=$?; date +%s.%N > {stamps}/end-$CLOUDTRAIN_INDEX; exit $rc"
    )


def phases(stamps: Path, t0: float, t1: float) -> tuple[str, float]:
    """Where run (a)'s time went (before the entrypoint, the entrypoint, after it), and the
    seconds cloudtrain added around the training (before + after)."""
    try:
        starts = [float(p.read_text()) for p in stamps.glob("start-*")]
        ends = [float(p.read_text()) for p in stamps.glob("end-*")]
        start, end = min(starts), max(ends)
    except ValueError:
        return "no timestamps", float("nan")
    finally:
        for p in stamps.iterdir():
            p.unlink()
    text = (
        f"to entrypoint {start - t0:.2f} s, training {end - start:.2f} s "
        f"(workers started {max(starts) - start:.2f} s apart), "
        f"entrypoint end to exit {t1 - end:.2f} s"
    )
    return text, (start - t0) + (t1 - end)


def run_plain(work: Path, epochs: int, workers: int = 2) -> float:
    """Two hand-launched MultiWorkerMirrored workers: wall seconds until both exit."""
    return run_by_hand(work, EXAMPLE, ["python", "train.py", "--epochs", str(epochs)], workers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="pairs of runs")
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()

    with bench_home("local-vs-plain") as tmp:
        stamps = tmp / "stamps"
        stamps.mkdir()
        job = write_job(
            tmp / "job.yaml", "bench-local-vs-plain", args.epochs, stamped(args.epochs, stamps)
        )
        a_times: list[float] = []
        b_times: list[float] = []
        fixed: list[float] = []
        for i in range(args.repeat):
            # alternate which goes first, so a drift in the host's load favours neither
            plain_first = i % 2 == 1
            if plain_first:
                b_times.append(run_plain(tmp / f"plain-{i}", args.epochs))
            t0 = time.time()
            wall, _ = cloudtrain_run(job, tmp / "cloudtrain.log")
            a_times.append(wall)
            split, added = phases(stamps, t0, t0 + wall)
            fixed.append(added)
            if not plain_first:
                b_times.append(run_plain(tmp / f"plain-{i}", args.epochs))
            info(f"pair {i + 1}: a cloudtrain {wall:.2f} s ({split}); b plain {b_times[-1]:.2f} s")
        a, b = median(a_times), median(b_times)
        paired = median(x / y for x, y in zip(a_times, b_times, strict=True))
        info(f"epochs {args.epochs}: median a={a:.2f} s, b={b:.2f} s, ratio of medians {a / b:.3f}")
        figure("local_run_wall_s", a, n=len(a_times))
        figure("plain_run_wall_s", b, n=len(b_times))
        figure("local_fixed_overhead_s", median(fixed), n=len(fixed))
        ok = result(
            "local_vs_plain_ratio",
            paired,
            TARGET_RATIO,
            stat="paired_median",
            n=args.repeat,
            digits=3,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
