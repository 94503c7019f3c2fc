"""One real OS, booted as root (issue 16): `cloudtrain run --provider aws` against moto, whose
one node boots "Debian's own Debian 12 AMI" as a real Debian 12 root (tests/fakes/debian_boot.py:
a copy-on-write disk over a debootstrapped bookworm, the UserData run as root the way cloud-init
runs it).

Nothing stands in for Debian: the bootstrap's `apt-get install python3-venv` runs against
deb.debian.org, `python3 -m venv /opt/cloudtrain/venv` uses Debian's python3 3.11, pip installs
the pinned TensorFlow and tf-keras (from PyPI, or from the run bucket's wheelhouse when the
template fetches one), curl fetches the bundle through the presigned URL from moto's S3, and the
agent trains digits for 2 epochs on that interpreter. Afterwards every instance is terminated and
nothing of the VM is left: no process in its root, no mount.

Slow (a cold pip install of TensorFlow): marked `slow`; CI's tests/run.sh still runs it. Needs
root and debootstrap (the root is built once per machine by `python3 -m tests.fakes.debian_root`).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.run import wheelhouse
from cloudtrain.run.startup import TF_KERAS_VERSION, TF_VERSION
from tests.e2e.conftest import Env
from tests.e2e.test_aws_in_a_box import REGION, AwsBox, _discover
from tests.fakes.boot_harness import Vm
from tests.fakes.box_images import DEBIAN_12_AMI_PARAM
from tests.fakes.debian_boot import DebianBootHarness, mounts_under
from tests.fakes.moto_server import MotoServer, moto_amis, seed_ssm_parameter


@pytest.fixture(autouse=True)
def _debootstrap_possible() -> None:
    """Fails, never skips: tests/run.sh installs debootstrap and runs as root."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        pytest.fail("booting the Debian 12 root needs root and debootstrap (tests/run.sh)", False)


EPOCHS = "cloudtrain: epoch 2/2 done"


