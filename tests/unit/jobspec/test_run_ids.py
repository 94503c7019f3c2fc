"""Run ids are untrusted: one shape rule (`run_ids.parse_run_ref`/`parse_run_id`, next to
`new_run_id`), applied once at the edges into a typed value (`RunRef`, `RunId`), and the
local provider, below it, never builds a path out of its root from a run id or node name and
never signals a pid that is not provably its node's.

The local-provider tests use real processes: a "sentinel" (a session of its own, like a node)
whose pid is planted in a crafted node.json must survive every delete; a real node must not.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudtrain import api
from cloudtrain.core.errors import ProviderError, UsageError
from cloudtrain.jobspec.run_ids import (
    RUN_REF_MAX,
    RunId,
    RunRef,
    check_run_ref,
    is_run_id,
    new_run_id,
    parse_run_id,
    parse_run_ref,
    read_run_ref,
)
from cloudtrain.providers.base import Node, NodeRequest, RunInfo
from cloudtrain.providers.local import LocalCompute, session_pids
from cloudtrain.run import build
from cloudtrain.run.teardown import teardown
from cloudtrain.state.ledger import Ledger

# the job name rule of spec.py (`name:`): what new_run_id is given
NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,28}[a-z0-9]|[a-z]", fullmatch=True)
HOSTILE = [
    "",
    "-",
    "--",
    "-x",
    "--help",
    "..",
    ".",
    "../x",
    "/etc",
    "a/../../b",
    "a/b",
    "a\\b",
    "*",
    "a*",
    "?",
    "[a]",
    "{a,b}",
    "~",
    "%",
    "a%",
    "_",
    "a_",
    "'",
    '"',
    "a'; DROP TABLE runs; --",
    "a;b",
    "a b",
    "a\nb",
    "a\tb",
    "a\rb",
    "a\x00b",
    "a\x1b[31m",
    "\uff41bc",  # fullwidth a
    "\u0430bc-abcdef",  # Cyrillic a
    "abc\u200b",  # zero-width space
    "ABC-abcdef",
    "1abc",
    "a" * (RUN_REF_MAX + 1),
    "a" * 100_000,
    "$(id)",
    "`id`",
    "a|b",
    "a&b",
    "a>b",
]


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_ids_are_refused_in_one_line(value: str) -> None:
    for exact in (False, True):
        with pytest.raises(UsageError) as refused:
            check_run_ref(value, exact=exact)
        message = str(refused.value)
        assert "\n" not in message and "\r" not in message and "\x00" not in message
        assert len(message) < 400
    assert not is_run_id(value)


@given(NAMES)
def test_every_id_new_run_id_makes_and_its_prefixes_pass(name: str) -> None:
    run_id = new_run_id(name)
    assert check_run_ref(run_id, exact=True) == run_id
    assert is_run_id(run_id)
    for end in range(1, len(run_id) + 1):
        assert check_run_ref(run_id[:end]) == run_id[:end]


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_any_text_is_a_run_ref_or_one_clear_error(value: str) -> None:
    try:
        check_run_ref(value)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    # accepted: nothing in it can climb a path, glob, quote or match like a wildcard
    assert value and "a" <= value[0] <= "z"
    assert set(value) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


def test_a_hostile_prefix_is_refused_at_the_edge_before_the_ledger_is_queried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.create_run("abc-123456", "abc", "local", None, None, None, None, None)
    monkeypatch.setattr(build, "ledger", lambda: ledger)
    for value in ("a%", "_", "a_c", "*", "../abc"):
        with pytest.raises(UsageError, match="not a run id"):
            api.find_run(value)
    assert api.find_run("ab").run_id == "abc-123456"
    assert ledger.find_run(parse_run_ref("ab")).run_id == "abc-123456"


@given(NAMES)
def test_parsed_values_are_typed_and_parsed_once(name: str) -> None:
    run_id = new_run_id(name)
    assert type(run_id) is RunId and isinstance(run_id, RunRef)
    ref = parse_run_ref(run_id[:-1])
    assert type(ref) is RunRef and ref == run_id[:-1]
    # a parsed value is trusted as it is: the same object back, no second check
    assert parse_run_ref(ref) is ref and parse_run_id(run_id) is run_id
    assert parse_run_ref(run_id) is run_id
    assert type(check_run_ref(str(run_id), exact=True)) is RunId
    assert read_run_ref(str(ref)) == ref and type(read_run_ref(str(ref))) is RunRef
    for kept in (pickle.loads(pickle.dumps(run_id)), copy.deepcopy(run_id)):
        assert type(kept) is RunId and kept == run_id


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_read_run_ref_skips_what_parse_refuses(value: str) -> None:
    assert read_run_ref(value) is None


def test_only_the_parse_functions_make_the_types() -> None:
    for kind in (RunRef, RunId):
        with pytest.raises(TypeError, match="parse_run"):
            kind("abc-123456")
    with pytest.raises(UsageError, match="not a run id"):
        parse_run_id("abc")  # a prefix is no whole id


# the places a run id's shape is checked: the edges only (issue 31). Below them a RunRef/RunId
# is trusted; a new check elsewhere means a value that skipped its edge, or a second check.
EDGES = {
    "cloudtrain/jobspec/run_ids.py",  # the rule itself
    "cloudtrain/api/__init__.py",  # Python callers: find_run, cost
    "cloudtrain/api/tear_down.py",  # Python callers: down
    "cloudtrain/cli/common.py",  # the command line: run_ref
    "cloudtrain/run/gc.py",  # a cloud's tag
    # sync_run takes a RunRef from its callers' edges; with no record it narrows it to a RunId
    "cloudtrain/run/journal_sync.py",
    "cloudtrain/managed/controller_node.py",  # the controller node's argv
}
CHECKS = re.compile(
    r"\b(?:(?:parse_run_ref|parse_run_id|check_run_ref|read_run_ref)\(|RUN_(?:REF|ID)_RE\.)"
)


def test_run_ids_are_checked_only_at_the_edges() -> None:
    root = Path(__file__).resolve().parents[3]
    found = {
        str(path.relative_to(root))
        for path in (root / "cloudtrain").rglob("*.py")
        if CHECKS.search(path.read_text())
    }
    assert found <= EDGES, f"a run id checked below the edges: {sorted(found - EDGES)}"
    assert found == EDGES, f"listed as edges but checking nothing: {sorted(EDGES - found)}"


# -- the local provider ----------------------------------------------------------------------


@pytest.fixture
def sentinel() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is no part of any run, in a session of its own (as a node is)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def _plant(root: Path, run_id: str, name: str, pid: int) -> Path:
    """A node.json as an attacker (or a stale file) leaves it: the pid of a process that is
    not the node's."""
    node_dir = root / "runs" / run_id / "nodes" / name
    node_dir.mkdir(parents=True)
    meta = {"name": name, "run_id": run_id, "role": "worker", "index": 0, "pid": pid}
    (node_dir / "node.json").write_text(json.dumps(meta))
    return node_dir


