"""The `cloudtrain report` command (stub: being built)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the command to `app`. Imports nothing heavy."""
