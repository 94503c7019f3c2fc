"""Runs on a Slurm cluster (issue 33), through the real `cloudtrain` CLI and the box's real
Slurm (tests/fakes/slurm_box.py): planned from the cluster's partitions and Slurm's own start
estimate, one gang allocation whose ranks each boot the agent on their own compute host, real
distributed TensorFlow between them, and nothing of the run left in the queue or on the
shared filesystem afterwards."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e import signals_kit
from tests.e2e.conftest import Env, assert_clean
from tests.fakes.slurm_box import SlurmBox, slurm_cluster, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBox]:
    # four compute hosts of one GPU each in partition gpu (a parameter-server job needs four)
    # and one without in partition cpu; the box has no GPU behind its GRES devices, so its
    # jobs may train on the CPU (a test harness's variable)
    harness = {"CT_ALLOW_NO_GPU": "1"}
    parts = {"gpu": ["c1", "c2", "c3", "c4"], "cpu": ["c5"]}
    with slurm_cluster(
        tmp_path_factory, computes=5, gpus=1, partitions=parts, no_gpus=("c5",), login_env=harness
    ) as box:
        yield box


@pytest.fixture
def slurm(ct: Env, cluster: SlurmBox, tmp_path: Path) -> Iterator[Env]:
    """`ct` with config.yaml naming the box's login host, as a user's would."""
    write_config(ct, cluster, tmp_path / "shared")
    yield ct
    cluster.cancel_all()


def write_config(env: Env, box: SlurmBox, shared: Path, **options: object) -> None:
    """config.yaml naming the box's login host, as a user's would; `shared` is the cluster's
    shared filesystem (every host sees this one)."""
    slurm = {
        "host": box.login_ip,
        "user": box.user,
        "key": str(box.key),
        "known_hosts": str(box.known_hosts),
        "workdir": str(shared),
        "python": sys.executable,  # the cluster's Python, with the pinned TensorFlow
        "gpu_hour_usd": 0.5,
        **options,
    }
    (env.home / "config.yaml").write_text(yaml.safe_dump({"providers": {"slurm": slurm}}))


def test_a_multiworker_job_plans_from_the_cluster_and_trains_on_three_hosts(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    cluster_spec = {"strategy": "multi_worker_mirrored", "workers": 3, "accelerator": "T4:1"}
    job = slurm.job(
        "digits-multiworker",
        "python train.py --epochs 2",
        provider="slurm",
        cluster=cluster_spec,
    )
    plan = slurm.cli("plan", str(job))
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert "Slurm partition gpu: 4 of 4 GPUs free, 4 of 4 nodes taking jobs" in plan.stdout
    assert "Slurm's estimate: the job would start at" in plan.stdout, plan.stdout

    proc = slurm.cli("run", str(job), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    (run_id,) = slurm.run_ids()
    logs = slurm.cli("logs", run_id).stdout
    assert "final accuracy=" in logs, logs[-3000:]
    assert_clean(slurm, run_id)
    assert_on_own_hosts(cluster, tmp_path / "shared", run_id, 3)
    assert_nothing_left(cluster, tmp_path / "shared", run_id)
    # the bill: the allocation's GPU-hours at the rate (3 x $0.5/h), queue time free, for the
    # job's run time in Slurm's accounting (settled to it at teardown)
    billed = slurm.ledger().billed_cost(run_id)
    (elapsed,) = [
        int(line.split("|")[1])
        for line in cluster.ssh(
            "sacct", "-c", "-X", "-n", "-P", "-o", "JobName,ElapsedRaw"
        ).splitlines()
        if line.startswith(f"cloudtrain-{run_id}-a1|")
    ]
    assert billed * 3600 / 1.5 == pytest.approx(elapsed, abs=0.01), (billed, elapsed)
    # the node stack: one venv, built on the login host, run by every node
    (stack,) = (tmp_path / "shared" / "stack").iterdir()
    assert (stack / ".complete").exists()
    bootstrap = tmp_path / "shared" / "bucket" / "cloudtrain" / "runs" / run_id / "bootstrap"
    for worker in range(3):
        boot = (bootstrap / f"worker-{worker}.log").read_text()
        assert f"phase python: {stack}/bin/python is Python" in boot, boot[-2000:]
        assert "installing" not in boot, boot[-2000:]  # neither the stack nor the wheel


def assert_on_own_hosts(cluster: SlurmBox, shared: Path, run_id: str, count: int) -> None:
    """Every node of attempt 1 published the address of a compute host of its own."""
    folder = shared / "bucket" / "cloudtrain" / "runs" / run_id / "attempt-1" / "nodes"
    addresses = [json.loads(p.read_text())["address"] for p in sorted(folder.glob("*.json"))]
    ips = [a.rsplit(":", 1)[0] for a in addresses]
    computes = {cluster.hosts[c].ip for c in cluster.computes}
    assert len(ips) == count and len(set(ips)) == count and set(ips) <= computes, addresses


def assert_nothing_left(cluster: SlurmBox, shared: Path, run_id: str) -> None:
    """No job in the queue, no process of the run on any host, no run folder."""
    assert cluster.ssh("squeue", "-h").strip() == ""
    marker = f"CT_RUN_ID={run_id}".encode()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                pytest.fail(f"process {proc.name} of run {run_id} is left")
    assert not (shared / "runs" / run_id).exists()


def slurm_job(env: Env, path: Path) -> Path:
    """The job at `path` (an Env job) run on Slurm."""
    spec = yaml.safe_load(path.read_text())
    spec["provider"] = "slurm"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_parameter_server_job_runs_each_task_on_its_own_host(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    job = slurm_job(slurm, slurm.job("digits-ps", "python train.py --epochs 2"))
    proc = slurm.cli("run", str(job), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    (run_id,) = slurm.run_ids()
    status = tmp_path / "shared" / "bucket" / "cloudtrain" / "runs" / run_id / "status"
    statuses = {p.stem: p.read_text() for p in status.glob("*.json")}
    assert set(statuses) == {"chief-0", "worker-0", "worker-1", "ps-0"}
    assert all("chief finished" in statuses[n] for n in ("worker-0", "worker-1", "ps-0"))
    assert_clean(slurm, run_id)
    assert_on_own_hosts(cluster, tmp_path / "shared", run_id, 4)
    assert_nothing_left(cluster, tmp_path / "shared", run_id)


def test_a_queued_job_shows_slurms_reason_and_ctrl_c_cancels_it(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    blocker = cluster.ssh(
        "sbatch", "--parsable", "-N4", "--gpus-per-node=1", "-t", "10", "--wrap", "sleep 600"
    ).strip()
    running = (
        "the blocker running",
        lambda: cluster.ssh("squeue", "-h", "-o", "%T", "-j", blocker),
    )
    wait_for(*running, lambda state: state.strip() == "RUNNING")
    job = slurm_job(slurm, slurm.tick_job("queued", epochs=5, seconds=1))
    cli = signals_kit.start(slurm.env, ["run", str(job)], log=slurm.home / "cli.log")
    try:
        slurm.wait_for(r"worker-0: PENDING \(Resources\)")
        cli.send_signal(signal.SIGINT)
        code = cli.wait(timeout=180)
    finally:
        cli.kill()
    out = slurm.output()
    assert "Slurm partition gpu: 0 of 4 GPUs free" in out, out[-3000:]
    assert code == 130, out[-3000:]
    # nothing to flush: no agent waits for a stop grace that only a running one could use
    assert "stop requested: the job still waits in the queue, no agent runs" in out, out[-3000:]
    (run_id,) = slurm.run_ids()
    assert slurm.ledger().billed_cost(run_id) == 0.0  # it never ran: queue time is free
    # only the blocker is left in the queue: the run's job was cancelled while it waited
    assert cluster.ssh("squeue", "-h", "-o", "%i").split() == [blocker]
    cluster.cancel_all()
    assert_clean(slurm, run_id)
    assert_nothing_left(cluster, tmp_path / "shared", run_id)


def killed_run(env: Env, name: str) -> str:
    """The id of a run of job `name` (60 epochs of 2 s) on Slurm whose controller was killed
    with SIGKILL once worker-0 finished its first epoch: its job goes on in the queue."""
    job = slurm_job(env, env.tick_job(name, epochs=60, seconds=2))
    cli = env.start("run", str(job))
    try:
        env.wait_for(r"^\[worker-0\] cloudtrain: epoch 1/60 done", timeout=300)
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
    finally:
        cli.kill()
    (run_id,) = env.run_ids()
    return run_id


def test_down_after_kill_9_leaves_no_job(slurm: Env, cluster: SlurmBox, tmp_path: Path) -> None:
    run_id = killed_run(slurm, "crashed")
    assert cluster.ssh("squeue", "-h", "-o", "%j").split() == [f"cloudtrain-{run_id}-a1"]
    proc = slurm.cli("down", run_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing of it is left" in proc.stdout, proc.stdout
    assert_clean(slurm, run_id)
    assert_nothing_left(cluster, tmp_path / "shared", run_id)
    again = slurm.cli("down", run_id)  # idempotent
    assert again.returncode == 0, again.stdout + again.stderr


def test_gc_finds_the_job_of_a_run_this_machine_never_recorded(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    run_id = killed_run(slurm, "orphan")
    for ledger in slurm.home.glob("ledger.db*"):  # the run was started from another machine
        ledger.unlink()
    survey = slurm.cli("gc", "--provider", "slurm")
    assert survey.returncode == 0, survey.stdout + survey.stderr
    assert run_id in survey.stdout, survey.stdout
    assert cluster.ssh("squeue", "-h", "-o", "%j").split() == [f"cloudtrain-{run_id}-a1"]
    proc = slurm.cli("gc", "--provider", "slurm", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_nothing_left(cluster, tmp_path / "shared", run_id)
    again = slurm.cli("gc", "--provider", "slurm", "--yes")  # nothing more to find
    assert again.returncode == 0 and run_id not in again.stdout, again.stdout + again.stderr


def wait_rank_epoch(env: Env, shared: Path, rank: int, epoch: int, timeout: float = 400) -> str:
    """The id of `env`'s run once rank `rank` of its first allocation has ended epoch `epoch`,
    as the node's own console says it (`runs/<run>/a1/rank-<r>.out` on the shared filesystem):
    not the controller's stream of the logs, which on a loaded machine came minutes late,
    after the training had ended (CI24: nothing left to take a node from)."""
    done = re.compile(rf"cloudtrain: epoch {epoch}/\d+ done")

    def seen() -> str | None:
        ids = env.run_ids()
        console = shared / "runs" / ids[0] / "a1" / f"rank-{rank}.out" if ids else None
        try:
            text = console.read_text(errors="replace") if console else ""
        except OSError:  # not made yet
            return None
        return ids[0] if done.search(text) else None

    run_id = wait_for(f"rank {rank}'s epoch {epoch}", seen, timeout=timeout)
    assert run_id is not None
    return run_id


def test_a_node_set_down_ends_the_allocation_and_the_next_one_resumes(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    job = slurm_job(
        slurm, slurm.job("digits-multiworker", "python train.py --epochs 30 --epoch-seconds 2")
    )
    cli = slurm.start("run", str(job))
    downed = None
    try:
        run_id = wait_rank_epoch(slurm, tmp_path / "shared", rank=1, epoch=2)
        nodes = tmp_path / "shared" / "bucket" / "cloudtrain" / "runs" / run_id / "attempt-1"
        address = json.loads((nodes / "nodes" / "worker-1.json").read_text())["address"]
        by_ip = {cluster.hosts[c].ip: c for c in cluster.computes}
        downed = by_ip[address.rsplit(":", 1)[0]]
        cluster.set_state(downed, "DOWN", "a failed GPU")  # as an administrator would
        assert cli.wait(timeout=600) == 0, slurm.output()[-4000:]
    finally:
        cli.kill()
        if downed:
            cluster.set_state(downed, "RESUME")
    out = slurm.output()
    assert "restart 1/" in out and "attempt 2" in out, out[-4000:]
    resumed = re.findall(r"^\[worker-\d\] cloudtrain: resumed at epoch (\d+)", out, re.M)
    assert resumed and all(int(e) >= 2 for e in resumed), out[-4000:]
    # every worker from the same checkpoint (the old allocation's chief sent none after)
    assert len(resumed) == 2 and len(set(resumed)) == 1, out[-4000:]
    jobs = cluster.ssh("sacct", "-c", "-X", "-n", "-P", "-o", "JobName,State").split()
    states = dict(line.split("|", 1) for line in jobs if line.startswith(f"cloudtrain-{run_id}"))
    assert states[f"cloudtrain-{run_id}-a1"].startswith("NODE_FAIL"), states
    assert_clean(slurm, run_id)
    assert_nothing_left(cluster, tmp_path / "shared", run_id)


def test_a_preempted_allocation_is_recognised_and_the_next_one_resumes(
    ct: Env, tmp_path: Path
) -> None:
    # a cluster whose `urgent` partition, on the same hosts, preempts `gpu`'s jobs
    parts = {"gpu": ["c1", "c2"], "urgent": ["c1", "c2"]}
    with SlurmBox(
        tmp_path / "tiers", computes=2, gpus=1, partitions=parts,
        tiers={"gpu": 1, "urgent": 10}, login_env={"CT_ALLOW_NO_GPU": "1"},
    ) as box:  # fmt: skip
        write_config(ct, box, tmp_path / "shared", partition="gpu")
        spec = {"strategy": "multi_worker_mirrored", "workers": 2, "accelerator": "T4:1"}
        job = ct.job(
            "digits-multiworker",
            "python train.py --epochs 30 --epoch-seconds 2",
            provider="slurm",
            cluster=spec,
        )
        cli = ct.start("run", str(job))
        try:
            wait_rank_epoch(ct, tmp_path / "shared", rank=1, epoch=2)
            box.ssh(
                "sbatch", "--partition=urgent", "--exclusive", "-N1", "-t", "5",
                "--wrap", "sleep 20",
            )  # fmt: skip
            assert cli.wait(timeout=600) == 0, ct.output()[-4000:]
        finally:
            cli.kill()
            box.cancel_all()
        (run_id,) = ct.run_ids()
        jobs = box.ssh("sacct", "-c", "-X", "-n", "-P", "-o", "JobName,State").split()
    out = ct.output()
    assert "worker-0: preempted (PREEMPTED by Slurm)" in out, out[-4000:]
    assert "restart 1/" in out and "attempt 2" in out, out[-4000:]
    resumed = re.findall(r"^\[worker-\d\] cloudtrain: resumed at epoch (\d+)", out, re.M)
    assert resumed and all(int(e) >= 2 for e in resumed), out[-4000:]
    # every worker from the same checkpoint (the old allocation's chief sent none after)
    assert len(resumed) == 2 and len(set(resumed)) == 1, out[-4000:]
    states = dict(line.split("|", 1) for line in jobs if line.startswith(f"cloudtrain-{run_id}"))
    assert states[f"cloudtrain-{run_id}-a1"] == "PREEMPTED", states
    # the second allocation ran to the end (the teardown cancels it once the job is done)
    assert states[f"cloudtrain-{run_id}-a2"].split()[0] in ("COMPLETED", "CANCELLED"), states
    assert_clean(ct, run_id)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The command's one error line: it failed, wrote no traceback, and said one `error:`."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def with_options(env: Env, **options: object) -> None:
    """config.yaml's providers.slurm with `options` changed."""
    path = env.home / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["providers"]["slurm"].update(options)
    path.write_text(yaml.safe_dump(config))


