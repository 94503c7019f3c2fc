"""The reliability figures the tests measure, for `benchmarks/reliability.py` and the README.

`record(section, key, **figures)` merges one row into `$CLOUDTRAIN_RELIABILITY_OUT` (a JSON file)
when that variable is set, and does nothing otherwise. Rows are keyed by (section, key), so a
rerun replaces its row. Safe across pytest processes (the file is rewritten atomically).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

REPORT_ENV = "CLOUDTRAIN_RELIABILITY_OUT"


def record(section: str, key: str, **figures: Any) -> None:
    """Merge the row `figures` under section/key into the report file, if one is configured."""
    target = os.environ.get(REPORT_ENV)
    if target:
        merge(target, section, key, **figures)


def merge(target: str | Path, section: str, key: str, **figures: Any) -> None:
    """Merge the row `figures` under section/key into the JSON file `target` (created if
    missing), under a lock and atomically: safe across processes, a rerun replaces its row."""
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
        data.setdefault(section, {})[key] = figures
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)


def load(path: Path) -> dict[str, dict[str, Any]]:
    """The report as written (empty if missing)."""
    return json.loads(path.read_text()) if path.exists() else {}
