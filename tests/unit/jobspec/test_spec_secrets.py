"""Tests of secret env values in the job spec (cloudtrain.jobspec.job.EnvVar): `{from_env: NAME}`
read from the controller's environment at load time, `{value: ...}`, `secret: true`; the resolved
values, the secrets for redaction, and no value in any repr, dump or error message."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cloudtrain.core.errors import SpecError
from cloudtrain.jobspec.job import json_schema, load_spec
from tests.unit.jobspec.test_spec import HEAD, load_error, write

SECRET = "wandb-0123456789abcdef"
SECRET_SPEC = HEAD + textwrap.dedent(
    """\
    env:
      WANDB_PROJECT: digits
      WANDB_API_KEY: {from_env: CT_TEST_WANDB, secret: true}
      HF_TOKEN: {value: "hf_inline_token_42", secret: true}
      BATCH: {value: "64"}
      EMPTY: {from_env: CT_TEST_EMPTY, secret: true}
    """
)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CT_TEST_WANDB", SECRET)
    monkeypatch.setenv("CT_TEST_EMPTY", "")


def test_env_secrets_resolve_at_load_time(tmp_path: Path, secret_env: None) -> None:
    spec = load_spec(write(tmp_path, SECRET_SPEC))
    assert spec.env["WANDB_PROJECT"] == "digits"  # plain strings stay plain strings
    assert spec.env_values() == {
        "WANDB_PROJECT": "digits",
        "WANDB_API_KEY": SECRET,
        "HF_TOKEN": "hf_inline_token_42",
        "BATCH": "64",
        "EMPTY": "",
    }
    assert spec.secret_names() == ["EMPTY", "HF_TOKEN", "WANDB_API_KEY"]
    assert sorted(spec.secret_values()) == sorted([SECRET, "hf_inline_token_42"])  # not ""


def test_env_plain_only_spec_has_no_secrets(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, HEAD + "env:\n  A: b\n"))
    assert spec.env_values() == {"A": "b"} and spec.secret_names() == []
    assert spec.secret_values() == []


def test_env_value_is_read_when_loaded_not_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret_env: None
) -> None:
    spec = load_spec(write(tmp_path, SECRET_SPEC))
    monkeypatch.setenv("CT_TEST_WANDB", "changed-later")
    assert spec.env_values()["WANDB_API_KEY"] == SECRET
    copy = spec.model_copy(deep=True)
    assert copy.env_values() == spec.env_values()


def test_env_secrets_survive_with_overrides(tmp_path: Path, secret_env: None) -> None:
    spec = load_spec(write(tmp_path, SECRET_SPEC)).with_overrides(provider="aws")
    assert spec.provider == "aws"
    assert spec.env_values()["WANDB_API_KEY"] == SECRET
    assert spec.env_values()["HF_TOKEN"] == "hf_inline_token_42"
    assert spec.secret_names() == ["EMPTY", "HF_TOKEN", "WANDB_API_KEY"]


def test_env_secret_values_are_never_shown(tmp_path: Path, secret_env: None) -> None:
    spec = load_spec(write(tmp_path, SECRET_SPEC))
    shown = [repr(spec), str(spec), spec.model_dump_json(), repr(spec.model_dump())]
    shown += [json.dumps(spec.model_dump(mode="json")), repr(spec.env["HF_TOKEN"])]
    for text in shown:
        assert SECRET not in text and "hf_inline_token_42" not in text
    assert spec.model_dump(mode="json")["env"]["WANDB_API_KEY"] == {
        "from_env": "CT_TEST_WANDB",
        "value": None,
        "secret": True,
    }


@pytest.mark.parametrize(
    ("body", "line", "field", "phrase"),
    [
        (
            "  K: {from_env: CT_TEST_NOT_SET, secret: true}\n",
            4,
            "env.K.from_env",
            "environment variable CT_TEST_NOT_SET is not set",
        ),
        (
            "  A: b\n  K:\n    secret: true\n    from_env: CT_TEST_NOT_SET\n",
            7,
            "env.K.from_env",
            "export it",
        ),
        ("  K: {value: hf_secret_abc, from_env: CT_TEST_WANDB}\n", 4, "env.K", "exactly one of"),
        ("  K: {secret: true}\n", 4, "env.K", "exactly one of from_env and value"),
        ("  K: {vlue: hf_secret_abc}\n", 4, "env.K.vlue", "did you mean 'value'?"),
        ("  K: {from_env: 1BAD}\n", 4, "env.K.from_env", "not a valid environment variable"),
        ("  K: {value: hf_secret_abc, secret: 2}\n", 4, "env.K.secret", "true or false (got 2)"),
        ("  K: {value: 3}\n", 4, "env.K.value", "must be a string (got 3)"),
        ("  K: [a, b]\n", 4, "env.K", "a mapping like {from_env: NAME, secret: true}"),
    ],
)
def test_env_entry_errors(
    tmp_path: Path, secret_env: None, body: str, line: int, field: str, phrase: str
) -> None:
    path = write(tmp_path, HEAD + "env:\n" + body)
    message = load_error(path)
    assert message.startswith(f"{path}:{line}: {field}: "), message
    assert phrase in message
    assert "hf_secret_abc" not in message and SECRET not in message


def test_env_missing_variable_is_refused_before_anything_else(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "env:\n  K: {from_env: CT_TEST_NOT_SET}\n")
    with pytest.raises(SpecError, match=r"job.yaml:4: env.K.from_env: .*CT_TEST_NOT_SET"):
        load_spec(path)


def test_env_schema_allows_strings_and_mappings() -> None:
    schema = json_schema()
    entry = schema["properties"]["env"]["additionalProperties"]
    assert {"type": "string"} in entry["oneOf"]
    env_var = schema["$defs"]["EnvVar"]
    assert set(env_var["properties"]) == {"from_env", "value", "secret"}
    assert env_var["additionalProperties"] is False
