"""What every provider's options model shares: the base class and the SSH CIDR field.

A provider's options are the `providers.<name>` section of job.yaml and of
`$CLOUDTRAIN_HOME/config.yaml`: one pydantic model per provider, in `providers/<name>/options.py`
(named by its INFO's `options`), read by `cloudtrain.jobspec.provider_config`. Controller side
only: it
imports pydantic, so no adapter imports it at module level (the node side has no pydantic); an
adapter reads its options with `ProviderConfig.option(name)`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cloudtrain.core import env
from cloudtrain.providers.access import cidr_problem


class ProviderOptions(BaseModel):
    """The base of every provider's options: unknown fields refused, no type coercion, frozen.
    `ENV_FALLBACKS` maps an option to the deprecated `CLOUDTRAIN_*` variable that set it before
    (used only when neither job.yaml nor config.yaml sets the option)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    ENV_FALLBACKS: ClassVar[dict[str, str]] = {}

    def get(self, name: str, default: Any = None) -> Any:
        """Mapping-style read of option `name` (`default` when unset), for adapter code written
        against the untyped options mapping. Pure."""
        value = getattr(self, name, None)
        return default if value is None else value


def _check_cidr(value: str | None) -> str | None:
    if value is None:
        return None
    problem = cidr_problem(value)
    if problem:
        raise ValueError(problem)
    return value.strip()


SshCidr = Annotated[
    str | None,
    AfterValidator(_check_cidr),
    Field(
        description="the one address range SSH may come from when cluster.ssh is true, e.g."
        " 203.0.113.7/32 (never 0.0.0.0/0)",
        examples=["203.0.113.7/32"],
    ),
]
SSH_CIDR_ENV = env.SSH_CIDR.name  # deprecated: use providers.<cloud>.ssh_cidr
