"""What the TPU fake's tests share: a GCE fake (the account) with the TPU fake beside it, and
a google-cloud-tpu client at it (`TpuBench`, fixture `tpu_bench`), plus `FAST`, a polling
policy that makes `operation.result(polling=FAST)` poll every 10-50 ms instead of the client's
1 s first wait. Tests only; import it after `pytest.importorskip("google.cloud.tpu_v2")`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core.future import polling
from google.cloud import tpu_v2

from tests.fakes.gce_fake import GceFake, start_gce_fake
from tests.fakes.tpu_fake import TpuFake, start_tpu_fake

PROJECT = "ct-test"
ZONE = "us-west4-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "tpu-vm-tf-2.16.1-pjrt"
FAST = polling.DEFAULT_POLLING.with_delay(initial=0.01, maximum=0.05).with_timeout(10)


class TpuBench:
    """The GCE fake (the account), the TPU fake beside it, and a TPU client at it."""

    def __init__(self, gce: GceFake, tpu: TpuFake) -> None:
        self.gce, self.tpu = gce, tpu
        self.client = tpu_v2.TpuClient(**tpu.client_kwargs())

    def create(self, node_id: str, **fields: Any) -> Any:
        """Start a node create; answers the client's operation future."""
        fields.setdefault("accelerator_type", "v5litepod-8")
        fields.setdefault("runtime_version", RUNTIME)
        return self.client.create_node(parent=PARENT, node_id=node_id, node=tpu_v2.Node(**fields))

    def queue(
        self,
        queued_id: str,
        node_id: str,
        spot: bool = True,
        queueing_policy: Any = None,
        **fields: Any,
    ) -> Any:
        """Start a queued-resource create of one node (`fields`: the node's)."""
        fields.setdefault("accelerator_type", "v5litepod-8")
        fields.setdefault("runtime_version", RUNTIME)
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=PARENT, node_id=node_id, node=tpu_v2.Node(**fields)
        )
        tier: dict[str, Any] = {"spot": tpu_v2.QueuedResource.Spot()} if spot else {}
        if queueing_policy is not None:
            tier["queueing_policy"] = queueing_policy
        queued = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), **tier)
        return self.client.create_queued_resource(
            parent=PARENT, queued_resource_id=queued_id, queued_resource=queued
        )

    def queued_state(self, queued_id: str) -> Any:
        """One GET of the queued resource (one step of its time): its state."""
        return self.client.get_queued_resource(name=f"{PARENT}/queuedResources/{queued_id}").state


@pytest.fixture
def tpu_bench() -> Iterator[TpuBench]:
    """Both fakes, started for one test and stopped after."""
    gce = start_gce_fake()
    tpu = start_tpu_fake(gce)
    try:
        yield TpuBench(gce, tpu)
    finally:
        tpu.stop()
        gce.stop()
