"""A TPU VM's view of the box's metadata server: its service account and its TPU attributes.

    identities = TpuNodeIdentities(gcp_cloud, tpu_fake).start()   # instead of NodeIdentities
    ... Vm(..., env=identities.vm_env(vm_id, role)) ...

A Cloud TPU VM is a Compute Engine VM: its metadata server answers what a GCE VM's does
(`instance/preempted`, `instance/network-interfaces/0/ip`, the service-account routes), for the
TPU node's own service account (`Node.serviceAccount`, as the TPU API fake stores it), plus the
TPU VM's attributes that TPU tooling reads there (`curl -H 'Metadata-Flavor: Google'
http://metadata.google.internal/computeMetadata/v1/instance/attributes/accelerator-type`, and
`agent-worker-number`, `instance/description` the TPU's name: as public TPU VM scripts read them,
e.g. the probes found through the `find_string` index; Google's pages in reach do not list
them):

- `instance/attributes/accelerator-type`: the node's `acceleratorType` (`v5litepod-8`);
- `instance/attributes/agent-worker-number`: `0` (single-host slices: one worker);
- `instance/description`: the node id.

`TpuNodeIdentities` is the GCP box's NodeIdentities (tests/fakes/gce_node_identity.py) whose
metadata server knows the TPU fake's nodes too: a TPU VM (the Vm id is its node's `id`) takes its
node's service account from it, and its GCS requests go through the same front, decided by the
bucket policy. Each answer needs `Metadata-Flavor: Google` (else 403), as GCE's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.fakes.gce_metadata_identity import Answer, service_account_route
from tests.fakes.gce_node_identity import NodeIdentities
from tests.fakes.gcs_authorizer import GcsFront
from tests.fakes.metadata_server import MetadataServer
from tests.fakes.tpu_fake import TpuFake

ROOT = "/computeMetadata/v1/instance/"
_FLAVOR = {"Metadata-Flavor": "Google", "Content-Type": "application/text"}


class _Machines:
    """The GCE fake's instances and the TPU fake's nodes as instances (`id`, `serviceAccounts`
    [{email, scopes}]): what `service_account_route` asks about the VM of an id."""

    def __init__(self, gce: Any, tpu: TpuFake) -> None:
        self.gce, self.tpu = gce, tpu

    def instances(self) -> list[dict[str, Any]]:
        nodes = [
            {
                "id": node["id"],
                "serviceAccounts": [
                    {
                        "email": node["serviceAccount"]["email"],
                        "scopes": list(node["serviceAccount"].get("scope") or []),
                    }
                ],
            }
            for node in self.tpu.nodes()
        ]
        return [*self.gce.instances(), *nodes]


def tpu_attributes_route(tpu: TpuFake) -> Any:
    """The metadata route of a TPU VM's own attributes (module docstring); None (fall through)
    for another path or a VM that is no TPU node."""

    def handle(
        method: str,
        path: str,
        query: Mapping[str, list[str]],
        headers: Mapping[str, str],
        asker: str,
        client: str,
    ) -> Answer | None:
        node = next((n for n in tpu.nodes() if n["id"] == asker), None) if asker else None
        values = {
            ROOT + "attributes/accelerator-type": lambda n: n["acceleratorType"],
            ROOT + "attributes/agent-worker-number": lambda n: "0",
            ROOT + "description": lambda n: n["name"].rsplit("/", 1)[-1],
        }
        if node is None or path not in values:
            return None
        if "x-forwarded-for" in headers or headers.get("metadata-flavor") != "Google":
            return 403, {"Content-Type": "text/html"}, b"Missing Metadata-Flavor:Google header."
        return 200, dict(_FLAVOR), str(values[path](node)).encode()

    return handle


class TpuNodeIdentities(NodeIdentities):
    """NodeIdentities whose metadata server also serves the TPU fake's nodes."""

    def __init__(self, cloud: Any, tpu: TpuFake) -> None:
        super().__init__(cloud)
        self.tpu = tpu

    def start(self) -> TpuNodeIdentities:
        """Serve the metadata server and the GCS front on 127.0.0.1; ready on return."""
        self.metadata = MetadataServer()
        machines = _Machines(self.cloud.gce, self.tpu)
        self.metadata.add_route("/", service_account_route(machines, self.book, self.cloud.project))
        self.metadata.add_route(ROOT, tpu_attributes_route(self.tpu))
        self.front = GcsFront(self.cloud.gcs.url, self.book).start()
        return self
