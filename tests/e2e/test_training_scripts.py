"""End-to-end runs of the example train.py scripts as local multi-process TensorFlow clusters.

Each node is a subprocess started the way the node agent starts it: in a copy of the example
folder, with a hand-built TF_CONFIG on free loopback ports and the CLOUDTRAIN_* variables,
each with its own checkpoint, model and temp folders under tmp_path. Every process gets its
own session and its process group is SIGKILLed in a ``finally``, so nothing outlives a test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain.providers.local_sessions import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"
TIMEOUT = 120.0  # seconds for any single run; the tests never wait longer than this

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("tensorflow", "tf_keras", "sklearn")),
        reason="needs tensorflow, tf-keras and scikit-learn",
    ),
]


@dataclass
class Node:
    """One launched task and the folders it was given."""

    role: str
    index: int
    is_chief: bool
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"

    @property
    def ckpt(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def log(self) -> Path:
        return self.root / "output.log"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, drawn as the local provider draws a node's (below the
    ephemeral range, from this worker's slice): a port the kernel hands out can be taken by an
    outgoing connection before the node's TensorFlow binds it."""
    return [free_port() for _ in range(count)]


def _layout(tmp_path: Path, roles: dict[str, int]) -> list[Node]:
    """Create the nodes of a cluster (chief = chief 0, else worker 0)."""
    has_chief = roles.get("chief", 0) > 0
    nodes = []
    for role, count in roles.items():
        for index in range(count):
            chief = (role, index) == (("chief", 0) if has_chief else ("worker", 0))
            nodes.append(Node(role, index, chief, tmp_path / f"{role}{index}"))
    return nodes


def _start(nodes: list[Node], workdir: Path, strategy: str, args: list[str], run: int = 0) -> None:
    """Start every node's ``python train.py *args`` (TF_CONFIG only for multi-node layouts)."""
    ports = iter(_free_ports(len(nodes)))
    cluster: dict[str, list[str]] = {}
    for node in nodes:
        cluster.setdefault(node.role, []).append(f"127.0.0.1:{next(ports)}")
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("CLOUDTRAIN_") and k != "TF_CONFIG"
    }
    for node in nodes:
        (node.root / "tmp").mkdir(parents=True, exist_ok=True)
        env = dict(
            base,
            TF_USE_LEGACY_KERAS="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONUNBUFFERED="1",
            TMPDIR=str(node.root / "tmp"),
            CLOUDTRAIN_STRATEGY=strategy,
            CLOUDTRAIN_ROLE=node.role,
            CLOUDTRAIN_INDEX=str(node.index),
            CLOUDTRAIN_IS_CHIEF="1" if node.is_chief else "0",
            CLOUDTRAIN_CHECKPOINT_DIR=str(node.ckpt),
            CLOUDTRAIN_MODEL_DIR=str(node.model),
        )
        if len(nodes) > 1:
            task = {"type": node.role, "index": node.index}
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
        with node.log.open("ab") as log:
            log.write(f"\n===== run {run}\n".encode())
            log.flush()
            node.proc = subprocess.Popen(
                [sys.executable, "train.py", *args],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def _kill(nodes: list[Node]) -> None:
    """SIGKILL every node's process group and reap it."""
    for node in nodes:
        if node.proc is None:
            continue
        with suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=30)


@contextmanager
def _cluster(
    tmp_path: Path, example: str, roles: dict[str, int]
) -> Iterator[tuple[list[Node], Path]]:
    """Yield (nodes, workdir) for ``example`` copied to tmp_path; kills all nodes on exit."""
    workdir = tmp_path / "workdir"
    shutil.copytree(EXAMPLES / example, workdir)
    nodes = _layout(tmp_path, roles)
    try:
        yield nodes, workdir
    finally:
        _kill(nodes)


def _logs(nodes: list[Node]) -> str:
    return "\n".join(f"----- {n.name}\n{n.output()[-3000:]}" for n in nodes)


def _wait_chief(nodes: list[Node], deadline: float) -> int:
    """Wait for the chief to exit (at most until ``deadline``) and return its exit code."""
    chief = next(n for n in nodes if n.is_chief)
    assert chief.proc is not None
    try:
        return chief.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"chief still running after {TIMEOUT:.0f} s\n{_logs(nodes)}")


def _wait_for_line(node: Node, text: str, deadline: float, nodes: list[Node]) -> None:
    """Poll ``node``'s output until ``text`` appears; fail at the deadline or if it exits."""
    while text not in node.output():
        assert node.proc is not None
        if node.proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{node.name} never printed {text!r}\n{_logs(nodes)}")
        time.sleep(0.05)


def _assert_outputs(chief: Node, epochs: int) -> None:
    saved = chief.model / "saved_model"
    assert (saved / "saved_model.pb").is_file(), sorted(map(str, chief.model.rglob("*")))
    assert (saved / "variables" / "variables.index").is_file()
    ckpt = chief.ckpt / "ckpt" / f"epoch-{epochs:03d}.index"
    assert ckpt.is_file(), sorted(map(str, chief.ckpt.rglob("*")))
    out = chief.output()
    assert f"cloudtrain: epoch {epochs}/{epochs} done loss=" in out
    assert "final accuracy=" in out


