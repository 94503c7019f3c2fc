"""The spec's YAML side: read a spec file safely and parse it into plain data plus key lines.

Imports only the stdlib and PyYAML. `read_spec_file` refuses folders, special files, files over
1 MiB and non-UTF-8 text; `parse_yaml` refuses anchors/aliases (no "billion laughs"), non-plain
tags, duplicate keys and deep nesting, and remembers the 1-based line of every key, so that
`cloudtrain.jobspec.job` can name the line the user must edit. Every refusal is a one-line
SpecError.

Plain scalars are read by YAML 1.2's core schema (yaml.org/spec/1.2.2, 10.3.2 "Tag Resolution"),
not PyYAML's YAML 1.1: `yes`, `no`, `on`, `off`, `1:30` (1.1's base 60), `1_000` and
`2026-01-01` are text, `1e3` is a number, and only `true`/`false` (any case) are booleans. The
numbers whose meaning differs between the two versions, or that no one means in a job spec, are
refused with what to write instead: leading zeros (`010`, octal 8 in YAML 1.1, 10 in 1.2) and
`0x`/`0o`/`0b` forms. Every plain scalar's text as written is kept (`written`), so that an error
shows `.nan` or `~` as the file has it.
"""

from __future__ import annotations

import re
import stat
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from cloudtrain.core.errors import SpecError

MAX_SPEC_BYTES = 1024 * 1024
MAX_DEPTH = 32
Loc = tuple[str | int, ...]


def read_spec_file(path: str | Path) -> str:
    """The text of the spec file at `path` (UTF-8, a BOM dropped). Raises SpecError naming the
    file for a missing, unreadable, non-regular, over-1-MiB or non-UTF-8 file."""
    shown = printable(path)
    file = Path(path)
    try:
        st = file.stat()
    except FileNotFoundError:
        raise SpecError(f"{shown}: no such file") from None
    except OSError as exc:
        raise SpecError(f"{shown}: cannot read the spec ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a special file"
        raise SpecError(f"{shown}: is {kind}, not a spec file")
    try:
        with file.open("rb") as fh:
            raw = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"{shown}: cannot read the spec ({exc.strerror or exc})") from None
    if len(raw) > MAX_SPEC_BYTES:  # read at most this much, whatever stat said
        raise SpecError(f"{shown}: too large (a spec may be at most 1 MiB)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError(f"{shown}:{line}: the spec is not UTF-8 text") from None


_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "str", "timestamp"))
_TEXT_TAGS = frozenset({_TAG + "value", _TAG + "merge"})  # the odd implicit tags of '=' and '<<'


class _Refused(Exception):
    """Raised while composing, for input refused outright; args: (mark, message)."""


# YAML 1.2 core schema, 10.3.2 (the regular expressions of its tag resolution table)
_CORE = (
    (_TAG + "null", re.compile(r"null|Null|NULL|~|")),
    (_TAG + "bool", re.compile(r"true|True|TRUE|false|False|FALSE")),
    (_TAG + "int", re.compile(r"[-+]?[0-9]+")),
    (
        _TAG + "float",
        re.compile(
            r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
            r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
        ),
    ),
)
# numbers that read differently in YAML 1.1 and 1.2, or that no spec means: refused (_build)
_REFUSED_TAG = "tag:cloudtrain,2026:refused-number"
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")
_OTHER_BASE = re.compile(r"[-+]?0([xX][0-9a-fA-F_]+|[oO][0-7_]+|[bB][01_]+)")


def core_tag(text: str) -> str:
    """The tag YAML 1.2's core schema gives the plain scalar `text` (str when nothing
    matches), or _REFUSED_TAG for a number refused here. Pure."""
    if _LEADING_ZERO.fullmatch(text) or _OTHER_BASE.fullmatch(text):
        return _REFUSED_TAG
    for tag, pattern in _CORE:
        if pattern.fullmatch(text):
            return tag
    return _TAG + "str"


def _refused_number(text: str) -> str:
    """Why a plain number of _REFUSED_TAG is refused, and what to write instead."""
    if _LEADING_ZERO.fullmatch(text):
        digits = text.lstrip("+-")
        sign = "-" if text.startswith("-") else ""
        decimal = sign + (digits.lstrip("0") or "0")
        return (
            f"{text}: a number with a leading zero is ambiguous (YAML 1.1 reads it as octal,"
            f" YAML 1.2 as decimal): write {decimal}, or quote it ('{text}') for text"
        )
    return (
        f"{text}: hexadecimal, octal and binary numbers are not read here: write the number in"
        f" decimal, or quote it ('{text}') for text"
    )


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases while composing (before anything expands)
    and resolves plain scalars by YAML 1.2's core schema (`core_tag`)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark, "YAML anchors and aliases are not allowed")
        return super().compose_node(parent, index)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:  # a plain scalar: no quotes, no tag
            return core_tag(value)
        return super().resolve(kind, value, implicit)


