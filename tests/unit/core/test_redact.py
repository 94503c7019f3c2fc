"""Tests of cloudtrain.core.redact and of its use in the agent's LogPump: secrets become `***`."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from cloudtrain.core.redact import MASK, MIN_LENGTH, Redactor
from cloudtrain.jobs.agent import LogPump

TOKEN = "hf_abcdefghijklmnop"


def test_redacts_every_occurrence() -> None:
    redactor = Redactor([TOKEN, "wandb-key-1"])
    line = f"token={TOKEN} again {TOKEN}; wandb=wandb-key-1."
    assert redactor.redact(line) == f"token={MASK} again {MASK}; wandb={MASK}."


def test_nothing_to_redact_returns_the_text_unchanged() -> None:
    redactor = Redactor([])
    assert not redactor and redactor.redact("plain line") == "plain line"
    assert Redactor([TOKEN]).redact("no secret here") == "no secret here"


def test_short_and_empty_secrets_are_ignored() -> None:
    short = "a" * (MIN_LENGTH - 1)
    redactor = Redactor(["", "1", short, None, 42])  # type: ignore[list-item]
    assert not redactor
    assert redactor.redact(f"epoch 1 {short} loss 0.1") == f"epoch 1 {short} loss 0.1"
    assert Redactor(["abcd"]).redact("xabcdx") == f"x{MASK}x"  # MIN_LENGTH itself is redacted


def test_longest_secret_wins_when_they_overlap() -> None:
    redactor = Redactor(["secret", "secret-and-more"])
    assert redactor.redact("x secret-and-more y secret") == f"x {MASK} y {MASK}"


def test_regex_characters_are_literal() -> None:
    odd = "p4$$.w0rd+(x)*[y]\\z"
    redactor = Redactor([odd])
    assert redactor.redact(f"pw={odd}!") == f"pw={MASK}!"
    assert redactor.redact("p4$$Xw0rd+(x)") == "p4$$Xw0rd+(x)"  # '.' is not a wildcard


def test_multi_line_secret_is_redacted_line_by_line() -> None:
    pem = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\nAQEFAASCBKcwggSjAgEAAoIB\n"
    pem += "-----END KEY-----\n"
    redactor = Redactor([pem])
    assert redactor.redact(pem) == MASK
    assert redactor.redact("line: MIIEvQIBADANBgkqhkiG9w0B") == f"line: {MASK}"


def test_repr_does_not_show_secrets() -> None:
    assert TOKEN not in repr(Redactor([TOKEN])) and "1 secrets" in repr(Redactor([TOKEN]))


def test_from_cluster_reads_the_named_env_values() -> None:
    doc = {"env": {"A": "plain-value", "K": TOKEN, "E": ""}, "secrets": ["K", "E", "GONE"]}
    redactor = Redactor.from_cluster(doc)
    assert redactor.redact(f"{TOKEN} plain-value") == f"{MASK} plain-value"
    assert not Redactor.from_cluster({"env": {"K": TOKEN}})  # no `secrets`: nothing to redact
    assert not Redactor.from_cluster({})


def test_many_lines_and_secrets() -> None:
    """Its speed is benchmarks/unit_timings.py's `redact_20k_lines_s`."""
    redactor = Redactor([f"secret-value-{i:03d}" for i in range(50)])
    lines = [f"step {i}: loss=0.{i} acc=0.9 secret-value-{i % 60:03d}" for i in range(20_000)]
    out = [redactor.redact(line) for line in lines]
    assert out[1].endswith(MASK) and out[55].endswith("secret-value-055")


def test_stdlib_only() -> None:
    code = (
        "import sys, cloudtrain.core.redact\n"
        "print(sorted(m for m in ('pydantic', 'yaml', 'jinja2') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


class _Store:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data


def test_log_pump_redacts_chunks_last_line_and_console(capsys: pytest.CaptureFixture[str]) -> None:
    store = _Store()
    pump = LogPump(store, "logs/worker-0/", 0, redactor=Redactor([TOKEN]))
    pump.add(f"login with {TOKEN}\n")
    pump.add("Epoch 1/3")
    pump.flush()
    pump.add(f"last {TOKEN}")
    assert pump.last_line == f"last {MASK}"
    pump.flush()
    uploaded = b"".join(store.objects.values()).decode()
    assert TOKEN not in uploaded and uploaded.count(MASK) == 2
    assert pump.epoch == (1, 3)
    assert TOKEN not in capsys.readouterr().out


def test_log_pump_redactor_can_be_set_later_and_defaults_to_none() -> None:
    store: Any = _Store()
    pump = LogPump(store, "p/", 0)
    pump.add(f"before {TOKEN}")  # no secrets known yet: unchanged
    pump.redactor = Redactor([TOKEN])
    pump.add(f"after {TOKEN}")
    pump.flush()
    assert store.objects["p/00000000.log"].decode() == f"before {TOKEN}\nafter {MASK}\n"
