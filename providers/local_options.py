"""The `providers.local` section of job.yaml and config.yaml (controller side: imports pydantic)."""

from __future__ import annotations

from pydantic import Field

from cloudtrain.providers.options_base import ProviderOptions


class LocalOptions(ProviderOptions):
    """Options of the local provider (nodes are processes on this machine)."""

    root: str | None = Field(
        None,
        min_length=1,
        description="folder for the local nodes' working folders (default: $CLOUDTRAIN_HOME/local)",
    )
