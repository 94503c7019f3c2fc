"""Hostile and bad input through the real CLI: bad specs, bad invocations, a broken environment.

Every case runs `cloudtrain` in a subprocess and must end with exactly one stderr line
`error: ...` (a hint is part of that line, in parentheses: see `cli.main`), a non-zero exit, no
traceback anywhere, and nothing created: no run in the ledger, no local bucket, no node process.
Spec-level cases go through `plan` (fast); a representative subset goes through `run`, which must
refuse before the ledger has a run. Typer's own usage errors (unknown command or option) have
click's shape and are checked separately.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Env

pytestmark = pytest.mark.e2e

# every variable through which a cloud SDK or cloudtrain could reach a real or fake cloud
_CLOUD_ENV_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCE_", "CLOUDSDK_", "CLOUDTRAIN_")
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


def plan_text(text: str | bytes) -> Build:
    return lambda d, env: ["plan", str(write_text(d, text))]


def plan_spec(*args: str, cluster: dict[str, Any] | None = None, **fields: Any) -> Build:
    return lambda d, env: ["plan", *args, str(write_spec(d, cluster, **fields))]


def run_spec(*args: str, cluster: dict[str, Any] | None = None, **fields: Any) -> Build:
    return lambda d, env: ["run", "--quiet", *args, str(write_spec(d, cluster, **fields))]


def cli(*args: str) -> Build:
    return lambda d, env: list(args)


def _billion_laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "name: hostile\nentrypoint: python train.py\n" + "\n".join(lines) + "\n"


def _nested_block(depth: int) -> str:
    """`env:` holding a mapping `depth` levels deep, in block style."""
    body = "".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(depth))
    return f"name: hostile\nentrypoint: x\nenv:\n{body}{'  ' * (depth + 1)}leaf: 1\n"


def _workdir_with(link: Callable[[Path], None]) -> Build:
    """`run` a spec whose workdir (the spec's folder) holds what `link` puts there."""

    def build(d: Path, env: dict[str, str]) -> list[str]:
        link(d)
        return ["run", "--quiet", str(write_spec(d))]

    return build


def _outside_file(d: Path) -> None:
    secret = d.parent / "secret.txt"
    secret.write_text("not yours\n")
    (d / "secret.txt").symlink_to(secret)


def _homefile(args: list[str]) -> Build:
    def build(d: Path, env: dict[str, str]) -> list[str]:
        home = write_text(d, "i am a file, not a folder\n", "home")
        env["CLOUDTRAIN_HOME"] = str(home)
        return [*args, str(write_spec(d))] if args[0] in ("run", "plan") else args

    return build


def _corrupt_ledger(args: list[str]) -> Build:
    def build(d: Path, env: dict[str, str]) -> list[str]:
        (Path(env["CLOUDTRAIN_HOME"]) / "ledger.db").write_bytes(b"\x00garbage" * 512)
        return [*args, str(write_spec(d))] if args[0] == "run" else args

    return build


def _with_env(build: Build, **values: str) -> Build:
    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        env.update(values)
        return build(d, env)

    return wrapped


def _no_aws_credentials(build: Build) -> Build:
    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(write_text(d, "", "aws-credentials"))
        env["AWS_CONFIG_FILE"] = str(write_text(d, "", "aws-config"))
        env["AWS_EC2_METADATA_DISABLED"] = "true"
        return build(d, env)

    return wrapped


def _no_gcp_credentials(build: Build) -> Build:
    def wrapped(d: Path, env: dict[str, str]) -> list[str]:
        (d / "gcloud").mkdir()
        env["CLOUDSDK_CONFIG"] = str(d / "gcloud")
        env["GOOGLE_APPLICATION_CREDENTIALS"] = str(d / "missing-key.json")
        return build(d, env)

    return wrapped


def _shadow(files: dict[str, str], build: Build) -> Build:
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


# --- the corpus -------------------------------------------------------------------------------

SPEC_FILE_CASES = [
    Case("spec-missing", lambda d, env: ["plan", str(d / "nope.yaml")], r"no such file"),
    Case("spec-is-a-folder", lambda d, env: ["plan", str(d)], r"is a folder, not a spec file"),
    Case("spec-is-dev-null", cli("plan", "/dev/null"), r"is a special file"),
    Case("spec-is-etc-passwd", cli("plan", "/etc/passwd"), r"^error: /etc/passwd:1: "),
    Case("spec-empty", plan_text(""), r"the spec is empty"),
    Case("spec-only-comments", plan_text("# nothing\n\n# here\n"), r"the spec is empty"),
    Case(
        "spec-binary-garbage",
        plan_text(bytes(range(256)) * 8),
        r"job\.yaml:\d+: the spec is not UTF-8 text",
    ),
    Case("spec-nul-byte", plan_text("name: hos\x00tile\n"), r"job\.yaml:1: invalid YAML"),
    Case(
        "spec-top-level-list",
        plan_text("- name: hostile\n"),
        r"the spec must be a mapping of fields \(got a list\)",
    ),
    Case(
        "spec-top-level-scalar",
        plan_text("just some words\n"),
        r"must be a mapping of fields \(got 'just some words'\)",
    ),
    Case("spec-unclosed-quote", plan_text('name: "hostile\n'), r"invalid YAML"),
    Case("spec-tab-indent", plan_text("cluster:\n\tworkers: 2\n"), r"job\.yaml:2: invalid YAML"),
    Case(
        "spec-over-1mib",
        plan_text("name: hostile\nentrypoint: echo " + "x" * (1024 * 1024) + "\n"),
        r"too large \(a spec may be at most 1 MiB\)",
    ),
    Case(
        "yaml-billion-laughs",
        plan_text(_billion_laughs()),
        r"job\.yaml:3: YAML anchors and aliases are not allowed",
    ),
    Case(
        "yaml-merge-alias",
        plan_text("base: &b {workers: 2}\ncluster:\n  <<: *b\n"),
        r"anchors and aliases are not allowed",
    ),
    Case(
        "yaml-deep-flow-nesting",
        plan_text("name: hostile\nentrypoint: x\nenv: " + "[" * 50_000 + "]" * 50_000 + "\n"),
        r"nested too deeply",
    ),
    Case(
        "yaml-deep-block-nesting", plan_text(_nested_block(40)), r"env\.k0\.k1.*nested too deeply"
    ),
    Case(
        "yaml-python-tag",
        plan_text('name: !!python/object/apply:os.system ["touch /tmp/pwned"]\n'),
        r"job\.yaml:1: name: YAML tag '!!python/object/apply:os.system' is not allowed",
    ),
    Case(
        "yaml-duplicate-key",
        plan_text("name: a\nentrypoint: x\nname: b\n"),
        r"job\.yaml:3: name: duplicate key \(first at line 1\)",
    ),
    Case(
        "yaml-complex-key",
        plan_text("? [a, b]\n: 1\nname: hostile\n"),
        r"keys must be plain names",
    ),
]

FIELD_CASES = [
    Case("unknown-field", plan_spec(colour="blue"), r"colour: unknown field"),
    Case(
        "unknown-cluster-field",
        plan_spec(cluster={"wokers": 2}),
        r"cluster\.wokers: unknown field; did you mean 'workers'\?",
    ),
    Case(
        "cluster-field-at-top",
        plan_spec(workers=2),
        r"workers: unknown field; did you mean 'cluster\.workers'\?",
    ),
    Case(
        "workers-string",
        plan_spec(cluster={"strategy": "multi_worker_mirrored", "workers": "two"}),
        r"cluster\.workers: must be a whole number \(got 'two'\)",
    ),
    Case(
        "workers-float",
        plan_spec(cluster={"strategy": "multi_worker_mirrored", "workers": 2.5}),
        r"cluster\.workers: must be a whole number \(got 2\.5\)",
    ),
    Case("max-hours-string", plan_spec(max_hours="1h"), r"max_hours: must be a number"),
    Case("spot-string", plan_spec(cluster={"spot": "maybe"}), r"cluster\.spot: must be true or"),
    Case(
        "cluster-string",
        plan_text("name: hostile\nentrypoint: x\ncluster: big\n"),
        r"job\.yaml:3: cluster: must be a mapping \(got 'big'\)",
    ),
    Case("env-list", plan_spec(env=["A=1"]), r"env: must be a mapping"),
    Case("env-value-int", plan_spec(env={"SEED": 42}), r"env\.SEED: must be a string"),
    Case(
        "workers-negative",
        plan_spec(cluster={"strategy": "multi_worker_mirrored", "workers": -1}),
        r"cluster\.workers: must be at least 1 \(got -1\)",
    ),
    Case("disk-negative", plan_spec(cluster={"disk_gb": -100}), r"disk_gb: must be at least 10"),
    Case("restarts-negative", plan_spec(max_restarts=-3), r"max_restarts: must be at least 0"),
    Case(
        "accelerator-negative-count",
        plan_spec(cluster={"accelerator": "T4:-1"}),
        r"cluster\.accelerator: must look like 'V100' or 'V100:2'",
    ),
    Case(
        "accelerator-zero-count",
        plan_spec(cluster={"accelerator": "T4:0"}),
        r"cluster\.accelerator: count must be 1 to 16",
    ),
    Case(
        "accelerator-unknown-gpu",
        plan_spec("--provider", "aws", cluster={"accelerator": "Z9000:1"}),
        UNKNOWN_GPU,
    ),
    Case(
        "workers-huge",
        plan_spec(cluster={"strategy": "multi_worker_mirrored", "workers": 100_000}),
        r"cluster: at most 64 nodes in total \(got 100000",
    ),
    Case(
        "workers-astronomical",
        plan_text(
            "name: hostile\nentrypoint: x\ncluster:\n  strategy: multi_worker_mirrored\n"
            "  workers: " + "9" * 5000 + "\n"  # past Python's 4300-digit int parsing limit
        ),
        r"job\.yaml:5: cluster\.workers: cannot read '9999.*\.\.\.' as a value",
    ),
    Case("max-hours-inf", plan_spec(max_hours=float("inf")), r"max_hours: must be at most 168"),
    Case("budget-nan", plan_spec(max_cost_usd=float("nan")), r"max_cost_usd: must be a finite"),
    Case("budget-zero", plan_spec(max_cost_usd=0), r"max_cost_usd: must be more than 0"),
    Case(
        "budget-too-small",
        plan_spec("--provider", "aws", cluster=GPU, max_hours=10, max_cost_usd=0.05),
        BUDGET_REFUSED,
    ),
    Case("port-privileged", plan_spec(cluster={"port": 80}), r"cluster\.port: must be at least"),
    Case(
        "name-path-traversal",
        plan_spec(name="../../etc"),
        r"name: must be 1-30 lowercase letters.*\(got '\.\./\.\./etc'\)",
    ),
    Case("name-too-long", plan_spec(name="a" * 31), r"name: must be 1-30 lowercase letters"),
    Case("name-unicode", plan_spec(name="héllo"), r"name: must be 1-30 lowercase letters"),
    Case("name-shell", plan_spec(name="x;rm -rf ~"), r"name: must be 1-30 lowercase letters"),
    Case("entrypoint-missing", plan_text("name: hostile\n"), r"entrypoint: is required"),
    Case("entrypoint-blank", plan_spec(entrypoint="   "), r"entrypoint: must not be empty"),
    Case("entrypoint-null", plan_spec(entrypoint=None), r"entrypoint: must be a string"),
    Case("workdir-missing", plan_spec(workdir="no/such/dir"), r"workdir: folder does not exist"),
    Case("workdir-is-a-file", plan_spec(workdir="job.yaml"), r"workdir: is not a folder"),
    Case(
        "workdir-traversal-missing",
        plan_spec(workdir="../" * 40 + "no-such-folder-xyz"),
        r"workdir: folder does not exist: /no-such-folder-xyz",
    ),
    Case(
        "checkpoint-traversal",
        plan_spec(checkpoint="file:///../../etc"),
        r"checkpoint: must not contain '\.\.' path segments",
    ),
    Case(
        "checkpoint-traversal-encoded",
        plan_spec(checkpoint="file:///tmp/%2e%2e/etc"),
        r"checkpoint: must not contain '\.\.' path segments",
    ),
    Case(
        "checkpoint-http",
        plan_spec(checkpoint="http://example.com/x"),
        r"checkpoint: must be a file://, s3://, gs:// or az:// URI",
    ),
    Case(
        "checkpoint-wrong-cloud",
        plan_spec("--provider", "aws", checkpoint="gs://bucket/x"),
        r"checkpoint: provider 'aws' keeps checkpoints at s3:// URIs",
    ),
    Case("env-tf-config", plan_spec(env={"TF_CONFIG": "{}"}), r"env\.TF_CONFIG: is reserved"),
    Case(
        "env-cloudtrain-var",
        plan_spec(env={"CLOUDTRAIN_HOME": "/"}),
        r"env\.CLOUDTRAIN_HOME: is reserved",
    ),
    Case(
        "env-bad-key",
        plan_spec(env={"BAD-KEY=1": "x"}),
        r"is not a valid environment variable name",
    ),
    Case("provider-unknown", plan_spec(provider="ibm"), r"provider: must be one of: local"),
    Case("provider-flag-unknown", plan_spec("--provider", "ibm"), r"provider: must be one of"),
    Case(
        "region-flag-injection",
        plan_spec("--provider", "aws", "--region", "us-east-1; rm -rf /"),
        r"region: must be letters, digits and '-' only",
    ),
    Case(
        "region-with-cheapest",
        plan_spec(provider="cheapest", region="us-east-1"),
        r"region: cannot be set with provider 'cheapest'",
    ),
    Case("strategy-unknown", plan_spec(cluster={"strategy": "magic"}), r"strategy: must be one"),
    Case(
        "mirrored-two-workers",
        plan_spec(cluster={"workers": 2}),
        r"cluster\.workers: must be 1 for strategy 'mirrored'",
    ),
    Case(
        "ps-without-ps",
        plan_spec(cluster={"strategy": "parameter_server", "workers": 2, "ps": 0}),
        r"cluster\.ps: strategy 'parameter_server' needs at least 1",
    ),
    Case(
        "gcp-project-bad",
        plan_spec(provider="gcp", project="Not A Project!"),
        r"project: must be a Google Cloud project id",
    ),
    Case(
        "azure-subscription-bad",
        plan_spec(provider="azure", subscription="my-sub"),
        r"subscription: must be an Azure subscription id",
    ),
]

RUN_CASES = [
    Case(
        "run-workdir-symlink-to-etc",
        _workdir_with(lambda d: (d / "etc").symlink_to("/etc")),
        r"workdir: etc is a symlink to /etc, outside the workdir",
    ),
    Case(
        "run-workdir-symlink-to-outside-file",
        _workdir_with(_outside_file),
        r"workdir: secret\.txt is a symlink to .*secret\.txt, outside the workdir",
    ),
    Case(
        "run-workdir-dangling-symlink",
        _workdir_with(lambda d: (d / "data.csv").symlink_to(d / "gone.csv")),
        r"workdir: data\.csv is not a regular file",
    ),
    Case(
        "run-workdir-fifo",
        _workdir_with(lambda d: os.mkfifo(d / "pipe")),
        r"workdir: pipe is not a regular file",
    ),
    Case(
        "run-json-bad-spec",
        run_spec("--json", cluster={"workers": "two"}),
        r"cluster\.workers: must be a whole number",
    ),
    Case("run-workdir-missing", run_spec(workdir="gone"), r"workdir: folder does not exist"),
    Case(
        "run-unknown-gpu",
        run_spec("--provider", "aws", cluster={"accelerator": "Z9000:1"}),
        UNKNOWN_GPU,
    ),
    Case(
        "run-budget-too-small",
        run_spec("--provider", "aws", cluster=GPU, max_hours=10, max_cost_usd=0.05),
        BUDGET_REFUSED,
    ),
    Case("run-env-tf-config", run_spec(env={"TF_CONFIG": "{}"}), r"env\.TF_CONFIG: is reserved"),
    Case(
        "run-workers-huge",
        run_spec(cluster={"strategy": "multi_worker_mirrored", "workers": 100_000}),
        r"at most 64 nodes",
    ),
    Case("run-provider-unknown", run_spec("--provider", "ibm"), r"provider: must be one of"),
    Case(
        "run-faults-not-json",
        _with_env(run_spec(), CLOUDTRAIN_FAULTS="{not json"),
        r"CLOUDTRAIN_FAULTS is not valid JSON",
    ),
    Case(
        "run-faults-not-object",
        _with_env(run_spec(), CLOUDTRAIN_FAULTS="[1, 2]"),
        r"CLOUDTRAIN_FAULTS must be a JSON object",
    ),
    Case(
        "run-faults-unknown-key",
        _with_env(run_spec(), CLOUDTRAIN_FAULTS='{"chaos": 11}'),
        r"CLOUDTRAIN_FAULTS has unknown keys \['chaos'\]",
    ),
    Case(
        "run-faults-bad-rate",
        _with_env(run_spec(), CLOUDTRAIN_FAULTS='{"error_rate": 7}'),
        r"error_rate must be between 0 and 1",
    ),
    Case(
        "run-home-is-a-file",
        _homefile(["run", "--quiet"]),
        r"cannot create the ledger folder .*home.*set CLOUDTRAIN_HOME to a writable folder",
    ),
    Case(
        "run-ledger-corrupt",
        _corrupt_ledger(["run", "--quiet"]),
        r"cannot use the ledger at .*ledger\.db",
        home_untouched=True,
    ),
    Case(
        "run-azure-no-subscription",
        run_spec("--provider", "azure", cluster=GPU),
        r"no Azure subscription for the azure provider",
    ),
    Case(
        "run-aws-no-credentials",
        _no_aws_credentials(run_spec("--provider", "aws", cluster=GPU)),
        r"no AWS credentials found",
    ),
    Case(
        "run-gcp-credentials-file-missing",
        _no_gcp_credentials(run_spec("--provider", "gcp", cluster=GPU)),
        r"no usable Google Cloud credentials: .*missing-key\.json was not found",
    ),
    Case(
        "run-gcp-sdk-missing",
        # a regular `google` package without `cloud` hides the installed namespace package
        _shadow({"google/__init__.py": ""}, run_spec("--provider", "gcp", cluster=GPU)),
        r"provider 'gcp' needs its SDK, which is not installed \(pip install 'cloudtrain\[gcp\]'",
    ),
    Case(
        "run-aws-sdk-missing",
        _shadow(
            {"sitecustomize.py": "import sys\nsys.modules['boto3'] = None\n"},
            run_spec("--provider", "aws", cluster=GPU),
        ),
        r"provider 'aws' needs its SDK, which is not installed \(pip install 'cloudtrain\[aws\]'",
    ),
    Case(
        "run-aws-sdk-broken",
        _shadow(
            {"boto3/__init__.py": "raise ImportError('boto3 is half installed')\n"},
            run_spec("--provider", "aws", cluster=GPU),
        ),
        r"provider 'aws' cannot load its SDK: boto3 is half installed",
    ),
]

INVOCATION_CASES = [
    Case("down-unknown-run", cli("down", "no-such-run-1a2b3c"), r"no run 'no-such-run-1a2b3c'"),
    Case("down-empty-run-id", cli("down", ""), r"no run ''"),
    Case("logs-unknown-run", cli("logs", "no-such-run"), r"no run 'no-such-run'"),
    Case("logs-traversal-run", cli("logs", "../../etc", "--node", "../x"), r"no run '\.\./\.\./"),
    Case("status-unknown-run", cli("status", "no-such-run"), r"no run 'no-such-run'"),
    Case("resume-unknown-run", cli("resume", "no-such-run"), r"no run 'no-such-run'"),
    Case("cost-unknown-run", cli("cost", "no-such-run"), r"no run 'no-such-run'"),
    Case(
        "down-unknown-provider",
        cli("down", "some-run-1a2b3c", "--provider", "ibm"),
        r"unknown provider 'ibm'",
    ),
    Case(
        "down-aws-no-region",
        _no_aws_credentials(cli("down", "some-run-1a2b3c", "--provider", "aws")),
        r"no AWS region",
    ),
    Case(
        "down-aws-no-credentials",
        _no_aws_credentials(
            cli("down", "some-run-1a2b3c", "--provider", "aws", "--region", "us-east-1")
        ),
        r"no AWS credentials found",
    ),
    Case("cost-since-bogus", cli("cost", "--since", "bogus"), r"--since 'bogus' is not a duration"),
    Case("cost-since-negative", cli("cost", "--since=-5d"), r"--since '-5d' is not a duration"),
    Case(
        "catalog-bad-accelerator",
        cli("catalog", "--accelerator", "V100:x"),
        r"bad accelerator request 'V100:x'",
    ),
    Case("catalog-unknown-provider", cli("catalog", "--provider", "ibm"), r"unknown provider"),
    Case(
        "catalog-refresh-local",
        cli("catalog", "refresh", "--provider", "local"),
        r"no price API for provider 'local'",
    ),
    Case("ls-home-is-a-file", _homefile(["ls"]), r"cannot create the ledger folder"),
    Case(
        "ls-ledger-corrupt",
        _corrupt_ledger(["ls"]),
        r"cannot use the ledger at .*ledger\.db",
        home_untouched=True,
    ),
]

CASES = SPEC_FILE_CASES + FIELD_CASES + RUN_CASES + INVOCATION_CASES


def _hermetic(ct: Env) -> dict[str, str]:
    """The fixture's environment without any route to a cloud (or to a cloud fake)."""
    env = {k: v for k, v in ct.env.items() if not k.startswith(_CLOUD_ENV_PREFIXES)}
    env.pop("STORAGE_EMULATOR_HOST", None)
    env["CLOUDTRAIN_HOME"] = str(ct.home)
    return env


def assert_nothing_created(ct: Env) -> None:
    """No run in the ledger (so no resource), no local bucket, no node process."""
    ledger = ct.ledger()
    runs = ledger.list_runs()
    assert runs == [], [(r.run_id, ledger.resources(r.run_id)) for r in runs]
    assert not (ct.home / "buckets").exists()
    assert not (ct.home / "local").exists()
    assert ct.live_processes() == []


def assert_one_error(proc: Any, expect: str) -> str:
    """The CLI's shape for a user error: exit non-zero, one `error:` line, no traceback."""
    out = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode != 0, out
    assert "Traceback" not in proc.stdout + proc.stderr, out
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("error: "), out
    assert re.search(expect, lines[0]), f"{expect!r} not in the error line\n{out}"
    return lines[0]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_refused_with_one_error_line(case: Case, ct: Env, tmp_path: Path) -> None:
    scratch = tmp_path / "in"
    scratch.mkdir()
    env = _hermetic(ct)
    args = case.build(scratch, env)
    ledger_file = ct.home / "ledger.db"
    before = ledger_file.read_bytes() if case.home_untouched else b""
    proc = Env(ct.home, env).cli(*args, timeout=60)
    assert_one_error(proc, case.expect)
    if case.home_untouched:
        assert ledger_file.read_bytes() == before
        assert ct.live_processes() == []
    else:
        assert_nothing_created(ct)


USAGE_ERRORS = [
    pytest.param(["frobnicate"], id="unknown-command"),
    pytest.param(["plan"], id="missing-argument"),
    pytest.param(["plan", "--frobnicate", "job.yaml"], id="unknown-option"),
    pytest.param(["ls", "--limit", "many"], id="option-not-a-number"),
    pytest.param(["cost", "--since"], id="option-without-value"),
    pytest.param(["catalog", "refresh"], id="missing-required-option"),
]


@pytest.mark.parametrize("args", USAGE_ERRORS)
def test_usage_errors_are_clicks_and_create_nothing(args: list[str], ct: Env) -> None:
    """Typer rejects these before cloudtrain runs: click's usage box (not one `error:` line),
    exit 2, no traceback, and nothing created."""
    proc = Env(ct.home, _hermetic(ct)).cli(*args, timeout=60)
    out = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 2, out
    assert "Traceback" not in proc.stdout + proc.stderr, out
    assert proc.stdout == "", out
    assert "Error" in proc.stderr, out
    assert_nothing_created(ct)
