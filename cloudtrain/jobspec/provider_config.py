"""The typed configuration a run's provider is built with, and where each option came from.

A provider's options (its `providers.<name>` model, e.g. providers/gcp/options.py) are taken, per
field, from the first of:
1. job.yaml's `providers.<name>` section (its account field also from the top-level alias,
   `project:` / `subscription:`);
2. `$CLOUDTRAIN_HOME/config.yaml`'s `providers.<name>` section (defaults across jobs);
3. the field's deprecated `CLOUDTRAIN_*` variable (the model's ENV_FALLBACKS), with one warning
   line per variable and process (a value the option's rule refuses: one line saying so, and
   the variable is ignored). Only this module reads those variables: the adapters read their
   options alone;
4. the model's default.

Layers 2 and 3 are read by `outside_layers`, never by the spec's validation, and once per command:
the edge (`cloudtrain.api`'s plan, prepare, check) holds what it read for the block it runs
(`read_once`), and every `resolve` inside takes that; a run's provider takes its options from
the plan (`options_of_plan`), not from a second read. The plan records
each option's value and source (`Plan.provider_options`, stored in the ledger's plan JSON), and
`cloudtrain.run.configs.config_for_record` rebuilds the same config for `down`/`status`. No
option is a secret. Controller side only (pydantic); the node side builds providers with no options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cloudtrain.core.env import by_name
from cloudtrain.core.paths import cloudtrain_home
from cloudtrain.jobspec.error_lines import spec_error
from cloudtrain.jobspec.provider_sections import (
    SECTION,
    account_field,
    model_at_section,
    options_model,
    section_model,
)
from cloudtrain.jobspec.yaml_source import Loc, parse_yaml, read_spec_file
from cloudtrain.providers.base import ProviderConfig

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec

CONFIG_FILE = "config.yaml"
JOB, CONFIG, ENV, DEFAULT = "job.yaml", "config.yaml", "env (deprecated)", "default"
Warn = Callable[[str], None]

__all__ = [
    "CONFIG_FILE",
    "OptionSource",
    "OutsideLayers",
    "Resolved",
    "config_for_provider",
    "deprecation_lines",
    "load_user_config",
    "make_config",
    "options_of_plan",
    "outside_layers",
    "read_once",
    "resolve",
    "warn_once",
]


@dataclass(frozen=True)
class OptionSource:
    """Where one option's value came from: `kind` is job.yaml, config.yaml, env (deprecated) or
    default; `where` is `FILE:LINE` (a file) or `$VAR` (the environment), else empty."""

    kind: str
    where: str = ""


@dataclass(frozen=True)
class OutsideLayers:
    """What the environment of this process adds to a spec: config.yaml's `providers:` section
    (validated, with its file and key lines) and the deprecated variables that were set."""

    config: Any = None  # the config file's providers section (section_model()), or None
    config_path: str = ""
    config_lines: Mapping[Loc, int] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)  # deprecated variable -> its value


@dataclass(frozen=True)
class Resolved:
    """A provider's options in effect (`options`, its typed model) and each field's source."""

    provider: str
    options: BaseModel
    sources: Mapping[str, OptionSource]
    # option -> (deprecated variable, its value, why it was refused): set but ignored
    refused: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)

    def shown(self) -> list[dict[str, Any]]:
        """Every option as `{name, value, source, where}`, in the model's field order (what
        `plan` shows and the ledger's plan JSON keeps). Pure."""
        return [
            {"name": name, "value": getattr(self.options, name), **_src(self.sources[name])}
            for name in type(self.options).model_fields
        ]


def _src(source: OptionSource) -> dict[str, str]:
    return {"source": source.kind, "where": source.where}


class _ConfigFile(BaseModel):
    """The schema of `$CLOUDTRAIN_HOME/config.yaml`: only a `providers:` section, as in job.yaml."""

    model_config = ConfigDict(extra="forbid", strict=True)
    providers: section_model() = Field(default_factory=section_model())  # type: ignore[valid-type]


def user_config_path() -> Path:
    """`$CLOUDTRAIN_HOME/config.yaml` (it may not exist). Pure."""
    return cloudtrain_home() / CONFIG_FILE


