"""Where cloudtrain keeps its local state: `$CLOUDTRAIN_HOME`, defaulting to `~/.cloudtrain`.

Pure path arithmetic: nothing here creates a folder (callers that write make their own).
"""

from __future__ import annotations

from pathlib import Path

from cloudtrain.core import env

HOME_ENV = env.HOME.name


def cloudtrain_home() -> Path:
    """`$CLOUDTRAIN_HOME` (with `~` expanded), else `~/.cloudtrain`. Read on every call; pure."""
    home: Path | None = env.HOME.get()
    return home if home is not None else Path.home() / ".cloudtrain"


def runs_dir() -> Path:
    """The folder holding one subfolder per run (logs, rendered scripts). Pure."""
    return cloudtrain_home() / "runs"


def ledger_path() -> Path:
    """The default SQLite run ledger file. Pure."""
    return cloudtrain_home() / "ledger.db"
