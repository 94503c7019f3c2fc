"""The CLI as a user meets it: fast start, one-line errors with no traceback, nothing created on
bad input, and no TensorFlow or cloud SDK on the --help / plan / schema paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "jobs" / "examples"
HEAVY = (
    "tensorflow",
    "boto3",
    "botocore",
    "google.cloud",
    "azure",
    "tf_keras",
    "jinja2",
    "tensorboard",
    "matplotlib",
)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200")
    env.pop("CLOUDTRAIN_FAULTS", None)
    return subprocess.run(
        [sys.executable, "-m", "cloudtrain.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def heavy_modules(home: Path, *args: str, expect: str, of: tuple[str, ...] = HEAVY) -> list[str]:
    """Modules from HEAVY (or `of`) that running the CLI (`cloudtrain.cli.main.main`, as the console
    script does) with `args` imports. Asserts the command succeeded, exit 0 with `expect` in its
    output: a command that crashes early imports little, so its import list proves nothing."""
    report = home / "modules.json"
    code = (
        "import json, sys\n"
        "from cloudtrain.cli.main import main\n"
        f"sys.argv = ['cloudtrain', *{list(args)!r}]\n"
        "status = 0\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    status = exc.code or 0\n"
        f"with open({str(report)!r}, 'w') as f:\n"
        "    json.dump({'status': status, 'modules': sorted(sys.modules)}, f)\n"
        "sys.exit(status)\n"
    )
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CLOUDTRAIN_HOME=str(home), COLUMNS="200")
    env.pop("CLOUDTRAIN_FAULTS", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    out = f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, out
    assert expect in proc.stdout, f"{expect!r} not in the output\n{out}"
    result = json.loads(report.read_text())
    assert result["status"] == 0, out
    return [m for m in result["modules"] if m.startswith(of)]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--help",), "Usage: cloudtrain"),
        (
            ("plan", str(EXAMPLES / "digits-multiworker" / "job.yaml")),
            "plan for digits-multiworker on local",
        ),
        (("schema",), '"additionalProperties"'),
        (("tensorboard", "--help"), "Usage: cloudtrain tensorboard"),
        (("report", "--help"), "Usage: cloudtrain report"),
        (("scale", "--help"), "Usage: cloudtrain scale"),
    ],
)
def test_light_paths_import_no_tensorflow_or_cloud_sdk(
    tmp_path: Path, args: tuple[str], expect: str
) -> None:
    assert heavy_modules(tmp_path, *args, expect=expect) == []


def test_commands_of_other_modules_load_only_when_asked_for(tmp_path: Path) -> None:
    lazy = ("cloudtrain.cli.scale", "cloudtrain.cli.tensorboard", "cloudtrain.cli.report")
    lazy += ("cloudtrain.cli.catalog",)
    assert heavy_modules(tmp_path, "schema", expect='"additionalProperties"', of=lazy) == []
    listed = cli(tmp_path, "--help").stdout  # every command, with its own help line
    for line in (
        "status       The run's state from the ledger",
        "logs         Print the run's logs from its bucket",
        "scale        Run the job briefly at each worker count",
        "tensorboard  Serve the run's TensorBoard event files",
        "report       Write one run's report",
        "catalog      The price catalog; refresh it live.",
    ):
        assert line in listed, listed
    assert listed.index("  schema ") < listed.index("  catalog ")  # a group, after the commands


def test_plan_prints_the_price_and_creates_nothing(tmp_path: Path) -> None:
    job = EXAMPLES / "digits-ps" / "job.yaml"
    proc = cli(tmp_path, "plan", str(job), "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["provider"] == "local" and plan["hourly_usd"] == 0
    assert [n["role"] for n in plan["nodes"]] == ["chief", "worker", "worker", "ps"]
    aws = json.loads(cli(tmp_path, "plan", str(job), "--provider", "aws", "--json").stdout)
    assert aws["provider"] == "aws" and aws["hourly_usd"] > 0
    assert not (tmp_path / "ledger.db").exists()
    table = cli(tmp_path, "plan", str(job))
    assert "digits-ps" in table.stdout and "$/h" in table.stdout


def test_schema_is_json_schema(tmp_path: Path) -> None:
    schema = json.loads(cli(tmp_path, "schema").stdout)
    assert schema["additionalProperties"] is False
    assert {"name", "cluster", "entrypoint"} <= set(schema["properties"])


def test_bad_spec_names_file_line_and_field_and_creates_nothing(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        textwrap.dedent(
            """\
            name: demo
            cluster:
              strategy: multi_worker_mirrored
              wokers: 2
            entrypoint: python train.py
            """
        )
    )
    proc = cli(tmp_path, "run", str(job))
    assert_one_line_error(proc, "job.yaml:4", "cluster.wokers", "did you mean 'workers'")
    assert proc.returncode == 2
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "local").exists()


def test_missing_spec_file(tmp_path: Path) -> None:
    assert_one_line_error(cli(tmp_path, "run", str(tmp_path / "nope.yaml")), "nope.yaml")


def test_over_budget_plan_is_refused_before_anything_exists(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    (tmp_path / "w").mkdir()
    job.write_text(
        "name: pricey\nprovider: aws\nregion: us-east-1\ncluster:\n  workers: 2\n"
        "  accelerator: V100:4\nworkdir: w\nentrypoint: python t.py\nmax_hours: 10\n"
        "max_cost_usd: 5\n"
    )
    proc = cli(tmp_path, "run", str(job))
    assert_one_line_error(proc, "max_cost_usd", "affords")
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.parametrize("command", ["status", "logs", "down"])
def test_unknown_run_id(tmp_path: Path, command: str) -> None:
    proc = cli(tmp_path, command, "no-such-run-123456")
    assert_one_line_error(proc, "no-such-run-123456")
    assert proc.returncode == 2


def test_down_without_ledger_needs_a_provider_and_then_works(tmp_path: Path) -> None:
    proc = cli(tmp_path, "down", "ghost-abcdef", "--provider", "local")
    assert proc.returncode == 0, proc.stderr
    assert "nothing of it is left" in proc.stdout


def test_unknown_provider_is_one_line(tmp_path: Path) -> None:
    proc = cli(tmp_path, "down", "x-123456", "--provider", "openstack")
    assert_one_line_error(proc, "unknown provider 'openstack'")


def test_ls_on_an_empty_ledger(tmp_path: Path) -> None:
    proc = cli(tmp_path, "ls", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == []


def test_workdir_with_a_link_out_of_it_is_refused_before_anything_exists(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    (work / "passwd").symlink_to("/etc/passwd")
    job = work / "job.yaml"
    job.write_text("name: linky\nworkdir: .\nentrypoint: python train.py\n")
    proc = cli(home, "run", str(job))
    assert_one_line_error(proc, "passwd", "outside the workdir")
    assert json.loads(cli(home, "ls", "--json").stdout) == []  # no run, so no resource
    assert not (home / "buckets").exists() and not (home / "local").exists()
