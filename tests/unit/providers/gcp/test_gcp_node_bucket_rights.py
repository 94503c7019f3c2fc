"""Least privilege in the bucket, GCP (issue 29): what each node's own service account may do
with each key of the bucket protocol, read from the bucket policy the adapter really wrote
(google-cloud-storage against the GCS emulator, through `ensure_network`) and evaluated per
request by tests/fakes/gcs_iam_conditions.py, against tests/unit/node_rights_kit.py's table for
that node (built from the key builders, never from jobs/node_rights.py).

Every node reads the run's objects but `control/key`; writes and deletes its own keys (and the
chief its checkpoints, model, TensorBoard, orphan notice and restore marker), never the
controllers' documents nor another node's (worker-1 not worker-10's, whose id its own is a
prefix of); reaches nothing of another run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from cloudtrain.jobs import protocol as proto
from cloudtrain.providers.gcp import identity
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.state import run_key
from tests.fakes import gcs_iam_conditions as iam
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.unit import node_rights_kit as kit
from tests.unit.providers.gcp.test_gcp_identity import BUCKET, RUN, provider, run_info

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session", "provider"]  # fixtures
ROOT = "pfx/"  # the store's own prefix (test_gcp_identity.STORE)
OTHER = "other-run-def456"
ATTEMPT = 2

# what a node may never touch: the run's key
KEY = run_key.key_object(RUN)
# what the agent lists (stop, registrations, the restore barrier, checkpoints, its metrics)
AGENT_LISTS = (
    proto.stop_key(RUN),
    proto.registrations_prefix(RUN, ATTEMPT),
    proto.checkpoints_ready_key(RUN, ATTEMPT),
    proto.checkpoints_prefix(RUN),
    *(proto.metrics_prefix(RUN, n) for n in kit.NODES),
)


def ensured(provider: GcpProvider, gcp_cloud: GcpCloud) -> dict[str, Any]:
    """The bucket policy after ensure_network for a run of the kit's nodes."""
    provider.compute.ensure_network(dataclasses.replace(run_info(), nodes=kit.NODES))
    return gcp_cloud.gcs.iam_policy(BUCKET)


def member(provider: GcpProvider, node: str) -> str:
    return f"serviceAccount:{identity.node_email(provider.project, RUN, node)}"


def rights(policy: dict[str, Any], who: str, key: str) -> tuple[bool, bool]:
    """(may read, may write and delete) `key` of the store, for member `who`. A write needs
    create and delete (replacing), and a node that may create may delete what it made."""
    name = ROOT + key
    can_write = iam.can_write(policy, who, BUCKET, name)
    can_create = iam.allows(
        policy, who, iam.Request("storage.objects.create", iam.object_name(BUCKET, name))
    )
    can_delete = iam.can_delete(policy, who, BUCKET, name)
    assert can_write == can_create == can_delete, (key, can_write, can_create, can_delete)
    return iam.can_read(policy, who, BUCKET, name), can_write


@pytest.mark.parametrize("node", kit.NODES)
def test_each_node_account_has_exactly_its_rights(
    provider: GcpProvider, gcp_cloud: GcpCloud, node: str
) -> None:
    policy = ensured(provider, gcp_cloud)
    who = member(provider, node)
    table = {**kit.node_rights(RUN, node), **kit.other_runs(RUN)}
    actual = {key: rights(policy, who, key) for key in table}
    wrong = {key: (actual[key], want) for key, want in table.items() if actual[key] != want}
    assert wrong == {}, f"{node}: key -> (actual, wanted) (read, write)"


@pytest.mark.parametrize("node", kit.NODES)
def test_each_node_account_lists_inside_its_run_only(
    provider: GcpProvider, gcp_cloud: GcpCloud, node: str
) -> None:
    policy = ensured(provider, gcp_cloud)
    who = member(provider, node)
    unlisted = [k for k in AGENT_LISTS if not iam.can_list(policy, who, BUCKET, ROOT + k)]
    assert unlisted == []
    for prefix in ("", ROOT, ROOT + proto.RUNS_ROOT, ROOT + proto.run_prefix(OTHER)):
        assert not iam.can_list(policy, who, BUCKET, prefix), f"a listing of {prefix!r}"
    assert not iam.can_read(policy, who, BUCKET, "unrelated.txt")


