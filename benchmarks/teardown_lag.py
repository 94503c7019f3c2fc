"""Measure how long nodes outlive a finished job: the teardown lag of `cloudtrain run`.

How: run a short real job, the digits-multiworker example (2 workers, MultiWorkerMirrored,
`--epochs 2`), with `cloudtrain run <job.yaml> --json` on the local provider, `--repeat` times
(default 3). The JSON result carries `teardown_lag_s`: from the moment the controller sees the
chief's `succeeded` status to every node confirmed gone. Reports its median. Target <= 10 s.

Supporting figures: `teardown_s` (the teardown call alone) and the lag measured from the chief's
status file being written (its mtime in the bucket folder) to the last node's `deleted_at` in
the ledger, which adds the controller's detection delay (its poll interval) to the lag.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from pathlib import Path

from _common import HOME_ENV, bench_home, cloudtrain_run, figure, info, median, result, write_job

TARGET_S = 10.0


def lag_from_status(home: Path, run_id: str) -> float | None:
    """Seconds from the chief's final status write to the last node deletion in the ledger."""
    status = home / "buckets" / "local" / "cloudtrain" / "runs" / run_id / "status"
    chief = status / "chief-0.json"
    if not chief.exists():
        chief = status / "worker-0.json"
    if not chief.exists() or json.loads(chief.read_text()).get("state") != "succeeded":
        return None
    with sqlite3.connect(home / "ledger.db") as db:
        row = db.execute(
            "SELECT MAX(deleted_at) FROM resources WHERE run_id = ? AND kind = 'node'", (run_id,)
        ).fetchone()
    if not row or row[0] is None:
        return None
    return float(row[0]) - chief.stat().st_mtime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    with bench_home("teardown") as tmp:
        home = Path(os.environ[HOME_ENV])
        job = write_job(tmp / "job.yaml", "bench-teardown", args.epochs)
        lags: list[float] = []
        calls: list[float] = []
        from_status: list[float] = []
        for i in range(args.repeat):
            wall, data = cloudtrain_run(job, tmp / "cloudtrain.log")
            lag = data.get("teardown_lag_s")
            if lag is None:
                raise SystemExit(f"no teardown_lag_s in the result: {data}")
            lags.append(float(lag))
            calls.append(float(data.get("teardown_s") or 0.0))
            extra = lag_from_status(home, str(data["run_id"]))
            if extra is not None:
                from_status.append(extra)
            shown = f"{extra:.2f} s" if extra is not None else "n/a"
            info(
                f"run {i + 1}: wall {wall:.1f} s, teardown_lag_s {lags[-1]:.2f}, "
                f"teardown_s {calls[-1]:.2f}, status-write -> last node gone {shown}"
            )
        figure("teardown_call_s", median(calls), n=len(calls))
        if from_status:
            figure("teardown_lag_from_status_s", median(from_status), n=len(from_status))
        ok = result("teardown_lag_s", median(lags), TARGET_S, n=len(lags))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
