"""Least privilege in the bucket, GCP (issue 29): what the run's node service account may do
with each key of the bucket protocol, read from the bucket policy the adapter really wrote
(google-cloud-storage against the GCS emulator, through `ensure_network`) and evaluated per
request by tests/fakes/gcs_iam_conditions.py (the emulator stores policies, never enforces
them).

The nodes may not read, write or delete `control/key`, nor write or delete the controllers'
documents (cluster.json, control/stop, control/lease, control/yield, control/launch.json,
ledger/, bundle/); they keep every right the agent uses. Every key comes from the protocol's
key builders (jobs/protocol.py, cloudtrain/run_key.py). Per-node rules (one node writing
another's status) are out of scope: one identity serves every node of the run.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from cloudtrain import run_key
from cloudtrain.jobs import protocol as proto
from cloudtrain.providers.gcp import identity
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes import gcs_iam_conditions as iam
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.unit.test_gcp_identity import BUCKET, RUN, provider, run_info

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session", "provider"]  # fixtures
ROOT = "pfx/"  # the store's own prefix (test_gcp_identity.STORE)
OTHER = "other-run-def456"
NODES = ("chief-0", "worker-1")
ATTEMPT = 2
SHA = "ab" * 32

# what a node may never touch: the run's key
KEY = run_key.key_object(RUN)
# the controllers' documents: a node reads some (cluster.json, stop, lease), writes none
CONTROLLER_DOCS = (
    proto.cluster_key(RUN),
    proto.stop_key(RUN),
    proto.lease_key(RUN),
    proto.yield_key(RUN),
    proto.launch_key(RUN),
    proto.journal_prefix(RUN) + "1700000000000000000-000001-ab12.json",
    proto.bundle_key(RUN, SHA),
)
# what the agent reads (jobs/agent.py, rendezvous.py, checkpoints.py, logpump.py, log_chunks.py)
AGENT_READS = (
    proto.cluster_key(RUN),
    proto.stop_key(RUN),
    proto.lease_key(RUN),
    proto.registration_key(RUN, ATTEMPT, NODES[1]),
    proto.checkpoints_ready_key(RUN, ATTEMPT),
    proto.checkpoints_prefix(RUN) + "ckpt-3.index",
    *(proto.log_index_key(RUN, n) for n in NODES),
    *(proto.log_chunk_key(RUN, n, 7) for n in NODES),
)
# what the agent lists (stop, registrations, the restore barrier, checkpoints, its metrics)
AGENT_LISTS = (
    proto.stop_key(RUN),
    proto.registrations_prefix(RUN, ATTEMPT),
    proto.checkpoints_ready_key(RUN, ATTEMPT),
    proto.checkpoints_prefix(RUN),
    *(proto.metrics_prefix(RUN, n) for n in NODES),
)
# what the agent writes and deletes (beats, logpump, metrics, node_trace, rendezvous,
# checkpoints, agent's notice and orphan report)
AGENT_WRITES = (
    *(
        key
        for node in NODES
        for key in (
            proto.status_key(RUN, node),
            proto.heartbeat_key(RUN, node),
            proto.notice_key(RUN, node),
            proto.log_chunk_key(RUN, node, 7),
            proto.log_segment_key(RUN, node, 0, 6),
            proto.log_index_key(RUN, node),
            proto.log_open_segment_key(RUN, node, 7),
            proto.metrics_chunk_key(RUN, node, 3),
            proto.trace_key(RUN, node),
            proto.registration_key(RUN, ATTEMPT, node),
        )
    ),
    proto.checkpoints_ready_key(RUN, ATTEMPT),
    proto.checkpoints_prefix(RUN) + "ckpt-3.data-00000-of-00001",
    proto.model_prefix(RUN) + "saved_model.pb",
    proto.tensorboard_prefix(RUN) + "train/events.out.tfevents.1.host",
    proto.orphaned_key(RUN),
)


def node_policy(provider: GcpProvider, gcp_cloud: GcpCloud) -> tuple[dict[str, Any], str]:
    """The bucket policy after the run's ensure_network, and the node account's member."""
    provider.compute.ensure_network(run_info())
    email = identity.service_account_email(provider.project, RUN)
    return gcp_cloud.gcs.iam_policy(BUCKET), f"serviceAccount:{email}"


def test_the_node_identity_never_reaches_the_runs_key(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    policy, node = node_policy(provider, gcp_cloud)
    name = ROOT + KEY
    assert not iam.can_read(policy, node, BUCKET, name), "a node can read control/key"
    assert not iam.can_write(policy, node, BUCKET, name), "a node can replace control/key"
    assert not iam.can_delete(policy, node, BUCKET, name), "a node can delete control/key"


def test_the_node_identity_writes_and_deletes_no_controller_document(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    policy, node = node_policy(provider, gcp_cloud)
    writable = [k for k in CONTROLLER_DOCS if iam.can_write(policy, node, BUCKET, ROOT + k)]
    deletable = [k for k in CONTROLLER_DOCS if iam.can_delete(policy, node, BUCKET, ROOT + k)]
    assert writable == [], "a node can write the controllers' documents"
    assert deletable == [], "a node can delete the controllers' documents"
    # nor can it make an object the controller then finds (create alone, on a new name)
    created = [
        k
        for k in CONTROLLER_DOCS
        if iam.allows(
            policy, node, iam.Request("storage.objects.create", iam.object_name(BUCKET, ROOT + k))
        )
    ]
    assert created == []


def test_the_node_identity_keeps_every_right_the_agent_uses(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    policy, node = node_policy(provider, gcp_cloud)
    unread = [k for k in AGENT_READS if not iam.can_read(policy, node, BUCKET, ROOT + k)]
    unlisted = [k for k in AGENT_LISTS if not iam.can_list(policy, node, BUCKET, ROOT + k)]
    unwritten = [k for k in AGENT_WRITES if not iam.can_write(policy, node, BUCKET, ROOT + k)]
    undeleted = [k for k in AGENT_WRITES if not iam.can_delete(policy, node, BUCKET, ROOT + k)]
    unread += [k for k in AGENT_WRITES if not iam.can_read(policy, node, BUCKET, ROOT + k)]
    assert (unread, unlisted, unwritten, undeleted) == ([], [], [], [])
    # the chief's large checkpoints: resumable uploads (JSON API) and XML multipart uploads
    part = iam.object_name(BUCKET, ROOT + proto.checkpoints_prefix(RUN) + "ckpt-3.data")
    for permission in ("storage.multipartUploads.create", "storage.multipartUploads.abort"):
        assert iam.allows(policy, node, iam.Request(permission, part)), permission


def test_the_node_identity_reaches_nothing_outside_its_run(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    policy, node = node_policy(provider, gcp_cloud)
    others = (proto.cluster_key(OTHER), proto.status_key(OTHER, "chief-0"), "unrelated.txt")
    for key in others:
        name = ROOT + key if key.startswith(proto.RUNS_ROOT) else key
        assert not iam.can_read(policy, node, BUCKET, name), name
        assert not iam.can_write(policy, node, BUCKET, name), name
        assert not iam.can_delete(policy, node, BUCKET, name), name
    for prefix in ("", ROOT, ROOT + proto.RUNS_ROOT, ROOT + proto.run_prefix(OTHER)):
        assert not iam.can_list(policy, node, BUCKET, prefix), f"a listing of {prefix!r}"


def test_each_condition_stays_within_iams_limits(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    policy, node = node_policy(provider, gcp_cloud)
    mine = [b for b in policy["bindings"] if node in b["members"]]
    assert mine and policy["version"] == 3
    for binding in mine:
        expression = binding["condition"]["expression"]
        iam.parse(expression)  # within the subset the evaluator knows, else ConditionError
        assert iam.logical_operators(expression) <= identity.MAX_LOGICAL_OPERATORS
        assert len(binding["condition"]["title"]) <= 100


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
    for unsupported in ('resource.name.endsWith("a")', 'resource.name == "a"', "true", ""):
        with pytest.raises(iam.ConditionError):
            iam.parse(unsupported)


def test_a_whole_prefix_binding_of_an_older_cloudtrain_is_replaced(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    """A node account that still holds the earlier shape (objectAdmin on the whole prefix, the
    controller's `grant`) loses it when the run's network is ensured again."""
    email = identity.service_account_email(provider.project, RUN)
    provider.compute.ensure_network(run_info())
    client = identity.storage_client(provider.auth())
    identity.grant(client, email, BUCKET, ROOT, RUN)
    policy = gcp_cloud.gcs.iam_policy(BUCKET)
    assert iam.can_read(policy, f"serviceAccount:{email}", BUCKET, ROOT + KEY)  # the old shape
    policy, node = node_policy(provider, gcp_cloud)
    assert not iam.can_read(policy, node, BUCKET, ROOT + KEY)
    assert sorted(b["role"] for b in policy["bindings"] if node in b["members"]) == [
        identity.OBJECT_ADMIN,
        identity.OBJECT_VIEWER,
    ]