def test_the_chief_uploads_large_checkpoints_the_workers_none(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    """Resumable uploads (JSON API) and XML multipart uploads of the chief's checkpoints."""
    policy = ensured(provider, gcp_cloud)
    part = iam.object_name(BUCKET, ROOT + proto.checkpoints_prefix(RUN) + "ckpt-3.data")
    for permission in ("storage.multipartUploads.create", "storage.multipartUploads.abort"):
        assert iam.allows(policy, member(provider, kit.CHIEF), iam.Request(permission, part))
        assert not iam.allows(policy, member(provider, kit.NODE), iam.Request(permission, part))


def test_each_node_has_its_own_account(provider: GcpProvider, gcp_cloud: GcpCloud) -> None:
    ensured(provider, gcp_cloud)
    accounts = {a["email"]: a for a in gcp_cloud.gce.service_accounts()}
    emails = {identity.node_email(provider.project, RUN, n) for n in kit.NODES}
    assert emails <= set(accounts) and len(emails) == len(kit.NODES)
    for node in kit.NODES:
        account = accounts[identity.node_email(provider.project, RUN, node)]
        assert identity.node_of(account) == (RUN, node)
        assert account["displayName"] == f"cloudtrain run {RUN} node {node}"


def test_each_condition_stays_within_iams_limits(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    policy = ensured(provider, gcp_cloud)
    assert policy["version"] == 3
    for node in kit.NODES:
        mine = [b for b in policy["bindings"] if member(provider, node) in b["members"]]
        assert mine, node
        for binding in mine:
            expression = binding["condition"]["expression"]
            iam.parse(expression)  # within the subset the evaluator knows, else ConditionError
            assert iam.logical_operators(expression) <= identity.MAX_LOGICAL_OPERATORS
            assert len(binding["condition"]["title"]) <= 100
        # the same role for the same principal: IAM allows at most 20 such bindings
        assert len([b for b in mine if b["role"] == identity.OBJECT_ADMIN]) <= 2
    conditional = [b for b in policy["bindings"] if b.get("condition")]
    assert len(conditional) == 1 + len(kit.NODES) + 1, "reads, a write each, the chief's second"


def test_the_evaluator_reads_the_subset_and_refuses_the_rest() -> None:
    """The evaluator's own check: negation and precedence as CEL has them, a listing's prefix
    attribute absent on object requests, and anything outside the subset an error."""
    expression = (
        '(resource.name.startsWith("a/") && !resource.name.startsWith("a/k")) || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("a/")'
    )
    assert iam.evaluate(expression, iam.Request("p", "a/x"))
    assert not iam.evaluate(expression, iam.Request("p", "a/key"))
    assert not iam.evaluate(expression, iam.Request("p", "b/x"))
    assert iam.evaluate(expression, iam.Request("p", "bucket", {iam.LIST_PREFIX: "a/k"}))
    assert iam.logical_operators(expression) == 3
    ends = 'resource.name.startsWith("a/") && resource.name.endsWith("/n.json")'
    assert iam.evaluate(ends, iam.Request("p", "a/attempt-3/n.json"))
    assert not iam.evaluate(ends, iam.Request("p", "a/attempt-3/n.json.tmp"))
    assert not iam.evaluate(ends, iam.Request("p", "b/attempt-3/n.json"))
    for unsupported in ('resource.name.contains("a")', 'resource.name == "a"', "true", ""):
        with pytest.raises(iam.ConditionError):
            iam.parse(unsupported)


def test_a_whole_prefix_binding_of_an_older_cloudtrain_is_replaced(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    """A node account that holds another shape (objectAdmin on the whole prefix, the
    controller's `grant`) loses it when the run's network is ensured again."""
    email = identity.node_email(provider.project, RUN, kit.NODE)
    ensured(provider, gcp_cloud)
    client = identity.storage_client(provider.auth())
    identity.grant(client, email, BUCKET, ROOT, RUN)
    policy = gcp_cloud.gcs.iam_policy(BUCKET)
    assert iam.can_read(policy, f"serviceAccount:{email}", BUCKET, ROOT + KEY)  # the old shape
    policy = ensured(provider, gcp_cloud)
    node = member(provider, kit.NODE)
    assert not iam.can_read(policy, node, BUCKET, ROOT + KEY)
    assert sorted(b["role"] for b in policy["bindings"] if node in b["members"]) == [
        identity.OBJECT_ADMIN,
        identity.OBJECT_VIEWER,
    ]
