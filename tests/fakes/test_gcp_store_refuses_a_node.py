"""The GCP box's store refuses a node by itself (issue 29): a process with a node VM's
environment (tests/fakes/gce_node_identity.py) takes its instance's service account from the
box's metadata server through google-auth, and the GCS front decides each of its requests by
the bucket policy ensure_network wrote (tests/fakes/gcs_authorizer.py).

The node's side is the real one: `GcsStore` with the environment's credentials
(providers/gcp/storage.py `environment_credentials`), in a fresh process, as on the VM.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from cloudtrain.jobs import protocol as proto
from cloudtrain.providers.gcp import identity
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes.gce_node_identity import NodeIdentities
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.unit.providers.gcp.test_gcp_identity import RUN, STORE, node, provider, run_info

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session", "provider"]  # fixtures
NODES = ("worker-0", "worker-1")
ME = "worker-1"


@pytest.fixture
def box(provider: GcpProvider, gcp_cloud: GcpCloud) -> Iterator[tuple[NodeIdentities, str]]:
    """The run's network (an account per node) and worker-1's instance; the box's identities.
    Yields them and worker-1's VM id (its GCE instance id)."""
    info = dataclasses.replace(run_info(), nodes=NODES)
    provider.compute.ensure_network(info)
    made = provider.compute.create_node(info, node(index=1))
    (inst,) = [i for i in gcp_cloud.gce.instances() if i["name"] == made.name]
    with NodeIdentities(gcp_cloud) as ids:
        yield ids, str(inst["id"])


def as_node(ids: NodeIdentities, vm_id: str, ops: list[tuple[str, str]]) -> dict[str, str]:
    """Run `ops` ((op, key) of the store) in a process with the node VM's environment."""
    return ids.as_node(vm_id, STORE, ops)


def test_a_nodes_own_token_is_refused_the_controllers_keys_and_a_peers(
    box: tuple[NodeIdentities, str], provider: GcpProvider
) -> None:
    ids, vm_id = box
    assert ids.front is not None
    refused = [
        proto.stop_key(RUN),
        proto.lease_key(RUN),
        proto.journal_prefix(RUN) + "1700000000000000000-000001-ab12.json",
        proto.status_key(RUN, "worker-0"),
        proto.status_key(RUN, "worker-10"),
    ]
    mine = [proto.status_key(RUN, ME), proto.heartbeat_key(RUN, ME)]
    got = as_node(ids, vm_id, [("put", k) for k in refused + mine])
    email = identity.node_email(provider.project, RUN, ME)
    for key in refused:
        answer = got[f"put {key}"]
        assert answer != "ok", key
        assert "storage.objects.create" in answer and email in answer, answer
    assert [got[f"put {k}"] for k in mine] == ["ok"] * len(mine)
    # every refusal was the front's, for this node's own account
    assert {r.email for r in ids.front.refusals} == {email}
    assert {r.permission for r in ids.front.refusals} == {"storage.objects.create"}


def test_a_node_reads_lists_and_replaces_what_it_may(
    box: tuple[NodeIdentities, str], provider: GcpProvider
) -> None:
    ids, vm_id = box
    store = provider.store(STORE)
    store.put(proto.cluster_key(RUN), b"{}")  # the controller: anonymous, the owner
    store.put(proto.run_prefix(RUN) + proto.KEY_NAME, b"secret")
    status = proto.status_key(RUN, ME)
    got = as_node(
        ids,
        vm_id,
        [
            ("get", proto.cluster_key(RUN)),
            ("list", proto.run_prefix(RUN)),
            ("put", status),
            ("put", status),  # a replacement needs delete too
            ("delete", status),
            ("get", proto.run_prefix(RUN) + proto.KEY_NAME),
            ("list", proto.RUNS_ROOT),
            ("delete", proto.cluster_key(RUN)),
        ],
    )
    oks = [f"get {proto.cluster_key(RUN)}", f"list {proto.run_prefix(RUN)}", f"put {status}"]
    oks.append(f"delete {status}")
    assert {k: got[k] for k in oks} == dict.fromkeys(oks, "ok")
    for key, permission in (
        (f"get {proto.run_prefix(RUN)}{proto.KEY_NAME}", "storage.objects.get"),
        (f"list {proto.RUNS_ROOT}", "storage.objects.list"),
        (f"delete {proto.cluster_key(RUN)}", "storage.objects.delete"),
    ):
        assert permission in got[key], (key, got[key])


def test_the_metadata_routes_answer_as_gce_does(
    box: tuple[NodeIdentities, str], provider: GcpProvider
) -> None:
    import urllib.error
    import urllib.request

    ids, vm_id = box
    assert ids.metadata is not None
    base = f"{ids.metadata.url}/vm/{vm_id}/computeMetadata/v1/instance/service-accounts/"

    def get(path: str, flavor: bool = True) -> tuple[int, str, Any]:
        req = urllib.request.Request(
            base + path, headers={"Metadata-Flavor": "Google"} if flavor else {}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.headers.get("Metadata-Flavor", ""), resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("Metadata-Flavor", ""), err.read().decode()

    email = identity.node_email(provider.project, RUN, ME)
    assert get("default/email") == (200, "Google", email)
    assert get("") == (200, "Google", f"default/\n{email}/\n")
    status, _, body = get("default/?recursive=true")
    assert status == 200 and json.loads(body)["email"] == email
    status, _, body = get("default/token")
    token = json.loads(body)
    assert status == 200 and token["token_type"] == "Bearer" and token["expires_in"] > 0
    assert ids.book.who(token["access_token"]) == email
    assert get("default/scopes")[2].splitlines() == [
        "https://www.googleapis.com/auth/devstorage.read_write"
    ]
    assert get("default/email", flavor=False)[0] == 403
    assert get("someone@else.iam.gserviceaccount.com/token")[0] == 404


def test_a_refusal_after_the_nodes_bindings_are_revoked_is_marked_unbound(
    box: tuple[NodeIdentities, str], provider: GcpProvider
) -> None:
    """A node's last flush after teardown revoked its bindings is refused, as on GCP; the front
    marks it `bound=False`, so a box run's "nothing refused" check tells it from a rule that is
    too tight (`bound=True`)."""
    ids, vm_id = box
    assert ids.front is not None
    status = proto.status_key(RUN, ME)
    assert as_node(ids, vm_id, [("put", proto.stop_key(RUN))]) != {}
    email = identity.node_email(provider.project, RUN, ME)
    client = identity.storage_client(provider.compute.auth)
    identity.revoke(client, email, STORE.removeprefix("gs://").split("/", 1)[0])
    got = as_node(ids, vm_id, [("put", status)])
    assert "storage.objects.create" in got[f"put {status}"], got
    assert [
        (r.resource.endswith(k), r.bound)
        for r, k in zip(ids.front.refusals, [proto.stop_key(RUN), status], strict=True)
    ] == [(True, True), (True, False)]
