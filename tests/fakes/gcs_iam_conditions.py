"""Cloud Storage bucket IAM policies, evaluated the way GCS decides a request (tests only).

The GCS emulator stores bucket policies but never enforces them, so the tests that check what
an identity may do evaluate the stored policy here: a request (a permission on a resource name,
with API attributes) is allowed when some binding names the member, its role holds the
permission, and its condition (if any) is true. Allow policies are a union: no binding denies.

The CEL subset cloudtrain writes ("Overview of IAM Conditions",
https://cloud.google.com/iam/docs/conditions-overview; the attributes in
https://cloud.google.com/iam/docs/conditions-attribute-reference):

    expr    := and ("||" and)*
    and     := unary ("&&" unary)*
    unary   := "!" unary | "(" expr ")" | test
    test    := "resource.name.startsWith(" STR ")"
             | "resource.name.endsWith(" STR ")"
             | "api.getAttribute(" STR "," STR ").startsWith(" STR ")"

(`startsWith` and `endsWith` are the string functions the attribute reference lists for
`resource.name`: "Attribute reference for IAM Conditions", "Resource name attribute",
https://cloud.google.com/iam/docs/conditions-attribute-reference#resource-name.)

STR is a double-quoted string with JSON escapes. Anything else raises ConditionError.

Resource names: an object is `projects/_/buckets/B/objects/NAME`, the bucket itself (what a
list request names) `projects/_/buckets/B`; a listing's `prefix` parameter is the API attribute
`storage.googleapis.com/objectListPrefix` (absent on other requests: the default is used).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import iam_limits

LIST_PREFIX = "storage.googleapis.com/objectListPrefix"

# the object permissions of the predefined roles cloudtrain may bind ("IAM roles for Cloud
# Storage", https://cloud.google.com/storage/docs/access-control/iam-roles); the folder, managed
# folder and project permissions these roles also hold are left out (no object is reached by them)
_MULTIPART = {
    "storage.multipartUploads.abort",
    "storage.multipartUploads.create",
    "storage.multipartUploads.list",
    "storage.multipartUploads.listParts",
}
ROLE_PERMISSIONS: Mapping[str, frozenset[str]] = {
    "roles/storage.objectViewer": frozenset({"storage.objects.get", "storage.objects.list"}),
    "roles/storage.objectCreator": frozenset(
        {"storage.objects.create"}
        | {"storage.multipartUploads.create", "storage.multipartUploads.abort"}
        | {"storage.multipartUploads.listParts"}
    ),
    "roles/storage.objectUser": frozenset(
        {"storage.objects." + p for p in ("create", "delete", "get", "list", "restore", "update")}
        | _MULTIPART
    ),
    "roles/storage.objectAdmin": frozenset(
        {"storage.objects." + p for p in ("create", "delete", "get", "list", "restore", "update")}
        | {"storage.objects.getIamPolicy", "storage.objects.setIamPolicy"}
        | _MULTIPART
    ),
}


class ConditionError(ValueError):
    """A condition outside the supported subset (the message says where)."""


_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>\|\||&&|[!(),.])|(?P<name>[A-Za-z_][A-Za-z0-9_]*))'
)


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match:
            raise ConditionError(f"cannot read the condition at {text[pos : pos + 40]!r}")
        kind = str(match.lastgroup)
        value: Any = json.loads(match.group(kind)) if kind == "str" else match.group(kind)
        out.append((kind, value))
        pos = match.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str) -> Any:
        """The next token's value: a "str" or "name" token by kind, an operator by its text."""
        tok = self.peek()
        kind = expected if expected in ("str", "name") else "op"
        if tok is None or tok[0] != kind or (kind == "op" and tok[1] != expected):
            raise ConditionError(f"expected {expected!r} at token {self.i}: {tok}")
        self.i += 1
        return tok[1]

    def words(self, *names: str) -> None:
        for n, name in enumerate(names):
            if n:
                self.take(".")
            if self.take("name") != name:
                raise ConditionError(f"expected {'.'.join(names)} at token {self.i}")

    def expr(self) -> tuple[Any, ...]:
        return self.chain("||", "or", self.conj)

    def conj(self) -> tuple[Any, ...]:
        return self.chain("&&", "and", self.unary)

    def chain(self, op: str, kind: str, operand: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
        """operand (op operand)*: one node of `kind` over them, or the lone operand."""
        kids = [operand()]
        while self.peek() == ("op", op):
            self.take(op)
            kids.append(operand())
        return (kind, kids) if len(kids) > 1 else kids[0]

    def unary(self) -> tuple[Any, ...]:
        tok = self.peek()
        if tok == ("op", "!"):
            self.take("!")
            return ("not", self.unary())
        if tok == ("op", "("):
            self.take("(")
            inner = self.expr()
            self.take(")")
            return inner
        if tok == ("name", "resource"):
            self.words("resource", "name")
            self.take(".")
            function = self.take("name")
            if function not in ("startsWith", "endsWith"):
                raise ConditionError(f"unsupported function on resource.name: {function}")
            self.take("(")
            value = self.take("str")
            self.take(")")
            return ("starts" if function == "startsWith" else "ends", "resource.name", value)
        if tok == ("name", "api"):
            self.words("api", "getAttribute")
            self.take("(")
            attribute = self.take("str")
            self.take(",")
            default = self.take("str")
            self.take(")")
            self.take(".")
            self.words("startsWith")
            self.take("(")
            prefix = self.take("str")
            self.take(")")
            return ("starts", ("attr", attribute, default), prefix)
        raise ConditionError(f"unsupported term at token {self.i}: {tok}")


def parse(expression: str) -> tuple[Any, ...]:
    """The condition's tree. Raises ConditionError outside the subset. Pure."""
    parser = _Parser(expression)
    tree = parser.expr()
    if parser.peek() is not None:
        raise ConditionError(f"trailing tokens from {parser.peek()}")
    return tree


def logical_operators(expression: str) -> int:
    """How many of &&, || and ! the expression holds, counted as the box's setIamPolicy counts
    them for IAM's limit (tests/fakes/iam_limits.py). Pure."""
    return iam_limits.logical_operators(expression)


@dataclass(frozen=True)
class Request:
    """One permission check: `permission` on `resource` (a resource name), with API
    attributes (`attributes`, e.g. a listing's objectListPrefix)."""

    permission: str
    resource: str
    attributes: Mapping[str, str] = field(default_factory=dict)


def _eval(tree: tuple[Any, ...], request: Request) -> bool:
    kind = tree[0]
    if kind == "or":
        return any(_eval(k, request) for k in tree[1])
    if kind == "and":
        return all(_eval(k, request) for k in tree[1])
    if kind == "not":
        return not _eval(tree[1], request)
    subject = tree[1]
    if subject == "resource.name":
        value = request.resource
    else:
        _, attribute, default = subject
        value = request.attributes.get(attribute, default)
    return value.startswith(tree[2]) if kind == "starts" else value.endswith(tree[2])


def evaluate(expression: str, request: Request) -> bool:
    """Whether the condition holds for the request. Raises ConditionError. Pure."""
    return _eval(parse(expression), request)


def allows(policy: Mapping[str, Any], member: str, request: Request) -> bool:
    """Whether the bucket policy grants `member` the request: some binding names the member,
    its role holds the permission (an unknown role: ConditionError) and its condition holds.
    Pure."""
    for binding in policy.get("bindings") or []:
        if member not in (binding.get("members") or ()):
            continue
        role = binding["role"]
        if role not in ROLE_PERMISSIONS:
            raise ConditionError(f"a role this evaluator does not know: {role}")
        if request.permission not in ROLE_PERMISSIONS[role]:
            continue
        condition = binding.get("condition")
        if condition is None or evaluate(condition["expression"], request):
            return True
    return False


def object_name(bucket: str, name: str) -> str:
    """The IAM resource name of object `name` in `bucket`. Pure."""
    return f"projects/_/buckets/{bucket}/objects/{name}"


def bucket_name(bucket: str) -> str:
    """The IAM resource name of the bucket (what a list request names). Pure."""
    return f"projects/_/buckets/{bucket}"


def can_read(policy: Mapping[str, Any], member: str, bucket: str, name: str) -> bool:
    """GET of the object (storage.objects.get). Pure."""
    return allows(policy, member, Request("storage.objects.get", object_name(bucket, name)))


def can_write(policy: Mapping[str, Any], member: str, bucket: str, name: str) -> bool:
    """PUT of the object, a new one or over an existing one: GCS asks storage.objects.create
    and, to replace, storage.objects.delete ("IAM permissions for JSON methods",
    https://cloud.google.com/storage/docs/access-control/iam-json). Pure."""
    resource = object_name(bucket, name)
    return all(
        allows(policy, member, Request(p, resource))
        for p in ("storage.objects.create", "storage.objects.delete")
    )


def can_delete(policy: Mapping[str, Any], member: str, bucket: str, name: str) -> bool:
    """DELETE of the object (storage.objects.delete). Pure."""
    return allows(policy, member, Request("storage.objects.delete", object_name(bucket, name)))


def can_list(policy: Mapping[str, Any], member: str, bucket: str, prefix: str) -> bool:
    """A listing of the bucket with `prefix` (storage.objects.list on the bucket). Pure."""
    request = Request("storage.objects.list", bucket_name(bucket), {LIST_PREFIX: prefix})
    return allows(policy, member, request)
