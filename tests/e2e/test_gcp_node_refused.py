"""Issue 29 on the GCP box: a node's own credentials are refused by the store itself.

A real detached run (`cloudtrain run --detach --no-controller --provider gcp`) makes one
service account per node and writes each node's bindings on the bucket; its node VMs boot with
their instance's service account from the box's metadata server and reach GCS through the
box's authorizing front (tests/fakes/gce_node_identity.py). With worker-1's VM's own
credentials (its token from the metadata route, as its google-auth gets it, in a process with
its environment), GCS refuses writing `control/stop`, `control/lease`, a journal entry under
`ledger/` and worker-0's status, with GCS's 403 `forbidden` naming the permission, and accepts
worker-1's own status; the run itself still succeeds, every node request allowed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest

from cloudtrain.jobs import protocol as proto
from tests.e2e.test_gcp_in_a_box import (
    REGION,
    GcpBox,
    gcp,
    gcp_cloud,
    gcs_emulator,
    gcs_emulator_session,
)

__all__ = ["gcp", "gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e


def _token(metadata_url: str, vm_id: str) -> str:
    """The VM's access token from the metadata route, as google-auth asks for it."""
    url = f"{metadata_url}/vm/{vm_id}/computeMetadata/v1/instance/service-accounts/default/token"
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(json.loads(resp.read())["access_token"])


def _upload(front: str, bucket: str, name: str, token: str) -> tuple[int, dict]:
    """A JSON API media upload with the bearer `token`: (status, JSON body)."""
    url = f"{front}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}"
    req = urllib.request.Request(
        url, data=b"{}", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_a_nodes_own_credentials_are_refused_the_controllers_keys_and_a_peers(
    gcp: GcpBox,
) -> None:
    job = gcp.ct.tick_job("refused", epochs=3, seconds=0.5)
    proc = gcp.run(
        "run", "--detach", "--no-controller", "--provider", "gcp", "--region", REGION, str(job)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_id,) = gcp.ct.run_ids()
    accounts = {a["displayName"].rsplit(" ", 1)[-1]: a["email"] for a in gcp.run_accounts(run_id)}
    assert sorted(accounts) == ["worker-0", "worker-1"], "one service account per node"
    (worker_1,) = [i for i in gcp.cloud.gce.instances() if i["name"].endswith("-worker-1")]
    assert [a["email"] for a in worker_1["serviceAccounts"]] == [accounts["worker-1"]]
    vm_id = str(worker_1["id"])
    store = f"gs://{gcp.bucket}"
    refused = [
        proto.stop_key(run_id),
        proto.lease_key(run_id),
        proto.journal_prefix(run_id) + "1700000000000000000-000001-ab12.json",
        proto.status_key(run_id, "worker-0"),
    ]
    ids = gcp.identities
    assert ids.front is not None and ids.metadata is not None
    got = ids.as_node(vm_id, store, [("put", k) for k in refused], gcp.ct.env)
    for key in refused:
        answer = got[f"put {key}"]
        assert "storage.objects.create" in answer and accounts["worker-1"] in answer, (key, answer)
    # GCS's own error, as the wire carries it
    token = _token(ids.metadata.url, vm_id)
    status, body = _upload(ids.front.url, gcp.bucket, proto.stop_key(run_id), token)
    assert status == 403 and body["error"]["code"] == 403, body
    assert body["error"]["errors"][0]["reason"] == "forbidden"
    assert body["error"]["message"].startswith(
        f"{accounts['worker-1']} does not have storage.objects.create access to"
    )
    # its own status is the node's to write
    mine = proto.status_key(run_id, "worker-1")
    assert _upload(ids.front.url, gcp.bucket, mine, token)[0] == 200
    # nothing of the refused reached the store
    keys = set(gcp.keys(proto.run_prefix(run_id)))
    assert not keys & {proto.stop_key(run_id), refused[2]}
    # the run goes on and succeeds with every node request allowed
    follow = gcp.run("logs", run_id, "--follow")
    assert "cloudtrain: epoch 3/3 done" in follow.stdout, follow.stdout[-3000:]
    status_doc = json.loads(gcp.run("status", run_id, "--json").stdout)
    assert status_doc["nodes"]["worker-1"]["status"]["state"] == "succeeded"
    # the front refused only those five (four through the store, one on the wire)
    bound = [r for r in ids.front.refusals if r.bound]  # not a flush after teardown
    assert len(bound) == len(refused) + 1, ids.front.refusals
    down = gcp.run("down", run_id)
    assert down.returncode == 0, down.stdout + down.stderr
    gcp.assert_nothing_left(run_id)
