"""Redact secret values from text: `Redactor(secrets).redact(line)` replaces each with `***`.

Stdlib only: it runs on the nodes too (the agent's LogPump) as well as on the controller.
Secrets shorter than `MIN_LENGTH` characters are ignored (redacting "a" or "1" would mangle every
line). A multi-line secret (a PEM key) is also redacted line by line, since logs travel as lines.
Matching is literal and case-sensitive; an encoded form of a secret (base64, URL-quoted) is not
caught. One precompiled alternation, longest secret first, so that many lines are cheap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
MIN_LENGTH = 4


class Redactor:
    """Replaces every occurrence of any of its secrets with `MASK`. Immutable, thread-safe."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Redact `secrets` (strings shorter than MIN_LENGTH, or not strings, are ignored)."""
        found: set[str] = set()
        for secret in secrets:
            if not isinstance(secret, str):
                continue
            parts = [secret]
            if "\n" in secret or "\r" in secret:
                parts += [line.strip() for line in secret.splitlines()]
            found.update(part for part in parts if len(part) >= MIN_LENGTH)
        self._secrets = tuple(sorted(found, key=lambda s: (-len(s), s)))
        self._pattern = re.compile("|".join(map(re.escape, self._secrets))) if found else None

    @classmethod
    def from_cluster(cls, doc: Mapping[str, Any]) -> Redactor:
        """The redactor for a node, from cluster.json: the `env` values of the names listed in
        `secrets` (missing names are skipped). A document without `secrets` redacts nothing."""
        env = doc.get("env") or {}
        names = doc.get("secrets") or []
        return cls(str(env[name]) for name in names if name in env)

    def __bool__(self) -> bool:
        """Whether there is anything to redact."""
        return self._pattern is not None

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"  # never the secrets themselves

    def redact(self, text: str) -> str:
        """`text` with every occurrence of a secret replaced by `MASK`. Pure."""
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)