def _run_to_completion(
    tmp_path: Path, example: str, strategy: str, roles: dict[str, int], args: list[str]
) -> tuple[list[Node], dict[str, int | None]]:
    """Run a cluster until the chief exits, then kill the rest; return nodes and exit codes."""
    deadline = time.monotonic() + TIMEOUT
    with _cluster(tmp_path, example, roles) as (nodes, workdir):
        _start(nodes, workdir, strategy, args)
        rc = _wait_chief(nodes, deadline)
        assert rc == 0, _logs(nodes)
        codes: dict[str, int | None] = {}
        for node in nodes:
            assert node.proc is not None
            try:
                # MWMS workers finish with the chief; PS workers and ps serve until killed.
                limit = 30.0 if strategy == "multi_worker_mirrored" else 0.0
                codes[node.name] = node.proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                codes[node.name] = None
    return nodes, codes


def test_multiworker_two_workers(tmp_path: Path) -> None:
    roles = {"worker": 2}
    args = ["--epochs", "2"]
    nodes, codes = _run_to_completion(
        tmp_path, "digits-multiworker", "multi_worker_mirrored", roles, args
    )
    assert codes == {"worker0": 0, "worker1": 0}, _logs(nodes)
    _assert_outputs(nodes[0], epochs=2)
    assert not (nodes[1].model / "saved_model").exists()  # the non-chief saved to its temp dir
    assert not (nodes[1].ckpt / "ckpt").exists()


def test_parameter_server(tmp_path: Path) -> None:
    roles = {"chief": 1, "worker": 2, "ps": 1}
    args = ["--epochs", "2"]
    nodes, codes = _run_to_completion(tmp_path, "digits-ps", "parameter_server", roles, args)
    assert codes["chief0"] == 0
    # workers and ps never exit on their own: they were serving until killed
    assert all(codes[n] is None for n in ("worker0", "worker1", "ps0")), codes
    _assert_outputs(nodes[0], epochs=2)
    for node in nodes[1:]:
        assert "serving the parameter-server cluster" in node.output(), _logs(nodes)


@pytest.mark.parametrize(
    ("strategy", "built"),
    [
        ("mirrored", "MirroredStrategy"),
        # variables on the CPU, compute replicated on the node's devices (here its CPU alone)
        ("central_storage", "CentralStorageStrategy"),
    ],
)
def test_single_node(tmp_path: Path, strategy: str, built: str) -> None:
    nodes, codes = _run_to_completion(
        tmp_path, "digits-mirrored", strategy, {"chief": 1}, ["--epochs", "2"]
    )
    assert codes == {"chief0": 0}
    _assert_outputs(nodes[0], epochs=2)
    assert f"strategy {built}: 1 replica(s)" in nodes[0].output()


def test_multiworker_resume_after_kill(tmp_path: Path) -> None:
    roles = {"worker": 2}
    args = ["--epochs", "4", "--epoch-seconds", "1.5"]
    deadline = time.monotonic() + TIMEOUT
    with _cluster(tmp_path, "digits-multiworker", roles) as (nodes, workdir):
        chief = nodes[0]
        _start(nodes, workdir, "multi_worker_mirrored", args, run=1)
        _wait_for_line(chief, "cloudtrain: epoch 2/4 done", deadline, nodes)
        _kill(nodes)
        assert (chief.ckpt / "backup" / "chief" / "checkpoint").is_file()
        assert "epoch 3/4 done" not in chief.output()
        # what the agent's restore does: every node gets the chief's checkpoint folder
        for node in nodes[1:]:
            shutil.rmtree(node.ckpt, ignore_errors=True)
            shutil.copytree(chief.ckpt, node.ckpt)
        _start(nodes, workdir, "multi_worker_mirrored", args, run=2)
        assert _wait_chief(nodes, deadline) == 0, _logs(nodes)
        assert nodes[1].proc is not None and nodes[1].proc.wait(timeout=30) == 0, _logs(nodes)
    for node in nodes:
        second = node.output().split("===== run 2", 1)[1]
        assert "cloudtrain: resumed at epoch 3" in second, _logs(nodes)
        assert "cloudtrain: epoch 1/4 done" not in second
        assert "cloudtrain: epoch 2/4 done" not in second
        assert "cloudtrain: epoch 3/4 done" in second
        assert "cloudtrain: epoch 4/4 done" in second
    _assert_outputs(chief, epochs=4)
    assert not (chief.ckpt / "backup" / "chief").exists()  # deleted after a finished fit


def test_central_storage_resume_after_kill(tmp_path: Path) -> None:
    # tf-keras' BackupAndRestore refuses CentralStorageStrategy unless the runtime admits it
    args = ["--epochs", "3", "--epoch-seconds", "1.5"]
    deadline = time.monotonic() + TIMEOUT
    with _cluster(tmp_path, "digits-mirrored", {"chief": 1}) as (nodes, workdir):
        (chief,) = nodes
        _start(nodes, workdir, "central_storage", args, run=1)
        _wait_for_line(chief, "cloudtrain: epoch 1/3 done", deadline, nodes)
        _kill(nodes)
        assert (chief.ckpt / "backup" / "chief" / "checkpoint").is_file()
        _start(nodes, workdir, "central_storage", args, run=2)
        assert _wait_chief(nodes, deadline) == 0, _logs(nodes)
    second = chief.output().split("===== run 2", 1)[1]
    assert "strategy CentralStorageStrategy" in second, _logs(nodes)
    assert "cloudtrain: resumed at epoch 2" in second, _logs(nodes)
    assert "cloudtrain: epoch 1/3 done" not in second
    _assert_outputs(chief, epochs=3)
