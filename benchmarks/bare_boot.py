"""Bare Debian 12 boot, cold vs warm wheelhouse: the bootstrap's phases on a real Debian root.

Boots one node of `cloudtrain run --provider aws` (moto) twice against one fresh bucket, each
time as a plain Debian 12 machine booted as root (tests/fakes/debian_boot.py: a debootstrapped
bookworm, real apt, venv, pip, curl and agent):

1. cold: the bucket has no wheelhouse: the node apt-installs python3-venv, makes the venv, builds
   the pinned stack's wheels from the index (`pip wheel`), installs them and publishes the
   wheelhouse into the bucket;
2. warm: a new run on the same bucket: the node fetches that wheelhouse (one presigned GET,
   sha256-checked) and installs with no index.

Printed per boot, from the node's bootstrap log (cloudtrain/state/bootlog.py): apt, venv, fetch, pip
(the python phase's steps), bundle (fetch through the presigned URL, check, install the
cloudtrain wheel), agent start (the `phase agent: starting` line to the agent's registration in
the bucket, both to the second), and the whole boot (first log line to the registration).
The job is digits-mirrored for 1 epoch; its training is not counted.

Needs root, debootstrap and network access to deb.debian.org and PyPI; takes 3-6 minutes a
pair. Run: `python benchmarks/bare_boot.py [--repeat N]` (N cold+warm pairs, medians; the
wheelhouse is deleted from the bucket before each cold boot after the first). The README's
table "Bare Debian 12 boot" comes from it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import REPO, bench_home, console_script, figure, info, median

sys.path.insert(0, str(REPO))

REGION = "us-east-1"
STEPS = ("apt", "venv", "fetch", "pip")
_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) cloudtrain-bootstrap\[[^]]*\]: (.*)$")
_JOB = """\
name: bare-boot
cluster: {{strategy: mirrored, workers: 1, accelerator: "T4:1", image: {ami}}}
workdir: {workdir}
setup: python -c 'import sklearn' 2>/dev/null || python -m pip install -q scikit-learn==1.7.2
entrypoint: python train.py --epochs 1
max_hours: 0.5
"""


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def _first_line_at(log: str, prefix: str) -> float:
    for line in log.splitlines():
        m = _TIME_RE.match(line)
        if m and m.group(2).startswith(prefix):
            return _stamp(m.group(1))
    raise SystemExit(f"no bootstrap line starting {prefix!r} in the node's log:\n{log[-3000:]}")


def boot_figures(log: str, registered_at: float) -> dict[str, float]:
    """The phase figures of one boot from its bootstrap log and the agent's registration time."""
    from cloudtrain.state import bootlog

    parsed = bootlog.parse(log)
    steps = parsed.steps.get("python", {})
    out = {name: steps.get(name, 0.0) for name in STEPS}
    out["bundle"] = parsed.durations.get("bundle", float("nan"))
    out["agent start"] = registered_at - _first_line_at(log, "phase agent: starting")
    out["boot total"] = registered_at - _first_line_at(log, "start (deadline")
    return out


def run_once(label: str, job: Path, harness: Any, s3: Any, bucket: str) -> dict[str, float]:
    """One `cloudtrain run` whose single node boots the Debian root; its figures."""
    before = set(harness.boots)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(console_script()), "run", "--provider", "aws", "--region", REGION, str(job)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    wall = time.perf_counter() - t0
    (vm_id,) = set(harness.boots) - before
    disk = harness.disk(vm_id)
    log = (disk.upper / "opt/cloudtrain/bootstrap.log").read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{label} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{log}")
    run_id = re.search(r"cloudtrain run (\S+) on ", proc.stdout)
    assert run_id, proc.stdout[-2000:]
    key = f"cloudtrain/runs/{run_id.group(1)}/attempt-1/nodes/chief-0.json"
    registered = s3.head_object(Bucket=bucket, Key=key)["LastModified"].timestamp()
    figures = boot_figures(log, registered)
    for line in log.splitlines():
        if "wheelhouse" in line or line.split(": ", 1)[-1].startswith(("steps ", "durations ")):
            info(f"{label}: {line.split(': ', 1)[-1]}")
    info(f"{label}: cloudtrain run took {wall:.0f} s in all")
    disk.unmount()  # this boot's layers (GBs in memory) are no longer needed
    return figures


