"""The GCP box's node identities: its metadata server with the service-account routes, the GCS
front that enforces the bucket's IAM policy, and what a training node VM's environment gets.

    with NodeIdentities(gcp_cloud) as ids:
        harness.metadata_url = ids.metadata.url
        ... Vm(..., env=ids.vm_env(vm_id, role)) ...

A training node's VM takes its instance's service account from the metadata server (google-auth
through GCE_METADATA_HOST) and reaches GCS through the front (STORAGE_EMULATOR_HOST), so every
request it makes carries its own token and is decided by the policy ensure_network wrote
(tests/fakes/gce_metadata_identity.py, tests/fakes/gcs_authorizer.py). A managed run's
controller VM keeps the box's environment (anonymous on the emulator, as the project's owner):
enforcing the controller's identity is issue 30's. The laptop side sets NO_GCE_CHECK=true
(`LAPTOP_ENV`) so its google-auth never probes for a metadata server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from tests.fakes.gce_metadata_identity import service_account_route, token_book, vm_env
from tests.fakes.gcs_authorizer import GcsFront
from tests.fakes.metadata_server import MetadataServer

# the box's laptop-side processes (the CLI, its controller): no metadata-server probe by
# google-auth (its `_metadata.is_on_gce`), whose ping would otherwise go to 169.254.169.254
LAPTOP_ENV = {"NO_GCE_CHECK": "true"}
CONTROLLER_ROLE = "controller"
# what `as_node` runs: the store operations, with the node side's real GcsStore
_NODE_SCRIPT = """
import json, sys
from cloudtrain.providers.gcp.storage import GcsStore
store = GcsStore(sys.argv[1])
out = {}
for op, key in json.loads(sys.argv[2]):
    try:
        if op == "put":
            store.put(key, b"x")
        elif op == "get":
            store.get(key)
        elif op == "delete":
            store.delete(key)
        else:
            store.list(key)
        out[op + " " + key] = "ok"
    except Exception as exc:
        out[op + " " + key] = type(exc).__name__ + ": " + str(exc)
print(json.dumps(out))
"""


class NodeIdentities:
    """The metadata server and the GCS front of one GCP box. `start()`, always `close()`."""

    def __init__(self, cloud: Any) -> None:
        self.cloud = cloud
        self.book = token_book()
        self.metadata: MetadataServer | None = None
        self.front: GcsFront | None = None

    def start(self, host: str = "127.0.0.1") -> NodeIdentities:
        """Serve both on `host` (daemon threads; a box whose VMs are hosts of their own gives
        its network's host address); ready on return."""
        self.metadata = MetadataServer(host=host)
        self.metadata.add_route(
            "/", service_account_route(self.cloud.gce, self.book, self.cloud.project)
        )
        self.front = GcsFront(self.cloud.gcs.url, self.book, host=host).start()
        return self

    def close(self) -> None:
        """Stop both. Idempotent."""
        if self.front is not None:
            self.front.close()
            self.front = None
        if self.metadata is not None:
            self.metadata.close()
            self.metadata = None

    def __enter__(self) -> NodeIdentities:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def vm_env(self, vm_id: str, role: str | None) -> Mapping[str, str | None]:
        """The environment changes of the VM `vm_id` whose node role is `role`: a training node
        takes its own credentials (gce_metadata_identity.vm_env); a controller VM none."""
        if role == CONTROLLER_ROLE or self.metadata is None or self.front is None:
            return {}
        return vm_env(self.metadata.url, vm_id, self.front.url)

    def as_node(
        self,
        vm_id: str,
        store_uri: str,
        ops: list[tuple[str, str]],
        base_env: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Run `ops` ((op, key): put, get, delete, list) on the store `store_uri` in a fresh
        process with the environment of the training node VM `vm_id` (`vm_env` over
        `base_env`, default this process's, without LAPTOP_ENV): "<op> <key>" -> "ok" or
        "<error type>: <message>". Blocks (up to 120 s)."""
        env = {k: v for k, v in (base_env or os.environ).items() if k not in LAPTOP_ENV}
        for key, value in self.vm_env(vm_id, "worker").items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        proc = subprocess.run(
            [sys.executable, "-c", _NODE_SCRIPT, store_uri, json.dumps(ops)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the node's process failed: {proc.stderr[-3000:]}")
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
