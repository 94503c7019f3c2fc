"""Tags and `$filter` expressions as the ARM fake checks and evaluates them.

`check_tags()` refuses what ARM refuses in `tags` (400 InvalidTag...: not a string map, more
than 50 tags, names over 512 or values over 256 characters, names with `<>%&\\?/`).
`resource_filter()` parses the `$filter` of resource group and resource lists: terms joined by
` and `, each `tagName eq '...'`, `tagValue eq '...'` (with a tagName), `resourceType eq '...'`,
`name eq '...'` or `substringof('...', name)`, and answers a predicate over a body. Names, types
and tag names compare case-insensitively, tag values exactly. `role_filter()` parses the filters
of role assignment lists: `atScope()`, `principalId eq '...'`, `assignedTo('...')`, joined by
` and `. Anything else is 400 InvalidFilterInQueryString.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes.arm_errors import ArmApiError

MAX_TAGS = 50
_TERM = re.compile(r"(?P<field>\w+)\s+eq\s+'(?P<value>(?:[^']|'')*)'", re.IGNORECASE)
_SUBSTRING = re.compile(r"substringof\('(?P<value>(?:[^']|'')*)',\s*name\)", re.IGNORECASE)
_ASSIGNED = re.compile(r"assignedTo\('(?P<value>[^']*)'\)", re.IGNORECASE)


def check_tags(tags: Any) -> dict[str, str]:
    """The tags, checked (see the module docstring); {} for None."""
    if tags is None:
        return {}
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        raise ArmApiError(400, "InvalidTagFormat", "The tags must be a map of strings.")
    if len(tags) > MAX_TAGS:
        raise ArmApiError(
            400, "InvalidTagCount", f"The number of tags exceeds the limit of {MAX_TAGS}."
        )
    for name, value in tags.items():
        if len(name) > 512 or len(value) > 256:
            raise ArmApiError(
                400, "InvalidTagNameLength", f"The tag '{name}' or its value is too long."
            )
        if not name or re.search(r"[<>%&\\?/]", name):
            raise ArmApiError(
                400,
                "InvalidTagNameCharacters",
                f"The tag names '{name}' have reserved characters '<,>,%,&,\\,?,/' or control "
                "characters.",
            )
    return dict(tags)


def _bad_filter(text: str) -> ArmApiError:
    return ArmApiError(
        400,
        "InvalidFilterInQueryString",
        f"Invalid $filter '{text}' specified in the query string.",
    )


def _terms(text: str) -> list[str]:
    return [t.strip() for t in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE)]


def resource_filter(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """A predicate over resource (or group) bodies for `$filter` `text` (None: all)."""
    if not text or not text.strip():
        return lambda body: True
    wanted: dict[str, str] = {}
    substrings: list[str] = []
    for term in _terms(text):
        sub = _SUBSTRING.fullmatch(term)
        match = _TERM.fullmatch(term)
        if sub:
            substrings.append(sub.group("value").replace("''", "'").lower())
        elif match and match.group("field").lower() in (
            "tagname",
            "tagvalue",
            "resourcetype",
            "name",
        ):
            wanted[match.group("field").lower()] = match.group("value").replace("''", "'")
        else:
            raise _bad_filter(text)
    if "tagvalue" in wanted and "tagname" not in wanted:
        raise _bad_filter(text)

    def keep(body: dict[str, Any]) -> bool:
        tags = {k.lower(): v for k, v in (body.get("tags") or {}).items()}
        name = str(body.get("name", "")).lower()
        checks = (
            "tagname" not in wanted or wanted["tagname"].lower() in tags,
            "tagvalue" not in wanted
            or tags.get(wanted.get("tagname", "").lower()) == wanted["tagvalue"],
            "resourcetype" not in wanted
            or str(body.get("type", "")).lower() == wanted["resourcetype"].lower(),
            "name" not in wanted or name == wanted["name"].lower(),
            all(s in name for s in substrings),
        )
        return all(checks)

    return keep


@dataclass
class RoleFilter:
    """A parsed role assignment `$filter`."""

    at_scope: bool = False
    principal_id: str | None = None


def role_filter(text: str | None) -> RoleFilter:
    """The parsed role assignment filter `text` (None: no filter)."""
    result = RoleFilter()
    if not text or not text.strip():
        return result
    for term in _terms(text):
        match, assigned = _TERM.fullmatch(term), _ASSIGNED.fullmatch(term)
        if term.replace(" ", "").lower() == "atscope()":
            result.at_scope = True
        elif match and match.group("field").lower() == "principalid":
            result.principal_id = match.group("value").lower()
        elif assigned:
            result.principal_id = assigned.group("value").lower()
        else:
            raise _bad_filter(text)
    return result
