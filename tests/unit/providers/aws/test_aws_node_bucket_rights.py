"""What each AWS node role may do to each key of the bucket protocol (issue 29, least privilege).

Each node's policy is the one AwsCompute really sends (the PutRolePolicy request of its role,
read back from moto), evaluated here key by key with `decide` (tests/fakes/iam_policy_eval.py,
the evaluator the box's S3 authorizer uses too: the IAM User Guide's "Policy evaluation logic",
an explicit Deny wins over any Allow, and without an Allow the request is refused). The keys and
what each node may do to each are `node_rights_kit.node_rights(run, node)`'s table, built from
the protocol's key builders, for every node of the run (chief-0, worker-0, worker-1, worker-10).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cloudtrain.jobs import protocol as p
from cloudtrain.providers.aws.identity import node_name
from cloudtrain.state import run_key
from tests.fakes.iam_policy_eval import decide
from tests.unit import security_kit as kit
from tests.unit.aws_kit import RUN, STORE, aws, ct, policy_doc, run_info
from tests.unit.node_rights_kit import NODES, node_rights, other_runs

__all__ = ["aws", "ct"]  # fixtures, for pytest
BUCKET, _, STORE_PREFIX = STORE.removeprefix("s3://").partition("/")
READ = ("s3:GetObject",)
# writing a key, multipart uploads included (resuming one lists its parts, replacing one aborts it)
WRITE = (
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


def _node_policies(ct: Any, node: str) -> list[dict[str, Any]]:
    """Node `node`'s role's inline policies as the adapter sent them (and moto kept them)."""
    with kit.record_requests() as sent:
        ct.ensure_network(run_info(nodes=NODES))
    bodies = [json.loads(b) for b in sent.calls("iam", "PutRolePolicy")]
    role = node_name(RUN, node)
    sent_docs = [json.loads(b["PolicyDocument"]) for b in bodies if b["RoleName"] == role]
    names = ct.iam.list_role_policies(RoleName=role)["PolicyNames"]
    kept = [
        policy_doc(ct.iam.get_role_policy(RoleName=role, PolicyName=n)["PolicyDocument"])
        for n in names
    ]
    assert sent_docs and kept == sent_docs
    assert ct.iam.list_attached_role_policies(RoleName=role)["AttachedPolicies"] == []
    return kept


def _arn(key: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/{STORE_PREFIX}/{key}"


@pytest.mark.parametrize("node", NODES)
def test_each_node_role_writes_its_own_keys_only(ct: Any, node: str) -> None:
    policies = _node_policies(ct, node)
    table = {**node_rights(RUN, node), **other_runs(RUN)}
    assert (False, False) in table.values() and (True, False) in table.values()
    wrong = [
        f"{action} {key}: want {'allowed' if want else 'refused'}"
        for key, (may_read, may_write) in table.items()
        for actions, want in ((READ, may_read), (WRITE, may_write))
        for action in actions
        if decide(policies, action, _arn(key)) != want
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("node", NODES)
def test_no_other_action_reaches_the_runs_key(ct: Any, node: str) -> None:
    policies = _node_policies(ct, node)
    sealed = _arn(run_key.key_object(RUN))
    for action in ("s3:GetObjectVersion", "s3:PutObjectAcl", "s3:GetObjectAttributes", "s3:*"):
        assert not decide(policies, action, sealed), action
    # the run's own listings still work: the rendezvous and the restore list their prefixes
    for prefix in (p.registrations_prefix(RUN, 2), p.checkpoints_prefix(RUN)):
        context = {"s3:prefix": f"{STORE_PREFIX}/{prefix}"}
        assert decide(policies, "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", context), prefix
    other = {"s3:prefix": f"{STORE_PREFIX}/{p.run_prefix('other-run')}"}
    assert not decide(policies, "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", other)


def test_decide_follows_iam_evaluation() -> None:
    allow = {"Effect": "Allow", "Action": "s3:*Object", "Resource": "arn:aws:s3:::b/r/*"}
    deny = {"Effect": "Deny", "Action": ["s3:PutObject"], "Resource": "arn:aws:s3:::b/r/k?y"}
    docs = [{"Statement": [allow]}, {"Statement": [deny]}]
    assert decide(docs, "S3:GETOBJECT", "arn:aws:s3:::b/r/a/b")  # actions ignore case
    assert decide(docs, "s3:GetObject", "arn:aws:s3:::b/r/key")
    assert not decide(docs, "s3:PutObject", "arn:aws:s3:::b/r/key")  # the Deny wins
    assert decide(docs, "s3:PutObject", "arn:aws:s3:::b/r/keey")  # `?` is one character
    assert not decide(docs, "s3:GetObject", "arn:aws:s3:::b/R/a")  # resources keep their case
    assert not decide(docs, "s3:GetObjectAcl", "arn:aws:s3:::b/r/a")  # no Allow: refused
    not_resource = {"Effect": "Deny", "Action": "s3:*", "NotResource": "arn:aws:s3:::b/r/*"}
    assert not decide([{"Statement": [allow, not_resource]}], "s3:GetObject", "arn:aws:s3:::b/x")
    assert decide([{"Statement": [allow, not_resource]}], "s3:GetObject", "arn:aws:s3:::b/r/x")
