"""The job spec: pydantic models and one-line `FILE:LINE: FIELD: problem` errors.

Imports only the stdlib, pydantic and PyYAML, so `cloudtrain validate` stays fast. The safe YAML
loader (no anchors/aliases, plain tags only, no duplicate keys, at most 1 MiB, the line of every
key) is `cloudtrain.jobspec.yaml_source`; every error names the line the user must edit.

`env` values are plain strings or `{from_env: NAME | value: TEXT, secret: BOOL}` (`EnvVar`, in
`cloudtrain.jobspec.env_values`). `JobSpec.env_values()` is what the nodes get (through
cluster.json only); `secret_values()` is what must be redacted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cloudtrain.core.errors import SpecError
from cloudtrain.jobs.node_rules import (
    env_entry_problem,
    env_key_problem,
    spec_exec_problem,
    text_problem,
)
from cloudtrain.jobs.strategies import DEFAULT, NAMES, ROLES, StrategyInfo
from cloudtrain.jobs.strategies import strategy as lookup_strategy
from cloudtrain.jobspec.env_values import EnvKey, EnvValue, EnvVar
from cloudtrain.jobspec.error_lines import ENV_ENTRY_ERROR, spec_error
from cloudtrain.jobspec.provider_sections import (
    SECTION,
    account_field,
    account_label,
    check_alias,
    check_aliases,
    clouds_text,
    model_at_section,
    provider_names,
    section_model,
)
from cloudtrain.jobspec.tpu_rules import check_tpu
from cloudtrain.jobspec.yaml_source import (
    MAX_DEPTH,
    MAX_SPEC_BYTES,
    Loc,
    parse_yaml,
    printable,
    read_spec_file,
    show,
)
from cloudtrain.providers.registry import DEFAULT_PROVIDER
from cloudtrain.providers.uri_rules import SCHEMES, checkpoint_problem

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_SPEC_BYTES",
    "PROVIDER_SCHEMES",
    "ROLES",
    "ClusterSpec",
    "EnvKey",
    "EnvVar",
    "JobSpec",
    "json_schema",
    "load_spec",
    "load_spec_text",
]

MAX_NODES = 64
PROVIDER_SCHEMES: dict[str, str] = SCHEMES

Strategy = Literal[NAMES]  # the declared strategies (jobs/strategies.py), in their order
ProviderName = provider_names()  # the registered providers (cloudtrain.providers), cheapest
ProvidersSection = section_model()  # `providers:`, one options model per registered provider

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,29}$")
_ACCELERATOR_RE = re.compile(r"^(?P<name>[A-Za-z0-9-]+)(?::(?P<count>[0-9]+))?$")
_PLACE = r"^[A-Za-z0-9-]{1,64}$"  # a region or zone name
_WORD_RE = re.compile(r"^[\x21-\x7e]{1,1024}$")  # an image or machine type: one printable word


# the spec's count field of each role (`workers` counts the role `worker`)
_ROLE_OF_FIELD = {"chief": "chief", "workers": "worker", "ps": "ps", "evaluator": "evaluator"}


def _count_problem(strategy: str, field: str, value: int | None) -> str | None:
    """What is wrong with a role count (chief, workers, ps, evaluator) for the strategy, if any:
    its declaration's rule (jobs/strategies.py)."""
    return _declared(strategy).counts()[_ROLE_OF_FIELD[field]].problem(strategy, value)


def _declared(strategy: str) -> StrategyInfo:
    """The declaration of a valid spec's strategy (jobs/strategies.py). Pure; AssertionError for
    a name the spec's validation would have refused."""
    info = lookup_strategy(strategy)
    assert info is not None, strategy
    return info


