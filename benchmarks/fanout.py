"""Measure node fan-out: creating and deleting N nodes must cost about one call, not N calls.

How: wrap the local provider with the fault injector, `faults.wrap(LocalProvider(...),
FaultPlan(latency_s=1.0))`, so every compute call (create_node, delete_node, list_nodes) takes
at least 1 s, as a cloud API does. Build N NodeRequests (role worker, index 0..N-1) whose startup
script is `exec sleep 600`, then time `compute.create_nodes(run, requests)` and the parallel
delete of the nodes it returned (`compute.delete_listed`), separately and together. In between
and after, the inner (fault-free) compute must list N live nodes, then none, and no process of
any node's session may survive. Done for N=8 and N=64: the target is total <= 3 s at N=64, and
the N=8 figure shows the cost stays flat as N grows (a serial fan-out would take 2 * N seconds).

The floor: create_node then delete_node are two calls in sequence, so with 1 s of latency nothing
beats 2.0 s; the lines printed show the overhead above it. The teardown path
(`delete_nodes(run_id)`: list by tag, then delete) adds one listing call and is printed as a
supporting figure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from _common import bench_home, figure, info, result

from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from cloudtrain.providers.faults import FaultPlan, wrap
from cloudtrain.providers.local import LocalProvider, session_pids

TARGET_S = 3.0
LATENCY_S = 1.0
SCRIPT = "#!/usr/bin/env bash\nexec sleep 600\n"


def fan_out(root: Path, n: int, by_tag: bool = False) -> tuple[float, float]:
    """Create then delete `n` nodes; `by_tag` deletes as teardown does (list, then delete)."""
    floor_calls = 3 if by_tag else 2
    """Create then delete `n` nodes through the slow provider: (create s, delete s)."""
    provider = wrap(
        LocalProvider(ProviderConfig(name="local", options={"root": str(root)})),
        FaultPlan(latency_s=LATENCY_S),
    )
    compute, inner = provider.compute, provider.inner.compute
    run_id = f"fanout{n}"
    run = RunInfo(run_id=run_id, region="local", zone="local", port_range=(2222, 2232))
    requests = [
        NodeRequest(
            run_id=run_id, role="worker", index=i, instance_type="local", startup_script=SCRIPT
        )
        for i in range(n)
    ]
    try:
        t0 = time.perf_counter()
        created = compute.create_nodes(run, requests)
        t1 = time.perf_counter()
        live = [node for node in inner.list_nodes(run_id) if node.alive]
        if len(created) != n or len(live) != n:
            raise SystemExit(f"N={n}: created {len(created)}, list_nodes shows {len(live)} live")
        sessions = [int(node.cloud_id or 0) for node in live]
        t2 = time.perf_counter()
        if by_tag:
            compute.delete_nodes(run_id)
        else:
            compute.delete_listed(created)
        t3 = time.perf_counter()
        left = inner.list_nodes(run_id)
        survivors = [pid for sid in sessions for pid in session_pids(sid)]
        if left or survivors:
            raise SystemExit(f"N={n}: after delete, nodes {left} and processes {survivors} remain")
    finally:
        with contextlib.suppress(Exception):
            inner.delete_nodes(run_id)  # fault-free, only if something above failed
    calls = dict(compute.calls)
    total = t1 - t0 + t3 - t2
    info(
        f"N={n}{' (delete by tag)' if by_tag else ''}: create {t1 - t0:.2f} s, "
        f"delete {t3 - t2:.2f} s, total {total:.2f} s "
        f"(floor {floor_calls * LATENCY_S:.1f} s, +{total - floor_calls * LATENCY_S:.2f} s); "
        f"list_nodes showed {n} then 0; calls {calls}"
    )
    return t1 - t0, t3 - t2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--small", type=int, default=8)
    args = parser.parse_args()

    with bench_home("fanout"):
        root = Path(os.environ["CLOUDTRAIN_HOME"]) / "local"
        info(f"every compute call sleeps {LATENCY_S:.1f} s first (FaultPlan latency_s)")
        small_c, small_d = fan_out(root, args.small)
        big_c, big_d = fan_out(root, args.nodes)
        tag_c, tag_d = fan_out(root, args.nodes, by_tag=True)
        figure(f"fanout_teardown_path_{args.nodes}_s", tag_c + tag_d, stat="value")
        figure(f"fanout_create_{args.nodes}_s", big_c, stat="value")
        figure(f"fanout_delete_{args.nodes}_s", big_d, stat="value")
        figure(f"fanout_total_{args.small}_s", small_c + small_d, stat="value")
        ok = result(f"fanout_total_{args.nodes}_s", big_c + big_d, TARGET_S, stat="value")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
