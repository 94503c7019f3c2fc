"""Measure Azure node fan-out through the real azure-mgmt clients: N nodes cost about one node's
calls, not N.

How: serve the ARM fake (`tests/fakes/arm_fake.py`, HTTPS) in-process with every request delayed
by LATENCY_S, point AzureCompute at it (CLOUDTRAIN_ARM_ENDPOINT/CA, a static token), make the
run's network, then time `create_nodes` (per node: NIC PUT and poll, VM PUT, poll and GET, two
role assignments, a NIC listing) and `delete_listed` (per node: a VM GET, a role listing, three
role deletes, the VM DELETE and its poll) for N=8 and N=32. A serial fan-out would take N times
one node's calls. The fake must hold N VMs after the create and none after the delete. The SDK
import is timed apart, before the fan-outs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any

from _common import REPO, bench_home, figure, info, result

sys.path.insert(0, str(REPO))

from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from tests.fakes.arm_fake import ArmFake, start_arm_fake
from tests.fakes.arm_testkit import SUB

LATENCY_S = float(os.environ.get("ARM_LATENCY_S", "0.2"))
TARGET_S = 6.0


def slow(fake: ArmFake, latency_s: float) -> None:
    """Delay every request the fake serves (its server answers requests in parallel)."""
    handle = fake.handle

    def delayed(method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> Any:
        time.sleep(latency_s)
        return handle(method, raw_path, headers, raw_body)

    fake.handle = delayed  # type: ignore[method-assign]


def fan_out(fake: ArmFake, n: int) -> tuple[float, float]:
    """Create then delete `n` nodes: (create s, delete s)."""
    config = ProviderConfig(name="azure", region="eastus", options={"storage_account": "ctbench"})
    compute = AzureProvider(config).compute
    run_id = f"fanout{n}"
    run = RunInfo(run_id, "eastus", None, (2222, 2232), store_uri=f"az://ctbench/ct-{run_id}")
    compute.ensure_network(run)
    requests = [
        NodeRequest(run_id, "worker", i, "Standard_D4s_v5", "#!/bin/bash\n") for i in range(n)
    ]
    t0 = time.perf_counter()
    created = compute.create_nodes(run, requests)
    t1 = time.perf_counter()
    held = len(fake.resources(kind="virtualMachines"))
    if len(created) != n or held != n:
        raise SystemExit(f"N={n}: created {len(created)}, the fake holds {held}")
    t2 = time.perf_counter()
    compute.delete_listed(created)
    t3 = time.perf_counter()
    if fake.resources(kind="virtualMachines"):
        raise SystemExit(f"N={n}: VMs left after the delete")
    compute.delete_resources(compute.list_resources(run_id))
    total = t1 - t0 + t3 - t2
    info(f"N={n}: create {t1 - t0:.2f} s, delete {t3 - t2:.2f} s, total {total:.2f} s")
    return t1 - t0, t3 - t2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--small", type=int, default=8)
    args = parser.parse_args()
    with bench_home("azure_fanout"):
        fake = start_arm_fake()
        os.environ.update(
            CLOUDTRAIN_ARM_ENDPOINT=fake.url,
            CLOUDTRAIN_ARM_CA=fake.ca_path,
            AZURE_SUBSCRIPTION_ID=SUB,
        )
        try:
            t0 = time.perf_counter()
            for module in ("azure.mgmt.compute", "azure.mgmt.network"):
                importlib.import_module(module)  # paid once per CLI run, not per node

            figure("azure_sdk_import_s", time.perf_counter() - t0, stat="value")
            slow(fake, LATENCY_S)
            info(f"every ARM request waits {LATENCY_S:.1f} s; LROs need 1 poll")
            small_c, small_d = fan_out(fake, args.small)
            big_c, big_d = fan_out(fake, args.nodes)
        finally:
            fake.stop()
        figure(f"azure_fanout_total_{args.small}_s", small_c + small_d, stat="value")
        figure(f"azure_fanout_create_{args.nodes}_s", big_c, stat="value")
        ok = result(f"azure_fanout_total_{args.nodes}_s", big_c + big_d, TARGET_S, stat="value")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
