"""Google's documented IAM Conditions vocabulary for the resources cloudtrain conditions, as data,
and a checker of a CEL condition against it. Test-side; pure; no network.

Sources (read 2026-11-28 through the search tool's page excerpts and the repositories named):
- ATTRS: "Attribute reference for IAM Conditions", https://cloud.google.com/iam/docs/
  conditions-attribute-reference: the resource service, type and name attributes "can be used in
  allow policy role bindings" and are recognised by Cloud Storage and Compute Engine (both in
  each attribute's "Supported Google Cloud services" list); resource.name takes startsWith,
  endsWith, extract and ==/!=, resource.type and resource.service ==/!= (the page's function
  tables; CEL itself: github.com/google/cel-spec doc/langdef.md).
- RES: "Resource attributes for IAM Conditions", https://cloud.google.com/iam/docs/
  conditions-resource-attributes: the service values (storage.googleapis.com,
  compute.googleapis.com, ...), the type values (compute.googleapis.com/Disk, /Firewall, /Image,
  /Instance, /InstanceTemplate ... in the excerpt read; /Snapshot and /MachineImage as
  controller_identity.py cites the same page), and the resource name formats.
- GCS_NAMES: Cloud Storage objects are `projects/_/buckets/BUCKET/objects/OBJECT` in conditions
  (Google's client reference, "Google::Cloud::Storage::Policy::Binding", https://cloud.google.com/
  ruby/docs/reference/google-cloud-storage/latest/Google-Cloud-Storage-Policy-Binding:
  `resource.name.startsWith("projects/_/buckets/bucket-name/objects/prefix-a-")`; "Full resource
  names", https://cloud.google.com/iam/docs/full-resource-names: a bucket is
  `//storage.googleapis.com/projects/_/buckets/BUCKET_ID`, a Compute instance
  `//compute.googleapis.com/projects/PROJECT_ID/zones/ZONE/instances/INSTANCE_ID`; a condition's
  resource.name is that name without `//service/`).
- LIST_PREFIX: the API attribute `storage.googleapis.com/objectListPrefix`, read with
  `api.getAttribute(name, default)`: documented for Credential Access Boundaries
  ("Downscope with Credential Access Boundaries", https://cloud.google.com/iam/docs/
  downscoping-short-lived-credentials) and used the same way by Google's own connectors
  (e.g. the GCS connector's downscoped tokens). /work/shared/reference/cloud-facts-2026-11.md
  records that its effect in a bucket *allow-policy* binding is not confirmed: the table keeps
  it, marked `allow_policy_confirmed=False`, and the test names it (see its docstring).
- ROLES: the predefined roles' permissions as `gcloud iam roles describe` gives them, in
  github.com/iann0036/iam-dataset gcp/roles/*.json (storage.objectViewer at 49a20a56,
  storage.objectAdmin at 0197cfea, compute.instanceAdmin.v1 at 0043e408, compute.securityAdmin
  at 0044f06a, iam.serviceAccountUser at 1818bc70); only the permissions cloudtrain relies on
  are copied here. The reference: https://cloud.google.com/iam/docs/understanding-roles.
- LIMITS: "Overview of IAM Conditions", https://cloud.google.com/iam/docs/conditions-overview,
  "Limitations": at most 12 logical operators per condition, 12,800 characters per expression.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tests.unit.authz_tree import leaves, scan

RESOURCE_FUNCTIONS = {
    "resource.name": frozenset({"startsWith", "endsWith", "extract", "==", "!="}),
    "resource.type": frozenset({"==", "!="}),
    "resource.service": frozenset({"==", "!="}),
}


@dataclass(frozen=True)
class ApiAttribute:
    """An API attribute: the functions documented on its value, and whether its effect in an
    allow-policy binding (not only a Credential Access Boundary) is confirmed."""

    name: str
    functions: frozenset[str]
    allow_policy_confirmed: bool


API_ATTRIBUTES = {
    "storage.googleapis.com/objectListPrefix": ApiAttribute(
        "storage.googleapis.com/objectListPrefix", frozenset({"startsWith"}), False
    ),
}

SERVICES = {"storage.googleapis.com", "compute.googleapis.com"}
RESOURCE_TYPES = {
    "storage.googleapis.com": frozenset(
        {
            "storage.googleapis.com/Bucket",
            "storage.googleapis.com/Object",
            "storage.googleapis.com/ManagedFolder",
        }
    ),
    "compute.googleapis.com": frozenset(
        {
            f"compute.googleapis.com/{t}"
            for t in (
                "BackendService",
                "Disk",
                "Firewall",
                "ForwardingRule",
                "GlobalForwardingRule",
                "Image",
                "Instance",
                "InstanceTemplate",
                "MachineImage",
                "Snapshot",
            )
        }
    ),
}
# resource.name formats (RES "Resource name format", GCS_NAMES), as regexes of a whole name
NAME_FORMATS = {
    "storage.googleapis.com/Bucket": r"projects/_/buckets/[^/]+",
    "storage.googleapis.com/Object": r"projects/_/buckets/[^/]+/objects/.+",
    "compute.googleapis.com/Instance": r"projects/[^/]+/zones/[^/]+/instances/[^/]+",
    "compute.googleapis.com/Disk": r"projects/[^/]+/zones/[^/]+/disks/[^/]+",
    "compute.googleapis.com/Firewall": r"projects/[^/]+/global/firewalls/[^/]+",
}
# ROLES: role -> the permissions of it cloudtrain relies on (each in the role's dataset file)
ROLE_PERMISSIONS = {
    "roles/storage.objectViewer": frozenset({"storage.objects.get", "storage.objects.list"}),
    "roles/storage.objectAdmin": frozenset(
        {
            "storage.objects.create",
            "storage.objects.delete",
            "storage.objects.get",
            "storage.objects.list",
            "storage.objects.update",
            "storage.multipartUploads.create",
            "storage.multipartUploads.abort",
            "storage.multipartUploads.listParts",
        }
    ),
    "roles/compute.instanceAdmin.v1": frozenset(
        {
            "compute.instances.create",
            "compute.instances.delete",
            "compute.instances.start",
            "compute.instances.stop",
            "compute.instances.get",
            "compute.disks.create",
            "compute.subnetworks.use",
            "compute.instances.setServiceAccount",
        }
    ),
    "roles/compute.securityAdmin": frozenset({"compute.firewalls.delete", "compute.firewalls.get"}),
    "roles/iam.serviceAccountUser": frozenset({"iam.serviceAccounts.actAs"}),
}
MAX_LOGICAL_OPERATORS = 12
MAX_EXPRESSION = 12800


# --- a parser of the CEL subset IAM documents ------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<str>\"(?:[^\"\\]|\\.)*\")|(?P<op>&&|\|\||==|!=|!|\(|\)|,|\.)"
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*))"
)


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) tokens; ValueError on a character no token starts with. Pure."""
    out = []
    for m in scan(_TOKEN, text):
        kind = m.lastgroup or ""
        out.append((kind, json.loads(m[kind]) if kind == "str" else m[kind]))
    return out


