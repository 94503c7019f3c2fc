"""A small evaluator of the IAM identity-policy subset cloudtrain's AWS roles use, shared by the
unit test of the node policies (tests/unit/providers/aws/test_aws_node_bucket_rights.py) and the
box's S3 authorizer (tests/fakes/s3_authorizer.py), so both judge a request alike.

`decide(policies, action, resource, context)` (and `decision`, its answer in the policy
simulator's words, for the box's SimulatePrincipalPolicy, tests/fakes/aws_front.py) follows
the IAM User Guide's "Policy evaluation logic" (docs.aws.amazon.com/IAM/latest/UserGuide/
reference_policies_evaluation-logic.html) for identity policies alone: an explicit Deny wins
over any Allow, and without an Allow the request is refused. Statements: Allow and Deny,
Action (case-insensitive) and Resource / NotResource (case-sensitive) with the `*` (any run of
characters, `/` included) and `?` (one) wildcards (reference_policies_elements_resource.html),
StringLike / StringEquals conditions; a condition key the request lacks fails its condition
(reference_policies_elements_condition.html). What it cannot evaluate raises ValueError, so a
policy outgrowing it is noticed, never misjudged.
"""

from __future__ import annotations

import re
from typing import Any

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
        raise ValueError(f"decide cannot evaluate {st}")
    if ("Resource" in st) == ("NotResource" in st):
        raise ValueError(f"a statement needs Resource or NotResource: {st}")
    if not any(_pattern(a, fold=True).fullmatch(action) for a in _listed(st["Action"])):
        return False
    hit = any(_pattern(r).fullmatch(resource) for r in _listed(st.get("Resource", [])))
    miss = not any(_pattern(r).fullmatch(resource) for r in _listed(st.get("NotResource", [])))
    if not (hit if "Resource" in st else miss):
        return False
    for operator, keys in st.get("Condition", {}).items():
        if operator not in ("StringLike", "StringEquals"):
            raise ValueError(f"decide cannot evaluate {operator}")
        for key, wanted in keys.items():
            got = context.get(key)
            exact = operator == "StringEquals"
            if got is None or not any(
                (got == w) if exact else bool(_pattern(w).fullmatch(got)) for w in _listed(wanted)
            ):
                return False
    return True


def decision(
    policies: list[dict[str, Any]],
    action: str,
    resource: str,
    context: dict[str, str] | None = None,
) -> str:
    """IAM's decision on the request, in the policy simulator's words (IAM API Reference,
    EvaluationResult.EvalDecision): "explicitDeny" when a matching statement denies it,
    "allowed" when one allows it and none denies, else "implicitDeny". Pure."""
    matching = [
        st
        for doc in policies
        for st in (doc["Statement"] if isinstance(doc["Statement"], list) else [doc["Statement"]])
        if _applies(st, action, resource, context or {})
    ]
    if any(st["Effect"] == "Deny" for st in matching):
        return "explicitDeny"
    return "allowed" if any(st["Effect"] == "Allow" for st in matching) else "implicitDeny"


def decide(
    policies: list[dict[str, Any]],
    action: str,
    resource: str,
    context: dict[str, str] | None = None,
) -> bool:
    """Whether identity policies `policies` allow the request: no matching Deny, some Allow."""
    return decision(policies, action, resource, context) == "allowed"
