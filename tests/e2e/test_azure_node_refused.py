"""Issue 29 on the Azure box: the store itself refuses a node's managed identity.

The run's nodes are made by the real AzureCompute against the ARM fake (each VM its own
system-assigned identity, granted the run's container under its own ABAC condition). Then,
as a node's cloudtrain does on its VM, a BlobStore without a connection string takes
DefaultAzureCredential, whose ManagedIdentityCredential gets the VM's token from the box's IMDS
route (AZURE_POD_IDENTITY_AUTHORITY_HOST = that VM's view of the metadata service), and talks to
the box's Blob front (tests/fakes/blob_authorizer.py), which authorizes each request by the
ARM fake's role assignments and conditions before Azurite serves it. The node may write its own
status; `control/stop`, `control/lease`, a journal entry and another node's status are refused
with Blob storage's 403 AuthorizationPermissionMismatch, and nothing of them reaches Azurite.
A listing outside the run's prefix (another run's, every run's, the whole container, or none)
is refused by the condition's List Blobs prefix rule; and the front enforces the node's role
as its definition in the ARM fake says (node_role.py's custom role: narrowing it there narrows
what the node may do).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from azure.storage.blob import BlobServiceClient

from cloudtrain.core.errors import CloudtrainError
from cloudtrain.jobs import protocol as proto
from cloudtrain.providers.azure import node_role
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.azure.provider import AzureProvider
from cloudtrain.providers.azure.storage import BlobStore
from cloudtrain.providers.base import NodeRequest, RunInfo
from cloudtrain.state import journal
from tests.fakes.arm_testkit import ArmClients
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azure_config, azurite, azurite_session
from tests.fakes.azure_imds_identity import TOKEN_PATH
from tests.fakes.azure_node_identity import NodeIdentities

__all__ = ["azure_cloud", "azurite", "azurite_session"]  # fixtures, for pytest
pytestmark = pytest.mark.e2e
RUN = "box-noderef1"
STORE = f"az://devstoreaccount1/ct-{RUN}"
NODES = ("worker-0", "worker-1")


@pytest.fixture
def box(
    azure_cloud: AzureCloud, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[NodeIdentities, dict[str, str]]]:
    """The run's two nodes made for real, and the box's identities; yields (them, node id ->
    vmId)."""
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_AZURE_RESOURCE_GROUP", raising=False)
    provider = AzureProvider(azure_config("eastus"))
    provider.store(STORE).ensure_bucket()
    compute: AzureCompute = provider.compute
    run = RunInfo(RUN, "eastus", None, (2222, 2232), store_uri=STORE, nodes=NODES)
    compute.ensure_network(run)
    for node in NODES:
        role, _, index = node.rpartition("-")
        request = NodeRequest(RUN, role, int(index), "Standard_D4s_v5", "#!/bin/bash\n")
        compute.create_node(run, request)
    vm_ids = {}
    for vm in azure_cloud.arm.resources(kind="virtualMachines"):
        tags = vm["tags"]
        vm_ids[f"{tags['cloudtrain-role']}-{tags['cloudtrain-index']}"] = vm["properties"]["vmId"]
    with NodeIdentities(azure_cloud) as ids:
        yield ids, vm_ids


def node_store(ids: NodeIdentities, vm_id: str, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    """The store as the node's cloudtrain opens it on its VM, in the VM's environment."""
    for name, value in ids.vm_env(vm_id, "worker").items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    from azure.identity import DefaultAzureCredential

    # a fresh credential (the process's shared one belongs to no VM); what the store builds
    credential = DefaultAzureCredential(exclude_cli_credential=True)
    return BlobStore(STORE, credential=credential, client_options={"retry_total": 0})


def test_the_store_refuses_a_nodes_writes_outside_its_own_keys(
    box: tuple[NodeIdentities, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vm_ids = box
    store = node_store(ids, vm_ids["worker-1"], monkeypatch)
    mine = proto.status_key(RUN, "worker-1")
    store.put(mine, b'{"state": "running"}')  # its own status: accepted
    assert store.get(mine) == b'{"state": "running"}'
    entry = proto.journal_prefix(RUN) + journal.entry_key(1, 0, journal.writer_id("laptop"))
    refused = (
        proto.stop_key(RUN),
        proto.lease_key(RUN),
        entry,
        proto.status_key(RUN, "worker-0"),
    )
    for key in refused:
        with pytest.raises(CloudtrainError) as err:
            store.put(key, b"{}")
        assert "AuthorizationPermissionMismatch" in str(err.value), (key, str(err.value))
    names = [
        b.name for b in ids.cloud.azurite.client().get_container_client(f"ct-{RUN}").list_blobs()
    ]
    assert names == [mine], names
    refusals = [(r.method, r.blob) for r in ids.front.refusals]
    assert refusals == [("PUT", key) for key in refused], refusals
    # the node still reads what it needs: the run's listing and another node's status
    assert [o.key for o in store.list(proto.status_prefix(RUN))] == [mine]


def test_the_imds_route_answers_as_azures_does(
    box: tuple[NodeIdentities, dict[str, str]],
) -> None:
    ids, vm_ids = box
    url = f"{ids.imds(vm_ids['worker-0'])}{TOKEN_PATH}?api-version=2018-02-01"
    storage = "&resource=https%3A%2F%2Fstorage.azure.com%2F"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as err:  # no Metadata header: 400
        opener.open(url + storage, timeout=5)
    assert err.value.code == 400
    asked = urllib.request.Request(url + storage, headers={"Metadata": "true"})
    with opener.open(asked, timeout=5) as resp:
        token = json.loads(resp.read())
    wanted = {"access_token", "expires_in", "expires_on", "ext_expires_in", "not_before"}
    assert wanted | {"resource", "token_type"} <= set(token), token
    assert token["resource"] == "https://storage.azure.com/" and token["token_type"] == "Bearer"
    principal = {
        v["properties"]["vmId"]: v["identity"]["principalId"]
        for v in ids.cloud.arm.resources(kind="virtualMachines")
    }[vm_ids["worker-0"]]
    assert ids.book.who(token["access_token"]) == principal
    no_vm = urllib.request.Request(
        f"{ids.imds('no-such-vm')}{TOKEN_PATH}?api-version=2018-02-01{storage}",
        headers={"Metadata": "true"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(no_vm, timeout=5)
    assert err.value.code == 400


def test_the_front_authenticates_and_lets_the_account_key_through(
    box: tuple[NodeIdentities, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vm_ids = box
    mine = proto.status_key(RUN, "worker-0")
    # a token the box's IMDS never issued, and one for another audience: 401
    ssl_context = ssl.create_default_context(cafile=ids.front.ca_path)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ssl_context)
    )
    arm_token = ids.book.issue(
        "00000000-0000-0000-0000-000000000001", "https://management.azure.com/"
    )
    for token in ("forged", arm_token):
        asked = urllib.request.Request(
            f"{ids.front.endpoint}/ct-{RUN}/{mine}",
            headers={"Authorization": f"Bearer {token}", "x-ms-version": "2025-11-05"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            opener.open(asked, timeout=5)
        assert err.value.code == 401
        assert err.value.headers["x-ms-error-code"] == "InvalidAuthenticationInfo"
    # the node deletes its own keys, not another node's
    store = node_store(ids, vm_ids["worker-0"], monkeypatch)
    store.put(mine, b"{}")
    store.delete(mine)
    assert store.list(mine) == []
    # the account key (the controller's connection string) goes through as the owner
    keyed = BlobServiceClient.from_connection_string(
        ids.cloud.azurite.connection_string.replace(ids.cloud.azurite.endpoint, ids.front.endpoint),
        connection_verify=ids.front.ca_path,
    )
    keyed.get_blob_client(f"ct-{RUN}", proto.stop_key(RUN)).upload_blob(b"{}")
    with pytest.raises(CloudtrainError, match="AuthorizationPermissionMismatch"):
        store.delete(proto.stop_key(RUN))
    assert [o.key for o in store.list(proto.stop_key(RUN))] == [proto.stop_key(RUN)]


def test_a_node_lists_only_under_its_runs_prefix(
    box: tuple[NodeIdentities, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vm_ids = box
    keyed = ids.cloud.azurite.client().get_container_client(f"ct-{RUN}")
    theirs = proto.status_key("box-other1", "worker-0")  # another run's, in the same container
    keyed.upload_blob(theirs, b"{}")
    store = node_store(ids, vm_ids["worker-0"], monkeypatch)
    mine = proto.status_key(RUN, "worker-0")
    store.put(mine, b"{}")
    assert [o.key for o in store.list(proto.run_prefix(RUN))] == [mine]
    for prefix in (proto.run_prefix("box-other1"), proto.RUNS_ROOT, ""):
        with pytest.raises(CloudtrainError, match="AuthorizationPermissionMismatch"):
            store.list(prefix)
    # a List Blobs without any prefix (the SDK's own call): refused too
    container = store._containers()
    with pytest.raises(Exception, match="AuthorizationPermissionMismatch"):
        list(container.list_blobs())
    listings = [r for r in ids.front.refusals if r.method == "GET" and r.blob is None]
    assert len(listings) == 4, ids.front.refusals


def test_the_front_enforces_the_nodes_role_as_defined(
    box: tuple[NodeIdentities, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vm_ids = box
    store = node_store(ids, vm_ids["worker-0"], monkeypatch)
    mine = proto.status_key(RUN, "worker-0")
    store.put(mine, b"{}")
    # the node role without blobs/delete: the front takes the role's data actions from its
    # definition in the ARM fake, so the node's own delete is refused now
    az = ArmClients(ids.cloud.arm)
    narrowed = node_role.definition(az.sub)
    block = narrowed["properties"]["permissions"][0]
    block["dataActions"] = [a for a in block["dataActions"] if not a.endswith("/delete")]
    az.auth.role_definitions.create_or_update(
        f"/subscriptions/{az.sub}", node_role.role_guid(az.sub), narrowed
    )
    with pytest.raises(CloudtrainError, match="AuthorizationPermissionMismatch"):
        store.delete(mine)
    store.put(mine, b'{"state": "running"}')  # still written
    assert store.get(mine) == b'{"state": "running"}'
