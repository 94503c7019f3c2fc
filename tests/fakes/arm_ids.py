"""ARM resource ids, names and timestamps as the fake writes and checks them.

A resource id is `/subscriptions/{sub}/resourceGroups/{rg}/providers/{namespace}/{type}/{name}`
(child types add `/{child}/{name}` pairs); the fake keys ids lower-cased since ARM compares them
case-insensitively. `parse_id()` splits a reference a client sent (e.g. a NIC's subnet id) and
raises 400 LinkedInvalidPropertyId if it is not a resource id. `check_name()` refuses names ARM
refuses (400 InvalidResourceName). `now()` is an ISO 8601 UTC timestamp with 7 fraction digits
as ARM writes them.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from tests.fakes.arm_errors import ArmApiError

NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9_])?")
GROUP_NAME_RE = re.compile(r"[-\w._()]{0,89}[-\w_()]", re.UNICODE)
_ID_RE = re.compile(
    r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)"
    r"/providers/(?P<ns>[^/]+)/(?P<rest>[^?]+)",
    re.IGNORECASE,
)


@dataclass
class ParsedId:
    """The parts of a resource id; `kind` is e.g. `Microsoft.Network/virtualNetworks/subnets`."""

    sub: str
    group: str
    kind: str
    names: list[str]

    @property
    def name(self) -> str:
        return self.names[-1]


def now() -> str:
    """An ISO 8601 UTC timestamp as ARM writes them."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f0+00:00")


def resource_id(sub: str, group: str, kind: str, *names: str) -> str:
    """The id of resource `names` (parent first) of type `kind` (`Namespace/type[/child]`)."""
    namespace, *types = kind.split("/")
    pairs = "/".join(f"{t}/{n}" for t, n in zip(types, names, strict=True))
    return f"/subscriptions/{sub}/resourceGroups/{group}/providers/{namespace}/{pairs}"


def parse_id(value: object, prop: str = "id") -> ParsedId:
    """Split resource id `value`; 400 LinkedInvalidPropertyId unless it is one."""
    match = _ID_RE.fullmatch(str(value or ""))
    parts = match.group("rest").strip("/").split("/") if match else []
    if match is None or len(parts) % 2:
        raise ArmApiError(
            400,
            "LinkedInvalidPropertyId",
            f"Property id '{value}' at path '{prop}' is invalid. Expect fully qualified resource "
            "Id that start with '/subscriptions/{subscriptionId}' or "
            "'/providers/{resourceProviderNamespace}/'.",
        )
    kind = "/".join([match.group("ns"), *parts[0::2]])
    return ParsedId(match.group("sub"), match.group("rg"), kind, parts[1::2])


def check_name(name: str, kind: str) -> None:
    """400 InvalidResourceName unless `name` is a valid name for a resource of `kind`."""
    pattern = GROUP_NAME_RE if kind == "resourceGroups" else NAME_RE
    if not pattern.fullmatch(name) or name.endswith("."):
        raise ArmApiError(
            400,
            "InvalidResourceName",
            f"Resource name {name} is invalid. The name can be up to 80 characters long. It must "
            "begin with a word character, and it must end with a word character or with '_'. The "
            "name may contain word characters or '.', '-', '_'.",
        )
