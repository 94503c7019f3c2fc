"""What every `cloudtrain` command module shares: consoles, JSON output, the run-id check at the
edge, and the provider, store and ledger of `cloudtrain.api` (which the commands call). Imports
only the standard library at start-up (the SDKs load when a provider is made), so
`cloudtrain --help` stays light.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from cloudtrain.jobspec.run_ids import RunRef
    from cloudtrain.providers.base import Provider
    from cloudtrain.state.ledger import Ledger, RunRecord


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) with no auto-highlighting."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def provider(
    name: str, region: str | None = None, zone: str | None = None, account: str | None = None
) -> Provider:
    """The provider (see `cloudtrain.api.provider`)."""
    from cloudtrain import api

    return api.provider(name, region, zone, account)


def ledger() -> Ledger:
    """The ledger at $CLOUDTRAIN_HOME/ledger.db (created on first use)."""
    from cloudtrain import api

    return api.ledger()


def warn(line: str) -> None:
    """A warning of the API's (a deprecated variable in use) as one `warning: ...` line on
    stderr."""
    sys.stderr.write(f"warning: {line}\n")


def emit_json(data: Any) -> None:
    """`data` as indented JSON on stdout: always valid JSON, a NaN or an infinity (a figure a
    node's heartbeat led to) written as null, an object JSON has no form for as its str()."""
    text = json.dumps(json_safe(data), indent=2, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")


def json_safe(data: Any) -> Any:
    """`data` in the form strict JSON allows, through dicts, lists and tuples: every float that
    is not finite as None (as a key: its str), an object with a `to_dict()` (a run's
    Throughput) as that. Pure."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {_json_key(key): json_safe(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(value) for value in data]
    to_dict = getattr(data, "to_dict", None)
    if callable(to_dict) and not isinstance(data, type):
        return json_safe(to_dict())
    return data


def _json_key(key: Any) -> Any:
    return str(key) if isinstance(key, float) and not math.isfinite(key) else key


def run_ref(value: str) -> RunRef:
    """A run id (or prefix) from the command line, parsed before anything is built from it:
    UsageError (one `error:` line) unless it has a run id's shape (`run_ids.parse_run_ref`)."""
    from cloudtrain.jobspec.run_ids import parse_run_ref

    return parse_run_ref(value)


def find_run(value: str) -> RunRecord:
    """The ledger's run for a command-line run id or unique prefix (parsed first, by
    `api.find_run`)."""
    from cloudtrain import api

    return api.find_run(value)
