"""The bad-input corpus's building blocks: the `Case` record and the writers that turn one bad
input into a scratch folder, an environment change and the CLI arguments
(tests/e2e/test_hostile_input.py holds the cases)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# every variable through which a cloud SDK or cloudtrain could reach a real or fake cloud
CLOUD_ENV_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCE_", "CLOUDSDK_", "CLOUDTRAIN_")
BASE: dict[str, Any] = {
    "name": "hostile",
    "cluster": {"strategy": "mirrored", "workers": 1},
    "entrypoint": "python train.py",
    "max_hours": 0.1,
}
GPU = {"strategy": "mirrored", "workers": 1, "accelerator": "T4:1"}
UNKNOWN_GPU = r"aws offers no Z9000 in the price catalog; nearest: \S+ \("
BUDGET_REFUSED = (
    r"estimated \$[\d.]+ for 10\.0 h exceeds max_cost_usd \$0\.05; that budget affords \d+ min"
)

Build = Callable[[Path, dict[str, str]], list[str]]


@dataclass(frozen=True)
class Case:
    """One bad input: `build` writes what it needs under a scratch folder, may change the CLI's
    environment, and returns the CLI arguments; `expect` is a regex the error line must match."""

    id: str
    build: Build
    expect: str
    marks: tuple[Any, ...] = field(default=())
    home_untouched: bool = False  # the ledger is the input (corrupt): only check it is unchanged


# --- input writers ----------------------------------------------------------------------------


def write_text(d: Path, text: str | bytes, name: str = "job.yaml") -> Path:
    path = d / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def write_spec(d: Path, cluster: dict[str, Any] | None = None, **fields: Any) -> Path:
    """BASE with `cluster` merged into its cluster and `fields` replacing top-level fields."""
    spec: dict[str, Any] = {**BASE, "cluster": {**BASE["cluster"], **(cluster or {})}}
    spec.update(fields)
    return write_text(d, yaml.safe_dump(spec, sort_keys=False))


def run_text(text: str | bytes) -> Build:
    return lambda d, env: ["run", "--quiet", str(write_text(d, text))]


def plan_spec(*args: str, cluster: dict[str, Any] | None = None, **fields: Any) -> Build:
    return lambda d, env: ["plan", *args, str(write_spec(d, cluster, **fields))]


def run_spec(*args: str, cluster: dict[str, Any] | None = None, **fields: Any) -> Build:
    return lambda d, env: ["run", "--quiet", *args, str(write_spec(d, cluster, **fields))]


def cli(*args: str) -> Build:
    return lambda d, env: list(args)


def billion_laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "name: hostile\nentrypoint: python train.py\n" + "\n".join(lines) + "\n"


def nested_block(depth: int) -> str:
    """`env:` holding a mapping `depth` levels deep, in block style."""
    body = "".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(depth))
    return f"name: hostile\nentrypoint: x\nenv:\n{body}{'  ' * (depth + 1)}leaf: 1\n"


def workdir_with(link: Callable[[Path], None]) -> Build:
    """`run` a spec whose workdir (the spec's folder) holds what `link` puts there."""

    def build(d: Path, env: dict[str, str]) -> list[str]:
        link(d)
        return ["run", "--quiet", str(write_spec(d))]

    return build


def outside_file(d: Path) -> None:
    secret = d.parent / "secret.txt"
    secret.write_text("not yours\n")
    (d / "secret.txt").symlink_to(secret)


def homefile(args: list[str]) -> Build:
    def build(d: Path, env: dict[str, str]) -> list[str]:
        home = write_text(d, "i am a file, not a folder\n", "home")
        env["CLOUDTRAIN_HOME"] = str(home)
        return [*args, str(write_spec(d))] if args[0] in ("run", "plan") else args

    return build


def corrupt_ledger(args: list[str]) -> Build:
    def build(d: Path, env: dict[str, str]) -> list[str]:
        (Path(env["CLOUDTRAIN_HOME"]) / "ledger.db").write_bytes(b"\x00garbage" * 512)
        return [*args, str(write_spec(d))] if args[0] == "run" else args

    return build


def with_env(build: Build, **values: str) -> Build:
    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        env.update(values)
        return build(d, env)

    return wrapped


def no_aws_credentials(build: Build) -> Build:
    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(write_text(d, "", "aws-credentials"))
        env["AWS_CONFIG_FILE"] = str(write_text(d, "", "aws-config"))
        env["AWS_EC2_METADATA_DISABLED"] = "true"
        return build(d, env)

    return wrapped


def no_gcp_credentials(build: Build) -> Build:
    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        (d / "gcloud").mkdir()
        env["CLOUDSDK_CONFIG"] = str(d / "gcloud")
        env["GOOGLE_APPLICATION_CREDENTIALS"] = str(d / "missing-key.json")
        return build(d, env)

    return wrapped


def shadow(files: dict[str, str], build: Build) -> Build:
    """Put `files` (relative path -> source) first on PYTHONPATH, to fake a missing SDK."""

    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        for rel, source in files.items():
            path = d / "shadow" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(d / "shadow"), env.get("PYTHONPATH")])
        )
        return build(d, env)

    return wrapped
