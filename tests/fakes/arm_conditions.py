"""ABAC conditions of role assignments, as the ARM fake checks and evaluates them.

The subset of Azure's condition grammar that delegating role assignment management uses
("Azure role assignment condition format and syntax",
https://learn.microsoft.com/azure/role-based-access-control/conditions-format; "Examples to
delegate Azure role assignment management with conditions",
https://learn.microsoft.com/azure/role-based-access-control/delegate-role-assignments-examples):

    condition := term (("AND" | "OR") term)*        (AND binds tighter than OR)
    term      := "(" condition ")" | "!" "(" condition ")" | action | compare
    action    := ActionMatches{'Microsoft.Authorization/roleAssignments/write'|'.../delete'}
    compare   := (@Request|@Resource)[Microsoft.Authorization/roleAssignments:ATTR] OP {values}
    ATTR      := RoleDefinitionId | PrincipalType | PrincipalId
    OP        := ForAnyOfAnyValues:GuidEquals | ForAnyOfAllValues:GuidNotEquals
               | ForAnyOfAnyValues:StringEqualsIgnoreCase

`parse` raises ConditionError for anything else (an unknown attribute or operator, a value that
is not a GUID where a GUID is compared, unbalanced parentheses); `evaluate` decides a request.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

ACTIONS = {
    "Microsoft.Authorization/roleAssignments/write",
    "Microsoft.Authorization/roleAssignments/delete",
}
ATTRS = {"RoleDefinitionId", "PrincipalType", "PrincipalId"}
OPS = {
    "ForAnyOfAnyValues:GuidEquals",
    "ForAnyOfAllValues:GuidNotEquals",
    "ForAnyOfAnyValues:StringEqualsIgnoreCase",
}
_TOKEN = re.compile(
    r"\s*(?:(?P<paren>[()!])|(?P<word>AND|OR)\b"
    r"|ActionMatches\{'(?P<action>[^']*)'\}"
    r"|@(?P<source>Request|Resource)\[Microsoft\.Authorization/roleAssignments:(?P<attr>\w+)\]"
    r"\s+(?P<op>[\w:]+)\s*\{(?P<values>[^}]*)\})"
)


class ConditionError(ValueError):
    """A condition outside the supported grammar (the message says where)."""


@dataclass(frozen=True)
class Request:
    """What a role assignment write or delete asks: the action and the attributes."""

    action: str
    request: dict[str, str]  # @Request attributes (write)
    resource: dict[str, str]  # @Resource attributes (delete: the existing assignment)


def _tokens(text: str) -> list[dict[str, str]]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConditionError(f"cannot parse the condition at {text[pos : pos + 40]!r}")
        out.append({k: v for k, v in m.groupdict().items() if v is not None})
        pos = m.end()
    return out


def _values(tok: dict[str, str]) -> list[str]:
    raw = [v.strip() for v in tok["values"].split(",") if v.strip()]
    if tok["op"].split(":")[1].startswith("Guid"):
        for v in raw:
            try:
                uuid.UUID(v)
            except ValueError as exc:
                raise ConditionError(f"{v!r} is not a GUID") from exc
        return [v.lower() for v in raw]
    return [v.strip("'").lower() for v in raw]


def parse(text: str) -> Any:
    """The condition's tree: ("and"|"or", [kids]), ("not", kid), ("action", a),
    ("cmp", source, attr, op, values). Raises ConditionError."""
    toks = _tokens(text)
    pos = 0

    def peek() -> dict[str, str] | None:
        return toks[pos] if pos < len(toks) else None

    def take() -> dict[str, str]:
        nonlocal pos
        if pos >= len(toks):
            raise ConditionError("the condition ends too early")
        pos += 1
        return toks[pos - 1]

    def expr() -> Any:
        kids = [conj()]
        while (t := peek()) is not None and t.get("word") == "OR":
            take()
            kids.append(conj())
        return kids[0] if len(kids) == 1 else ("or", kids)

    def conj() -> Any:
        kids = [term()]
        while (t := peek()) is not None and t.get("word") == "AND":
            take()
            kids.append(term())
        return kids[0] if len(kids) == 1 else ("and", kids)

    def term() -> Any:
        t = take()
        if t.get("paren") == "(":
            inner = expr()
            if take().get("paren") != ")":
                raise ConditionError("unbalanced parentheses")
            return inner
        if t.get("paren") == "!":
            if take().get("paren") != "(":
                raise ConditionError("! needs parentheses")
            inner = expr()
            if take().get("paren") != ")":
                raise ConditionError("unbalanced parentheses")
            return ("not", inner)
        if "action" in t:
            if t["action"] not in ACTIONS:
                raise ConditionError(f"unsupported action {t['action']!r}")
            return ("action", t["action"])
        if "attr" in t:
            if t["attr"] not in ATTRS or t["op"] not in OPS:
                raise ConditionError(f"unsupported attribute or operator: {t}")
            return ("cmp", t["source"], t["attr"], t["op"], _values(t))
        raise ConditionError(f"unexpected {t}")

    tree = expr()
    if pos != len(toks):
        raise ConditionError("trailing text after the condition")
    return tree


def evaluate(text: str, req: Request) -> bool:
    """Whether the condition allows `req` (Azure: a missing attribute fails a comparison)."""

    def ev(node: Any) -> bool:
        kind = node[0]
        if kind == "and":
            return all(ev(k) for k in node[1])
        if kind == "or":
            return any(ev(k) for k in node[1])
        if kind == "not":
            return not ev(node[1])
        if kind == "action":
            return bool(req.action == node[1])
        _, source, attr, op, values = node
        got = (req.request if source == "Request" else req.resource).get(attr)
        if got is None:
            return False
        got = got.rsplit("/", 1)[-1].lower()  # a role definition id compares by its GUID
        return got not in values if op.endswith("NotEquals") else got in values

    return ev(parse(text))
