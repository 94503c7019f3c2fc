"""What the AWS node role may do to each key of the bucket protocol (issue 29, least privilege).

The policy is the one AwsCompute really sends (the PutRolePolicy request, read back from moto,
which checks IAM's grammar but enforces nothing), evaluated here key by key with `decide`: a
small evaluator of the IAM subset the role uses (Allow and Deny statements, Action, Resource
and NotResource with the `*`/`?` wildcards, StringLike/StringEquals conditions), as the IAM
User Guide's "Policy evaluation logic" states it: an explicit Deny wins over any Allow, and
without an Allow the request is refused. The keys and what the node may do to each are
`node_rights_kit.node_rights`'s table, built from the protocol's key builders.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cloudtrain import run_key
from cloudtrain.jobs import protocol as p
from tests.unit import security_kit as kit
from tests.unit.aws_kit import RUN, STORE, aws, ct, policy_doc, run_info
from tests.unit.node_rights_kit import node_rights, other_runs

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
STATEMENT_FIELDS = {"Sid", "Effect", "Action", "Resource", "NotResource", "Condition"}


def _pattern(wildcard: str, *, fold: bool = False) -> re.Pattern[str]:
    """An IAM wildcard (`*` any run of characters, `/` included; `?` one) as a regex."""
    body = ".*".join(".".join(re.escape(q) for q in s.split("?")) for s in wildcard.split("*"))
    return re.compile(body, re.IGNORECASE if fold else 0)


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _applies(st: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether statement `st` matches the request. Raises on what `decide` cannot evaluate."""
    if set(st) - STATEMENT_FIELDS or st.get("Effect") not in ("Allow", "Deny"):
        raise AssertionError(f"decide cannot evaluate {st}")
    if ("Resource" in st) == ("NotResource" in st):
        raise AssertionError(f"a statement needs Resource or NotResource: {st}")
    if not any(_pattern(a, fold=True).fullmatch(action) for a in _listed(st["Action"])):
        return False
    hit = any(_pattern(r).fullmatch(resource) for r in _listed(st.get("Resource", [])))
    miss = not any(_pattern(r).fullmatch(resource) for r in _listed(st.get("NotResource", [])))
    if not (hit if "Resource" in st else miss):
        return False
    for operator, keys in st.get("Condition", {}).items():
        if operator not in ("StringLike", "StringEquals"):
            raise AssertionError(f"decide cannot evaluate {operator}")
        for key, wanted in keys.items():
            got = context.get(key)
            exact = operator == "StringEquals"
            if got is None or not any(
                (got == w) if exact else bool(_pattern(w).fullmatch(got)) for w in _listed(wanted)
            ):
                return False
    return True


def decide(
    policies: list[dict[str, Any]],
    action: str,
    resource: str,
    context: dict[str, str] | None = None,
) -> bool:
    """Whether identity policies `policies` allow the request: no matching Deny, some Allow."""
    matching = [
        st
        for doc in policies
        for st in doc["Statement"]
        if _applies(st, action, resource, context or {})
    ]
    return any(st["Effect"] == "Allow" for st in matching) and not any(
        st["Effect"] == "Deny" for st in matching
    )


def _node_policies(ct: Any) -> list[dict[str, Any]]:
    """The node role's inline policies as the adapter sent them (and moto kept them)."""
    with kit.record_requests() as sent:
        ct.ensure_network(run_info())
    bodies = [json.loads(b) for b in sent.calls("iam", "PutRolePolicy")]
    node_role = f"cloudtrain-{RUN}"
    sent_docs = [json.loads(b["PolicyDocument"]) for b in bodies if b["RoleName"] == node_role]
    names = ct.iam.list_role_policies(RoleName=node_role)["PolicyNames"]
    kept = [
        policy_doc(ct.iam.get_role_policy(RoleName=node_role, PolicyName=n)["PolicyDocument"])
        for n in names
    ]
    assert sent_docs and kept == sent_docs
    assert ct.iam.list_attached_role_policies(RoleName=node_role)["AttachedPolicies"] == []
    return kept


def _arn(key: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/{STORE_PREFIX}/{key}"


def test_the_node_role_is_refused_the_key_and_the_controllers_documents(ct: Any) -> None:
    policies = _node_policies(ct)
    table = {**node_rights(RUN), **other_runs(RUN)}
    assert (False, False) in table.values() and (True, False) in table.values()
    wrong = [
        f"{action} {key}: want {'allowed' if want else 'refused'}"
        for key, (may_read, may_write) in table.items()
        for actions, want in ((READ, may_read), (WRITE, may_write))
        for action in actions
        if decide(policies, action, _arn(key)) != want
    ]
    assert not wrong, "\n".join(wrong)


def test_no_other_action_reaches_the_runs_key(ct: Any) -> None:
    policies = _node_policies(ct)
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