class ClusterSpec(BaseModel):
    """The nodes of the job: the distribution strategy, role counts and the machine to use."""

    model_config = ConfigDict(extra="forbid", strict=True)

    strategy: Strategy = Field(
        DEFAULT, description="tf.distribute strategy, or horovod (workers only)"
    )
    chief: int | None = Field(None, ge=0, le=1, validate_default=True, description="0 or 1")
    workers: int = Field(1, ge=1, description="worker nodes (exactly 1 for single-node strategies)")
    ps: int = Field(0, ge=0, validate_default=True, description="parameter servers")
    evaluator: int = Field(0, ge=0, le=1, description="0 or 1 side-car evaluator node")
    accelerator: str | None = Field(None, description="GPU per node: 'V100' or 'V100:2'")
    instance_type: str | None = Field(None, min_length=1, description="force a machine type")
    spot: bool = Field(False, description="use spot/preemptible capacity")
    spot_fallback: bool = Field(
        False, description="spot only: on-demand where no region has spot capacity (its price)"
    )
    port: int = Field(2222, ge=1024, le=65000, description="first TensorFlow port")
    disk_gb: int = Field(100, ge=10, le=4096, description="boot disk size per node")
    image: str | None = Field(None, min_length=1, description="force a VM image")
    ssh: bool = Field(False, description="open SSH to the nodes")

    @field_validator("chief", "workers", "ps", "evaluator")
    @classmethod
    def _check_counts(cls, value: int | None, info: ValidationInfo) -> int | None:
        strategy = info.data.get("strategy")  # absent when invalid: that error is reported
        problem = _count_problem(strategy, info.field_name or "", value) if strategy else None
        if problem:
            raise ValueError(problem)
        if info.field_name == "chief" and strategy:
            return _declared(strategy).chief.settle(value)
        return value

    @field_validator("accelerator")
    @classmethod
    def _check_accelerator(cls, value: str | None) -> str | None:
        if value is None:
            return None
        m = _ACCELERATOR_RE.match(value)
        if not m:
            raise ValueError(f"must look like 'V100' or 'V100:2' (got {show(value)})")
        if m["count"] is not None and not 1 <= int(m["count"]) <= 16:
            raise ValueError(f"count must be 1 to 16 (got {show(value)})")
        return value

    @field_validator("image", "instance_type")
    @classmethod
    def _check_word(cls, value: str | None) -> str | None:
        if value and not _WORD_RE.match(value):
            raise ValueError(
                "must be one word of printable ASCII, at most 1024 characters (a cloud's name"
                f" for it), with no spaces or control characters (got {show(value)})"
            )
        return value

    @model_validator(mode="after")
    def _check_total(self) -> ClusterSpec:
        total = self.total_nodes()
        if total > MAX_NODES:
            parts = ", ".join(f"{n} {role}" for role, n in self.roles().items())
            raise ValueError(f"at most {MAX_NODES} nodes in total (got {total}: {parts})")
        if self.spot_fallback and not self.spot:
            raise ValueError("spot_fallback: true needs spot: true (it is spot's fallback)")
        return self

    @property
    def accelerator_name(self) -> str | None:
        """The GPU model ('V100' of 'V100:2'), or None when no accelerator is asked for."""
        return self.accelerator.split(":", 1)[0] if self.accelerator else None

    @property
    def accelerator_count(self) -> int:
        """GPUs per node (2 of 'V100:2', 1 of 'V100'); 0 when no accelerator is asked for."""
        if not self.accelerator:
            return 0
        _, _, count = self.accelerator.partition(":")
        return int(count) if count else 1

    @property
    def strategy_info(self) -> StrategyInfo:
        """The declaration of the strategy (jobs/strategies.py): what every other module reads
        instead of comparing its name. Pure."""
        return _declared(self.strategy)

    def roles(self) -> dict[str, int]:
        """Node count per role, in the order chief, worker, ps, evaluator; only counts > 0."""
        info = self.strategy_info
        if not info.spans_nodes:
            return {"chief": 1}
        chief = info.chief.settle(self.chief)
        counts = zip(ROLES, (chief, self.workers, self.ps, self.evaluator), strict=True)
        return {role: n for role, n in counts if n > 0}

    def total_nodes(self) -> int:
        """How many nodes the job runs on (the sum of `roles()`)."""
        return sum(self.roles().values())


