"""Measure how fast `cloudtrain plan` prices a job, and that planning loads no TF or cloud SDK.

How: run the installed console script `cloudtrain plan <job.yaml>` as a subprocess on the
digits-multiworker example (a copy of its job.yaml written to the temp dir if the example has
none yet), once to warm up, then `--repeat` times (default 10); report the median wall time.
Target <= 0.5 s. The warm-up is timed too (`plan_first_run_wall_s`: the first command after a
fresh install, which compiles every module into the empty bytecode cache). Runs use bytecode
caching as a user's shell does (the cache lives in the temp dir); the child's CPU time is
printed too (`plan_cpu_s`), as it is insensitive to competing load.

Also runs `python -X importtime <console script> plan <job.yaml>` and checks that no module of
TensorFlow, tf-keras/keras, boto3/botocore, google.cloud/google.api_core or azure was imported;
the slowest imports are printed to show where the time goes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import (
    EXAMPLES,
    bench_home,
    cli_env,
    console_script,
    figure,
    import_report,
    info,
    median,
    result,
    timed_run,
    timed_runs,
)

TARGET_S = 0.5
FALLBACK_JOB = """\
name: digits-multiworker
cluster:
  strategy: multi_worker_mirrored
  workers: 2
workdir: {workdir}
entrypoint: python train.py --epochs 4
max_hours: 0.5
max_cost_usd: 5
"""


def job_file(tmp: Path) -> Path:
    """The example's job.yaml, or an equivalent one written into `tmp`."""
    example = EXAMPLES / "digits-multiworker"
    if (example / "job.yaml").is_file():
        return example / "job.yaml"
    path = tmp / "job.yaml"
    path.write_text(FALLBACK_JOB.format(workdir=example))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    with bench_home("plan") as tmp:
        job = job_file(tmp)
        env = cli_env(tmp)
        cmd = [str(console_script()), "plan", str(job)]
        # the first run fills the empty bytecode cache, as a fresh install's first command does
        first, _ = timed_run(cmd, env)
        times, cpu = timed_runs(cmd, args.repeat, env, warmup=0)
        info(f"cloudtrain plan {job}: wall min {min(times):.3f} s, max {max(times):.3f} s")
        info(f"CPU time (user+sys) median {median(cpu):.3f} s")

        heavy = import_report(cmd, env, "plan")
        info(f"heavy modules loaded by `plan`: {heavy or 'none'}")

        figure("plan_first_run_wall_s", first, stat="once")
        figure("plan_cpu_s", median(cpu), n=len(cpu))
        ok = result("plan_wall_s", median(times), TARGET_S, n=len(times))
        ok &= result("plan_heavy_imports", len(heavy), 0, op="==", stat="count")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
