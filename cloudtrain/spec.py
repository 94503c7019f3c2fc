"""The job spec: pydantic models and one-line `FILE:LINE: FIELD: problem` errors.

Imports only the stdlib, pydantic and PyYAML, so `cloudtrain validate` stays fast. The safe YAML
loader (no anchors/aliases, plain tags only, no duplicate keys, at most 1 MiB, the line of every
key) is `cloudtrain.spec_yaml`; every error names the line the user must edit.

`env` values are plain strings or `{from_env: NAME | value: TEXT, secret: BOOL}` (`EnvVar`): a
`from_env` value is read from this process's environment when the spec is validated (a missing
variable is a SpecError), so a secret need not be written in job.yaml. `JobSpec.env_values()` is
what the nodes get (through cluster.json only); `secret_values()` is what must be redacted. No
repr, dump or error message of a spec shows an `EnvVar`'s value.
"""

from __future__ import annotations

import difflib
import os
import re
import urllib.parse
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SecretStr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from cloudtrain.errors import SpecError
from cloudtrain.spec_yaml import (
    MAX_DEPTH,
    MAX_SPEC_BYTES,
    Loc,
    one_line,
    parse_yaml,
    path_text,
    read_spec_file,
    show,
)

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
SINGLE_NODE_STRATEGIES = ("one_device", "mirrored")
ROLES = ("chief", "worker", "ps", "evaluator")
PROVIDER_SCHEMES: dict[str, str] = {"local": "file", "aws": "s3", "gcp": "gs", "azure": "az"}

