"""cloudtrain's Horovod launcher (`cloudtrain.jobs.horovod`) against Horovod itself: horovod
0.28.1 built with Gloo against tensorflow 2.15.1, strategy horovod's stack (cloudtrain/run/
startup.py: HOROVOD_STACK), as the box builds it once per machine (tests/fakes/horovod_stack.py,
which tests/run.sh calls first; a cold machine builds it here, for minutes).

The controller's Python cannot import it (its TensorFlow is 2.21), so each check runs in the
stack's interpreter, with this checkout's cloudtrain on its path (stdlib-only node code):

- the slot plan is what Horovod's own `get_host_assignments` computes;
- the rendezvous server serves Gloo's HTTP store (a PUT, then a GET of a key);
- two "nodes" of two ranks each, launched by `launch_node` with the real server, run a real
  Gloo allreduce and broadcast over loopback (the launcher names `lo` as Gloo's interface).
Cross-host allreduce, with the job's example, is tests/e2e/test_horovod_real.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from cloudtrain.jobs import horovod as hvd
from tests.fakes import horovod_stack
from tests.unit.horovod_kit import hosts_of

ROOT = Path(__file__).resolve().parents[3]
PYTHON = "3.10"  # an image Python the stack has wheels for (Ubuntu 22.04's)
# cloudtrain.jobs is the repository's jobs/ folder (pyproject's package-dir)
PRELUDE = f"import cloudtrain\ncloudtrain.__path__.append({str(ROOT)!r})\n"


def in_stack(code: str, timeout: float = 120) -> str:
    """Run `code` in the stack's interpreter; its stdout. Fails the test on a non-zero exit."""
    proc = run_in_stack(code, timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def run_in_stack(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` in the stack's interpreter to its end. Blocks."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [str(horovod_stack.python(PYTHON)), "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("hosts", [[("a", 1)], [("a", 4)], [("a", 2), ("b", 2), ("c", 2)]])
def test_slot_plan_equals_get_host_assignments(hosts: list[tuple[str, int]]) -> None:
    out = in_stack(
        f"""
        import json
        from horovod.runner.common.util import hosts as util
        infos = [util.HostInfo(name, slots) for name, slots in {hosts!r}]
        slots = util.get_host_assignments(infos, {sum(s for _, s in hosts)})
        print(json.dumps([vars(s) for s in slots]))
        """
    )
    assert [vars(s) for s in hvd.slot_plan(hosts)] == json.loads(out)


def test_rendezvous_server_with_real_horovod() -> None:
    out = in_stack(
        f"""
        import http.client, socket
        from cloudtrain.jobs import horovod as hvd
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = hvd.start_rendezvous_server(port, hvd.slot_plan({hosts_of(1, 2)!r}))
        try:  # what Gloo's HTTPStore does: PUT then GET a key of a scope
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("PUT", "/global/rank_0", body=b"addr")
            print(repr(conn.getresponse().read()))
            conn.request("GET", "/global/rank_0")
            print(repr(conn.getresponse().read()))
            conn.close()
        finally:
            server.stop()
        """
    )
    assert out.split() == ["b''", "b'addr'"]


RANK = """
import horovod.tensorflow as hvd, os, tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
first = hvd.broadcast(tf.constant([float(hvd.rank() + 10)]), 0)
fields = (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_rank(), hvd.gloo_enabled(),
          float(total[0]), float(first[0]), os.environ["HOROVOD_GLOO_IFACE"])
# one write per line: the four ranks share one pipe, and an unbuffered print writes each of
# its arguments on its own (lines interleaved under load: "rankrank 1 4 ...")
os.write(1, (" ".join(map(str, ("rank", *fields))) + "\\n").encode())
"""


def test_two_nodes_of_two_ranks_allreduce_through_launch_node() -> None:
    proc = run_in_stack(
        f"""
        import os, shlex, socket, subprocess, sys
        from cloudtrain.jobs import horovod as hvd
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        addresses = [f"127.0.0.1:{{port}}"] * 2  # both nodes on this host
        regs = [{{"slots": 2}}, {{"slots": 2}}]

        def start(command, env, *, prefix, process_group):
            return subprocess.Popen(shlex.split(command), env=env,
                                    preexec_fn=lambda: os.setpgid(0, process_group))

        command = shlex.join([sys.executable, "-c", {RANK!r}])
        base = {{**os.environ, "CT_GPU_COUNT": "2"}}
        groups = [hvd.launch_node(command, base, addresses, regs, node, start=start)
                  for node in (0, 1)]
        print("exit", [group.wait(timeout=150) for group in groups])
        """,
        timeout=200,
    )
    out = proc.stdout
    said = out[-3000:] + proc.stderr[-6000:]  # the ranks' stderr too
    assert proc.returncode == 0, said
    lines = sorted(line.split() for line in out.splitlines() if line.startswith("rank "))
    # rank, size, local rank, cross rank, gloo, the allreduced sum (1+2+3+4), rank 0's value
    assert lines == [
        ["rank", str(r), "4", str(r % 2), str(r // 2), "True", "10.0", "10.0", "lo"]
        for r in range(4)
    ], said
    assert "exit [0, 0]" in out, said
