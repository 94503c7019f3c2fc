"""YAML's surprises: a spec reads by YAML 1.2's core schema, refuses the numbers whose meaning
differs between YAML 1.1 and 1.2, and every message names the real problem with the value as the
file has it. Also the node's rules (jobs/node_rules.py) and the URI rules (providers/uri_rules.py)
as the spec applies them: `file:line: field: problem`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cloudtrain.catalog.offers import Catalog
from cloudtrain.core.errors import SpecError
from cloudtrain.jobspec.job import load_spec_text
from cloudtrain.plan.planner import make_plan

HEAD = "name: job\nentrypoint: python train.py\n"  # lines 1-2


def error(text: str, tmp_path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, filename="job.yaml", base_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("max_hours: .nan", "job.yaml:3: max_hours: must be a finite number (got .nan, which is"
         " not a number)"),
        ("max_hours: .NaN", "max_hours: must be a finite number (got .NaN, which is not a number)"),
        ("max_cost_usd: .nan", "max_cost_usd: must be a finite number (got .nan, which is not"),
        ("max_restarts: .nan", "max_restarts: must be a whole number (got .nan, which is not a"),
        ("max_hours: .inf", "job.yaml:3: max_hours: must be at most 168 (got .inf)"),
        ("max_hours: 1e3", "job.yaml:3: max_hours: must be at most 168 (got 1e3)"),
        ("max_hours: 1:30", "max_hours: must be a number (got '1:30'); YAML 1.2 reads it as text,"
         " not as YAML 1.1's base-60 number: write the number itself (an hour and a half is 1.5)"),
        ("max_restarts: 1_0", "max_restarts: must be a whole number (got '1_0'); YAML 1.2 reads"
         " '_' in a number as text: write 10"),
        ("max_restarts: 010", "job.yaml:3: max_restarts: 010: a number with a leading zero is"
         " ambiguous (YAML 1.1 reads it as octal, YAML 1.2 as decimal): write 10, or quote it"
         " ('010') for text"),
        ("max_restarts: 0x1f", "job.yaml:3: max_restarts: 0x1f: hexadecimal, octal and binary"
         " numbers are not read here: write the number in decimal, or quote it ('0x1f') for"),
        ("max_restarts: 0o17", "max_restarts: 0o17: hexadecimal, octal and binary numbers"),
        ("max_restarts: 0b101", "max_restarts: 0b101: hexadecimal, octal and binary numbers"),
        ("max_restarts: ~", "job.yaml:3: max_restarts: must be a whole number (got ~)"),
        ("max_restarts: !!int 010", "max_restarts: '010' is not a YAML 1.2 int (!!int)"),
        ("teardown: !!bool yes", "teardown: 'yes' is not a YAML 1.2 bool (!!bool)"),
        ("cluster:\n  spot: yes", "job.yaml:4: cluster.spot: must be true or false (got 'yes')"),
        ("cluster:\n  spot: on", "cluster.spot: must be true or false (got 'on')"),
        ("cluster:\n  spot: N", "cluster.spot: must be true or false (got 'N')"),
        ("env:\n  SEED: 010", "job.yaml:4: env.SEED: 010: a number with a leading zero is"),
        ("env:\n  SEED: 0x1f", "env.SEED: 0x1f: hexadecimal, octal and binary numbers"),
        ("env:\n  SEED: 1e3", "env.SEED: must be a string (got 1e3); quote it"),
        ("env:\n  SEED: .nan", "env.SEED: must be a string (got .nan); quote it"),
        ("env:\n  SEED: ~", "env.SEED: must be a string (got ~)"),
        ("env:\n  SEED: TRUE", "env.SEED: must be a string (got TRUE)"),
    ],
)
def test_yaml_surprises_name_the_real_problem(line: str, expected: str, tmp_path: Path) -> None:
    assert expected in error(HEAD + line + "\n", tmp_path)


@pytest.mark.parametrize(
    ("value", "read_as"),
    [
        ("1:30", "1:30"),  # YAML 1.1: 90
        ("yes", "yes"),  # YAML 1.1: True
        ("off", "off"),
        ("1_000", "1_000"),  # YAML 1.1: 1000
        ("2026-01-01", "2026-01-01"),  # YAML 1.1: a date
        ("'010'", "010"),
        ('"0x1f"', "0x1f"),
        ("!!str 010", "010"),
        ('"~"', "~"),
        ("'.nan'", ".nan"),
        ("=", "="),  # YAML 1.1's value tag
        ("<<", "<<"),  # YAML 1.1's merge key
    ],
)
def test_yaml_1_1_forms_are_text_as_written(value: str, read_as: str, tmp_path: Path) -> None:
    spec = load_spec_text(HEAD + f"env:\n  V: {value}\n", base_dir=tmp_path)
    assert spec.env_values() == {"V": read_as}


@pytest.mark.parametrize(
    ("value", "number"),
    [("1e3", 1000.0), (".5", 0.5), ("+2", 2.0), ("2.", 2.0), ("1.5E1", 15.0), ("0", None)],
)
def test_yaml_1_2_numbers(value: str, number: float | None, tmp_path: Path) -> None:
    text = HEAD + f"max_cost_usd: {value}\n"
    if number is None:
        assert "max_cost_usd: must be more than 0 (got 0)" in error(text, tmp_path)
    else:
        assert load_spec_text(text, base_dir=tmp_path).max_cost_usd == number
    assert load_spec_text(HEAD + "cluster:\n  spot: True\n", base_dir=tmp_path).cluster.spot
    spec = load_spec_text(HEAD + "max_cost_usd: NULL\nmax_restarts: -0\n", base_dir=tmp_path)
    assert spec.max_cost_usd is None and spec.max_restarts == 0
    assert not math.isnan(spec.max_hours)


# --- the node's rules at spec time --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('entrypoint: "python x\\0"', "job.yaml:2: entrypoint: contains a NUL byte at character 9"),
        ('entrypoint: "a\\nb"', "job.yaml:2: entrypoint: contains a line break (U+000A) at"),
        ("entrypoint: |\n  python x\n  y\n", "entrypoint: contains a line break (U+000A) at"
         " character 9: the entrypoint is one command line; put more lines in setup"),
        ('entrypoint: "a\\u2028b"', "entrypoint: contains a line separator (U+2028)"),
        ('entrypoint: "a\\Nb"', "entrypoint: contains a next-line (NEL) (U+0085)"),
        ('entrypoint: "echo \\u202ex"', "entrypoint: contains a bidirectional control (U+202E)"),
        ('entrypoint: "\\ud800"', "entrypoint: contains a lone surrogate (U+D800) at character"),
        ('entrypoint: "a\\eb"', "entrypoint: contains an escape (U+001B)"),
    ],
)
def test_entrypoint_rules(text: str, expected: str, tmp_path: Path) -> None:
    assert expected in error("name: job\n" + text + "\n", tmp_path)


@pytest.mark.parametrize("style", ["|", ">", "|+", ">+"])
def test_an_entrypoint_block_of_one_line_keeps_its_line_ends(style: str, tmp_path: Path) -> None:
    """YAML's block styles end the text with line ends; the one command line is what runs."""
    text = f"name: job\nentrypoint: {style}\n  python train.py\n  --epochs 4\n\n"
    if style.startswith(">"):
        spec = load_spec_text(text, base_dir=tmp_path)
        assert spec.entrypoint.rstrip("\n") == "python train.py --epochs 4"
        assert spec.entrypoint.endswith("\n")
    else:  # | keeps the line break between the two lines: two commands, refused
        assert "entrypoint: contains a line break (U+000A) at character 16" in error(text, tmp_path)


