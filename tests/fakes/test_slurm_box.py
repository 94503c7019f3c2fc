"""The Slurm box (tests/fakes/slurm_box.py) is a real cluster: jobs submitted over SSH to its
login host get whole compute hosts, GPUs through GRES with CUDA_VISIBLE_DEVICES as Slurm sets
it, refusals for what no node has, a node set DOWN ends the job on it, an unknown host key stops
ssh, and closing it leaves no process."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import netns
from tests.fakes.slurm_box import SlurmBox, SlurmError, slurm_cluster, wait_for

pytestmark = pytest.mark.timeout(300)

STEP = "echo $(hostname) $(hostname -I) gpus=$CUDA_VISIBLE_DEVICES node=$SLURM_NODEID"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    with slurm_cluster(tmp_path_factory) as box:
        yield box


def test_a_job_gets_every_compute_host_and_its_gpus_through_the_login_host(
    cluster: SlurmBox,
) -> None:
    assert cluster.node_states() == {"c1": "idle", "c2": "idle", "c3": "idle"}
    assert "gpu:2" in cluster.ssh("sinfo", "-h", "-o", "%G")
    out = cluster.ssh("srun", "-N3", "--gpus-per-node=2", "bash", "-c", STEP)
    lines = sorted(out.split("\n")[:-1])
    expected = [f"c{i} {cluster.hosts[f'c{i}'].ip} gpus=0,1 node={i - 1}" for i in (1, 2, 3)]
    assert lines == expected, out
    # one GPU asked: Slurm hands one device, and says so in CUDA_VISIBLE_DEVICES
    assert "gpus=0 " in cluster.ssh("srun", "-N1", "--gpus-per-node=1", "bash", "-c", STEP)


def test_a_batch_job_runs_and_its_end_is_in_the_job_completion_log(cluster: SlurmBox) -> None:
    out = cluster.ssh("sbatch", "--parsable", "-N2", "--job-name=ct-box", "--wrap", "srun true")
    job = out.strip().split(";")[0]
    assert job.isdigit(), out
    wait_for("the job's end", lambda: cluster.ssh("squeue", "-h", "-j", job).strip() == "")
    done = cluster.ssh("sacct", "-c", "-n", "-P", "-j", job, "-o", "JobID,JobName,State,NodeList")
    assert re.search(rf"^{job}\|ct-box\|COMPLETED\|c\[1-2\]$", done, re.M), done


def test_what_no_node_has_is_refused(cluster: SlurmBox) -> None:
    with pytest.raises(SlurmError, match="Requested node configuration is not available"):
        cluster.ssh("sbatch", "-N1", "--gpus-per-node=3", "--wrap", "true")
    assert cluster.ssh("squeue", "-h").strip() == ""
    # more nodes than the partition has: accepted, and pending for ever (EnforcePartLimits=NO,
    # Slurm's default), so a caller must compare with sinfo itself
    job = cluster.ssh("sbatch", "--parsable", "-N4", "--wrap", "true").strip()
    try:
        wait_for(
            "the job's reason",
            lambda: (
                cluster.ssh("squeue", "-h", "-j", job, "-o", "%T %r").split()
                == ["PENDING", "PartitionNodeLimit"]
            ),
        )
    finally:
        cluster.ssh("scancel", job)
    wait_for("the job gone", lambda: cluster.ssh("squeue", "-h").strip() == "")


def test_a_node_set_down_ends_the_job_on_it_and_slurm_requeues_it(cluster: SlurmBox) -> None:
    job = cluster.ssh("sbatch", "--parsable", "-N3", "--wrap", "srun sleep 300").strip()
    try:
        wait_for(
            "the job running",
            lambda: cluster.ssh("squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING",
        )
        cluster.set_state("c2", "DOWN")
        # a batch job is requeued on a node failure (JobRequeue=1, Slurm's default): it waits
        # again, its first run's end in the completion log as NODE_FAIL
        wait_for(
            "the job requeued",
            lambda: (
                cluster.ssh("squeue", "-h", "-j", job, "-o", "%T %r").split()
                == ["PENDING", "BeginTime"]
            ),
        )
        done = cluster.ssh("sacct", "-c", "-n", "-P", "-j", job, "-o", "JobID,State")
        assert done.split() == [f"{job}|NODE_FAIL"], done
        # an administrator's DOWN stays (ReturnToService=1): c2 takes no job until RESUME
        assert cluster.node_states()["c2"].startswith("down"), cluster.node_states()
    finally:
        cluster.ssh("scancel", job, check=False)
        cluster.set_state("c2", "RESUME")
    wait_for("c2 idle again", lambda: cluster.node_states()["c2"] == "idle")


def test_an_unknown_host_key_stops_ssh(cluster: SlurmBox, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    args = cluster.ssh_args("-o", f"UserKnownHostsFile={empty}")
    done = subprocess.run([*args, "true"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 255, done
    assert "Host key verification failed" in done.stderr, done.stderr


def _processes_under(root: Path) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if str(root).encode() in cmdline + environ:
            found.append(f"{pid}: {cmdline.decode(errors='replace')}")
    return found


def test_closing_the_box_leaves_no_process(tmp_path: Path) -> None:
    netns.require()
    box = SlurmBox(tmp_path / "box", computes=1, gpus=0)
    with box:
        job = box.ssh("sbatch", "--parsable", "-N1", "--wrap", "srun sleep 300").strip()
        wait_for(
            "the job running",
            lambda: box.ssh("squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING",
        )
        assert _processes_under(box.root)
    assert _processes_under(box.root) == []
    assert not box.root.exists()
