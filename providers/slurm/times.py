"""Slurm's times, read without guessing the cluster's zone.

Slurm's client commands print times (squeue's %S and %V, `sbatch --test-only`'s "to start at")
as ISO 8601 without a zone, in the local time of the process that prints them (localtime(3), so
the TZ of the login host's shell: Slurm's src/common/parse_time.c slurm_make_time_str). A login
host in another zone than this machine would be read hours off (an estimate "in 5 hours" for a
job starting now, a job submitted "in the future" for gc). So the commands whose times are read
run under TZ=UTC0 (`in_utc`: through env(1), which any login shell runs, csh's too), their
times are read as UTC (`utc_time`) and shown in this machine's zone (`shown`). Never for the
`sbatch` that submits: the job would inherit TZ (--export=ALL), the user's code its zone. Pure.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

# by its path: a login shell's PATH may lack it (env(1) is at /usr/bin/env on every Linux,
# NixOS's included); POSIX TZ "UTC0" needs no zoneinfo on the cluster
UTC_ENV = ("/usr/bin/env", "TZ=UTC0")


def in_utc(command: Sequence[str]) -> list[str]:
    """`command` run with TZ=UTC0. Pure."""
    return [*UTC_ENV, *command]


def utc_time(text: str) -> datetime.datetime | None:
    """A time a command run `in_utc` printed, as an aware UTC datetime; None for Slurm's
    "N/A", "Unknown" or anything else that is not an ISO time. Pure."""
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is not None:
        return when.astimezone(datetime.timezone.utc)
    return when.replace(tzinfo=datetime.timezone.utc)


def shown(when: datetime.datetime) -> str:
    """`when` in this machine's zone, named: "2026-11-30 09:15:00 CET". Pure."""
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").strip()