class _Parser:
    def __init__(self, toks: list[tuple[str, str]]) -> None:
        self.toks, self.i = toks, 0

    def peek(self, n: int = 0) -> str | None:
        j = self.i + n
        return (
            self.toks[j][1]
            if j < len(self.toks) and self.toks[j][0] != "str"
            else ("<str>" if j < len(self.toks) else None)
        )

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise ValueError("unexpected end")
        tok = self.toks[self.i]
        if want is not None and tok[1] != want and not (want == "<str>" and tok[0] == "str"):
            raise ValueError(f"expected {want}, found {tok[1]!r}")
        self.i += 1
        return tok

    def expr(self, depth: str = "||") -> Any:
        if depth == "||":
            items = [self.expr("&&")]
            while self.peek() == "||":
                self.take()
                items.append(self.expr("&&"))
            return ("or", items) if len(items) > 1 else items[0]
        items = [self.unary()]
        while self.peek() == "&&":
            self.take()
            items.append(self.unary())
        return ("and", items) if len(items) > 1 else items[0]

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return ("not", self.unary())
        if self.peek() == "(":
            self.take()
            inner = self.expr()
            self.take(")")
            return inner
        return self.term()

    def _dotted(self) -> str:
        parts = [self.take()[1]]
        while self.peek() == "." and self.peek(2) != "(":
            self.take(".")
            parts.append(self.take()[1])
        return ".".join(parts)

    def term(self) -> Any:
        """`attr.fn("lit")`, `attr == "lit"`, `api.getAttribute("a", "").fn("lit")`."""
        if self.peek() == "api":
            self.take()
            self.take(".")
            fn = self.take()[1]
            self.take("(")
            name = self.take("<str>")[1]
            self.take(",")
            default = self.take("<str>")[1]
            self.take(")")
            subject = ("api", fn, name, default)
        else:
            subject = ("attr", self._dotted())
        if self.peek() in ("==", "!="):
            op = self.take()[1]
            return ("cmp", subject, op, self.take("<str>")[1])
        self.take(".")
        fn = self.take()[1]
        self.take("(")
        arg = self.take("<str>")[1]
        self.take(")")
        return ("cmp", subject, fn, arg)


