"""The two small pieces the GCP and Azure condition checkers share (authz_reference_gcp.py,
authz_reference_azure.py): a regex tokenizer loop and the leaves of a boolean tree. Pure."""

from __future__ import annotations

import re
from typing import Any


def scan(pattern: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """`pattern`'s consecutive matches over all of `text` (trailing blanks ignored); ValueError
    where no token starts. Pure."""
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = pattern.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"no token at {text[pos : pos + 30]!r}")
        out.append(m)
        pos = m.end()
    return out


def leaves(node: Any) -> list[Any]:
    """The leaves of a tree of ('and'|'or', [children]) and ('not', child) nodes. Pure."""
    if node[0] == "not":
        return leaves(node[1])
    if node[0] in ("and", "or"):
        return [leaf for child in node[1] for leaf in leaves(child)]
    return [node]