Strategy = Literal["one_device", "mirrored", "multi_worker_mirrored", "parameter_server", "horovod"]
ProviderName = Literal["local", "aws", "gcp", "azure", "cheapest"]

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,29}$")
_ACCELERATOR_RE = re.compile(r"^(?P<name>[A-Za-z0-9-]+)(?::(?P<count>[0-9]+))?$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACE = r"^[A-Za-z0-9-]{1,64}$"  # a region or zone name
_PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")  # a GCP project id
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_URI_RE = re.compile(r"^(?P<scheme>[a-z0-9]+)://(?P<rest>.+)$")


def _check_env_key(key: str) -> str:
    if not _ENV_KEY_RE.match(key):
        raise ValueError("is not a valid environment variable name (letters, digits and '_')")
    if key == "TF_CONFIG" or key.startswith("CLOUDTRAIN_"):
        raise ValueError("is reserved: cloudtrain sets TF_CONFIG and CLOUDTRAIN_* itself")
    return key


def _count_problem(strategy: str, field: str, value: int | None) -> str | None:
    """What is wrong with a role count (chief, workers, ps, evaluator) for the strategy, if any."""
    single, ps = strategy in SINGLE_NODE_STRATEGIES, strategy == "parameter_server"
    hvd = strategy == "horovod"  # workers only: worker 0 hosts the rendezvous
    if field == "chief" and hvd and value:
        return "must be 0 or unset for strategy 'horovod' (worker 0 is the rendezvous host)"
    if field == "evaluator" and hvd and value:
        return "must be 0 for strategy 'horovod' (it has no evaluator node)"
    if field == "chief" and ps and value == 0:
        return "must be 1 or unset for strategy 'parameter_server' (it always has a chief)"
    if field == "chief" and single and value:
        return f"must be 0 or unset for strategy {strategy!r} (its single node is the chief)"
    if field == "workers" and single and value != 1:
        return f"must be 1 for strategy {strategy!r} (got {value}; use multi_worker_mirrored)"
    if field == "ps" and ps and (value or 0) < 1:
        return f"strategy 'parameter_server' needs at least 1 (got {value})"
    if field == "ps" and not ps and value:
        return f"must be 0 for strategy {strategy!r} (only parameter_server uses ps nodes)"
    if field == "evaluator" and single and value:
        return f"must be 0 for strategy {strategy!r}, a single node without an evaluator"
    return None


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


# the tags appear in pydantic error locations; `_spec_error` drops them (see _ENV_TAGS)
EnvValue = Annotated[
    Annotated[str, Tag("text")] | Annotated[EnvVar, Tag("ref")], Discriminator(_env_kind)
]
_ENV_TAGS = frozenset({"text", "ref"})


class ClusterSpec(BaseModel):
    """The nodes of the job: the distribution strategy, role counts and the machine to use."""

    model_config = ConfigDict(extra="forbid", strict=True)

    strategy: Strategy = Field(
        "multi_worker_mirrored", description="tf.distribute strategy, or horovod (workers only)"
    )
    chief: int | None = Field(None, ge=0, le=1, validate_default=True, description="0 or 1")
    workers: int = Field(1, ge=1, description="worker nodes (exactly 1 for single-node strategies)")
    ps: int = Field(0, ge=0, validate_default=True, description="parameter servers")
    evaluator: int = Field(0, ge=0, le=1, description="0 or 1 side-car evaluator node")
    accelerator: str | None = Field(None, description="GPU per node: 'V100' or 'V100:2'")
    instance_type: str | None = Field(None, min_length=1, description="force a machine type")
    spot: bool = Field(False, description="use spot/preemptible capacity")
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
            return 1 if strategy == "parameter_server" else (value or 0)
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

    @model_validator(mode="after")
    def _check_total(self) -> ClusterSpec:
        total = self.total_nodes()
        if total > MAX_NODES:
            parts = ", ".join(f"{n} {role}" for role, n in self.roles().items())
            raise ValueError(f"at most {MAX_NODES} nodes in total (got {total}: {parts})")
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

    def roles(self) -> dict[str, int]:
        """Node count per role, in the order chief, worker, ps, evaluator; only counts > 0."""
        if self.strategy in SINGLE_NODE_STRATEGIES:
            return {"chief": 1}
        chief = 1 if self.strategy == "parameter_server" else (self.chief or 0)
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
        "local", description="where to run; 'cheapest': the cheapest of aws, gcp and azure"
    )
    region: str | None = Field(None, pattern=_PLACE, description="default: the cheapest")
    zone: str | None = Field(None, pattern=_PLACE, description="a zone of the region")
    project: str | None = Field(
        None,
        description="Google Cloud project id (gcp only; default: $GOOGLE_CLOUD_PROJECT or the"
        " gcloud project)",
    )
    subscription: str | None = Field(
        None,
        description="Azure subscription id (azure only; default: $AZURE_SUBSCRIPTION_ID)",
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

    @field_validator("name", "entrypoint")
    @classmethod
    def _check_text(cls, value: str, info: ValidationInfo) -> str:
        if info.field_name == "entrypoint" and not value.strip():
            raise ValueError("must not be empty")
        if info.field_name == "name" and (not _NAME_RE.match(value) or value.endswith("-")):
            raise ValueError(
                "must be 1-30 lowercase letters, digits or '-', start with a letter and"
                f" not end with '-' (got {show(value)})"
            )
        return value

    @field_validator("project")
    @classmethod
    def _check_project(cls, value: str | None) -> str | None:
        if value is not None and not _PROJECT_RE.match(value):
            raise ValueError(
                "must be a Google Cloud project id: 6-30 lowercase letters, digits or '-',"
                f" starting with a letter (got {show(value)})"
            )
        return value

    @field_validator("subscription")
    @classmethod
    def _check_subscription(cls, value: str | None) -> str | None:
        if value is not None and not _UUID_RE.match(value):
            raise ValueError(f"must be an Azure subscription id, a GUID (got {show(value)})")
        return value

    @field_validator("region", "zone")
    @classmethod
    def _check_place(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("provider") == "cheapest":
            field = info.field_name
            raise ValueError(
                f"cannot be set with provider 'cheapest' (got {show(value)}): a {field} belongs"
                f" to one cloud; remove {field}, or set provider to aws, gcp or azure"
            )
        return value

    @property
    def account(self) -> str | None:
        """The cloud account of the spec's provider: the GCP project or the Azure
        subscription (None: the SDK's default, and always None for local, aws and cheapest;
        with cheapest, use `account_for(plan.provider)` once the plan has chosen the cloud)."""
        return self.account_for(self.provider)

    def account_for(self, provider: str) -> str | None:
        """The account to use on `provider` (a real cloud, e.g. the provider a plan chose): the
        spec's GCP project for gcp, its Azure subscription for azure, else None (the SDK's
        default). Pure."""
        return {"gcp": self.project, "azure": self.subscription}.get(provider)

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, value: str, info: ValidationInfo) -> str:
        base = (info.context or {}).get("base_dir") or Path.cwd()
        path = (Path(base) / Path(value).expanduser()).resolve()
        if not path.exists():
            raise ValueError(f"folder does not exist: {path}")
        if not path.is_dir():
            raise ValueError(f"is not a folder: {path}")
        return value

    @field_validator("checkpoint")
    @classmethod
    def _check_checkpoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        m, got = _URI_RE.match(value or ""), show(value)
        if value is not None and (not m or m["scheme"] not in PROVIDER_SCHEMES.values()):
            raise ValueError(f"must be a file://, s3://, gs:// or az:// URI (got {got})")
        if m and ".." in urllib.parse.unquote(m["rest"]).split("/"):
            raise ValueError(f"must not contain '..' path segments (got {got})")
        provider = info.data.get("provider")
        if value is not None and provider == "cheapest":
            raise ValueError(
                f"cannot be set with provider 'cheapest' (got {got}): a checkpoint URI belongs"
                " to one cloud; remove it (the chosen cloud's run bucket is used), or set"
                " provider to aws, gcp or azure"
            )
        scheme = PROVIDER_SCHEMES.get(provider or "local")
        if m and provider not in (None, "local") and m["scheme"] != scheme:
            raise ValueError(
                f"provider {provider!r} keeps checkpoints at {scheme}:// URIs (got {got})"
            )
        return value

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
        redaction (`cloudtrain.redact.Redactor`). Pure."""
        values = (self.env[name] for name in self.secret_names())
        return list(
            dict.fromkeys(v.resolved for v in values if isinstance(v, EnvVar) and v.resolved)
        )

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
        updates: dict[str, Any] = {}
        if provider is not None and provider != self.provider:
            updates.update(provider=provider, region=None, zone=None)
        if region is not None and region != updates.get("region", self.region):
            updates.update(region=region, zone=None)
        if zone is not None:
            updates["zone"] = zone
        if not updates:
            return self.model_copy(deep=True)
        data = self.model_dump() | updates
        given = {"provider": provider, "region": region, "zone": zone}
        overridden = frozenset(k for k, v in given.items() if v is not None)
        spec = _validate(data, self._filename, self._lines, self._source_dir, overridden)
        spec._source_path = self._source_path
        return spec


def json_schema() -> dict[str, Any]:
    """The JSON Schema of JobSpec (what `cloudtrain schema` prints)."""
    return JobSpec.model_json_schema()


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML spec file. Raises SpecError (`FILE:LINE: FIELD: problem`); an
    env entry's `from_env` variable missing from this process's environment is one too."""
    file = Path(path)
    spec = load_spec_text(read_spec_file(file), filename=str(path), base_dir=file.absolute().parent)
    spec._source_path = file.absolute()
    return spec


def load_spec_text(text: str, filename: str = "<string>", base_dir: Path | None = None) -> JobSpec:
    """Validate a YAML spec given as text; relative paths resolve against `base_dir` (or the cwd).

    `filename` is only used in error messages. Raises SpecError."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"{filename}: too large (a spec may be at most 1 MiB)")
    data, lines = parse_yaml(text, filename)
    return _validate(data, filename, lines, Path(base_dir or Path.cwd()).absolute(), frozenset())


def _validate(
    data: Any, filename: str, lines: Mapping[Loc, int], base_dir: Path, overridden: frozenset[str]
) -> JobSpec:
    try:
        spec = JobSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise _spec_error(exc, filename, lines, overridden) from exc
    spec._source_dir = base_dir
    spec._filename = filename
    spec._lines = dict(lines)
    return spec


# --- pydantic errors -> one line -------------------------------------------------------------


def _spec_error(
    exc: ValidationError, filename: str, lines: Mapping[Loc, int], overridden: frozenset[str]
) -> SpecError:
    """The first error by line as `FILE:LINE: PATH: problem`, plus how many more and where."""
    found: list[tuple[int, str, str]] = []  # (line, or 0 when there is none; path; problem)
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p != "[key]")
        if len(loc) >= 3 and loc[0] == "env" and loc[2] in _ENV_TAGS:
            loc = loc[:2] + loc[3:]  # env.KEY.ref.from_env -> env.KEY.from_env
        from_file = bool(lines) and not (loc and loc[0] in overridden)  # else: no line to show
        line = _line_of(loc, lines) if from_file else 0
        found.append((line, path_text(loc), _describe(err, loc)))
    found.sort(key=lambda f: f[0])
    line, path, problem = found[0]
    text = f"{filename}:{line}" if line else filename
    text += f": {path}: {problem}" if path else f": {problem}"
    rest = list(dict.fromkeys(p or "spec" for _, p, _ in found[1:]))
    if rest:
        text += f" (+{len(rest)} more: {', '.join(rest)})"
    return SpecError(text)


def _line_of(loc: Loc, lines: Mapping[Loc, int]) -> int:
    """The line of the deepest key of `loc` that the file has (a missing key: its parent's)."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1  # a top-level field: the document


def _model_at(loc: Loc) -> type[BaseModel]:
    """The model that holds the field at the end of `loc`."""
    if len(loc) > 2 and loc[0] == "env":
        return EnvVar
    return ClusterSpec if len(loc) > 1 and loc[0] == "cluster" else JobSpec


_TEMPLATES = {  # pydantic error type -> plain words
    "int_type": "must be a whole number (got {got})",
    "float_type": "must be a number (got {got})",
    "bool_type": "must be true or false (got {got})",
    "dict_type": "must be a mapping (got {got})",
    "model_type": "must be a mapping (got {got})",
    "model_attributes_type": "must be a mapping (got {got})",
    "finite_number": "must be a finite number (got {got})",
    "string_too_short": "must not be empty",
    "string_pattern_mismatch": "must be letters, digits and '-' only (got {got})",
    "greater_than_equal": "must be at least {ge} (got {got})",
    "less_than_equal": "must be at most {le} (got {got})",
    "greater_than": "must be more than {gt} (got {got})",
    "less_than": "must be less than {lt} (got {got})",
}


def _describe(err: ErrorDetails, loc: Loc) -> str:
    """The error in plain words, with the offending value."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    got = show(value)
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return _unknown_field(loc)
    if kind == "value_error":
        return one_line(str(ctx.get("error", err["msg"])))
    template = _TEMPLATES.get(kind)
    if template:
        nums = {k: f"{v:g}" for k, v in ctx.items() if isinstance(v, int | float)}
        return template.format(got=got, **nums)
    if kind == "string_type" and len(loc) == 2 and loc[0] == "env" and isinstance(value, list):
        return "must be a string, or a mapping like {from_env: NAME, secret: true} (got a list)"
    if kind == "string_type":
        quote = "; quote it" if isinstance(value, int | float | date) else ""
        return f"must be a string (got {got}){quote}"
    if kind == "literal_error":
        field = _model_at(loc).model_fields.get(str(loc[-1]))
        allowed = get_args(field.annotation) if field else (ctx.get("expected", ""),)
        return f"must be one of: {', '.join(map(str, allowed))} (got {got})"
    msg = one_line(err["msg"])
    return msg[:1].lower() + msg[1:]


def _unknown_field(loc: Loc) -> str:
    model, key = _model_at(loc), str(loc[-1])
    if model is JobSpec and key in ClusterSpec.model_fields:
        return f"unknown field; did you mean 'cluster.{key}'?"
    close = difflib.get_close_matches(key, list(model.model_fields), n=1)
    return f"unknown field; did you mean {close[0]!r}?" if close else "unknown field"