def parse(expression: str) -> Any:
    """The expression as a tree of ('or'|'and', [..]), ('not', x), ('cmp', subject, function,
    literal). ValueError on anything outside the documented subset. Pure."""
    p = _Parser(tokens(expression))
    tree = p.expr()
    if p.i != len(p.toks):
        raise ValueError(f"trailing tokens from {p.i}")
    return tree


def _operators(node: Any) -> int:
    if node[0] == "cmp":
        return 0
    if node[0] == "not":
        return 1 + _operators(node[1])
    return len(node[1]) - 1 + sum(_operators(n) for n in node[1])


def _prefix_regex(fmt: str) -> str:
    """A regex of every prefix of a name of format `fmt` (a placeholder may be cut). Pure."""
    pieces = [p for p in re.split(r"(\[\^/\]\+|\.\+)", fmt) if p]
    units: list[str] = []
    for piece in pieces:
        units += [piece] if piece in ("[^/]+", ".+") else [re.escape(c) for c in piece]
    regex = ""
    for unit in reversed(units):
        if unit in ("[^/]+", ".+"):
            partial = "[^/]*" if unit == "[^/]+" else ".*"
            regex = f"(?:{unit}{regex}|{partial})"
        else:
            regex = f"(?:{unit}{regex})?"
    return regex


def _prefix_fits(literal: str, fmt: str) -> bool:
    """Some name of format `fmt` starts with `literal`. Pure."""
    return re.fullmatch(_prefix_regex(fmt), literal) is not None


def _name_fits(fn: str, literal: str, fmt: str) -> bool:
    """A startsWith literal is a prefix of a name of `fmt`; an ==/!= literal is one. Pure."""
    if fn == "startsWith":
        return _prefix_fits(literal, fmt)
    return re.fullmatch(fmt, literal) is not None


def problems(expression: str, service: str) -> list[str]:
    """What in a condition on a `service` resource (the bucket's or the project's binding) the
    docs do not support; empty if all of it is documented. Pure."""
    if len(expression) > MAX_EXPRESSION:
        return [f"over {MAX_EXPRESSION} characters"]
    try:
        tree = parse(expression)
    except ValueError as err:
        return [f"not the documented CEL subset: {err}"]
    out = []
    if _operators(tree) > MAX_LOGICAL_OPERATORS:
        out.append(f"{_operators(tree)} logical operators, over {MAX_LOGICAL_OPERATORS}")
    types = RESOURCE_TYPES.get(service, frozenset())
    if service not in SERVICES:
        out.append(f"{service} recognises no resource attributes")
    for _, subject, fn, literal in leaves(tree):
        if subject[0] == "api":
            _, getter, name, _default = subject
            attr = API_ATTRIBUTES.get(name)
            if getter != "getAttribute" or attr is None:
                out.append(f"no documented API attribute {name} (read by api.{getter})")
            elif fn not in attr.functions:
                out.append(f"{fn} is not documented on {name}")
            continue
        attribute = subject[1]
        if attribute not in RESOURCE_FUNCTIONS:
            out.append(f"no documented attribute {attribute}")
            continue
        if fn not in RESOURCE_FUNCTIONS[attribute]:
            out.append(f"{attribute} has no function {fn}")
        if attribute == "resource.type" and literal not in types:
            out.append(f"{literal} is not a documented {service} resource type")
        if attribute == "resource.service" and literal not in SERVICES:
            out.append(f"{literal} is not a documented resource service")
        if attribute == "resource.name" and fn in ("startsWith", "==", "!="):
            fmts = [NAME_FORMATS[t] for t in types if t in NAME_FORMATS]
            if not any(_name_fits(fn, literal, f) for f in fmts):
                out.append(f"{literal!r} fits no {service} resource name format")
    return out


def api_attributes_used(expression: str) -> set[str]:
    """The API attributes an expression reads. Pure; ValueError if it does not parse."""
    return {s[2] for _, s, _, _ in leaves(parse(expression)) if s[0] == "api"}
