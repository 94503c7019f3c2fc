"""IAM's limits on the conditions of an allow policy, as setIamPolicy enforces them (tests only).

The box's policy writes (the GCE fake's projects and service accounts, gce_policies.py; the GCS
emulator's buckets, gcs_emulator.py) ask `policy_problem` and refuse with 400 what it names,
as IAM does ("Overview of IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview,
"Limitations"):

- a condition expression holds at most 12 logical operators: `&&`, `||` and unary `!`
  ("Logical operators" of the CEL section there). `!=` is a comparison, not a `!`, and what
  is inside a string literal is text; CEL's `in` is no logical operator either (openshift/ci-tools
  PR #5398, "gsm-secrets: match collections with CEL "in"": "GCP allows at most 12 logical
  operators per condition ... `in` is not counted"). Projects packing to this limit: 13
  `||`-joined tests per binding in GoogleCloudPlatform/cloud-foundation-fabric PR #3729;
- an expression is at most 12,800 characters (ibid., "Limitations", as
  providers/gcp/node_bindings.py cites it too);
- a condition's title is at most 100 characters and its description at most 256 (the limits
  gce_policies.py applied before; the `Expr` reference, https://cloud.google.com/iam/docs/
  reference/rest/v1/Expr, names the fields);
- one role and one principal have at most 20 conditional role bindings (ibid.; "max 20
  conditional bindings for the same role+principal ... cause apply failures",
  cloud-foundation-fabric PR #3729). A binding naming several principals counts for each.

Not a refusal, so not modelled: at most 100 conditional role bindings in one allow policy is
Google's advice (ibid., "Conditions in allow policies": a best practice, since more might pass
the policy's overall size limit), not a limit setIamPolicy enforces; the size limit itself
(1,500 principals, "Policy", https://cloud.google.com/iam/docs/reference/rest/v1/Policy) is not
modelled here.

Pure functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

MAX_LOGICAL_OPERATORS = 12
MAX_EXPRESSION = 12800
TITLE_MAX, DESCRIPTION_MAX = 100, 256
MAX_CONDITIONAL_PER_ROLE_AND_PRINCIPAL = 20


def _string_end(text: str, start: int) -> int:
    """The index just past the CEL string literal opening at `start` (a quote; a `r`/`R` before
    it makes it raw, with no escapes; three quotes open a triple-quoted one). An unclosed
    literal runs to the end. Pure."""
    raw = start > 0 and text[start - 1] in "rR"
    quote = text[start : start + 3] if text[start : start + 3] in ('"""', "'''") else text[start]
    i = start + len(quote)
    while i < len(text) and not text.startswith(quote, i):
        i += 2 if text[i] == "\\" and not raw else 1
    return min(len(text), i + len(quote))


def logical_operators(expression: str) -> int:
    """How many of `&&`, `||` and unary `!` the CEL expression holds, outside its string
    literals and `//` comments (`!=` is not one). Any text is counted, valid CEL or not. Pure."""
    count, i = 0, 0
    while i < len(expression):
        ch = expression[i]
        if ch in "\"'":
            i = _string_end(expression, i)
        elif expression.startswith("//", i):
            newline = expression.find("\n", i)
            i = len(expression) if newline < 0 else newline + 1
        elif expression.startswith(("&&", "||"), i):
            count, i = count + 1, i + 2
        else:
            count += ch == "!" and not expression.startswith("!=", i)
            i += 1
    return count


def condition_problem(condition: Mapping[str, Any]) -> str | None:
    """Why IAM refuses this condition (`title`, `description`, `expression`), or None when it is
    within the limits. Pure."""
    expression = str(condition.get("expression") or "")
    title = str(condition.get("title") or "")
    if len(expression) > MAX_EXPRESSION:
        return (
            f"The condition expression of {title!r} has {len(expression)} characters; "
            f"at most {MAX_EXPRESSION} are allowed."
        )
    operators = logical_operators(expression)
    if operators > MAX_LOGICAL_OPERATORS:
        return (
            f"The condition {title!r} has {operators} logical operators; "
            f"at most {MAX_LOGICAL_OPERATORS} are allowed in a condition expression."
        )
    if len(title) > TITLE_MAX:
        return f"The condition title is {len(title)} characters; at most {TITLE_MAX} are allowed."
    about = str(condition.get("description") or "")
    if len(about) > DESCRIPTION_MAX:
        return (
            f"The condition description of {title!r} is {len(about)} characters; "
            f"at most {DESCRIPTION_MAX} are allowed."
        )
    return None


def policy_problem(bindings: Iterable[Mapping[str, Any]]) -> str | None:
    """Why IAM refuses a policy of these bindings for its conditions (each condition's
    `condition_problem`, then the conditional bindings per role and principal), or None. Other
    checks (roles, members, versions) are the caller's. Pure."""
    per_principal: Counter[tuple[str, str]] = Counter()
    for binding in bindings:
        condition = binding.get("condition")
        if not isinstance(condition, Mapping):
            continue
        problem = condition_problem(condition)
        if problem:
            return problem
        role = str(binding.get("role") or "")
        per_principal.update((role, str(m)) for m in set(binding.get("members") or ()))
    for (role, member), count in sorted(per_principal.items()):
        if count > MAX_CONDITIONAL_PER_ROLE_AND_PRINCIPAL:
            return (
                f"The policy has {count} conditional role bindings for {role} and {member}; "
                f"at most {MAX_CONDITIONAL_PER_ROLE_AND_PRINCIPAL} are allowed for one role "
                "and principal."
            )
    return None