def load_user_config(path: Path | None = None) -> tuple[Any, dict[Loc, int], str]:
    """The `providers:` section of config.yaml (None when the file does not exist), its key
    lines (paths start with `providers`) and its name. Raises SpecError naming the file and line
    (`FILE:LINE: providers.gcp.network: problem`) for a bad file."""
    file = path or user_config_path()
    shown = str(file)
    if not file.exists():
        return None, {}, shown
    data, lines, written = parse_yaml(read_spec_file(file), shown)
    try:
        parsed = _ConfigFile.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc, shown, lines, written, frozenset(), _config_model_at) from exc
    return parsed.providers, lines, shown


def _config_model_at(loc: Loc) -> type[BaseModel]:
    return model_at_section(loc) if len(loc) > 1 and loc[0] == SECTION else _ConfigFile


def outside_layers(environ: Mapping[str, str] | None = None) -> OutsideLayers:
    """config.yaml's section and the deprecated variables set in `environ` (default: this
    process's environment). Reads the file; raises SpecError for a bad config.yaml."""
    config, lines, path = load_user_config()
    names = {var for n in _names() for var in options_model(n).ENV_FALLBACKS.values()}
    found = {var: text for var in sorted(names) if (text := by_name(var).text(environ))}
    return OutsideLayers(config, path, lines, found)


# what the command running in this context read (`read_once`); None: nothing held
_HELD: ContextVar[OutsideLayers | None] = ContextVar("cloudtrain_outside_layers", default=None)


@contextmanager
def read_once(layers: OutsideLayers | None = None) -> Iterator[OutsideLayers]:
    """Hold one read of config.yaml and the deprecated variables for the block (this thread
    and context): `layers` if given, else what an enclosing block holds, else read now
    (SpecError for a bad config.yaml). Every `resolve` and `command_layers` inside takes it
    instead of reading again. Blocks only to read the file."""
    held = _HELD.get()
    if held is not None:
        yield held
        return
    token = _HELD.set(layers if layers is not None else outside_layers())
    try:
        yield _HELD.get() or OutsideLayers()
    finally:
        _HELD.reset(token)


def command_layers() -> OutsideLayers:
    """What the enclosing `read_once` holds, else a read now (`outside_layers`)."""
    return _HELD.get() or outside_layers()


def _names() -> tuple[str, ...]:
    from cloudtrain import providers as registry

    return registry.names()


def resolve(spec: JobSpec | None, provider: str, layers: OutsideLayers | None = None) -> Resolved:
    """The options of `provider` in effect for `spec` (None: no job.yaml, as for an old ledger
    run), layer by layer (see the module doc). A deprecated variable whose value the option's
    rule refuses is skipped and kept in `Resolved.refused` (`warn_once` says it). Pure given
    `layers` (default: read now, `outside_layers()`: config.yaml and the environment)."""
    model = options_model(provider)
    if layers is None:
        layers = command_layers()
    section_of = getattr(spec, "provider_section", None)  # a stand-in spec may lack it
    job = section_of(provider) if section_of is not None else None
    conf = getattr(layers.config, provider, None) if layers.config is not None else None
    alias = account_field(provider)
    values: dict[str, Any] = {}
    sources: dict[str, OptionSource] = {}
    refused: dict[str, tuple[str, str, str]] = {}
    for name in model.model_fields:
        if job is not None and name in job.model_fields_set:
            values[name] = getattr(job, name)
            sources[name] = OptionSource(JOB, _where(spec, (SECTION, provider, name)))
        elif spec is not None and name == alias and getattr(spec, name, None) is not None:
            values[name] = getattr(spec, name)
            sources[name] = OptionSource(JOB, _where(spec, (name,)))
        elif conf is not None and name in conf.model_fields_set:
            values[name] = getattr(conf, name)
            line = layers.config_lines.get((SECTION, provider, name))
            sources[name] = OptionSource(CONFIG, f"{layers.config_path}:{line}" if line else "")
        elif (problem := _env_problem(model, name, layers.env)) is None:
            var = model.ENV_FALLBACKS[name]
            values[name] = layers.env[var]
            sources[name] = OptionSource(ENV, f"${var}")
        else:
            if problem:
                var = model.ENV_FALLBACKS[name]
                refused[name] = (var, layers.env[var], problem)
            sources[name] = OptionSource(DEFAULT)
    return Resolved(provider, model.model_validate(values), sources, refused)


