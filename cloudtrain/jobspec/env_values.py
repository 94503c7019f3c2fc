"""The job spec's `env` values: plain strings, or `{from_env: NAME | value: TEXT, secret: BOOL}`
(`EnvVar`).

A `from_env` value is read from this process's environment when the spec is validated (a
missing variable is a SpecError), so a secret need not be written in job.yaml. No repr, dump or
error message of a spec shows an `EnvVar`'s value (SecretStr). A key follows the node's own
rule (jobs/node_rules.py). Imports only the stdlib, pydantic and the node rules.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SecretStr,
    Tag,
    field_validator,
    model_validator,
)

from cloudtrain.jobs.node_rules import env_key_problem

__all__ = ["EnvKey", "EnvValue", "EnvVar"]

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_env_key(key: str) -> str:
    problem = env_key_problem(key)  # the node's own rule (jobs/node_rules.py)
    if problem:
        raise ValueError(problem)
    return key


EnvKey = Annotated[str, AfterValidator(_check_env_key)]


class EnvVar(BaseModel):
    """An env value given as a mapping: `{from_env: NAME}` (read from the controller's
    environment at load time) or `{value: TEXT}`, plus `secret: true` to redact it from logs.
    The value never appears in a repr, a dump (SecretStr) or an error message."""

    model_config = ConfigDict(extra="forbid", strict=True)

    from_env: str | None = Field(
        None, description="read the value from this variable of the controller's environment"
    )
    value: SecretStr | None = Field(
        None, description="the value itself (for a secret, prefer from_env: job.yaml is shared)"
    )
    secret: bool = Field(False, description="redact the value from the logs and never show it")
    _resolved: str = PrivateAttr("")

    @field_validator("from_env")
    @classmethod
    def _check_from_env(cls, name: str | None) -> str | None:
        if name is None:
            return None
        if not _ENV_KEY_RE.match(name):
            raise ValueError("is not a valid environment variable name (letters, digits and '_')")
        if name not in os.environ:
            raise ValueError(
                f"environment variable {name} is not set here; export it before running"
                " (the value is read from the controller's environment, never from job.yaml)"
            )
        return name

    @model_validator(mode="after")
    def _resolve(self) -> EnvVar:
        if (self.from_env is None) == (self.value is None):
            raise ValueError("give exactly one of from_env and value")
        if self.from_env is not None:
            self._resolved = os.environ[self.from_env]
        else:
            assert self.value is not None
            self._resolved = self.value.get_secret_value()
        return self

    @property
    def resolved(self) -> str:
        """The value the nodes get (from the environment at validation time, or `value`)."""
        return self._resolved


def _env_kind(value: Any) -> str:
    return "ref" if isinstance(value, dict | EnvVar) else "text"


# the tags appear in pydantic error locations; `spec_error` drops them (see ENV_TAGS)
EnvValue = Annotated[
    Annotated[str, Tag("text")] | Annotated[EnvVar, Tag("ref")], Discriminator(_env_kind)
]
