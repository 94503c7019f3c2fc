"""The node's rules for the spec's strings (jobs/node_rules.py), held against what Linux, bash and
Python really do with them, and applied by a real Agent on a real LocalStore before exec."""

# ruff: noqa: F811 - the fixtures `store` and `work` are agent_kit's, taken by name

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.jobs import horovod, node_rules
from cloudtrain.jobs.agent import Agent
from cloudtrain.jobs.node_rules import (
    MAX_ARG_STRLEN,
    env_entry_problem,
    env_key_problem,
    launch_problem,
    spec_exec_problem,
    text_problem,
)
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (  # noqa: F401 - the agent tests' fixtures, shared
    RUN_ID,
    base_cluster,
    put_json,
    read_logs,
    status_of,
    store,
    work,
)

BASH = "/bin/bash"
CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0)]


def _controls_allowed(kind: str) -> set[int]:
    return {cp for cp in CONTROLS if text_problem(kind, f"a{chr(cp)}b") is None}


def test_each_kind_allows_exactly_its_controls() -> None:
    assert _controls_allowed("entrypoint") == {0x09}
    assert _controls_allowed("setup") == {0x09, 0x0A}
    assert _controls_allowed("env") == {0x09, 0x0A, 0x0D}


@pytest.mark.parametrize("kind", ["entrypoint", "setup", "env"])
def test_nul_and_lone_surrogates_are_refused_everywhere(kind: str) -> None:
    assert "NUL byte at character 4" in (text_problem(kind, "abc\x00") or "")
    assert "lone surrogate (U+D800) at character 1" in (text_problem(kind, "\ud800x") or "")
    # what the rule stands for: Python's exec and environment refuse both
    with pytest.raises(ValueError, match="embedded null byte"):
        subprocess.run([BASH, "-c", "true\x00"], check=False)
    with pytest.raises(ValueError, match="embedded null byte"):
        subprocess.run([BASH, "-c", "true"], env={"A": "x\x00"}, check=False)
    with pytest.raises(UnicodeEncodeError):
        subprocess.run([BASH, "-c", "true"], env={"A": "\ud800"}, check=False)


def test_line_breaks_are_refused_in_the_entrypoint_only_where_they_hide_a_line() -> None:
    for cp in (0x0A, 0x0D, 0x85, 0x2028, 0x2029):
        problem = text_problem("entrypoint", f"echo a{chr(cp)}echo b") or ""
        assert f"(U+{cp:04X}) at character 7" in problem and "one command line" in problem
    assert text_problem("setup", "pip install x\necho done\n") is None
    assert "carriage return (U+000D)" in (text_problem("setup", "pip install x\r\n") or "")
    assert text_problem("env", "-----BEGIN KEY-----\r\nabc\n-----END KEY-----") is None
    assert text_problem("env", "a\u2028b") is None  # data, not code


@pytest.mark.parametrize("cp", [0x202E, 0x2066, 0x200F, 0x061C])
def test_bidi_controls_are_refused_in_code_but_not_in_values(cp: int) -> None:
    for kind in ("entrypoint", "setup"):
        assert "Trojan Source" in (text_problem(kind, f"echo {chr(cp)}x") or "")
    assert text_problem("env", f"{chr(cp)}x") is None


@pytest.mark.parametrize(
    "text",
    ["e\u0301cho", "echo שלום", "echo a\u200bb", "echo \ufeff", "echo 🙂\u200d🙂", "echo \u00a0"],
)
def test_other_unicode_passes_untouched(text: str) -> None:
    for kind in ("entrypoint", "setup", "env"):
        assert text_problem(kind, text) is None, kind