def test_setup_and_env_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ok = load_spec_text(
        HEAD + 'setup: "pip install x\\n\\techo done\\n"\nenv:\n  PEM: "a\\r\\nb\\tc"\n',
        base_dir=tmp_path,
    )
    assert ok.setup == "pip install x\n\techo done\n" and ok.env_values() == {"PEM": "a\r\nb\tc"}
    assert "job.yaml:3: setup: contains a carriage return (U+000D) at character 14" in error(
        HEAD + 'setup: "pip install x\\r\\n"\n', tmp_path
    )
    assert "job.yaml:5: env.B: contains a NUL byte at character 2" in error(
        HEAD + 'env:\n  A: "1"\n  B: "x\\0"\n', tmp_path
    )
    assert "job.yaml:4: env.B: contains a delete (U+007F)" in error(
        HEAD + 'env:\n  B: "x\\x7f"\n', tmp_path
    )
    big = "v" * (131072 - 2)  # B=VALUE: 131072 bytes, 131073 with its NUL
    assert "env.B: B=VALUE is 131072 bytes, over the 131071 bytes Linux passes" in error(
        HEAD + f"env:\n  B: {big}\n", tmp_path
    )
    assert load_spec_text(HEAD + f"env:\n  B: {big[:-1]}\n", base_dir=tmp_path)
    # a from_env value is read here, at load time, and must pass the same rules
    monkeypatch.setenv("CT_TEST_TOKEN", "abc\x1bdef")
    message = error(HEAD + "env:\n  TOKEN: {from_env: CT_TEST_TOKEN, secret: true}\n", tmp_path)
    assert message.endswith(
        "job.yaml:4: env.TOKEN: the value of $CT_TEST_TOKEN (from_env) contains an escape"
        " (U+001B) at character 4: an env value may hold tabs and line breaks (LF, CR), no"
        " other control"
    )
    assert "abc" not in message  # never the value


