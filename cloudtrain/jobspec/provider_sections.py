"""The spec's `providers:` section: one optional mapping per registered provider, each validated by
the options model the provider declares (its INFO's `options`, e.g. providers/gcp/options.py).

Imports the registry and each provider's options module (pydantic, no SDK). Nothing here names a
cloud: the section's fields, the account aliases (the spec's top-level `project:` is
`providers.<the provider whose account_field is project>.project`) and the allowed provider names
all come from the registry. The same section is the schema of `$CLOUDTRAIN_HOME/config.yaml`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from cloudtrain import providers as registry
from cloudtrain.core.errors import SpecError
from cloudtrain.jobspec.yaml_source import Loc, show
from cloudtrain.providers.options_base import ProviderOptions

CHEAPEST = "cheapest"  # the spec's provider meaning "the cheapest of the clouds"
SECTION = "providers"


def clouds_text(conjunction: str = "or") -> str:
    """The clouds `provider: cheapest` searches, for messages: "aws, gcp or azure". Pure."""
    names = [i.name for i in registry.infos() if i.searched_by_cheapest]
    return ", ".join(names[:-1]) + f" {conjunction} " + names[-1] if len(names) > 1 else names[0]


def account_label(field: str) -> str:
    """Who uses an account field, for descriptions: "GCP project". Pure."""
    users = [i.label for i in registry.infos() if i.account_field == field]
    return " / ".join(f"{label} {field}" for label in users)


@functools.cache
def options_model(name: str) -> type[ProviderOptions]:
    """The options model of provider `name` (an empty model when it declares none). Imports the
    provider's options module only (no SDK). Raises UsageError for an unknown provider."""
    ref = registry.info(name).options
    if not ref:
        return ProviderOptions
    model = registry.load(ref)
    assert isinstance(model, type) and issubclass(model, ProviderOptions), ref
    return model


@functools.cache
def section_model() -> type[BaseModel]:
    """The model of the `providers:` section: a field per registered provider, each None or
    that provider's options. Unknown keys are refused."""
    fields: dict[str, Any] = {
        name: (
            options_model(name) | None,
            Field(None, description=f"options of provider {name} (job.yaml wins over config.yaml)"),
        )
        for name in registry.names()
    }
    config = ConfigDict(extra="forbid", strict=True, frozen=True)
    return create_model("ProvidersSection", __config__=config, **fields)  # type: ignore[call-overload,no-any-return]


def provider_names() -> Any:
    """`Literal[<every registered provider>, "cheapest"]`, the type of the spec's `provider`."""
    return Literal[(*registry.names(), CHEAPEST)]  # type: ignore[valid-type]


def account_field(name: str) -> str | None:
    """The field naming the account provider `name` runs in ("project", "subscription"), or None
    (also for "cheapest" and an unknown name). Imports the provider's light module only."""
    if name not in registry.names():
        return None
    return registry.info(name).account_field


def account_aliases() -> dict[str, str]:
    """Top-level spec field -> the provider whose `account_field` it is (e.g. project -> the
    provider with projects). Pure apart from reading the providers' INFO."""
    return {f: n for n in registry.names() if (f := account_field(n))}


def users_of(field: str) -> list[str]:
    """The providers whose account field is `field`, in registry order."""
    return [n for n, f in ((n, account_field(n)) for n in registry.names()) if f == field]


def check_alias(field: str, value: str) -> str:
    """`value` of the top-level account alias `field`, validated by the options model of the
    provider it belongs to. Raises ValueError with that model's words."""
    owner = account_aliases().get(field)
    if owner is None:
        return value
    try:
        options_model(owner).model_validate({field: value})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise ValueError(str((err.get("ctx") or {}).get("error", err["msg"]))) from None
    return value


def model_at_section(loc: tuple[str | int, ...]) -> type[BaseModel]:
    """The model holding the field at the end of `loc`, a path inside `providers:` (loc[0] is
    `providers`): the section itself, or a provider's options."""
    if len(loc) > 2 and str(loc[1]) in registry.names():
        return options_model(str(loc[1]))
    return section_model()


def check_aliases(spec: Any, filename: str, lines: Mapping[Loc, int]) -> None:
    """Raise SpecError when a top-level account alias (`project:`) and its place in the
    `providers:` section both give a value and they differ, naming both lines."""
    for field, provider in account_aliases().items():
        top, section = getattr(spec, field), spec.provider_section(provider)
        inner = getattr(section, field, None) if section is not None else None
        if top is None or inner is None or top == inner:
            continue
        here, there = (SECTION, provider, field), (field,)
        line = lines.get(here)
        where = f"{filename}:{line}" if line else filename
        raise SpecError(
            f"{where}: {SECTION}.{provider}.{field}: {show(inner)} differs from {field}:"
            f" {show(top)} at line {lines.get(there, '?')}; give it once (the top-level"
            f" {field} is an alias of {SECTION}.{provider}.{field})"
        )
