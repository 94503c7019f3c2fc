"""The arguments and options of the commands that read a run (`status`, `logs`, `attach`, `cost`,
`tensorboard`, `report`): the run id, and where to find a run this machine's ledger has no
record of. Imports typer and the provider registry only, so `cloudtrain.cli.main` can name them
without importing those commands' modules."""

from __future__ import annotations

from typing import Annotated

import typer

from cloudtrain.providers.registry import infos

RunArg = Annotated[str, typer.Argument(help="A run id (or a unique prefix of one).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
# where to find a run this machine's ledger has no record of: its journal in the run's bucket
ProviderOpt = Annotated[
    str | None,
    typer.Option(
        "--provider",
        "-p",
        help="Needed only when the ledger has no record of RUN: read its journal from the "
        "provider's bucket.",
    ),
]
RegionOpt = Annotated[
    str | None, typer.Option("--region", help="The run's region, with --provider.")
]
# "GCP project / Azure subscription": the providers' own account fields (their INFO)
ACCOUNTS = " / ".join(f"{i.label} {i.account_field}" for i in infos() if i.account_field)
ProjectOpt = Annotated[str | None, typer.Option("--project", help=f"{ACCOUNTS}, with --provider.")]