class JobSpec(BaseModel):
    """A training job: where it runs, on which nodes, what it runs, and its limits."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(description="job name, used in cloud resource names")
    provider: ProviderName = Field(
        DEFAULT_PROVIDER,
        description=f"where to run; 'cheapest': the cheapest of {clouds_text('and')}",
    )
    region: str | None = Field(None, pattern=_PLACE, description="default: the cheapest")
    zone: str | None = Field(None, pattern=_PLACE, description="a zone of the region")
    project: str | None = Field(
        None,
        description=f"alias of providers.<the provider with projects>.project"
        f" ({account_label('project')} id; its default is that option's)",
    )
    subscription: str | None = Field(
        None,
        description=f"alias of providers.<the provider with subscriptions>.subscription"
        f" ({account_label('subscription')} id; its default is that option's)",
    )
    providers: ProvidersSection = Field(  # type: ignore[valid-type]
        default_factory=ProvidersSection,
        description="per-provider options, e.g. providers: {<provider>: {<option>: <value>}};"
        " each field also read from $CLOUDTRAIN_HOME/config.yaml (the job's value wins)",
    )
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    workdir: str = Field(".", description="folder shipped to each node, relative to the spec")
    setup: str = Field("", description="shell run on each node before the entrypoint")
    entrypoint: str = Field(description="shell command run in the workdir on each node")
    env: dict[EnvKey, EnvValue] = Field(
        default_factory=dict,
        description="extra environment: NAME: text, or NAME: {from_env: VAR, secret: true}",
    )
    checkpoint: str | None = Field(None, description="storage URI for checkpoints")
    max_hours: float = Field(1.0, gt=0, le=168, description="wall-clock limit of the run")
    max_cost_usd: float | None = Field(None, gt=0, allow_inf_nan=False, description="cost cap")
    max_gpu_hours: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="GPU-hour cap: the plan's GPUs x the hours they run, every attempt (the"
        " unit a cluster charges in)",
    )
    teardown: Literal["always", "keep-on-failure"] = Field("always", description="when to delete")
    max_restarts: int = Field(
        2, ge=0, le=20, description="restarts after a node is lost (gone, preempted, silent)"
    )
    # SkyPilot's name and meaning (its job_recovery.max_restarts_on_errors: restarts on user
    # code errors, integer >= 0, default 0; sky/utils/schemas.py, docs/source/reference/
    # yaml-spec.rst); the ceiling is max_restarts' own
    max_restarts_on_errors: int = Field(
        0,
        ge=0,
        le=20,
        description="new attempts after a node fails on its own (its entrypoint, setup or "
        "agent errs); a failed node otherwise ends the run at once",
    )

    _source_path: Path | None = PrivateAttr(None)
    _source_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _filename: str = PrivateAttr("<spec>")
    _lines: dict[Loc, int] = PrivateAttr(default_factory=dict)

    @field_validator("name", "entrypoint", "setup")
    @classmethod
    def _check_text(cls, value: str, info: ValidationInfo) -> str:
        if info.field_name == "entrypoint" and not value.strip():
            raise ValueError("must not be empty")
        if info.field_name in ("entrypoint", "setup"):
            problem = text_problem(info.field_name, value)  # the node's own rule
            if problem:
                raise ValueError(problem)
        if info.field_name == "name" and (not _NAME_RE.match(value) or value.endswith("-")):
            raise ValueError(
                "must be 1-30 lowercase letters, digits or '-', start with a letter and"
                f" not end with '-' (got {show(value)})"
            )
        return value

    @field_validator("project", "subscription")
    @classmethod
    def _check_account_alias(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A top-level account alias, by the rule of the provider it belongs to."""
        return None if value is None else check_alias(info.field_name or "", value)

    @field_validator("region", "zone")
    @classmethod
    def _check_place(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("provider") == "cheapest":
            field = info.field_name
            raise ValueError(
                f"cannot be set with provider 'cheapest' (got {show(value)}): a {field} belongs"
                f" to one cloud; remove {field}, or set provider to {clouds_text()}"
            )
        return value

    @property
    def account(self) -> str | None:
        """The cloud account of the spec's provider (its INFO's `account_field`: a project, a
        subscription); None: the SDK's default, and always None for a provider without
        accounts and for cheapest (use `account_for(plan.provider)` once the plan chose)."""
        return self.account_for(self.provider)

    def account_for(self, provider: str) -> str | None:
        """The account to use on `provider` as job.yaml gives it: `providers.<provider>.<its
        account_field>`, else the top-level alias of that field; None when neither is set or
        the provider has no account (then config.yaml, the environment or the SDK decide:
        `cloudtrain.run.configs.config_for`). Pure."""
        field = account_field(provider)
        if field is None:
            return None
        section = getattr(self.providers, provider, None)
        value = getattr(section, field, None) if section is not None else None
        return value if value is not None else getattr(self, field, None)

    def provider_section(self, provider: str) -> Any:
        """The options job.yaml gives for `provider` (its options model), or None. Pure."""
        return getattr(self.providers, provider, None)

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, value: str, info: ValidationInfo) -> str:
        if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            raise ValueError("contains a NUL byte or a lone surrogate: no folder has that name")
        base = (info.context or {}).get("base_dir") or Path.cwd()
        given = Path(base) / Path(value).expanduser()
        try:
            path = given.resolve()
        except (RuntimeError, OSError):  # Python 3.11's loop error is a RuntimeError
            raise ValueError(f"{printable(given)} is a symlink loop, not a folder") from None
        if not path.exists():
            raise ValueError(f"folder does not exist: {printable(path)}")
        if not path.is_dir():
            raise ValueError(f"is not a folder: {printable(path)}")
        return value

    @field_validator("checkpoint")
    @classmethod
    def _check_checkpoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        provider = info.data.get("provider")
        problem = checkpoint_problem(value, provider)  # the stores' own rules
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Every entry as the node will take it (from_env values resolved): the node's rules
        for keys under the strategy, values and sizes (jobs/node_rules.py)."""
        cluster = info.data.get("cluster")
        strategy = cluster.strategy if isinstance(cluster, ClusterSpec) else None
        values: dict[str, str] = {}
        for key, value in env.items():
            text = value.resolved if isinstance(value, EnvVar) else value
            problem = env_key_problem(key, strategy) or env_entry_problem(key, text)
            if problem and isinstance(value, EnvVar) and value.from_env:
                problem = f"the value of ${value.from_env} (from_env) {problem}"
            if problem:
                ctx = {"key": key, "problem": problem}
                raise PydanticCustomError(ENV_ENTRY_ERROR, "{problem}", ctx)
            values[key] = text
        setup, entrypoint = info.data.get("setup"), info.data.get("entrypoint")
        if isinstance(setup, str) and isinstance(entrypoint, str):
            problem = spec_exec_problem(setup, entrypoint, values)
            if problem:
                raise ValueError(problem)
        return env

    def env_values(self) -> dict[str, str]:
        """Every env entry's value as the nodes get it (from_env values resolved). Pure.
        Contains secrets: only for cluster.json in the private run bucket."""
        return {
            key: value.resolved if isinstance(value, EnvVar) else value
            for key, value in self.env.items()
        }

    def secret_names(self) -> list[str]:
        """The env names marked `secret: true`, sorted. Pure; safe to show."""
        return sorted(k for k, v in self.env.items() if isinstance(v, EnvVar) and v.secret)

    def secret_values(self) -> list[str]:
        """The resolved values of the secret env entries, non-empty and without repeats, for
        redaction (`cloudtrain.core.redact.Redactor`). Pure."""
        values = (self.env[name] for name in self.secret_names())
        return list(
            dict.fromkeys(v.resolved for v in values if isinstance(v, EnvVar) and v.resolved)
        )

    def where(self, *loc: str) -> str | None:
        """`FILE:LINE` of the field at `loc` (e.g. 'cluster', 'spot') when the spec file sets
        it, else None. Pure."""
        return f"{self._filename}:{self._lines[loc]}" if loc in self._lines else None

    @property
    def source_path(self) -> Path | None:
        """The spec file this was loaded from (absolute), or None when loaded from text."""
        return self._source_path

    @property
    def source_dir(self) -> Path:
        """The folder relative paths are resolved against: the spec file's, else the cwd."""
        return self._source_dir

    def workdir_path(self) -> Path:
        """The workdir as a resolved absolute path."""
        return (self._source_dir / Path(self.workdir).expanduser()).resolve()

    def with_overrides(
        self, provider: str | None = None, region: str | None = None, zone: str | None = None
    ) -> JobSpec:
        """A validated copy with the given values replaced (None keeps the spec's value).

        Changing the provider also clears region and zone, and changing the region clears the
        zone, unless they are given too: a region of one cloud means nothing to another (and
        provider 'cheapest' takes none). Raises SpecError naming the field."""
        current = {"provider": self.provider, "region": self.region}
        updates = _override_updates(current, provider, region, zone)
        if not updates:
            return self.model_copy(deep=True)
        data = self.model_dump() | updates
        data[SECTION] = self.providers.model_dump(exclude_unset=True)  # what job.yaml set only
        given = {"provider": provider, "region": region, "zone": zone}
        overridden = frozenset(k for k, v in given.items() if v is not None)
        spec = _validate(data, self._filename, self._lines, {}, self._source_dir, overridden)
        spec._source_path = self._source_path
        return spec


