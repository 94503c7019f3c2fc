"""Tests of cloudtrain.jobspec.job: every bad spec names its file, line and field; good specs
load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cloudtrain.core.errors import SpecError
from cloudtrain.jobspec.job import ClusterSpec, JobSpec, json_schema, load_spec, load_spec_text

MWM, PS = "multi_worker_mirrored", "parameter_server"
HEAD = "name: job\nentrypoint: python train.py\n"  # lines 1-2 of most cases below


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    return message


# (id, yaml text, line, field path or None, phrase)
BAD_SPECS = [
    ("typo-top", HEAD + "nmae: x\n", 3, "nmae", "unknown field; did you mean 'name'?"),
    ("cluster-field-at-top", HEAD + "workers: 2\n", 3, "workers", "did you mean 'cluster.workers'"),
    (
        "typo-cluster",
        HEAD + "cluster:\n  strategy: mirrored\n  wokers: 1\n",
        5,
        "cluster.wokers",
        "unknown field; did you mean 'workers'?",
    ),
    ("no-suggestion", HEAD + "zzzzzz: 1\n", 3, "zzzzzz", "unknown field"),
    (
        "workers-negative",
        HEAD + "# comment\n\ncluster:\n  workers: -2\n",
        6,
        "cluster.workers",
        "must be at least 1 (got -2)",
    ),
    (
        "workers-string",
        HEAD + "cluster:\n  workers: '2'\n",
        4,
        "cluster.workers",
        "must be a whole number (got '2')",
    ),
    (
        "workers-float",
        HEAD + "cluster:\n  workers: 2.0\n",
        4,
        "cluster.workers",
        "must be a whole number",
    ),
    (
        "provider",
        "name: job\nprovider: gpc\nentrypoint: x\n",
        2,
        "provider",
        "must be one of: local, aws, gcp, azure, slurm, cheapest (got 'gpc')",
    ),
    (
        "strategy",
        HEAD + "cluster:\n  strategy: tpu_pod\n",
        4,
        "cluster.strategy",
        "must be one of: one_device, mirrored, multi_worker_mirrored, parameter_server, horovod,"
        " central_storage, tpu",
    ),
    (
        "horovod-chief",
        HEAD + "cluster:\n  strategy: horovod\n  workers: 2\n  chief: 1\n",
        6,
        "cluster.chief",
        "must be 0 or unset for strategy 'horovod' (worker 0 is the rendezvous host)",
    ),
    (
        "horovod-ps",
        HEAD + "cluster:\n  strategy: horovod\n  ps: 1\n",
        5,
        "cluster.ps",
        "must be 0 for strategy 'horovod' (only parameter_server uses ps nodes)",
    ),
    (
        "horovod-evaluator",
        HEAD + "cluster:\n  strategy: horovod\n  evaluator: 1\n",
        5,
        "cluster.evaluator",
        "must be 0 for strategy 'horovod' (it has no evaluator node)",
    ),
    (
        "horovod-no-workers",
        HEAD + "cluster:\n  strategy: horovod\n  workers: 0\n",
        5,
        "cluster.workers",
        "must be at least 1 (got 0)",
    ),
    (
        "mirrored-workers",
        HEAD + "cluster:\n  strategy: mirrored\n  workers: 2\n",
        5,
        "cluster.workers",
        "must be 1 for strategy 'mirrored'",
    ),
    (
        "central-storage-workers",
        HEAD + "cluster:\n  strategy: central_storage\n  workers: 2\n",
        5,
        "cluster.workers",
        "must be 1 for strategy 'central_storage' (got 2; use multi_worker_mirrored)",
    ),
    (
        "ps-missing",
        HEAD + "cluster:\n  strategy: parameter_server\n  workers: 2\n",
        3,
        "cluster.ps",
        "needs at least 1",
    ),
    (
        "ps-without-ps-strategy",
        HEAD + "cluster:\n  workers: 2\n  ps: 1\n",
        5,
        "cluster.ps",
        "only parameter_server uses ps nodes",
    ),
    (
        "evaluator-one-device",
        HEAD + "cluster:\n  strategy: one_device\n  evaluator: 1\n",
        5,
        "cluster.evaluator",
        "must be 0 for strategy 'one_device'",
    ),
    ("evaluator-two", HEAD + "cluster:\n  evaluator: 2\n", 4, "cluster.evaluator", "at most 1"),
    (
        "chief-zero-ps",
        HEAD + "cluster:\n  strategy: parameter_server\n  ps: 1\n  chief: 0\n",
        6,
        "cluster.chief",
        "must be 1 or unset",
    ),
    (
        "chief-mirrored",
        HEAD + "cluster:\n  strategy: mirrored\n  chief: 1\n",
        5,
        "cluster.chief",
        "its single node is the chief",
    ),
    (
        "accelerator-format",
        HEAD + "cluster:\n  accelerator: 'V100 x2'\n",
        4,
        "cluster.accelerator",
        "must look like 'V100' or 'V100:2'",
    ),
    (
        "accelerator-count",
        HEAD + "cluster:\n  accelerator: A100:32\n",
        4,
        "cluster.accelerator",
        "count must be 1 to 16",
    ),
    (
        "too-many-nodes",
        HEAD + "\ncluster:\n  chief: 1\n  workers: 64\n",
        4,
        "cluster",
        "at most 64 nodes in total (got 65",
    ),
    ("port", HEAD + "cluster:\n  port: 80\n", 4, "cluster.port", "must be at least 1024 (got 80)"),
    ("disk", HEAD + "cluster:\n  disk_gb: 5000\n", 4, "cluster.disk_gb", "at most 4096"),
    ("spot", HEAD + "cluster:\n  spot: maybe\n", 4, "cluster.spot", "must be true or false"),
    ("cluster-scalar", HEAD + "cluster: big\n", 3, "cluster", "must be a mapping (got 'big')"),
    ("name-case", "entrypoint: x\nname: My_Job\n", 2, "name", "lowercase letters"),
    ("name-trailing-dash", "name: job-\nentrypoint: x\n", 1, "name", "not end with '-'"),
    ("name-too-long", "name: " + "a" * 31 + "\nentrypoint: x\n", 1, "name", "1-30"),
    ("name-missing", "# spec\nentrypoint: x\n", 1, "name", "is required"),
    ("entrypoint-missing", "name: job\nsetup: pip install x\n", 1, "entrypoint", "is required"),
    ("entrypoint-empty", "name: job\nentrypoint: '  '\n", 2, "entrypoint", "must not be empty"),
    (
        "entrypoint-list",
        "name: job\nentrypoint:\n  - python\n  - train.py\n",
        2,
        "entrypoint",
        "must be a string (got a list)",
    ),
    ("env-reserved-tf", HEAD + "env:\n  TF_CONFIG: '{}'\n", 4, "env.TF_CONFIG", "reserved"),
    ("env-reserved-ct", HEAD + "env:\n  A: b\n  CLOUDTRAIN_X: x\n", 5, "env.CLOUDTRAIN_X", "sets"),
    ("env-bad-key", HEAD + "env:\n  1BAD: x\n", 4, "env.1BAD", "not a valid environment variable"),
    ("env-int-value", HEAD + "env:\n  EPOCHS: 5\n", 4, "env.EPOCHS", "string (got 5); quote it"),
    ("env-not-mapping", HEAD + "env: [A, B]\n", 3, "env", "must be a mapping"),
    ("project-bad-id", HEAD + "project: My_Project\n", 3, "project", "Google Cloud project id"),
    ("subscription-not-guid", HEAD + "subscription: my-sub\n", 3, "subscription", "a GUID"),
    (
        "checkpoint-scheme",
        HEAD + "checkpoint: hdfs://x/y\n",
        3,
        "checkpoint",
        "must be a file://, s3://",
    ),
    (
        "checkpoint-provider",
        HEAD + "provider: aws\ncheckpoint: gs://bucket/ckpt\n",
        4,
        "checkpoint",
        "provider 'aws' keeps checkpoints at s3://",
    ),
    (
        "cheapest-region",
        HEAD + "provider: cheapest\nregion: us-east-1\n",
        4,
        "region",
        "cannot be set with provider 'cheapest' (got 'us-east-1'): a region belongs to one cloud",
    ),
    (
        "cheapest-zone",
        HEAD + "provider: cheapest\nzone: us-east-1b\n",
        4,
        "zone",
        "a zone belongs to one cloud; remove zone, or set provider to aws, gcp or azure",
    ),
    (
        "cheapest-checkpoint",
        HEAD + "provider: cheapest\ncheckpoint: s3://bucket/ckpt\n",
        4,
        "checkpoint",
        "a checkpoint URI belongs to one cloud",
    ),
    ("max-hours-zero", HEAD + "max_hours: 0\n", 3, "max_hours", "must be more than 0"),
    ("max-hours-big", HEAD + "max_hours: 200\n", 3, "max_hours", "at most 168 (got 200)"),
    ("max-hours-string", HEAD + "max_hours: '1'\n", 3, "max_hours", "must be a number (got '1')"),
    ("max-hours-inf", HEAD + "max_hours: .inf\n", 3, "max_hours", "at most 168"),
    ("cost-negative", HEAD + "max_cost_usd: -5\n", 3, "max_cost_usd", "must be more than 0"),
    ("cost-nan", HEAD + "max_cost_usd: .nan\n", 3, "max_cost_usd", "finite"),
    ("teardown", HEAD + "teardown: never\n", 3, "teardown", "always, keep-on-failure"),
    ("restarts", HEAD + "max_restarts: 21\n", 3, "max_restarts", "at most 20 (got 21)"),
    ("workdir-missing", HEAD + "workdir: nope\n", 3, "workdir", "folder does not exist"),
    ("workdir-file", HEAD + "workdir: job.yaml\n", 3, "workdir", "is not a folder"),
    ("region", HEAD + "region: us east 1\n", 3, "region", "letters, digits and '-'"),
    ("instance-empty", HEAD + "cluster:\n  image: ''\n", 4, "cluster.image", "must not be empty"),
    (
        "duplicate-key",
        HEAD + "cluster:\n  workers: 1\n  workers: 2\n",
        5,
        "cluster.workers",
        "duplicate key (first at line 4)",
    ),
    ("duplicate-top", HEAD + "name: other\n", 3, "name", "duplicate key (first at line 1)"),
    ("alias", HEAD + "setup: &s echo hi\nenv:\n  S: *s\n", 3, None, "aliases are not allowed"),
    (
        "python-tag",
        HEAD + "setup: !!python/object/apply:os.system [ls]\n",
        3,
        "setup",
        "YAML tag '!!python/object/apply:os.system' is not allowed",
    ),
    ("custom-tag", HEAD + "setup: !shell echo\n", 3, "setup", "is not allowed"),
    ("complex-key", HEAD + "? [a, b]\n: 1\n", 3, None, "keys must be plain names"),
    ("syntax", HEAD + "cluster:\n  workers: [1\n", 5, None, "invalid YAML"),
    ("tab-indent", HEAD + "cluster:\n\tworkers: 2\n", 4, None, "invalid YAML"),
    ("top-list", "- name: job\n", 1, None, "must be a mapping of fields (got a list)"),
    ("top-scalar", "\n\njust text\n", 3, None, "must be a mapping of fields (got 'just text')"),
    ("two-documents", HEAD + "---\nname: b\n", 3, None, "expected a single document"),
]


@pytest.mark.parametrize(
    ("text", "line", "field", "phrase"),
    [case[1:] for case in BAD_SPECS],
    ids=[case[0] for case in BAD_SPECS],
)
def test_bad_spec_names_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str | None, phrase: str
) -> None:
    path = write(tmp_path, text)
    message = load_error(path)
    prefix = f"{path}:{line}: " + (f"{field}: " if field else "")
    assert message.startswith(prefix), message
    assert phrase in message, message


def test_several_errors_report_first_by_line_and_list_the_rest(tmp_path: Path) -> None:
    text = """\
        name: job
        entrypoint: python train.py
        cluster:
          strategy: parameter_server
          workers: -2
        max_hours: 500
    """
    path = write(tmp_path, text)
    message = load_error(path)
    first = "cluster.ps: strategy 'parameter_server' needs at least 1 (got 0)"
    assert message == f"{path}:3: {first} (+2 more: cluster.workers, max_hours)"


def test_file_name_is_shown_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, HEAD + "max_restarts: -1\n")
    monkeypatch.chdir(tmp_path)
    message = load_error(Path("job.yaml"))
    assert message.startswith("job.yaml:3: max_restarts: must be at least 0 (got -1)")


def test_load_spec_text_uses_filename(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^<string>:2: provider: must be one of"):
        load_spec_text("name: job\nprovider: x\nentrypoint: y\n", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("setup", "phrase"),
    [
        ("missing", "no such file"),
        ("folder", "is a folder"),
        ("empty", "the spec is empty"),
        ("comments-only", "the spec is empty"),
        ("huge", "too large"),
        ("latin1", ":3: the spec is not UTF-8 text"),
    ],
)
def test_file_level_errors(tmp_path: Path, setup: str, phrase: str) -> None:
    path = tmp_path / "job.yaml"
    if setup == "folder":
        path.mkdir()
    elif setup == "empty":
        path.write_text("")
    elif setup == "comments-only":
        path.write_text("# nothing yet\n\n")
    elif setup == "huge":
        path.write_text(HEAD + "setup: " + "x" * (1024 * 1024) + "\n")
    elif setup == "latin1":
        path.write_bytes(HEAD.encode() + "setup: caf\xe9\n".encode("latin-1"))
    message = load_error(path)
    assert message.startswith(str(path)), message
    assert phrase in message, message


def test_yaml_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = [HEAD + 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    start = time.monotonic()
    message = load_error(path)
    assert time.monotonic() - start < 10.0  # expanded, the bomb is 9**10 items: hours, not 10 s
    assert message.startswith(f"{path}:3: ") and "aliases are not allowed" in message


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "setup: " + "[" * 50_000 + "\n")
    assert load_error(path).startswith(f"{path}: the spec is nested too deeply")
    path = write(tmp_path, HEAD + "setup: " + "[" * 100 + "]" * 100 + "\n")
    assert "nested too deeply" in load_error(path)


def test_text_over_one_mib_is_refused() -> None:
    with pytest.raises(SpecError, match="too large"):
        load_spec_text(HEAD + "setup: " + "x" * (1024 * 1024))


# --- good specs -------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, HEAD))
    assert spec.name == "job" and spec.entrypoint == "python train.py"
    assert spec.provider == "local" and spec.region is None and spec.zone is None
    assert spec.workdir == "." and spec.setup == "" and spec.env == {}
    assert spec.checkpoint is None and spec.max_cost_usd is None
    assert spec.max_hours == 1.0 and spec.teardown == "always" and spec.max_restarts == 2
    c = spec.cluster
    assert (c.strategy, c.chief, c.workers, c.ps, c.evaluator) == (MWM, 0, 1, 0, 0)
    assert (c.accelerator, c.instance_type, c.image) == (None, None, None)
    assert (c.spot, c.port, c.disk_gb, c.ssh) == (False, 2222, 100, False)
    assert c.roles() == {"worker": 1} and c.total_nodes() == 1
    assert spec.source_path == (tmp_path / "job.yaml").absolute()
    assert spec.source_dir == tmp_path.absolute()
    assert spec.workdir_path() == tmp_path.resolve()


def test_full_spec(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    text = """\
        name: mnist-2
        provider: aws
        region: us-east-1
        zone: us-east-1a
        cluster:
          strategy: multi_worker_mirrored
          chief: 1
          workers: 3
          evaluator: 1
          accelerator: T4
          spot: true
          port: 3000
          disk_gb: 50
          ssh: true
        workdir: src
        setup: pip install -r requirements.txt
        entrypoint: python train.py --epochs 3
        env:
          EPOCHS: "3"
          _PRIVATE: ""
        checkpoint: s3://my-bucket/mnist
        max_hours: 2
        max_cost_usd: 5
        teardown: keep-on-failure
        max_restarts: 0
    """
    spec = load_spec(write(tmp_path, text))
    assert spec.cluster.roles() == {"chief": 1, "worker": 3, "evaluator": 1}
    assert spec.cluster.total_nodes() == 5 and spec.cluster.spot is True
    assert spec.max_hours == 2.0 and isinstance(spec.max_hours, float)
    assert spec.max_cost_usd == 5.0 and spec.env == {"EPOCHS": "3", "_PRIVATE": ""}
    assert spec.workdir_path() == (tmp_path / "src").resolve()


@pytest.mark.parametrize(
    ("cluster", "roles", "chief"),
    [
        ({"strategy": "one_device"}, {"chief": 1}, 0),
        ({"strategy": "mirrored", "accelerator": "V100:4"}, {"chief": 1}, 0),
        ({"strategy": MWM, "workers": 4}, {"worker": 4}, 0),
        ({"workers": 2, "chief": 1, "evaluator": 1}, {"chief": 1, "worker": 2, "evaluator": 1}, 1),
        ({"strategy": PS, "workers": 3, "ps": 2}, {"chief": 1, "worker": 3, "ps": 2}, 1),
        (
            {"strategy": PS, "ps": 1, "chief": 1, "evaluator": 1},
            {"chief": 1, "worker": 1, "ps": 1, "evaluator": 1},
            1,
        ),
        ({"workers": 63, "chief": 1}, {"chief": 1, "worker": 63}, 1),
        ({"strategy": "horovod"}, {"worker": 1}, 0),
        ({"strategy": "horovod", "workers": 4, "chief": 0}, {"worker": 4}, 0),
        ({"strategy": "horovod", "workers": 2, "accelerator": "A100:8"}, {"worker": 2}, 0),
    ],
)
def test_roles(cluster: dict[str, object], roles: dict[str, int], chief: int) -> None:
    spec = ClusterSpec.model_validate(cluster)
    assert spec.roles() == roles
    assert list(spec.roles()) == [r for r in ("chief", "worker", "ps", "evaluator") if r in roles]
    assert spec.chief == chief
    assert spec.total_nodes() == sum(roles.values())


@pytest.mark.parametrize(
    ("accelerator", "name", "count"),
    [(None, None, 0), ("V100", "V100", 1), ("V100:2", "V100", 2), ("L4:16", "L4", 16)],
)
def test_accelerator_parsing(accelerator: str | None, name: str | None, count: int) -> None:
    cluster = ClusterSpec(accelerator=accelerator)
    assert cluster.accelerator_name == name and cluster.accelerator_count == count


def test_with_overrides(tmp_path: Path) -> None:
    text = HEAD + "provider: aws\nregion: us-east-1\nzone: us-east-1b\n"
    spec = load_spec(write(tmp_path, text))
    same = spec.with_overrides()
    assert same == spec and same is not spec
    moved = spec.with_overrides(region="us-west-2")
    assert (moved.provider, moved.region, moved.zone) == ("aws", "us-west-2", None)
    zoned = spec.with_overrides(region="us-west-2", zone="us-west-2a")
    assert (zoned.region, zoned.zone) == ("us-west-2", "us-west-2a")
    assert spec.with_overrides(region="us-east-1").zone == "us-east-1b"
    gcp = spec.with_overrides(provider="gcp")
    assert (gcp.provider, gcp.region, gcp.zone) == ("gcp", None, None)
    assert gcp.source_path == spec.source_path and gcp.source_dir == spec.source_dir
    assert (spec.provider, spec.region, spec.zone) == ("aws", "us-east-1", "us-east-1b")
    with pytest.raises(SpecError, match=r"job\.yaml: provider: must be one of: local, aws"):
        spec.with_overrides(provider="gpc")


def test_with_overrides_to_and_from_cheapest(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "provider: aws\nregion: us-east-1\nzone: us-east-1b\n")
    spec = load_spec(path)
    cheapest = spec.with_overrides(provider="cheapest")
    assert (cheapest.provider, cheapest.region, cheapest.zone) == ("cheapest", None, None)
    back = cheapest.with_overrides(provider="gcp", region="us-central1")
    assert (back.provider, back.region, back.zone) == ("gcp", "us-central1", None)
    # a region given with cheapest comes from the command line: no line to name
    with pytest.raises(SpecError, match=rf"^{path}: region: cannot be set with provider 'cheap"):
        spec.with_overrides(provider="cheapest", region="us-east-1")
    with pytest.raises(SpecError, match=rf"^{path}: zone: cannot be set with provider 'cheap"):
        cheapest.with_overrides(zone="us-east-1b")
    in_file = write(tmp_path, HEAD + "provider: cheapest\n", "cheap.yaml")
    with pytest.raises(SpecError, match=r"cheap\.yaml: region: cannot be set"):
        load_spec(in_file).with_overrides(region="eastus")


def test_account_for_the_planned_provider(tmp_path: Path) -> None:
    sub = "01234567-89ab-cdef-0123-456789abcdef"
    text = HEAD + f"provider: cheapest\nproject: my-project\nsubscription: {sub}\n"
    spec = load_spec(write(tmp_path, text))
    assert spec.account is None  # the cloud is not known before planning
    assert spec.account_for("gcp") == "my-project"
    assert spec.account_for("azure") == sub
    assert spec.account_for("aws") is None and spec.account_for("local") is None
    gcp = spec.with_overrides(provider="gcp")
    assert gcp.account == gcp.account_for(gcp.provider) == "my-project"


def test_with_overrides_checks_cross_field_rules(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "checkpoint: file:///tmp/ckpt\n")
    spec = load_spec(path)
    with pytest.raises(SpecError, match=rf"^{path}:3: checkpoint: provider 'azure' keeps"):
        spec.with_overrides(provider="azure")


def test_workdir_is_relative_to_the_spec_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "proj" / "code").mkdir(parents=True)
    path = write(tmp_path / "proj", HEAD + "workdir: code\n")
    monkeypatch.chdir(tmp_path)
    assert load_spec(path).workdir_path() == (tmp_path / "proj" / "code").resolve()
    spec = load_spec_text(HEAD + "workdir: code\n", base_dir=tmp_path / "proj")
    assert spec.source_path is None
    assert spec.workdir_path() == (tmp_path / "proj" / "code").resolve()


def test_programmatic_construction_validates(tmp_path: Path) -> None:
    spec = JobSpec(name="job", entrypoint="true", workdir=str(tmp_path))
    assert spec.workdir_path() == tmp_path.resolve()
    with pytest.raises(ValueError):
        JobSpec(name="job", entrypoint="true", max_hours="1")  # type: ignore[arg-type]


def test_json_schema() -> None:
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "entrypoint"}
    assert set(schema["properties"]) == set(JobSpec.model_fields)
    assert {"source_path", "source_dir"}.isdisjoint(schema["properties"])
    cluster = schema["$defs"]["ClusterSpec"]
    assert cluster["additionalProperties"] is False and "workers" in cluster["properties"]


def test_import_is_light() -> None:
    """Importing the spec module loads pydantic and yaml but no heavy module. The child must
    exit 0 and print its `loaded` line: a crashing import would load nothing heavy either."""
    code = (
        "import sys, cloudtrain.jobspec.job\n"
        "heavy = [m for m in ('tensorflow', 'boto3', 'google.cloud', 'azure', 'rich', 'typer')"
        " if m in sys.modules]\n"
        "print('loaded', 'pydantic' in sys.modules, 'yaml' in sys.modules, "
        "callable(cloudtrain.jobspec.job.load_spec))\n"
        "print('heavy', *heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["loaded True True True", "heavy"], result.stdout