def parse_yaml(text: str, filename: str) -> tuple[Any, dict[Loc, int], dict[Loc, str]]:
    """Parse `text` into plain data, a map from key path to 1-based line, and a map from key
    path to the text of each plain (unquoted) scalar value as written. Raises SpecError."""
    loader: _SpecLoader | None = None
    try:
        loader = _SpecLoader(text)
        root = loader.get_single_node()
        if root is None:
            raise SpecError(f"{filename}: the spec is empty; it needs at least name and entrypoint")
        if not isinstance(root, yaml.MappingNode):
            got = "a list" if isinstance(root, yaml.SequenceNode) else show(root.value)
            line = root.start_mark.line + 1
            raise SpecError(f"{filename}:{line}: the spec must be a mapping of fields (got {got})")
        return _build(loader, root, filename)
    except _Refused as exc:
        raise SpecError(f"{filename}:{exc.args[0].line + 1}: {exc.args[1]}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        what = ", ".join(p for p in (exc.context, exc.problem) if p)
        raise SpecError(f"{where}: invalid YAML: {one_line(what)}") from None
    except yaml.YAMLError as exc:  # a ReaderError: a control character at `position`
        line = text.count("\n", 0, getattr(exc, "position", 0)) + 1
        what = str(exc).partition("\n")[0]
        raise SpecError(f"{filename}:{line}: invalid YAML: {what}") from None
    except RecursionError:
        raise SpecError(f"{filename}: the spec is nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _build(
    loader: yaml.SafeLoader, root: yaml.Node, filename: str
) -> tuple[Any, dict[Loc, int], dict[Loc, str]]:
    """Turn a composed node tree into dicts/lists/scalars, recording each key's 1-based line
    and each plain scalar's text."""
    lines: dict[Loc, int] = {}
    written: dict[Loc, str] = {}

    def fail(node: yaml.Node, path: Loc, message: str) -> SpecError:
        field = f" {path_text(path)}:" if path else ""
        return SpecError(f"{filename}:{node.start_mark.line + 1}:{field} {message}")

    def check_tag(node: yaml.Node, allowed: frozenset[str], path: Loc) -> None:
        if node.tag not in allowed:
            raise fail(node, path, f"YAML tag {node.tag.replace(_TAG, '!!')!r} is not allowed")

    def build(node: yaml.Node, path: Loc, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise fail(node, path, "nested too deeply")
        if isinstance(node, yaml.MappingNode):
            check_tag(node, frozenset({_TAG + "map"}), path)
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise fail(key_node, path, "keys must be plain names, not lists/mappings")
                key = str(key_node.value)
                here = (*path, key)
                if key in out:
                    raise fail(key_node, here, f"duplicate key (first at line {lines[here]})")
                lines[here] = key_node.start_mark.line + 1
                out[key] = build(value_node, here, depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            check_tag(node, frozenset({_TAG + "seq"}), path)
            items: list[Any] = []
            for index, item in enumerate(node.value):
                lines[(*path, index)] = item.start_mark.line + 1
                items.append(build(item, (*path, index), depth + 1))
            return items
        if node.style is None:  # plain: the text as written (a folded one: its one line)
            written[path] = str(node.value)
        if node.tag == _REFUSED_TAG:
            raise fail(node, path, _refused_number(str(node.value)))
        if node.tag in _TEXT_TAGS:
            return str(node.value)
        check_tag(node, _SCALAR_TAGS, path)
        kind = node.tag.replace(_TAG, "")
        if kind in ("null", "bool", "int", "float") and core_tag(str(node.value)) != node.tag:
            raise fail(node, path, f"{show(node.value)} is not a YAML 1.2 {kind} (!!{kind})")
        try:
            return loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError):
            raise fail(node, path, f"cannot read {show(node.value)} as a value") from None

    return build(root, (), 0), lines, written


def path_text(loc: Loc) -> str:
    """A field path as the user reads it: cluster.workers, env.KEY; list items as .0, .1."""
    return ".".join(map(str, loc))


def show(value: Any) -> str:
    """A value as the user wrote it, shortened: 'text', 3, true, null, a list, a mapping. Pure."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, date):
        return value.isoformat()
    return repr(value)


def printable(text: object) -> str:
    """A path or name for an error line: as it is when printable, else quoted with escapes
    (`'a\\nb.yaml'`), so that a line break or a terminal escape in it can neither split nor
    colour the line, and the name stays exact. Pure."""
    value = str(text)
    return value if value.isprintable() else repr(value)


def one_line(text: str) -> str:
    """`text` on one line: runs of whitespace (newlines too) become one space. Pure."""
    return " ".join(str(text).split())