def test_four_mistakes_are_one_clear_error_each_and_nothing_is_submitted(
    slurm: Env, cluster: SlurmBox, tmp_path: Path
) -> None:
    job = slurm_job(slurm, slurm.tick_job("mistakes", epochs=5, seconds=1))
    with_options(slurm, partition="cpu")  # GPUs asked of a partition without any
    line = one_error_line(slurm.cli("run", str(job)))
    assert "partition cpu's nodes have 0 GPU(s) at most; the job asks T4 x1 per node" in line

    stranger = tmp_path / "stranger"  # a key the login host does not know
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with_options(slurm, partition=None, key=str(stranger))
    line = one_error_line(slurm.cli("run", str(job)))
    assert f"refused the SSH key {stranger}" in line, line

    empty = tmp_path / "known_hosts"  # the login host's key is not in it
    empty.write_text("")
    with_options(slurm, key=str(cluster.key), known_hosts=str(empty))
    line = one_error_line(slurm.cli("run", str(job)))
    assert f"its SSH host key is not in {empty}" in line, line

    # a login host whose PATH has Slurm's other commands but no sbatch
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sinfo", "squeue", "scancel", "sacct", "mkdir", "ls", "tar", "cat", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    with SlurmBox(tmp_path / "bare", computes=1, gpus=1, login_path=str(bin_dir)) as bare:
        with_options(
            slurm, host=bare.login_ip, key=str(bare.key), known_hosts=str(bare.known_hosts)
        )
        line = one_error_line(slurm.cli("run", str(job)))
        assert "`sbatch` is not on the login host's PATH: is this a Slurm login node?" in line
        assert bare.ssh("squeue", "-h", check=False).strip() == ""
    assert cluster.ssh("squeue", "-h").strip() == ""  # nothing was submitted, anywhere
    assert slurm.run_ids() == []  # nor recorded