@pytest.mark.parametrize(
    ("key", "strategy", "expected"),
    [
        ("PATH", "mirrored", "job.yaml:4: env.PATH: cannot be set: the node puts its Python's"),
        ("PYTHONHOME", "mirrored", "env.PYTHONHOME: cannot be set: it moves the standard"),
        ("BASH_ENV", "mirrored", "env.BASH_ENV: cannot be set: bash would run that file"),
        ("TF_USE_LEGACY_KERAS", "mirrored", "env.TF_USE_LEGACY_KERAS: is reserved"),
        ("HOROVOD_RANK", "horovod", "job.yaml:4: env.HOROVOD_RANK: is reserved under strategy"),
    ],
)
def test_env_keys_the_node_refuses(key: str, strategy: str, expected: str, tmp_path: Path) -> None:
    text = f"{HEAD}env:\n  {key}: x\ncluster:\n  strategy: {strategy}\n"
    assert expected in error(text, tmp_path)
    assert load_spec_text(f"{HEAD}env:\n  LD_PRELOAD: /x.so\n", base_dir=tmp_path)


def test_exec_sizes_at_spec_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long = "#" + "x" * 131071  # 131072 bytes: one over MAX_ARG_STRLEN with its NUL
    assert "job.yaml:1: entrypoint: is 131072 bytes, over the 131071 bytes Linux passes" in error(
        f"entrypoint: '{long}'\nname: job\n", tmp_path
    )
    assert "setup: is 131072 bytes" in error(HEAD + f"setup: '{long}'\n", tmp_path)
    # over the spec's share of ARG_MAX: only from_env values can get there (a spec is 1 MiB)
    for i in range(10):
        monkeypatch.setenv(f"CT_TEST_BIG{i}", "v" * 110_000)
    env = "".join(f"  K{i}: {{from_env: CT_TEST_BIG{i}}}\n" for i in range(10))
    assert "job.yaml:3: env: the entrypoint or setup and the env values together take" in error(
        HEAD + "env:\n" + env, tmp_path
    )
    assert load_spec_text(HEAD + "env:\n" + env[: env.index("  K9")], base_dir=tmp_path)


def test_image_and_instance_type_are_one_printable_word(tmp_path: Path) -> None:
    assert "job.yaml:4: cluster.image: must be one word of printable ASCII" in error(
        HEAD + 'cluster:\n  image: "ami-1\\nx"\n', tmp_path
    )
    assert "cluster.instance_type: must be one word" in error(
        HEAD + "cluster:\n  instance_type: n1 standard\n", tmp_path
    )
    spec = load_spec_text(
        HEAD + "cluster:\n  image: Canonical:ubuntu-24_04-lts:server:latest\n", base_dir=tmp_path
    )
    assert spec.cluster.image == "Canonical:ubuntu-24_04-lts:server:latest"