@pytest.fixture
def debian_box(
    ct: Env, moto_server: MotoServer, moto_public_images: dict[str, str], tmp_path: Path
) -> Iterator[tuple[AwsBox, str]]:
    """The AWS box whose VMs boot the Debian root; yields it and the Debian AMI id."""
    import boto3

    ami = next(a for a in moto_amis(8) if a not in moto_public_images.values())
    seed_ssm_parameter(DEBIAN_12_AMI_PARAM, ami, REGION)
    images = {**moto_public_images, DEBIAN_12_AMI_PARAM: ami}
    ct.env.update({k: v for k, v in os.environ.items() if k.startswith(("AWS_", "NO_PROXY"))})
    clients = {
        name: boto3.client(name, region_name=REGION, endpoint_url=moto_server.url)
        for name in ("ec2", "s3", "iam")
    }
    ec2 = clients["ec2"]
    harness = DebianBootHarness(
        tmp_path / "box",
        lambda: _discover(ec2, images),
        dict(ct.env),
        on_power_off=lambda vm: ec2.terminate_instances(InstanceIds=[vm]),
    ).start()
    try:
        yield AwsBox(ct, harness, ec2, clients["s3"], clients["iam"]), ami
    finally:
        harness.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_plain_debian_12_node_installs_everything_as_root_and_trains(
    debian_box: tuple[AwsBox, str],
) -> None:
    aws, ami = debian_box
    harness = aws.harness
    assert isinstance(harness, DebianBootHarness)
    # cloudtrain cannot know a custom AMI's Python: name the node's wheelhouse tag, so the bucket
    # has none yet and this first boot builds and publishes it (cold)
    wheel_tag = wheelhouse.tag("3.11", "x86_64", wheelhouse.stack_pins(gpu=False))
    aws.ct.env[wheelhouse.TAG_ENV] = wheel_tag
    job = aws.ct.job(
        "digits-mirrored",
        "python train.py --epochs 2",
        cluster={"strategy": "mirrored", "workers": 1, "accelerator": "T4:1", "image": ami},
    )
    proc = aws.run("run", "--provider", "aws", "--region", REGION, str(job), timeout=600)
    out = proc.stdout + proc.stderr
    assert len(harness.boots) == 1, out[-4000:] + f"\nharness errors: {harness.errors[:3]}"
    (vm_id,) = harness.boots
    disk = harness.disk(vm_id)
    console = harness.console(vm_id)
    assert proc.returncode == 0, out[-4000:] + "\n--- console\n" + console[-4000:]
    assert EPOCHS in out, out[-3000:]

    # the layers hold what the boot did; the cached root (the lower layer) is untouched
    upper = disk.upper
    boot_log = (upper / "opt/cloudtrain/bootstrap.log").read_text()
    # apt really installed python3-venv, into this VM's disk only
    status = (upper / "var/lib/dpkg/status").read_text()
    assert re.search(r"Package: python3\.11-venv\nStatus: install ok installed", status), boot_log[
        -3000:
    ]
    assert any((upper / "var/lib/apt/lists").glob("deb.debian.org_debian_dists_bookworm_*"))
    lower_status = (harness.lower / "var/lib/dpkg/status").read_text()
    assert "Package: python3.11-venv\n" not in lower_status
    assert not (harness.lower / "opt/cloudtrain").exists()
    # the venv is Debian's python3 3.11, with the pinned stack pip installed into it
    cfg = (upper / "opt/cloudtrain/venv/pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg and "version = 3.11.2" in cfg, cfg
    assert "include-system-site-packages = false" in cfg, cfg
    site = upper / "opt/cloudtrain/venv/lib/python3.11/site-packages"
    assert (site / f"tensorflow-{TF_VERSION}.dist-info").is_dir()
    assert (site / f"tf_keras-{TF_KERAS_VERSION}.dist-info").is_dir()
    assert "phase python: /usr/bin/python3 is Python 3.11.2" in boot_log, boot_log[-3000:]
    assert "python3-venv" in boot_log or "python3.11-venv" in console, boot_log[-3000:]
    # the bundle came through the presigned URL (from moto's S3, by curl, sha256-checked)
    assert re.search(r"phase bundle: done in \d+s", boot_log), boot_log[-3000:]
    assert (upper / "opt/cloudtrain/bundle.tar.gz").stat().st_size > 0
    user_data = (upper / f"var/lib/cloud/instances/{vm_id}/scripts/part-001").read_text()
    url = re.search(r"^CT_BUNDLE_URL='?([^'\n]+)", user_data, re.M)
    assert url and "X-Amz-Signature=" in url.group(1) and url.group(1).startswith("http://127.")
    # the agent ran on that interpreter, in the VM, and trained (the controller then tore the
    # instance down, so the agent's exit is never logged)
    assert "phase agent: starting" in boot_log, boot_log[-3000:]
    assert "final accuracy=" in boot_log and "uploaded the model" in boot_log, boot_log[-3000:]
    # the cold boot built the wheelhouse while installing and published it to the bucket
    assert re.search(r"steps python: apt=\d+s venv=\d+s pip=\d+s", boot_log), boot_log[-3000:]
    assert f"wheelhouse: published {wheel_tag}" in boot_log, boot_log[-3000:]
    assert wheelhouse.manifest_key(wheel_tag) in aws.keys(wheelhouse.ROOT)

    aws.assert_nothing_left(aws.ct.run_ids()[0])
    # the VM is gone: no process runs in its root and nothing is mounted there
    assert disk.pids() == [], "processes left in the VM's root"
    assert mounts_under(disk.root) == [], "mounts left in the VM's root"
    assert len(mounts_under(disk.folder)) == 1  # its layers, readable until the harness stops


# What the VM's first boot does, as root in the Debian root (no TensorFlow: a few seconds).
_PROBE = """#!/usr/bin/env bash
echo "uid=$(id -u) cwd=$PWD script=$0"
. /etc/os-release && echo "os=$ID-$VERSION_ID"
python3 -c 'import sys; print("python", sys.version.split()[0])'
echo "no-ensurepip=$(python3 -m venv /tmp/v 2>&1 | grep -c 'ensurepip is not')"
echo "proc=$(grep -c '^proc /proc proc' /proc/mounts)" ; test -c /dev/null && echo dev-ok
curl -sS -o /dev/null -w 'curl %{http_code}\\n' http://127.0.0.1:9/ || echo curl-refused
(sleep 600 &) ; setsid sleep 600 &
echo backgrounded  # both sleeps are forked by now: the test waits for this line, not an earlier one
sleep 600
"""


def test_the_first_boot_runs_user_data_as_cloud_init_does_and_nothing_is_left(
    tmp_path: Path,
) -> None:
    alive = {"i-debian": True}

    def discover() -> list[Vm]:
        return [
            Vm(v, "worker-0", up, lambda: _PROBE, f"aws:{DEBIAN_12_AMI_PARAM}")
            for v, up in alive.items()
        ]

    harness = DebianBootHarness(tmp_path / "box", discover, {"AWS_X": "1"}).start()
    try:
        disk = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "backgrounded" not in harness.console("i-debian"):
            time.sleep(0.2)
        console = harness.console("i-debian")
        assert harness.errors == [], harness.errors
        disk = harness.disk("i-debian")
        assert "uid=0 cwd=/ script=/var/lib/cloud/instance/scripts/part-001" in console, console
        assert "os=debian-12" in console and "python 3.11.2" in console, console
        assert "no-ensurepip=1" in console, console  # python3-venv is not on the image
        assert "proc=1" in console and "dev-ok" in console, console
        sem = disk.upper / "var/lib/cloud/instances/i-debian/sem/config_scripts_user"
        assert sem.exists()  # once per instance
        assert len(disk.pids()) >= 3  # the boot, and sleeps outside its session
        assert not (harness.lower / "var/lib/cloud").exists()  # the cached root is untouched
        alive["i-debian"] = False  # terminated: every process in its root ends, it unmounts
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and mounts_under(disk.root):
            time.sleep(0.2)
        assert disk.pids() == []
        assert mounts_under(disk.root) == []
    finally:
        harness.stop()
    assert disk is not None and mounts_under(disk.folder) == [] and not disk.folder.exists()
    assert disk.pids() == []


_REBOOTS = """#!/usr/bin/env bash
echo user-data >>/root/boots
printf '#!/bin/sh\\necho per-boot >>/root/boots\\nsleep 600\\n' >/var/lib/cloud/scripts/per-boot/x
chmod 700 /var/lib/cloud/scripts/per-boot/x
reboot
"""


def test_a_reboot_from_inside_runs_only_the_per_boot_scripts(tmp_path: Path) -> None:
    vm = Vm("i-reboot", "worker-0", True, lambda: _REBOOTS, f"aws:{DEBIAN_12_AMI_PARAM}")
    harness = DebianBootHarness(tmp_path / "box", lambda: [vm], {}).start()
    try:
        deadline = time.monotonic() + 60
        boots = Path("/nonexistent")
        while time.monotonic() < deadline:
            if "i-reboot" in harness.disks:
                boots = harness.disk("i-reboot").root / "root/boots"
                if boots.exists() and "per-boot" in boots.read_text():
                    break
            time.sleep(0.2)
        assert harness.errors == [], harness.errors
        # the `reboot` shim asked the harness: user data ran once, then cloud-init's per-boot
        assert boots.read_text() == "user-data\nper-boot\n", harness.console("i-reboot")
        assert harness.boots["i-reboot"] == 2
        disk = harness.disk("i-reboot")
    finally:
        harness.stop()
    assert disk.pids() == [] and mounts_under(disk.folder) == []
