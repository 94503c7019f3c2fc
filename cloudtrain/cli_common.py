"""What every `cloudtrain` command module shares: consoles, the provider and store factories, the
ledger, JSON output, and the run-id check at the edge. Imports only typer-free stdlib at start-up
(the SDKs load when a provider is made), so `cloudtrain --help` stays light.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from cloudtrain.ledger import Ledger, RunRecord
    from cloudtrain.providers.base import Provider


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) with no auto-highlighting."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def provider(
    name: str, region: str | None = None, zone: str | None = None, account: str | None = None
) -> Provider:
    """The provider, wrapped by the fault injector when $CLOUDTRAIN_FAULTS is set (tests and
    benchmarks use it to make any provider slow or flaky). `account`: the GCP project."""
    from cloudtrain.providers import get_provider
    from cloudtrain.providers.base import ProviderConfig
    from cloudtrain.providers.faults import FaultPlan, wrap

    config = ProviderConfig(name=name, region=region, zone=zone, account=account)
    prov = get_provider(name, config)
    faults = FaultPlan.from_env()
    return wrap(prov, faults) if faults else prov


def store(prov: Any, uri: str) -> Any:
    """The provider's store at `uri`, every call through the one retry policy."""
    from cloudtrain.providers.retrying import RetryingStore

    return RetryingStore(prov.store(uri))


def ledger() -> Ledger:
    """The ledger at $CLOUDTRAIN_HOME/ledger.db (created on first use)."""
    from cloudtrain.ledger import Ledger

    return Ledger()


def emit_json(data: Any) -> None:
    """`data` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def run_ref(value: str) -> str:
    """A run id (or prefix) from the command line, checked before anything is built from it:
    UsageError (one `error:` line) unless it has a run id's shape (`runrules.check_run_ref`)."""
    from cloudtrain.runrules import check_run_ref

    return check_run_ref(value)


def find_run(value: str) -> RunRecord:
    """The ledger's run for a command-line run id or unique prefix (checked first)."""
    return ledger().find_run(run_ref(value))