@pytest.mark.parametrize(
    ("provider", "uri", "expected"),
    [
        ("aws", "s3://ab", "an S3 bucket name is 3-63 characters"),
        ("aws", "s3://my..bucket", "no two periods in a row"),
        ("aws", "s3://192.168.5.4", "is not an IP address"),
        ("aws", "s3://xn--bucket", "S3 reserves that prefix or suffix"),
        ("aws", "s3://My-Bucket/x", "an S3 bucket name is 3-63 characters"),
        ("aws", "s3://bucket/a#b", "must not contain '?' or '#'"),
        ("gcp", "gs://googbucket", "may not begin with 'goog' or contain 'google'"),
        ("gcp", "gs://my-g00gle-x", "may not begin with 'goog' or contain 'google'"),
        ("gcp", "gs://" + "a" * 64, "a GCS bucket name is at most 63 characters"),
        ("gcp", "gs://bucket/%2e%2e/x", "must not contain '..' or '.' path segments"),
        ("azure", "az://Acct/container", "an Azure storage account name is 3-24"),
        ("azure", "az://acct/con--tainer", "an Azure container name is 3-63"),
        ("azure", "az://acct", "an Azure container name is 3-63"),
        ("local", "file://host/tmp/x", "a file:// URI has no host but localhost"),
        ("local", "file:///tmp/%00x", "a path cannot hold a NUL byte"),
        ("local", "file:///tmp/" + "x" * 256, "over 255 bytes (Linux's NAME_MAX)"),
        ("local", "s3://bucket", "provider 'local' keeps checkpoints at file:// URIs"),
        (
            "slurm",
            "file:///tmp/x",
            "provider 'slurm' keeps checkpoints at slurm://, s3://, gs:// or az:// URIs",
        ),
        ("slurm", "s3://My-Bucket/x", "an S3 bucket name is 3-63 characters"),
    ],
)
def test_checkpoint_uri_rules(provider: str, uri: str, expected: str, tmp_path: Path) -> None:
    message = error(HEAD + f"provider: {provider}\ncheckpoint: '{uri}'\n", tmp_path)
    assert message.startswith("job.yaml:4: checkpoint: ") and expected in message, message


def test_good_checkpoint_uris(tmp_path: Path) -> None:
    for provider, uri in [
        ("aws", "s3://my-bucket.data/prefix/run"),
        ("gcp", "gs://my_bucket-1/p"),
        ("gcp", "gs://" + ".".join(["a" * 60] * 3)),
        ("azure", "az://acct01/my-container/p/q"),
        ("local", f"file://{tmp_path}/ck%20pts"),
        ("local", "file://localhost/tmp/x"),
        # a Slurm cluster's shared folder, or an object store the cluster reaches
        ("slurm", "slurm:///scratch/team/bucket"),
        ("slurm", "s3://team-bucket/p"),
        ("slurm", "gs://team-bucket"),
        ("slurm", "az://acct01/runs"),
    ]:
        text = HEAD + f"provider: {provider}\ncheckpoint: '{uri}'\n"
        assert load_spec_text(text, base_dir=tmp_path).checkpoint == uri


def test_flags_a_provider_ignores_are_noted_with_their_line(tmp_path: Path) -> None:
    text = (
        HEAD + "project: my-project-1\nsubscription: 0b1f6471-1bf0-4dda-aec3-cb9272f09590\n"
        "cluster:\n  strategy: mirrored\n  ssh: true\n  disk_gb: 50\n  image: ubuntu-22.04\n"
    )
    spec = load_spec_text(text, filename="job.yaml", base_dir=tmp_path)
    notes = make_plan(spec, Catalog.bundled()).notes
    assert "job.yaml:7: cluster.ssh ignored by provider local: local nodes are processes on" \
        " this machine" in notes
    assert "job.yaml:9: cluster.image ignored by provider local: local nodes run this" \
        " machine's Python" in notes
    assert "job.yaml:8: cluster.disk_gb ignored by provider local: local nodes use this" \
        " machine's disk" in notes
    assert "job.yaml:3: project ignored by provider local: only gcp uses a project" in notes
    assert "job.yaml:4: subscription ignored by provider local: only azure uses a" \
        " subscription" in notes
    on_gcp = make_plan(spec.with_overrides(provider="gcp"), Catalog.bundled()).notes
    assert not any("project ignored" in n or "cluster." in n for n in on_gcp)
    assert "job.yaml:4: subscription ignored by provider gcp: only azure uses a subscription" \
        in on_gcp
    plain = load_spec_text(HEAD, filename="job.yaml", base_dir=tmp_path)
    assert not any("ignored by provider" in n for n in make_plan(plain, Catalog.bundled()).notes)