def _where(spec: Any, loc: Loc) -> str:
    where = spec.where(*loc) if hasattr(spec, "where") else None
    return where or ""


def _env_problem(model: Any, name: str, env: Mapping[str, str]) -> str | None:
    """None when option `name`'s deprecated variable is set in `env` to a valid value; "" when
    it has none or is unset; else why the option's rule refuses its value (one line)."""
    value = env.get(model.ENV_FALLBACKS.get(name, ""))
    if not value:
        return ""
    try:
        model.model_validate({name: value})
    except ValidationError as exc:
        message = str(exc.errors()[0].get("msg", "not a valid value"))
        return " ".join(message.removeprefix("Value error, ").split())
    return None


_warned: set[str] = set()  # the deprecated variables already warned about in this process


def warn_stderr(line: str) -> None:
    """Write one `warning: ...` line to stderr (the default `warn` of
    `cloudtrain.run.configs.config_for`)."""
    sys.stderr.write(f"warning: {line}\n")


def deprecation_lines(resolved: Resolved) -> list[str]:
    """One line per deprecated variable the options were taken from, naming the option to set
    instead, and one per variable set to a value the option refuses (ignored). Pure."""
    return [line for _var, line in _deprecations(resolved)]


def _deprecations(resolved: Resolved) -> list[tuple[str, str]]:
    instead = f"in job.yaml or {user_config_path()} instead"
    used = [
        (
            src.where,
            f"{src.where} is deprecated: set {SECTION}.{resolved.provider}.{name} {instead}",
        )
        for name, src in resolved.sources.items()
        if src.kind == ENV
    ]
    ignored = [
        (
            f"${var}",
            f"${var}={_shown(value)!r} is ignored: {problem}; set"
            f" {SECTION}.{resolved.provider}.{name} {instead}",
        )
        for name, (var, value, problem) in resolved.refused.items()
    ]
    return used + ignored


def _shown(value: str) -> str:
    value = value.strip()
    return value[:60] + ("..." if len(value) > 60 else "")


def warn_once(resolved: Resolved, warn: Warn | None) -> None:
    """Say each deprecated variable `resolved` took an option from (or ignored) through `warn`,
    once per process (None: silent)."""
    for var, line in _deprecations(resolved):
        if warn is not None and var not in _warned:
            _warned.add(var)
            warn(line)


def options_of_plan(provider: str, shown: Sequence[Any]) -> Resolved | None:
    """The options a plan recorded for `provider` (`Plan.provider_options`: name, value,
    source, where, as objects or dicts), as a Resolved; None when they are not a whole record
    of that provider's options (a plan made before options were kept, or for another cloud).
    Pure: nothing is read again."""
    model = options_model(provider)
    keys = ("name", "value", "source", "where")
    rows = [o if isinstance(o, Mapping) else {k: getattr(o, k, "") for k in keys} for o in shown]
    if [r.get("name") for r in rows] != list(model.model_fields):
        return None
    values = {r["name"]: r["value"] for r in rows}
    sources = {r["name"]: OptionSource(r.get("source", DEFAULT), r.get("where", "")) for r in rows}
    return Resolved(provider, model.model_validate(values), sources)


def make_config(
    name: str, region: str | None, zone: str | None, options: BaseModel
) -> ProviderConfig:
    """The ProviderConfig of `name` with these options; its account is the options' account
    field (the project, the subscription). Pure."""
    field_name = account_field(name)
    account = getattr(options, field_name, None) if field_name else None
    return ProviderConfig(name=name, region=region, zone=zone, account=account, options=options)


def config_for_provider(
    name: str,
    region: str | None = None,
    zone: str | None = None,
    account: str | None = None,
    *,
    warn: Warn | None = warn_stderr,
) -> ProviderConfig:
    """The ProviderConfig of provider `name` with no job spec and no ledger record (`gc`, `down`
    of an unrecorded run): config.yaml's options, else the deprecated variables (warned about
    once), else the defaults; `account` (None: config.yaml's) wins. Reads config.yaml; raises
    SpecError for a bad one."""
    resolved = resolve(None, name)
    warn_once(resolved, warn)
    config = make_config(name, region, zone, resolved.options)
    return replace(config, account=account) if account else config
