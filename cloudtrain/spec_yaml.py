"""The spec's YAML side: read a spec file safely and parse it into plain data plus key lines.

Imports only the stdlib and PyYAML. `read_spec_file` refuses folders, special files, files over
1 MiB and non-UTF-8 text; `parse_yaml` refuses anchors/aliases (no "billion laughs"), non-plain
tags, duplicate keys and deep nesting, and remembers the 1-based line of every key, so that
`cloudtrain.spec` can name the line the user must edit. Every refusal is a one-line SpecError.
"""

from __future__ import annotations

import stat
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from cloudtrain.errors import SpecError

MAX_SPEC_BYTES = 1024 * 1024
MAX_DEPTH = 32
Loc = tuple[str | int, ...]


def read_spec_file(path: str | Path) -> str:
    """The text of the spec file at `path` (UTF-8, a BOM dropped). Raises SpecError naming the
    file for a missing, unreadable, non-regular, over-1-MiB or non-UTF-8 file."""
    shown = str(path)
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


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases while composing (before anything expands)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark, "YAML anchors and aliases are not allowed")
        return super().compose_node(parent, index)


def parse_yaml(text: str, filename: str) -> tuple[Any, dict[Loc, int]]:
    """Parse `text` into plain data and a map from key path to 1-based line. Raises SpecError."""
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


def _build(loader: yaml.SafeLoader, root: yaml.Node, filename: str) -> tuple[Any, dict[Loc, int]]:
    """Turn a composed node tree into dicts/lists/scalars, recording each key's 1-based line."""
    lines: dict[Loc, int] = {}

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
        if node.tag in _TEXT_TAGS:
            return str(node.value)
        check_tag(node, _SCALAR_TAGS, path)
        try:
            return loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError):
            raise fail(node, path, f"cannot read {show(node.value)} as a value") from None

    return build(root, (), 0), lines


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


def one_line(text: str) -> str:
    """`text` on one line: runs of whitespace (newlines too) become one space. Pure."""
    return " ".join(str(text).split())
