"""Measure GCP node fan-out through the real google-cloud-compute client: N nodes cost about one
node's calls, not N.

How: serve the GCE fake (`tests/fakes/gce_fake.py`) in-process with every HTTP request delayed by
LATENCY_S (as a cloud API answers), operations taking 2 waits to be DONE, and point GcpCompute at
it (CLOUDTRAIN_GCE_ENDPOINT, anonymous credentials). Then time `create_nodes` (per node: insert,
two operation waits, one get) and `delete_listed` (per node: delete, two waits) for N=8 and
N=32. The floor is 7 calls in sequence, 7 x LATENCY_S; a serial fan-out would take N times that.
The fake must hold N instances after the create and none after the delete. The SDK's import
(about a second, paid once per CLI run) is timed apart, before the fan-outs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from _common import REPO, bench_home, figure, info, result

sys.path.insert(0, str(REPO))

from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes.gce_fake import GceFake, start_gce_fake

LATENCY_S = float(os.environ.get("GCE_LATENCY_S", "0.2"))
TARGET_S = 3.0
CALLS_PER_NODE = 7  # insert, wait, wait, get; delete, wait, wait


def slow(fake: GceFake, latency_s: float) -> None:
    """Delay every request the fake serves (its server answers requests in parallel)."""
    handle = fake.handle

    def delayed(method: str, raw_path: str, raw_body: bytes) -> tuple[int, dict[str, Any]]:
        time.sleep(latency_s)
        return handle(method, raw_path, raw_body)

    fake.handle = delayed  # type: ignore[method-assign]


def fan_out(fake: GceFake, n: int) -> tuple[float, float]:
    """Create then delete `n` nodes: (create s, delete s)."""
    provider = GcpProvider(
        ProviderConfig(name="gcp", region="us-central1", zone="us-central1-a", account="bench")
    )
    compute = provider.compute
    run_id = f"fanout{n}"
    run = RunInfo(run_id, "us-central1", "us-central1-a", (2222, 2232))
    requests = [
        NodeRequest(
            run_id,
            "worker",
            i,
            "n1-standard-8",
            "#!/bin/bash\n",
            accelerator="T4",
            accelerator_count=1,
        )
        for i in range(n)
    ]
    t0 = time.perf_counter()
    created = compute.create_nodes(run, requests)
    t1 = time.perf_counter()
    if len(created) != n or len(fake.instances()) != n:
        raise SystemExit(f"N={n}: created {len(created)}, the fake holds {len(fake.instances())}")
    t2 = time.perf_counter()
    compute.delete_listed(created)
    t3 = time.perf_counter()
    if fake.instances():
        raise SystemExit(f"N={n}: {len(fake.instances())} instance(s) left after the delete")
    total = t1 - t0 + t3 - t2
    floor = CALLS_PER_NODE * LATENCY_S
    info(
        f"N={n}: create {t1 - t0:.2f} s, delete {t3 - t2:.2f} s, total {total:.2f} s "
        f"(floor {floor:.1f} s, +{total - floor:.2f} s; serial would be ~{n * floor:.0f} s)"
    )
    return t1 - t0, t3 - t2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--small", type=int, default=8)
    args = parser.parse_args()
    with bench_home("gce_fanout"):
        fake = start_gce_fake()
        os.environ["CLOUDTRAIN_GCE_ENDPOINT"] = fake.url
        try:
            t0 = time.perf_counter()
            import google.cloud.compute_v1  # noqa: F401  (paid once per CLI run, not per node)

            figure("gce_sdk_import_s", time.perf_counter() - t0, stat="value")
            slow(fake, LATENCY_S)
            info(f"every GCE request waits {LATENCY_S:.1f} s; operations need 2 waits")
            small_c, small_d = fan_out(fake, args.small)
            big_c, big_d = fan_out(fake, args.nodes)
        finally:
            fake.stop()
        figure(f"gce_fanout_total_{args.small}_s", small_c + small_d, stat="value")
        figure(f"gce_fanout_create_{args.nodes}_s", big_c, stat="value")
        ok = result(f"gce_fanout_total_{args.nodes}_s", big_c + big_d, TARGET_S, stat="value")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
