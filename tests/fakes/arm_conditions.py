"""ABAC conditions of role assignments, as the ARM fake checks and evaluates them.

The subset of Azure's condition grammar (version 2.0) that cloudtrain's assignments use
("Azure role assignment condition format and syntax",
https://learn.microsoft.com/azure/role-based-access-control/conditions-format): delegating role
assignment management ("Examples to delegate Azure role assignment management with
conditions", https://learn.microsoft.com/azure/role-based-access-control/delegate-role-assignments-examples)
and the blob path rules of a node's Storage Blob Data Contributor assignment ("Actions and
attributes for Azure role assignment conditions for Azure Blob Storage",
https://learn.microsoft.com/azure/storage/blobs/storage-auth-abac-attributes):

    condition := term (("AND" | "OR") term)*   (one operator per level: "a AND b OR c" must be
                                                 parenthesized, as Azure requires)
    term      := "(" condition ")" | "!" "(" condition ")" | "NOT" term | action
               | suboperation | compare
    action    := ActionMatches{'ACTION'}          (ACTIONS)
    suboperation := SubOperationMatches{'Blob.List'}
    compare   := (@Request|@Resource)[NAMESPACE:ATTR] OP {values} | ... OP 'value'
    ATTR      := Microsoft.Authorization/roleAssignments: RoleDefinitionId | PrincipalType
                 | PrincipalId; Microsoft.Storage/storageAccounts/blobServices/containers/blobs:
                 path (@Resource only) | prefix (@Request only: List Blobs' prefix parameter,
                 "Blob prefix" on the attributes page)
    OP        := ForAnyOfAnyValues:GuidEquals | ForAnyOfAllValues:GuidNotEquals
               | ForAnyOfAnyValues:StringEqualsIgnoreCase (role assignments)
               | StringEquals | StringNotEquals | StringLike | StringNotLike
               | StringStartsWith | StringNotStartsWith (a blob's path or prefix, both of type
                 String, whose operators are conditions-format's "String comparison
                 operators": case-sensitive; in a Like value `*` is any run of characters,
                 `?` one, and `\\*`, `\\?` are themselves; StartsWith takes its value as is)

`parse` raises ConditionError for anything else (an unknown attribute, operator or action, a
value that is not a GUID where a GUID is compared, unbalanced or missing parentheses);
`evaluate` decides a request. A comparison whose attribute the request lacks is false, so its
negation ("StringNotEquals") is false too: Azure denies what it cannot evaluate.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

_ROLES = "Microsoft.Authorization/roleAssignments"
BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
ACTIONS = {
    f"{_ROLES}/write",
    f"{_ROLES}/delete",
    f"{BLOBS}/read",
    f"{BLOBS}/write",
    f"{BLOBS}/delete",
    f"{BLOBS}/add/action",
    f"{BLOBS}/move/action",
}
SUBOPERATIONS = {"Blob.List"}
ATTRS = {
    (_ROLES, "RoleDefinitionId"),
    (_ROLES, "PrincipalType"),
    (_ROLES, "PrincipalId"),
    (BLOBS, "path"),
    (BLOBS, "prefix"),
}
SOURCES = {"path": "Resource", "prefix": "Request"}  # where each blob attribute comes from
ROLE_OPS = {
    "ForAnyOfAnyValues:GuidEquals",
    "ForAnyOfAllValues:GuidNotEquals",
    "ForAnyOfAnyValues:StringEqualsIgnoreCase",
}
PATH_OPS = {
    "StringEquals",
    "StringNotEquals",
    "StringLike",
    "StringNotLike",
    "StringStartsWith",
    "StringNotStartsWith",
}
OPS = ROLE_OPS | PATH_OPS
_QUOTED = r"'(?:[^'\\]|\\.)*'"
_TOKEN = re.compile(
    r"\s*(?:(?P<paren>[()!])|(?P<word>AND|OR)\b|(?P<neg>NOT)\b"
    r"|ActionMatches\{'(?P<action>[^']*)'\}"
    r"|SubOperationMatches\{'(?P<subop>[^']*)'\}"
    r"|@(?P<source>Request|Resource)\[(?P<ns>[\w./]+):(?P<attr>\w+)\]"
    rf"\s+(?P<op>[\w:]+)\s*(?:\{{(?P<values>[^}}]*)\}}|(?P<value>{_QUOTED})))"
)


class ConditionError(ValueError):
    """A condition outside the supported grammar (the message says where)."""


@dataclass(frozen=True)
class Request:
    """What a request asks: the action, its attributes, and its suboperation (a blob listing
    is `blobs/read` with suboperation Blob.List). Attributes are keyed by their name after the
    colon (`RoleDefinitionId`, `path`)."""

    action: str
    request: dict[str, str]  # @Request attributes (a role assignment write; a listing's prefix)
    resource: dict[str, str]  # @Resource attributes (a delete: the existing assignment; a blob)
    suboperation: str | None = None


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
    if tok["op"] in PATH_OPS:
        if "value" not in tok:
            raise ConditionError(f"{tok['op']} compares one quoted value")
        return [tok["value"][1:-1]]  # case-sensitive, escapes kept for the Like pattern
    if "values" not in tok:
        raise ConditionError(f"{tok['op']} needs {{values}}")
    raw = [v.strip() for v in tok["values"].split(",") if v.strip()]
    if tok["op"].split(":")[1].startswith("Guid"):
        for v in raw:
            try:
                uuid.UUID(v)
            except ValueError as exc:
                raise ConditionError(f"{v!r} is not a GUID") from exc
        return [v.lower() for v in raw]
    return [v.strip("'").lower() for v in raw]


def _compare(tok: dict[str, str]) -> Any:
    ns, attr, op = tok["ns"], tok["attr"], tok["op"]
    if (ns, attr) not in ATTRS:
        raise ConditionError(f"unsupported attribute {ns}:{attr}")
    if op not in (PATH_OPS if ns == BLOBS else ROLE_OPS):
        raise ConditionError(f"unsupported operator {op} for {ns}:{attr}")
    if ns == BLOBS and tok["source"] != SOURCES[attr]:
        raise ConditionError(f"{ns}:{attr} is a @{SOURCES[attr]} attribute")
    return ("cmp", tok["source"], attr, op, _values(tok))


def parse(text: str) -> Any:
    """The condition's tree: ("and"|"or", [kids]), ("not", kid), ("action", a),
    ("subop", s), ("cmp", source, attr, op, values). Raises ConditionError."""
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
        kids, words = [term()], set()
        while (t := peek()) is not None and "word" in t:
            words.add(take()["word"])
            kids.append(term())
        if len(words) > 1:
            raise ConditionError("AND and OR at one level need parentheses")
        return kids[0] if len(kids) == 1 else (words.pop().lower(), kids)

    def closed() -> Any:
        inner = expr()
        if take().get("paren") != ")":
            raise ConditionError("unbalanced parentheses")
        return inner

    def term() -> Any:
        t = take()
        if t.get("paren") == "(":
            return closed()
        if t.get("paren") == "!":
            if take().get("paren") != "(":
                raise ConditionError("! needs parentheses")
            return ("not", closed())
        if "neg" in t:
            return ("not", term())
        if "action" in t:
            if t["action"] not in ACTIONS:
                raise ConditionError(f"unsupported action {t['action']!r}")
            return ("action", t["action"])
        if "subop" in t:
            if t["subop"] not in SUBOPERATIONS:
                raise ConditionError(f"unsupported suboperation {t['subop']!r}")
            return ("subop", t["subop"])
        if "attr" in t:
            return _compare(t)
        raise ConditionError(f"unexpected {t}")

    tree = expr()
    if pos != len(toks):
        raise ConditionError("trailing text after the condition")
    return tree


def like(value: str, pattern: str) -> bool:
    """Azure's StringLike: case-sensitive; `*` any run of characters (`/` included), `?` one
    character, `\\*` and `\\?` themselves. Pure."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and pattern[i + 1] in "*?":
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), value, re.DOTALL) is not None


def _unescape(value: str) -> str:
    return re.sub(r"\\([*?])", r"\1", value)


def _string(op: str, got: str, want: str) -> bool:
    if op == "StringEquals":
        return got == _unescape(want)
    if op == "StringNotEquals":
        return got != _unescape(want)
    if op == "StringLike":
        return like(got, want)
    if op == "StringStartsWith":
        return got.startswith(want)
    if op == "StringNotStartsWith":
        return not got.startswith(want)
    return not like(got, want)  # StringNotLike


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
        if kind == "subop":
            return bool(req.suboperation == node[1])
        _, source, attr, op, values = node
        got = (req.request if source == "Request" else req.resource).get(attr)
        if got is None:
            return False
        if op in PATH_OPS:
            return _string(op, got, values[0])
        got = got.rsplit("/", 1)[-1].lower()  # a role definition id compares by its GUID
        return got not in values if op.endswith("NotEquals") else got in values

    return ev(parse(text))
