"""Measure how fast `cloudtrain --help` answers, and that the CLI's start-up stays light.

How: run the installed console script (the one pip put next to this interpreter, not a shim) as
a subprocess, once to warm up, then `--repeat` times (default 10), timing each run's wall clock
from spawn to exit; report the median. Target <= 0.25 s. The warm-up is timed too
(`help_first_run_wall_s`): it compiles every module into the empty bytecode cache, as the first
command after a fresh install does. Runs use bytecode caching as a user's
shell does (the cache lives in the temp dir). The child's CPU time is printed too: unlike the
wall time, it hardly moves when other work competes for the cores.

Also, in a fresh interpreter: `import cloudtrain.cli.main` and list `sys.modules`, and run
`python -X importtime <console script> --help`; neither may load TensorFlow, tf-keras/keras,
boto3/botocore, google.cloud/google.api_core or azure. The slowest imports are printed to show
what the start-up time is made of, with a bare `python -c pass` as the floor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _common import (
    bench_home,
    cli_env,
    console_script,
    figure,
    heavy_modules,
    import_report,
    info,
    median,
    result,
    timed_run,
    timed_runs,
)

TARGET_S = 0.25


def modules_after_import(module: str) -> list[str]:
    """Every module in sys.modules after importing `module` in a fresh interpreter."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return list(json.loads(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    with bench_home("help") as tmp:
        env = cli_env(tmp)
        script = console_script()
        # the first run fills the empty bytecode cache, as a fresh install's first command does
        first, _ = timed_run([str(script), "--help"], env)
        walls, cpu = timed_runs([str(script), "--help"], args.repeat, env, warmup=0)
        floor, _ = timed_runs([sys.executable, "-c", "pass"], 5, env)
        info(f"{script} --help: wall min {min(walls):.3f} s, max {max(walls):.3f} s")
        info(f"CPU time (user+sys) median {median(cpu):.3f} s")
        info(f"floor: `python -c pass` wall median {median(floor):.3f} s")

        heavy_import = heavy_modules(modules_after_import("cloudtrain.cli.main"))
        heavy = sorted(
            set(heavy_import) | set(import_report([str(script), "--help"], env, "--help"))
        )
        info(f"heavy modules loaded by `import cloudtrain.cli.main` / `--help`: {heavy or 'none'}")

        figure("help_first_run_wall_s", first, stat="once")
        figure("help_cpu_s", median(cpu), n=len(cpu))
        ok = result("help_wall_s", median(walls), TARGET_S, n=len(walls))
        ok &= result("help_heavy_imports", len(heavy), 0, op="==", stat="count")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
