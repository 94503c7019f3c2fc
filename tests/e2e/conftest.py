"""Helpers for end-to-end runs: the real `cloudtrain` CLI in a subprocess, its own CLOUDTRAIN_HOME,
an example job copied into a temp folder with a tweakable entrypoint, and leak checks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cloudtrain.providers.local import session_pids
from cloudtrain.state.ledger import Ledger
from tests.fakes.moto_server import (  # noqa: F401 - fixtures for the cloud-in-a-box tests
    moto_public_images,
    moto_server,
    moto_server_session,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"
# the tick jobs' hold: with TICK_GATE (a path) in its environment, a job holds before epoch i
# past TICK_HOLD_AT until that path exists (the test's event, not a race against the clock)
TICK_HOLD = """\
def hold(i):
    gate, at = os.environ.get("TICK_GATE"), int(os.environ.get("TICK_HOLD_AT") or 0)
    while gate and i > at and not os.path.exists(gate):
        time.sleep(0.1)
"""
# a job that ticks instead of training: `python tick.py EPOCHS SECONDS` prints an epoch line
TICK = (
    "import os, sys, time\n"
    + TICK_HOLD
    + """\
epochs, seconds = int(sys.argv[1]), float(sys.argv[2])
for i in range(1, epochs + 1):
    hold(i)
    time.sleep(seconds)
    print(f"cloudtrain: epoch {i}/{epochs} done", flush=True)
"""
)


def tick_held(gate: Path, at: int) -> dict[str, str]:
    """A tick job's `env` that holds its training after epoch `at` until `gate` exists."""
    return {"TICK_GATE": str(gate), "TICK_HOLD_AT": str(at)}


RUN_ID_RE = re.compile(r"cloudtrain run (\S+) on ")


@dataclass
class Env:
    """One test's cloudtrain world."""

    home: Path
    env: dict[str, str]

    @property
    def bucket(self) -> Path:
        return self.home / "buckets" / "local" / "cloudtrain" / "runs"

    def ledger(self) -> Ledger:
        return Ledger(self.home / "ledger.db")

    def job(self, example: str, entrypoint: str | None = None, **fields: object) -> Path:
        """Copy an example into the home and rewrite its job.yaml fields."""
        dest = self.home / "jobs" / example
        shutil.copytree(EXAMPLES / example, dest, dirs_exist_ok=True)
        spec = yaml.safe_load((dest / "job.yaml").read_text())
        if entrypoint:
            spec["entrypoint"] = entrypoint
        spec.update(fields)
        (dest / "job.yaml").write_text(yaml.safe_dump(spec))
        return dest / "job.yaml"

    def tick_job(
        self,
        name: str,
        epochs: int = 200,
        seconds: float = 0.5,
        gate: tuple[Path, int] | None = None,
    ) -> Path:
        """A two-worker local job (digits-multiworker's spec) whose workers print an epoch line
        every `seconds`, `epochs` times, with no TensorFlow: for tests of the run's protocol.
        `gate` (path, epoch): the workers hold after that epoch until the test creates path."""
        dest = self.home / "jobs" / name
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "tick.py").write_text(TICK)
        spec = yaml.safe_load((EXAMPLES / "digits-multiworker" / "job.yaml").read_text())
        spec.pop("setup", None)
        spec.update(name=name, workdir=".", entrypoint=f"python tick.py {epochs} {seconds}")
        if gate is not None:
            spec["env"] = tick_held(*gate)
        (dest / "job.yaml").write_text(yaml.safe_dump(spec))
        return dest / "job.yaml"

    def cli(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        """Run `cloudtrain ARGS` to completion."""
        return subprocess.run(
            [sys.executable, "-m", "cloudtrain.cli.main", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str, log: Path | None = None) -> subprocess.Popen[str]:
        """Start `cloudtrain ARGS` in the background, its output to `log` (default: the home's
        cli.log, which `output` reads). No wait."""
        with open(log or self.home / "cli.log", "w") as out:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, "-m", "cloudtrain.cli.main", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def output(self) -> str:
        return (self.home / "cli.log").read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        """Wait until the background CLI's output matches `pattern`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.output(), re.M)
            if m:
                return m
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not seen in time; output:\n{self.output()[-4000:]}")

    def wait_for_node_line(self, node: str, pattern: str, timeout: float = 240) -> re.Match[str]:
        """Wait until a line of `node`'s training output in the bucket matches `pattern` (one
        local run in this home). Reads the agent's log chunks on disk, the moment its flush (~1 s)
        lands: the CLI prints a line only after a heartbeat announces its chunk and a poll reads
        it, seconds later on a loaded machine, which is too late to time a kill mid-epoch."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            ids = self.run_ids()
            if len(ids) == 1:
                logs = self.bucket / ids[0] / "logs" / node
                for chunk in sorted(logs.glob("*.log")):
                    with contextlib.suppress(OSError):  # rolled into a segment meanwhile
                        m = re.search(pattern, chunk.read_text(errors="replace"), re.M)
                        if m:
                            return m
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} not in {node}'s logs in time:\n{self.output()[-4000:]}")

    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.ledger().list_runs()]

    def live_processes(self) -> list[int]:
        """Every process of every local node this home ever started."""
        pids: list[int] = []
        for meta in self.home.glob("local/runs/*/nodes/*/node.json"):
            pids += session_pids(int(json.loads(meta.read_text())["pid"]))
        return pids

    def heartbeat(self, run_id: str, node: str) -> dict[str, object]:
        return json.loads((self.bucket / run_id / "heartbeat" / f"{node}.json").read_text())


def checkpoint_synced(keys: Callable[[str], Iterable[str]], prefix: str) -> bool:
    """Whether TensorFlow checkpoint `prefix` (a bucket key ending in "epoch-NNN.") has both its
    index and its data in the bucket, `keys(prefix)` listing the keys under it. Pure."""
    return {k.split(prefix, 1)[1][:4] for k in keys(prefix)} == {"inde", "data"}


def assert_clean(env: Env, run_id: str) -> None:
    """The ledger shows every resource deleted and no process of the run is left."""
    ledger = env.ledger()
    resources = ledger.resources(run_id)
    assert resources, "the ledger recorded no resource"
    states = [(r.resource_id, r.state) for r in resources]
    assert all(state == "deleted" for _, state in states), states
    assert env.live_processes() == []
    assert ledger.get_run(run_id).status == "done"  # type: ignore[union-attr]


@pytest.fixture
def ct(tmp_path: Path) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200")
    env.pop("CLOUDTRAIN_FAULTS", None)
    world = Env(home, env)
    yield world
    for pid in world.live_processes():  # never leave a process behind, even on failure
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
