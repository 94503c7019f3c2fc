"""Issue 19's acceptance, on local for real: a node restoring a large checkpoint is never reported
lost, however long the restore takes, and the live view says it is restoring.

A first run leaves a 48 MiB checkpoint (a file the chief writes into its checkpoint folder,
with its sha256). `cloudtrain resume` then starts a second run from it, with the heartbeat
timeout at its minimum (10 s) and the nodes' bucket behind the faults wrapper's bandwidth limit
(3 MiB/s), so each node's restore takes about 16 s. Only the nodes are slowed: the plan reaches
them through $CT_PYTHON, a documented override of the node's interpreter (jobs/startup.sh.j2),
here a wrapper that exports $CLOUDTRAIN_FAULTS, so the controller's copy of the checkpoints into
the new run's prefix goes at full speed and is not what takes the time.

worker-0 (the chief) is created 8 s after worker-1 (`slow_create_s`), so worker-1 waits at the
checkpoint barrier and beats there before its restore begins: an agent whose heartbeat is silent
while it restores is then taken for lost (it was, before the heartbeat had its own thread: a
restart, a second attempt), while one that beats through it is not. The job needs no TensorFlow:
it checks that the restored file is whole, and prints its epoch line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import EXAMPLES, Env, assert_clean

pytestmark = pytest.mark.e2e
MiB = 1024 * 1024
NODE_FAULTS = {"store_bytes_per_s": 3 * MiB}  # 48 MiB: ~16 s, > the 10 s heartbeat timeout
CONTROLLER_FAULTS = {"slow_create_s": {"worker-0": 8}}
JOB = """\
set -eu
cd "$CLOUDTRAIN_CHECKPOINT_DIR"
if [ -f big.bin ]; then
  sha256sum --quiet -c big.sha256
  echo "$CLOUDTRAIN_ROLE-$CLOUDTRAIN_INDEX: the restored checkpoint is whole"
elif [ "$CLOUDTRAIN_IS_CHIEF" = 1 ]; then
  head -c 48M /dev/urandom > big.bin
  sha256sum big.bin > big.sha256
fi
echo "cloudtrain: epoch 1/1 done"
"""


def _job(ct: Env) -> Path:
    """A two-worker local job (digits-multiworker's spec) running JOB, no TensorFlow."""
    dest = ct.home / "jobs" / "bigckpt"
    dest.mkdir(parents=True)
    (dest / "job.sh").write_text(JOB)
    spec = yaml.safe_load((EXAMPLES / "digits-multiworker" / "job.yaml").read_text())
    spec.pop("setup", None)
    spec.update(name="bigckpt", workdir=".", entrypoint="bash job.sh")
    (dest / "job.yaml").write_text(yaml.safe_dump(spec))
    return dest / "job.yaml"


def _slow_node_python(ct: Env) -> str:
    """An interpreter for the nodes: this one, with the nodes' bucket slowed down."""
    wrapper = ct.home / "bin" / "slow-bucket-python"
    wrapper.parent.mkdir(parents=True)
    plan = json.dumps(NODE_FAULTS)
    wrapper.write_text(
        f"#!/bin/sh\nexport CLOUDTRAIN_FAULTS='{plan}'\nexec '{sys.executable}' \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_long_restore_is_never_taken_for_a_lost_node(ct: Env) -> None:
    job = _job(ct)
    first = ct.cli("run", "--json", str(job))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    (source,) = ct.run_ids()
    assert (ct.bucket / source / "checkpoints" / "big.bin").stat().st_size == 48 * MiB
    assert_clean(ct, source)

    ct.env.update(
        CLOUDTRAIN_HEARTBEAT_TIMEOUT_S="10",
        CLOUDTRAIN_FAULTS=json.dumps(CONTROLLER_FAULTS),
        CT_PYTHON=_slow_node_python(ct),
    )
    second = ct.cli("resume", "--json", source)
    progress = second.stderr  # with --json the plain live view goes to stderr
    assert second.returncode == 0, second.stdout[-2000:] + progress[-4000:]
    result = json.loads(second.stdout)
    assert (result["outcome"], result["attempts"]) == ("succeeded", 1), progress[-4000:]
    assert f"resuming {source}: copied 2 checkpoint files" in progress
    assert re.search(r"worker-1: restoring [\d.]+/50\.3 MB", progress), progress[-4000:]
    (new_id,) = [r for r in ct.run_ids() if r != source]
    logs = ct.cli("logs", new_id).stdout
    for node in ("worker-0", "worker-1"):
        assert f"{node}: the restored checkpoint is whole" in logs, logs[-3000:]
    assert_clean(ct, new_id)
