"""List filters of the GCE fake: parsing GCE's `filter` query parameter and matching resources.

Supported comparisons are `field = "value"`, `field=value`, `field != value`, `field eq regex`,
`field ne regex` and `field:*` (present), optionally parenthesized, joined by spaces or AND;
anything else (e.g. OR) is refused with GCE's 400 invalid. Fields are dotted paths into the
resource's JSON, with lists flattened at each level, as GCE does for e.g. `labels.role` or
`networkInterfaces.network`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.fakes.gce_errors import invalid

_TERM_RE = re.compile(
    r"""\s*\(?\s*
    (?P<field>[A-Za-z_][\w.-]*)\s*
    (?P<op>!=|=|:|\beq\b|\bne\b)\s*
    (?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[^\s()"']+)
    \s*\)?\s*""",
    re.VERBOSE,
)
_AND_RE = re.compile(r"AND\s+")


@dataclass(frozen=True)
class FilterTerm:
    """One comparison of a list filter."""

    field: str
    op: str
    value: str


def parse_filter(text: str) -> list[FilterTerm]:
    """Parse a conjunction of comparisons; raise GceApiError(400) on anything else (e.g. OR)."""
    terms: list[FilterTerm] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        match = _TERM_RE.match(text, pos)
        if match is None:
            raise invalid(f"Invalid list filter expression (fake supports AND only): {text!r}")
        value = match["value"]
        if value[0] in "\"'":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        terms.append(FilterTerm(match["field"], match["op"], value))
        pos = match.end()
        conj = _AND_RE.match(text, pos)
        if conj is not None:
            pos = conj.end()
    return terms


def _lookup(obj: Any, path: str) -> list[Any]:
    """Every value at a dotted path, lists flattened at each level."""
    current = [obj]
    for part in path.split("."):
        found: list[Any] = []
        for item in current:
            if isinstance(item, dict) and part in item:
                value = item[part]
                found.extend(value if isinstance(value, list) else [value])
        current = found
    return current


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matches_filter(obj: dict[str, Any], terms: list[FilterTerm]) -> bool:
    """Whether a resource satisfies every term."""
    for term in terms:
        values = [_scalar(v) for v in _lookup(obj, term.field) if not isinstance(v, dict)]
        if term.op == ":" and term.value == "*":
            hit = bool(_lookup(obj, term.field))
        elif term.op in ("=", ":"):
            hit = term.value in values
        elif term.op == "!=":
            hit = term.value not in values
        else:
            try:
                pattern = re.compile(term.value)
            except re.error as exc:
                raise invalid(f"Invalid regular expression in filter: {term.value!r}") from exc
            any_match = any(pattern.fullmatch(v) for v in values)
            hit = any_match if term.op == "eq" else not any_match
        if not hit:
            return False
    return True
