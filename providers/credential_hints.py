"""Whether a cloud's credential chain would find something, looked for without its SDK.

`plan` asks a cloud's account (its quotas) only where credentials are visible: a variable or a
file its SDK's chain reads before any network (`ProviderInfo.credential_env`,
`credential_files`). Credentials only a metadata server gives (a cloud VM's) are not visible
here: `plan` then says it did not look, and `cloudtrain check` asks the chain itself.

Standard library only: `plan` stays SDK-free when nothing is visible.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cloudtrain.core import env as variables
from cloudtrain.providers.info import ProviderInfo


def visible(
    info: ProviderInfo, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> str | None:
    """The first credential source of `info`'s chain seen here (`$NAME` or `~/path`), else None.
    Reads only the environment and the file system; never a secret's value. Pure otherwise."""
    env = os.environ if environ is None else environ
    for name in info.credential_env:
        if _value(name, env):
            return f"${name}"
    folder = home if home is not None else Path(env.get("HOME") or Path.home())
    for rel in info.credential_files:
        if (folder / rel).is_file():
            return f"~/{rel}"
    return None


def _value(name: str, env: Mapping[str, str]) -> str:
    """`name`'s value in `env`, stripped ("" when unset): one of cloudtrain's own variables
    through its declaration (cloudtrain/core/env.py). Pure."""
    if name.startswith(variables.PREFIX):
        return variables.by_name(name).text(env)
    return env.get(name, "").strip()
