"""Pydantic's validation errors of a spec as one line: `FILE:LINE: FIELD: problem`.

Imports only the stdlib and pydantic. `spec_error` picks the first error by line, says it in plain
words with the value as the file has it (`.nan`, `~`, `1e3`: see `spec_yaml.parse_yaml`'s
`written`), and counts the others. The models are passed in (`model_at`), so this module does not
import `cloudtrain.jobspec.job`.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from cloudtrain.core.errors import SpecError
from cloudtrain.jobspec.yaml_source import Loc, one_line, path_text, show

ModelAt = Callable[[Loc], type[BaseModel]]
ENV_TAGS = frozenset({"text", "ref"})  # the env value union's tags, dropped from locations
ENV_ENTRY_ERROR = "env_entry"  # a custom error about one env entry: its ctx names the key

_TEMPLATES = {  # pydantic error type -> plain words
    "int_type": "must be a whole number (got {got})",
    "float_type": "must be a number (got {got})",
    "bool_type": "must be true or false (got {got})",
    "dict_type": "must be a mapping (got {got})",
    "model_type": "must be a mapping (got {got})",
    "model_attributes_type": "must be a mapping (got {got})",
    "finite_number": "must be a finite number (got {got})",
    "string_too_short": "must not be empty",
    "string_pattern_mismatch": "must be letters, digits and '-' only (got {got})",
    "greater_than_equal": "must be at least {ge} (got {got})",
    "less_than_equal": "must be at most {le} (got {got})",
    "greater_than": "must be more than {gt} (got {got})",
    "less_than": "must be less than {lt} (got {got})",
}
_NUMBER_KINDS = frozenset(
    {"int_type", "float_type", "finite_number", "greater_than_equal", "less_than_equal"}
    | {"greater_than", "less_than"}
)
# YAML 1.1 number forms that YAML 1.2 (and so cloudtrain) reads as text
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")
_UNDERSCORED = re.compile(r"[-+]?[0-9][0-9_]*_[0-9_]*(\.[0-9_]*)?")


def spec_error(
    exc: ValidationError,
    filename: str,
    lines: Mapping[Loc, int],
    written: Mapping[Loc, str],
    overridden: frozenset[str],
    model_at: ModelAt,
) -> SpecError:
    """The first error by line as `FILE:LINE: PATH: problem`, plus how many more and where.
    `lines` and `written` come from `parse_yaml`; a field in `overridden` (set on the command
    line) has no line. Pure."""
    found: list[tuple[int, str, str]] = []  # (line, or 0 when there is none; path; problem)
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p != "[key]")
        if len(loc) >= 3 and loc[0] == "env" and loc[2] in ENV_TAGS:
            loc = loc[:2] + loc[3:]  # env.KEY.ref.from_env -> env.KEY.from_env
        if err["type"] == ENV_ENTRY_ERROR:
            loc = ("env", str((err.get("ctx") or {})["key"]))
        from_file = bool(lines) and not (loc and loc[0] in overridden)  # else: no line to show
        line = line_of(loc, lines) if from_file else 0
        found.append((line, path_text(loc), _describe(err, loc, written, model_at)))
    found.sort(key=lambda f: f[0])
    line, path, problem = found[0]
    text = f"{filename}:{line}" if line else filename
    text += f": {path}: {problem}" if path else f": {problem}"
    rest = list(dict.fromkeys(p or "spec" for _, p, _ in found[1:]))
    if rest:
        text += f" (+{len(rest)} more: {', '.join(rest)})"
    return SpecError(text)


def line_of(loc: Loc, lines: Mapping[Loc, int]) -> int:
    """The line of the deepest key of `loc` that the file has (a missing key: its parent's)."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1  # a top-level field: the document


def _describe(err: ErrorDetails, loc: Loc, written: Mapping[Loc, str], model_at: ModelAt) -> str:
    """The error in plain words, with the offending value as the file has it."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    got = written[loc] if loc in written and not isinstance(value, str) else show(value)
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return _unknown_field(loc, model_at)
    if kind == "value_error":
        return one_line(str(ctx.get("error", err["msg"])))
    if kind == ENV_ENTRY_ERROR:
        return one_line(str(ctx["problem"]))
    if kind in _NUMBER_KINDS and isinstance(value, float) and math.isnan(value):
        number = "a whole number" if kind == "int_type" else "a finite number"
        return f"must be {number} (got {got}, which is not a number)"
    template = _TEMPLATES.get(kind)
    if template:
        nums = {k: f"{v:g}" for k, v in ctx.items() if isinstance(v, int | float)}
        return template.format(got=got, **nums) + _yaml11_hint(kind, value)
    if kind == "string_type" and len(loc) == 2 and loc[0] == "env" and isinstance(value, list):
        return "must be a string, or a mapping like {from_env: NAME, secret: true} (got a list)"
    if kind == "string_type":
        quote = "; quote it" if isinstance(value, int | float | date) else ""
        return f"must be a string (got {got}){quote}"
    if kind == "literal_error":
        field = model_at(loc).model_fields.get(str(loc[-1]))
        allowed = get_args(field.annotation) if field else (ctx.get("expected", ""),)
        return f"must be one of: {', '.join(map(str, allowed))} (got {got})"
    msg = one_line(err["msg"])
    return msg[:1].lower() + msg[1:]


def _yaml11_hint(kind: str, value: Any) -> str:
    """For text where a number belongs, written in a YAML 1.1 number form: why it is text."""
    if kind not in ("int_type", "float_type") or not isinstance(value, str):
        return ""
    if _BASE_60.fullmatch(value):
        return (
            "; YAML 1.2 reads it as text, not as YAML 1.1's base-60 number: write the number"
            " itself (an hour and a half is 1.5)"
        )
    if _UNDERSCORED.fullmatch(value):
        return f"; YAML 1.2 reads '_' in a number as text: write {value.replace('_', '')}"
    return ""


def _unknown_field(loc: Loc, model_at: ModelAt) -> str:
    model, key = model_at(loc), str(loc[-1])
    top, cluster = model_at(()), model_at(("cluster", "x"))
    if model is top and key in cluster.model_fields:
        return f"unknown field; did you mean 'cluster.{key}'?"
    close = difflib.get_close_matches(key, list(model.model_fields), n=1)
    return f"unknown field; did you mean {close[0]!r}?" if close else "unknown field"