def medians(boots: list[dict[str, float]]) -> dict[str, float]:
    """Per figure, the median over `boots`."""
    return {name: median([b[name] for b in boots]) for name in boots[0]}


def table(cold: dict[str, float], warm: dict[str, float], n: int) -> str:
    """The markdown table of both kinds of boot, one row per phase (medians of `n` each)."""
    rows = [
        f"| phase (median of {n}) | cold (no wheelhouse) | warm (wheelhouse in the bucket) |",
        "|---|---|---|",
    ]
    for name in cold:
        rows.append(f"| {name} | {cold[name]:.0f} s | {warm[name]:.0f} s |")
    return "\n".join(rows)


def forget_wheelhouse(s3: Any, bucket: str) -> None:
    """Delete every wheelhouse from the bucket, so the next boot is cold again."""
    from cloudtrain.run import wheelhouse

    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=wheelhouse.ROOT)
    for page in pages:
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="cold+warm pairs (default 1)")
    args = parser.parse_args(argv)
    import boto3

    from cloudtrain.run import wheelhouse
    from tests.e2e.test_aws_in_a_box import _discover
    from tests.fakes.box_images import DEBIAN_12_AMI_PARAM
    from tests.fakes.debian_boot import DebianBootHarness
    from tests.fakes.moto_server import (
        CLEARED_ENV,
        HOST,
        TEST_ENV,
        moto_amis,
        seed_ssm_parameter,
        start_moto,
    )

    moto = start_moto()
    for name in CLEARED_ENV:
        os.environ.pop(name, None)
    os.environ.update(TEST_ENV, AWS_ENDPOINT_URL=moto.url, NO_PROXY=HOST, no_proxy=HOST)
    # a custom AMI's Python is unknown to cloudtrain: name the node's wheelhouse tag
    os.environ[wheelhouse.TAG_ENV] = wheelhouse.tag(
        "3.11", "x86_64", wheelhouse.stack_pins(gpu=False)
    )
    (ami,) = moto_amis(1)
    seed_ssm_parameter(DEBIAN_12_AMI_PARAM, ami, REGION)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto.url)
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto.url)
    bucket = f"cloudtrain-123456789012-{REGION}"
    try:
        with bench_home("bare-boot") as tmp:
            job = tmp / "job.yaml"
            workdir = REPO / "jobs/examples/digits-mirrored"
            job.write_text(_JOB.format(ami=ami, workdir=workdir))
            harness = DebianBootHarness(
                tmp / "box",
                lambda: _discover(ec2, {DEBIAN_12_AMI_PARAM: ami}),
                dict(os.environ),
                on_power_off=lambda vm: ec2.terminate_instances(InstanceIds=[vm]),
            ).start()
            colds: list[dict[str, float]] = []
            warms: list[dict[str, float]] = []
            try:
                for i in range(args.repeat):
                    if i:
                        forget_wheelhouse(s3, bucket)
                    colds.append(run_once(f"cold {i + 1}", job, harness, s3, bucket))
                    warms.append(run_once(f"warm {i + 1}", job, harness, s3, bucket))
            finally:
                harness.stop()
    finally:
        moto.stop()
    cold, warm = medians(colds), medians(warms)
    print(table(cold, warm, args.repeat), flush=True)
    for name in cold:
        slug = name.replace(" ", "_")
        figure(f"bare_boot_cold_{slug}_s", cold[name], n=args.repeat)
        figure(f"bare_boot_warm_{slug}_s", warm[name], n=args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
