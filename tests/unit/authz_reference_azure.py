"""Azure's documented role-assignment-condition vocabulary, as data, and a checker of an ABAC
condition against it. Test-side; pure; no network.

Sources (MicrosoftDocs/azure-docs on GitHub, the text of learn.microsoft.com; read 2026-11-28):
- BLOB: "Actions and attributes for Azure role assignment conditions for Azure Blob Storage",
  https://learn.microsoft.com/azure/storage/blobs/storage-auth-abac-attributes
  (articles/storage/blobs/storage-auth-abac-attributes.md, commit 0085f2c2, ms.date 04/05/2023):
  the DataActions and suboperations a condition may target, and per target its Resource and
  Request attributes; each attribute's source and type.
- AUTHZ: "Authorization actions and attributes",
  https://learn.microsoft.com/azure/role-based-access-control/conditions-authorization-actions-
  attributes (conditions-authorization-actions-attributes.md, commit 1f87455f, ms.date
  09/20/2023): roleAssignments/write and /delete, their attributes and each one's operators.
- FORMAT: "Azure role assignment condition format and syntax",
  https://learn.microsoft.com/azure/role-based-access-control/conditions-format
  (conditions-format.md, commit b3afb547): the clause shape `!(ActionMatches{..} [AND [NOT]
  SubOperationMatches{..}]) OR (expression)`, the operators per attribute type, the
  cross-product prefixes, and "If you have three or more expressions for a targeted action, you
  must add parentheses" (no AND and OR mixed at one level).
- OPS: "Azure permissions for Storage", https://learn.microsoft.com/azure/role-based-access-
  control/permissions/storage (the Microsoft.Storage DataActions table): which blob DataActions
  exist, for a custom role's `dataActions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.unit.authz_tree import leaves, scan

BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
CONTAINERS = "Microsoft.Storage/storageAccounts/blobServices/containers"
ASSIGNMENTS = "Microsoft.Authorization/roleAssignments"

# OPS: the blob DataActions of Microsoft.Storage (every one the table lists).
STORAGE_BLOB_DATA_ACTIONS = frozenset(
    f"{BLOBS}/{a}"
    for a in (
        "read",
        "write",
        "delete",
        "deleteBlobVersion/action",
        "permanentDelete/action",
        "add/action",
        "filter/action",
        "move/action",
        "manageOwnership/action",
        "modifyPermissions/action",
        "runAsSuperUser/action",
        "immutableStorage/runAsSuperUser/action",
        "tags/read",
        "tags/write",
    )
)

# attribute -> (sources it may be read from, type)  [BLOB "Azure Blob Storage attributes";
# AUTHZ "Authorization attributes"]
ATTRIBUTES: dict[str, tuple[frozenset[str], str]] = {
    "Microsoft.Storage/storageAccounts:name": (frozenset({"Resource"}), "String"),
    f"{CONTAINERS}:name": (frozenset({"Resource"}), "String"),
    f"{BLOBS}:path": (frozenset({"Resource"}), "String"),
    f"{BLOBS}:prefix": (frozenset({"Request"}), "String"),
    f"{BLOBS}:isCurrentVersion": (frozenset({"Resource"}), "Boolean"),
    f"{BLOBS}:versionId": (frozenset({"Request"}), "DateTime"),
    f"{BLOBS}:snapshot": (frozenset({"Request"}), "DateTime"),
    "Microsoft.Storage/storageAccounts/encryptionScopes:name": (
        frozenset({"Resource"}),
        "String",
    ),
    f"{ASSIGNMENTS}:RoleDefinitionId": (frozenset({"Request", "Resource"}), "GUID"),
    f"{ASSIGNMENTS}:PrincipalId": (frozenset({"Request", "Resource"}), "GUID"),
    f"{ASSIGNMENTS}:PrincipalType": (frozenset({"Request", "Resource"}), "String"),
}

_PATHED = {f"{CONTAINERS}:name", f"{BLOBS}:path", "Microsoft.Storage/storageAccounts:name"}
_ACCOUNT = {"Microsoft.Storage/storageAccounts:name", f"{CONTAINERS}:name"}


@dataclass(frozen=True)
class Target:
    """One targetable action (with a suboperation spec: None = the whole action, 'NOT x' = all
    but suboperation x) and the attributes the docs list for it, by source."""

    action: str
    suboperation: str | None
    resource: frozenset[str]
    request: frozenset[str]


def _t(action: str, sub: str | None, resource: set[str], request: set[str] = set()) -> Target:  # noqa: B006
    return Target(action, sub, frozenset(resource), frozenset(request))


_VERSIONED = {f"{BLOBS}:versionId", f"{BLOBS}:snapshot"}
# BLOB "Azure Blob Storage actions and suboperations" (the targets cloudtrain may use; each row's
# attributes as that page lists them) and AUTHZ "Authorization actions".
TARGETS: tuple[Target, ...] = (
    _t(f"{BLOBS}/read", "Blob.List", set(_ACCOUNT), {f"{BLOBS}:prefix"}),
    _t(
        f"{BLOBS}/read",
        "NOT Blob.List",
        _PATHED
        | {f"{BLOBS}:isCurrentVersion", "Microsoft.Storage/storageAccounts/encryptionScopes:name"},
        _VERSIONED,
    ),
    _t(
        f"{BLOBS}/write",
        None,
        _PATHED | {"Microsoft.Storage/storageAccounts/encryptionScopes:name"},
    ),
    _t(
        f"{BLOBS}/write",
        "Blob.Write.Tier",
        _PATHED
        | {f"{BLOBS}:isCurrentVersion", "Microsoft.Storage/storageAccounts/encryptionScopes:name"},
        _VERSIONED,
    ),
    _t(
        f"{BLOBS}/add/action",
        None,
        _PATHED | {"Microsoft.Storage/storageAccounts/encryptionScopes:name"},
    ),
    _t(f"{BLOBS}/delete", None, _PATHED | {f"{BLOBS}:isCurrentVersion"}, _VERSIONED),
    _t(f"{BLOBS}/deleteBlobVersion/action", None, set(_PATHED), {f"{BLOBS}:versionId"}),
    _t(
        f"{BLOBS}/permanentDelete/action", None, _PATHED | {f"{BLOBS}:isCurrentVersion"}, _VERSIONED
    ),
    _t(f"{BLOBS}/move/action", None, set(_PATHED)),
    _t(
        f"{ASSIGNMENTS}/write",
        None,
        set(),
        {
            f"{ASSIGNMENTS}:RoleDefinitionId",
            f"{ASSIGNMENTS}:PrincipalId",
            f"{ASSIGNMENTS}:PrincipalType",
        },
    ),
    _t(
        f"{ASSIGNMENTS}/delete",
        None,
        {
            f"{ASSIGNMENTS}:RoleDefinitionId",
            f"{ASSIGNMENTS}:PrincipalId",
            f"{ASSIGNMENTS}:PrincipalType",
        },
    ),
)

# FORMAT "String comparison operators", "GUID comparison operators", "Boolean ...", "DateTime"
_STRING = {
    f"String{base}{case}"
    for base in ("Equals", "NotEquals", "StartsWith", "NotStartsWith", "Like", "NotLike")
    for case in ("", "IgnoreCase")
}
OPERATORS_BY_TYPE = {
    "String": frozenset(_STRING),
    "GUID": frozenset({"GuidEquals", "GuidNotEquals"}),
    "Boolean": frozenset({"BoolEquals", "BoolNotEquals"}),
    "DateTime": frozenset(
        f"DateTime{b}"
        for b in (
            "Equals",
            "NotEquals",
            "GreaterThan",
            "GreaterThanEquals",
            "LessThan",
            "LessThanEquals",
        )
    ),
}
CROSS_PRODUCT = (
    "ForAnyOfAnyValues:",
    "ForAllOfAnyValues:",
    "ForAnyOfAllValues:",
    "ForAllOfAllValues:",
)
# AUTHZ lists each authorization attribute's operators exactly.
ATTRIBUTE_OPERATORS = {
    f"{ASSIGNMENTS}:RoleDefinitionId": frozenset(
        {
            "GuidEquals",
            "GuidNotEquals",
            "ForAnyOfAnyValues:GuidEquals",
            "ForAnyOfAnyValues:GuidNotEquals",
        }
    ),
    f"{ASSIGNMENTS}:PrincipalId": frozenset(
        {
            "GuidEquals",
            "GuidNotEquals",
            "ForAnyOfAnyValues:GuidEquals",
            "ForAnyOfAnyValues:GuidNotEquals",
        }
    ),
    f"{ASSIGNMENTS}:PrincipalType": frozenset(
        {
            "StringEqualsIgnoreCase",
            "StringNotEqualsIgnoreCase",
            "ForAnyOfAnyValues:StringEqualsIgnoreCase",
            "ForAnyOfAnyValues:StringNotEqualsIgnoreCase",
        }
    ),
}


def operator_allowed(attribute: str, operator: str) -> bool:
    """Whether the docs allow `operator` on `attribute` (by its type, or its own list). Pure."""
    if attribute in ATTRIBUTE_OPERATORS:
        return operator in ATTRIBUTE_OPERATORS[attribute]
    kind = ATTRIBUTES[attribute][1]
    base = operator
    for prefix in CROSS_PRODUCT:
        base = base.removeprefix(prefix)
    return base in OPERATORS_BY_TYPE.get(kind, frozenset())


# --- the parser ------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<fn>ActionMatches|SubOperationMatches)\{'(?P<fnarg>[^']*)'\}"
    r"|@(?P<src>Resource|Request|Environment|Principal)\[(?P<attr>[^\]]+)\]"
    r"|(?P<list>\{[^}]*\})|'(?P<str>(?:[^'\\]|\\.)*)'"
    r"|(?P<punct>\(|\)|!|&&|\|\|)|(?P<word>[A-Za-z:]+))"
)


def tokens(text: str) -> list[tuple[str, Any]]:
    """The condition's tokens; ValueError on anything the grammar has no token for. Pure."""
    out: list[tuple[str, Any]] = []
    for m in scan(_TOKEN, text):
        if m["fn"]:
            out.append((m["fn"], m["fnarg"]))
        elif m["src"]:
            out.append(("attr", (m["src"], m["attr"])))
        elif m["list"] is not None:
            items = [v.strip().strip("'") for v in m["list"][1:-1].split(",") if v.strip()]
            out.append(("value", items))
        elif m["str"] is not None:
            out.append(("value", [m["str"]]))
        elif m["punct"]:
            out.append(
                {"&&": ("AND", None), "||": ("OR", None), "!": ("NOT", None)}.get(
                    m["punct"], (m["punct"], None)
                )
            )
        elif m["word"] in ("AND", "OR", "NOT"):
            out.append((m["word"], None))
        else:
            out.append(("op", m["word"]))
    return out