def _node(run_id: str, name: str) -> Node:
    return Node(name, run_id, "worker", 0, "running", "127.0.0.1", False, "local", "local")


def test_a_planted_pid_is_never_signalled(
    tmp_path: Path, sentinel: subprocess.Popen[bytes]
) -> None:
    root = tmp_path / "home" / "local"
    compute = LocalCompute(root)
    _plant(root, "evil-abcdef", "ct-evil-abcdef-worker-0", sentinel.pid)
    # the node is not the sentinel's session: not alive, and deleting it signals nothing
    assert [n.state for n in compute.list_nodes("evil-abcdef")] == ["terminated"]
    compute.delete_node(_node("evil-abcdef", "ct-evil-abcdef-worker-0"))
    teardown(_Provider(compute), None, "evil-abcdef")  # type: ignore[arg-type]
    time.sleep(0.2)
    assert sentinel.poll() is None, "a process outside the run was killed"


def test_a_planted_pid_reached_by_traversal_is_never_signalled(
    tmp_path: Path, sentinel: subprocess.Popen[bytes]
) -> None:
    home = tmp_path / "home"
    root = home / "local"
    root.mkdir(parents=True)
    # a node.json outside the root, where "../../x" from runs/ would lead
    outside = tmp_path / "x" / "nodes" / "n"
    outside.mkdir(parents=True)
    (outside / "node.json").write_text(json.dumps({"name": "n", "pid": sentinel.pid}))
    compute = LocalCompute(root)
    for run_id, name in (("../../x", "n"), ("..", "n"), ("r1", "../../../x/nodes/n"), ("r1", "")):
        with pytest.raises(ProviderError, match="refuses"):
            compute.delete_node(_node(run_id, name))
        with pytest.raises(ProviderError, match="refuses"):
            compute.console_output(_node(run_id, name))
    with pytest.raises(ProviderError, match="refuses"):
        compute.list_nodes("../../x")
    assert sentinel.poll() is None
    assert sorted(p.name for p in home.iterdir()) == ["local"]


def test_a_node_folder_linked_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "local"
    (root / "runs").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "runs" / "r1").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ProviderError, match="leads out of"):
        LocalCompute(root).delete_node(_node("r1", "ct-r1-worker-0"))


def test_a_real_node_is_killed_and_a_reused_session_id_is_not(
    tmp_path: Path, sentinel: subprocess.Popen[bytes]
) -> None:
    root = tmp_path / "local"
    compute = LocalCompute(root)
    run = RunInfo("real-abcdef", "local", None, (2222, 2232))
    request = NodeRequest(run.run_id, "worker", 0, "local", "sleep 600 & wait\n")
    node = compute.create_node(run, request)
    meta_path = root / "runs" / run.run_id / "nodes" / request.name / "node.json"
    meta = json.loads(meta_path.read_text())
    assert session_pids(meta["pid"]), "the node did not start"
    assert [n.state for n in compute.list_nodes(run.run_id)] == ["running"]
    # the kernel hands the pid on: node.json now names another process (with its stamp)
    real = dict(meta)
    meta["pid"] = sentinel.pid
    meta_path.write_text(json.dumps(meta))
    compute.delete_node(node)
    assert sentinel.poll() is None
    # the real record: the node's session is provably its own, and it is killed
    real["deleted"] = False
    meta_path.write_text(json.dumps(real))
    compute.delete_node(node)
    deadline = time.time() + 10
    while session_pids(real["pid"]) and time.time() < deadline:
        time.sleep(0.05)
    assert session_pids(real["pid"]) == []
    assert sentinel.poll() is None


class _Provider:
    """Just enough of a Provider for `teardown` over a real LocalCompute."""

    name = "local"

    def __init__(self, compute: LocalCompute) -> None:
        self.compute = compute


def test_the_sentinel_is_a_live_session_of_its_own(sentinel: subprocess.Popen[bytes]) -> None:
    """What makes the tests above meaningful: a plain session-wide kill would reach it."""
    assert session_pids(sentinel.pid) == [sentinel.pid]
    assert os.getsid(sentinel.pid) == sentinel.pid != os.getsid(0)