def test_argument_size_is_linuxs_max_arg_strlen() -> None:
    """MAX_ARG_STRLEN with its NUL: the longest argument passes the rule and really runs; one
    byte more is refused by the rule and by the kernel (E2BIG)."""
    longest = "#" + "x" * (MAX_ARG_STRLEN - 2)  # a bash comment: runs as a no-op
    assert text_problem("entrypoint", longest) is None
    assert subprocess.run([BASH, "-c", longest], check=False).returncode == 0
    too_long = longest + "x"
    assert "131072 bytes" in (text_problem("entrypoint", too_long) or "")
    assert "131071 bytes Linux passes" in (text_problem("setup", too_long) or "")
    with pytest.raises(OSError, match="Argument list too long"):
        subprocess.run([BASH, "-c", too_long], check=False)
    # multi-byte text counts in bytes
    assert text_problem("entrypoint", "#" + "é" * (MAX_ARG_STRLEN // 2)) is not None


def test_env_entry_size_is_key_equals_value_with_its_nul() -> None:
    key = "BIG"
    fits = "v" * (MAX_ARG_STRLEN - len(key) - 2)
    assert env_entry_problem(key, fits) is None
    env = {"PATH": os.environ["PATH"], key: fits}
    assert subprocess.run([BASH, "-c", "true"], env=env, check=False).returncode == 0
    assert "BIG=VALUE is 131072 bytes" in (env_entry_problem(key, fits + "v") or "")
    with pytest.raises(OSError, match="Argument list too long"):
        subprocess.run([BASH, "-c", "true"], env={**env, key: fits + "v"}, check=False)


def test_the_spec_may_use_half_of_arg_max_in_one_exec() -> None:
    env = {f"K{i}": "v" * 100_000 for i in range(10)}  # each fits, ~1 MB together
    assert all(env_entry_problem(k, v) is None for k, v in env.items())
    assert spec_exec_problem("", "python train.py", env) is None
    env["K10"] = "v" * 100_000
    problem = spec_exec_problem("", "python train.py", env) or ""
    assert "over the 1048576 a spec may use" in problem
    # the longer of setup and the entrypoint counts
    assert spec_exec_problem("#" + "x" * 100_000, "true", env={}) is None
    assert spec_exec_problem("x" * 100_000, "true", {"K": "v" * 1_000_000}) is not None


@pytest.mark.parametrize(
    "key",
    ["PATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "IFS"],
)
def test_keys_that_break_or_are_ignored_by_the_nodes_tools_are_refused(key: str) -> None:
    problem = env_key_problem(key) or ""
    why, _, what_instead = problem.partition("; ")
    assert why.startswith("cannot be set: ") and what_instead, problem


def test_the_refused_keys_do_what_the_messages_say(tmp_path: Path) -> None:
    base = {"PATH": os.environ["PATH"]}
    # PATH: without the node's, the agent's `bash` is not found at all
    with pytest.raises(FileNotFoundError):
        subprocess.run(["bash", "-c", "true"], env={"PATH": str(tmp_path)}, check=False)
    # PYTHONHOME / PYTHONPLATLIBDIR: the node's python cannot start
    for key in ("PYTHONHOME", "PYTHONPLATLIBDIR"):
        env = {**base, key: str(tmp_path / "nowhere")}
        assert subprocess.run([sys.executable, "-c", "1"], env=env, check=False).returncode != 0
    # BASH_ENV: bash runs the file before the command
    hook = tmp_path / "hook.sh"
    hook.write_text("echo hooked\n")
    out = subprocess.run(
        [BASH, "-c", "echo cmd"], env={**base, "BASH_ENV": str(hook)}, capture_output=True
    )
    assert out.stdout == b"hooked\ncmd\n"
    # IFS is ignored: the job would not get the value it says
    run = subprocess.run(
        [BASH, "-c", 'printf "%q" "$IFS"'], env={**base, "IFS": "x"}, capture_output=True
    )
    assert run.stdout == b"$' \\t\\n'"
    # SHELLOPTS / BASHOPTS: options the text does not show, and an unknown one is an error
    run = subprocess.run(
        [BASH, "-c", "echo hi"], env={**base, "SHELLOPTS": "xtrace"}, capture_output=True
    )
    assert run.stderr == b"+ echo hi\n"
    run = subprocess.run(
        [BASH, "-c", "true"], env={**base, "SHELLOPTS": "bogus"}, capture_output=True
    )
    assert b"bogus: invalid option name" in run.stderr
    run = subprocess.run(
        [BASH, "-c", "shopt -q extglob"], env={**base, "BASHOPTS": "extglob"}, check=False
    )
    assert run.returncode == 0


def test_ordinary_and_reserved_keys() -> None:
    for key in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME", "ENV", "LANG", "_X1"):
        assert env_key_problem(key) is None, key
    for key in ("TF_CONFIG", "CLOUDTRAIN_HOME", "TF_USE_LEGACY_KERAS", "PYTHONUNBUFFERED"):
        assert (env_key_problem(key) or "").startswith("is reserved"), key
    for key in ("1A", "A-B", "A=B", "", "É", "A B"):
        assert "not a valid environment variable name" in (env_key_problem(key) or ""), key
    assert env_key_problem("HOROVOD_RANK") is None
    assert "strategy horovod" in (env_key_problem("HOROVOD_RANK", "horovod") or "")
    assert env_key_problem("HOROVOD_FUSION_THRESHOLD", "horovod") is None


def test_horovod_own_names_are_what_the_launcher_sets() -> None:
    envs = horovod.process_envs([("worker-0", 2)], 0, ("10.0.0.1", 2345))
    assert {key for env in envs for key in env} == node_rules.HOROVOD_OWN


def test_launch_problem_names_the_field() -> None:
    env = dict(os.environ)
    assert launch_problem("entrypoint", "python train.py", env, {"A": "1"}) is None
    assert (launch_problem("setup", "a\rb", env, {}) or "").startswith("setup: contains a car")
    assert (launch_problem("entrypoint", "x", env, {"PATH": "/x"}) or "").startswith("env.PATH:")
    assert "env.A: contains a NUL" in (launch_problem("entrypoint", "x", env, {"A": "\0"}) or "")
    assert "env.A: must be a string" in (launch_problem("entrypoint", "x", env, {"A": 1}) or "")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("entrypoint", "echo a\x00b", "entrypoint: contains a NUL byte at character 7"),
        ("entrypoint", "echo a\necho b", "entrypoint: contains a line break (U+000A)"),
        ("setup", "echo one\r\necho two", "setup: contains a carriage return (U+000D)"),
        ("env", {"PATH": "/nowhere"}, "env.PATH: cannot be set"),
        ("env", {"TOKEN": "x\ud800y"}, "env.TOKEN: contains a lone surrogate"),
    ],
)
def test_the_agent_refuses_a_bad_value_as_a_failed_status(
    store: LocalStore, work: Path, tmp_path: Path, field: str, value: object, reason: str
) -> None:
    """A value that reaches the node anyway (cluster.json written by hand here) ends the
    attempt as `failed` with the reason, not as an agent error, and nothing runs."""
    ran = tmp_path / "ran"
    cluster = base_cluster(entrypoint=f"touch {ran}", linger_s=0.1)
    cluster[field] = value
    put_json(store, "cluster.json", cluster)
    assert Agent(RUN_ID, "chief", 0, store, work).run() == 0
    status = status_of(store, "chief-0")
    assert status["state"] == "failed", status
    assert status["reason"].startswith(f"refused on the node: {reason}"), status
    assert not ran.exists()
    logs = read_logs(store, "chief-0")
    assert "refused on the node" in logs and "Traceback" not in logs