class _Parser:
    def __init__(self, toks: list[tuple[str, Any]]) -> None:
        self.toks, self.i = toks, 0

    def peek(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, kind: str) -> Any:
        if self.peek() != kind:
            raise ValueError(f"expected {kind} at token {self.i}, found {self.peek()}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def expr(self) -> Any:
        items = [self.unary()]
        joins = set()
        while self.peek() in ("AND", "OR"):
            joins.add(str(self.peek()))
            self.i += 1
            items.append(self.unary())
        if len(joins) > 1:
            raise ValueError("AND and OR mixed without parentheses (conditions-format)")
        return (joins.pop().lower(), items) if joins else items[0]

    def unary(self) -> Any:
        kind = self.peek()
        if kind == "NOT":
            self.take("NOT")
            return ("not", self.unary())
        if kind == "(":
            self.take("(")
            inner = self.expr()
            self.take(")")
            return inner
        if kind in ("ActionMatches", "SubOperationMatches"):
            return (kind, self.take(kind))
        if kind == "attr":
            source, attribute = self.take("attr")
            operator = self.take("op")
            return ("cmp", source, attribute, operator, self.take("value"))
        raise ValueError(f"unexpected {kind} at token {self.i}")


def parse(condition: str) -> Any:
    """The condition as a tree: ('and'|'or', [..]), ('not', x), ('ActionMatches', a),
    ('SubOperationMatches', s), ('cmp', source, attribute, operator, values). ValueError on
    what the documented grammar does not allow. Pure."""
    p = _Parser(tokens(condition))
    tree = p.expr()
    if p.peek() is not None:
        raise ValueError(f"trailing tokens from {p.i}")
    return tree


# --- the checker -----------------------------------------------------------------------------


def _conjuncts(node: Any) -> list[Any]:
    return list(node[1]) if node[0] == "and" else [node]


def _targets_of(action_side: Any) -> list[tuple[str, str | None]] | None:
    """(action, suboperation spec) of a clause's action side: a conjunction of `!(ActionMatches
    {a} [AND [NOT] SubOperationMatches{s}])`; None if it is not that shape."""
    out: list[tuple[str, str | None]] = []
    for term in _conjuncts(action_side):
        if term[0] != "not":
            return None
        parts = _conjuncts(term[1])
        if not parts or parts[0][0] != "ActionMatches" or len(parts) > 2:
            return None
        sub = None
        if len(parts) == 2:
            s = parts[1]
            if s[0] == "SubOperationMatches":
                sub = s[1]
            elif s[0] == "not" and s[1][0] == "SubOperationMatches":
                sub = f"NOT {s[1][1]}"
            else:
                return None
        out.append((parts[0][1], sub))
    return out


def _target(action: str, sub: str | None) -> Target | None:
    return next((t for t in TARGETS if t.action == action and t.suboperation == sub), None)


def problems(condition: str) -> list[str]:
    """What in `condition` the docs do not support (empty: all of it is documented). Pure."""
    try:
        tree = parse(condition)
    except ValueError as err:
        return [f"not the documented grammar: {err}"]
    out = []
    for clause in _conjuncts(tree):
        if clause[0] != "or" or len(clause[1]) != 2:
            out.append(f"a clause that is not `!(ActionMatches..) OR (expression)`: {clause}")
            continue
        targets = _targets_of(clause[1][0])
        if targets is None:
            out.append(f"an action side that is not `!(ActionMatches{{..}} ..)`: {clause[1][0]}")
            continue
        listed = []
        for action, sub in targets:
            target = _target(action, sub)
            if target is None:
                out.append(f"no documented target {action} with suboperation {sub}")
            else:
                listed.append(target)
        for cmp in leaves(clause[1][1]):
            if cmp[0] != "cmp":
                out.append(f"{cmp[0]} inside an expression")
                continue
            _, source, attribute, operator, _values = cmp
            if attribute not in ATTRIBUTES:
                out.append(f"no documented attribute {attribute}")
                continue
            if source not in ATTRIBUTES[attribute][0]:
                out.append(f"{attribute} is not a {source} attribute")
            for target in listed:
                have = target.resource if source == "Resource" else target.request
                if attribute not in have:
                    sub = f" ({target.suboperation})" if target.suboperation else ""
                    out.append(f"{source} {attribute} is not available to {target.action}{sub}")
            if not operator_allowed(attribute, operator):
                out.append(f"{operator} is not an operator for {attribute}")
    return out


def targeted_actions(condition: str) -> set[str]:
    """The actions the condition's clauses target. Pure; ValueError if it does not parse."""
    out = set()
    for clause in _conjuncts(parse(condition)):
        if clause[0] == "or":
            out |= {a for a, _ in _targets_of(clause[1][0]) or []}
    return out


def role_problems(definition: dict[str, Any]) -> list[str]:
    """A custom role PUT body's permissions that OPS does not list among the blob DataActions,
    and any control-plane Action at all (the node role holds none). Pure."""
    out = []
    for permission in definition["properties"]["permissions"]:
        out += [f"an Action {a} (the node role holds none)" for a in permission["actions"]]
        out += [
            f"no DataAction {a} in Microsoft.Storage"
            for a in permission["dataActions"]
            if a not in STORAGE_BLOB_DATA_ACTIONS
        ]
    return out