def json_schema() -> dict[str, Any]:
    """The JSON Schema of JobSpec (what `cloudtrain schema` prints)."""
    return JobSpec.model_json_schema()


def load_spec(
    path: str | Path,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
) -> JobSpec:
    """Read and validate a YAML spec file, with the command line's provider, region and zone
    (None: the file's) in effect from the start, so every rule that depends on the provider
    judges the provider the run will use. Raises SpecError (`FILE:LINE: FIELD: problem`); an
    env entry's `from_env` variable missing from this process's environment is one too."""
    file = Path(path)
    spec = load_spec_text(
        read_spec_file(file),
        filename=printable(path),
        base_dir=file.absolute().parent,
        provider=provider,
        region=region,
        zone=zone,
    )
    spec._source_path = file.absolute()
    return spec


def load_spec_text(
    text: str,
    filename: str = "<string>",
    base_dir: Path | None = None,
    provider: str | None = None,
    region: str | None = None,
    zone: str | None = None,
) -> JobSpec:
    """Validate a YAML spec given as text; relative paths resolve against `base_dir` (or the cwd).
    `provider`, `region` and `zone` override the text's, as `JobSpec.with_overrides` does.

    `filename` is only used in error messages. Raises SpecError."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"{filename}: too large (a spec may be at most 1 MiB)")
    data, lines, written = parse_yaml(text, filename)
    base = Path(base_dir or Path.cwd()).absolute()
    updates = _override_updates(data, provider, region, zone)
    given = {"provider": provider, "region": region, "zone": zone}
    overridden = frozenset(k for k, v in given.items() if v is not None and k in updates)
    return _validate({**data, **updates}, filename, lines, written, base, overridden)


def _override_updates(
    current: Mapping[str, Any], provider: str | None, region: str | None, zone: str | None
) -> dict[str, Any]:
    """The fields to replace for the given overrides (None keeps the current value): a new
    provider clears region and zone, a new region clears the zone, unless they are given too.
    Pure."""
    updates: dict[str, Any] = {}
    if provider is not None and provider != current.get("provider", DEFAULT_PROVIDER):
        updates.update(provider=provider, region=None, zone=None)
    if region is not None and region != updates.get("region", current.get("region")):
        updates.update(region=region, zone=None)
    if zone is not None:
        updates["zone"] = zone
    return updates


def _validate(
    data: Any,
    filename: str,
    lines: Mapping[Loc, int],
    written: Mapping[Loc, str],
    base_dir: Path,
    overridden: frozenset[str],
) -> JobSpec:
    try:
        spec = JobSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise spec_error(exc, filename, lines, written, overridden, _model_at) from exc
    spec._source_dir = base_dir
    spec._filename = filename
    spec._lines = dict(lines)
    check_aliases(spec, filename, lines)
    check_tpu(spec, filename)
    return spec


def _model_at(loc: Loc) -> type[BaseModel]:
    """The model that holds the field at the end of `loc`."""
    if len(loc) > 2 and loc[0] == "env":
        return EnvVar
    if len(loc) > 1 and loc[0] == SECTION:
        return model_at_section(loc)
    return ClusterSpec if len(loc) > 1 and loc[0] == "cluster" else JobSpec
