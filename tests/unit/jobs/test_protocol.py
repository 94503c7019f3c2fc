"""The bucket protocol (`cloudtrain.jobs.protocol`): every key under the run's prefix, every
document's round trip, documents older than the `version` field and newer than this reader, and
the rule that no other module spells a key. Node-side: runs under Python 3.10 too (standard
library and pytest only; the property tests are in test_protocol_properties.py)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.jobs import protocol
from cloudtrain.jobs.protocol import (
    DOCUMENTS,
    FINAL_STATES,
    PROTOCOL_VERSION,
    UNVERSIONED,
    CheckpointsReady,
    ClusterDoc,
    Document,
    Heartbeat,
    LeaseDoc,
    LogIndex,
    MissingField,
    NodeState,
    NodeStatus,
    NoticeDoc,
    OrphanedDoc,
    ProtocolError,
    Registration,
)

ROOT = Path(__file__).resolve().parents[3]
RUN = "demo-0a1b2c"
P = f"cloudtrain/runs/{RUN}/"

# one full example of every document, as its writer makes it
EXAMPLES: dict[type[Document], Document] = {
    ClusterDoc: ClusterDoc(
        run_id=RUN,
        strategy="multi_worker_mirrored",
        roles={"chief": 1, "worker": 2},
        port=2222,
        attempt=3,
        deadline=1_900_000_000.5,
        entrypoint="python train.py",
        setup="pip install -r requirements.txt",
        env={"LR": "0.1", "TOKEN": "s3cr3t"},
        secrets=["TOKEN"],
        poll_s=0.2,
        rendezvous_timeout_s=120.0,
        stop_grace_s=15.0,
        linger_s=120.0,
    ),
    NodeStatus: NodeStatus(
        state=NodeState.FAILED,
        attempt=2,
        time=1_800_000_000.25,
        exit_code=-9,
        signal=9,
        reason="killed",
        tail=["line 1", "Killed"],
        log_seq=17,
    ),
    Heartbeat: Heartbeat(
        time=1_800_000_001.0,
        attempt=2,
        state=NodeState.RUNNING,
        epoch=3,
        epochs=10,
        last_line="Epoch 3/10",
        pid=4242,
        log_seq=17,
        activity="restoring 3.1/5.0 GB",
    ),
    NoticeDoc: NoticeDoc(
        attempt=1, time=1_800_000_002.0, cloud="gcp", action="preempt", deadline=1_800_000_032.0
    ),
    Registration: Registration(address="10.0.0.7:2222", time=1_800_000_003.0, slots=4),
    CheckpointsReady: CheckpointsReady(time=1_800_000_004.0, by="chief-0"),
    LeaseDoc: LeaseDoc(
        owner="controller:ct-r1-controller-0",
        term=3,
        expires=1_800_000_030.0,
        successor="",
        time=1_800_000_000.0,
    ),
    OrphanedDoc: OrphanedDoc(time=1_800_000_005.0, by="worker-1", term=3),
    LogIndex: LogIndex(
        node="worker-1",
        segments=[
            {
                "key": f"{P}logs/worker-1/segments/00000000-00000009.log",
                "first_seq": 0,
                "last_seq": 9,
                "first_line": 0,
                "lines": 120,
                "bytes": 8192,
                "time": 1_800_000_006.0,
            }
        ],
    ),
}


# --- keys ---------------------------------------------------------------------------------------
def test_every_key_is_under_the_run_prefix() -> None:
    assert protocol.run_prefix(RUN) == P
    keys = {
        protocol.cluster_key(RUN): "cluster.json",
        protocol.stop_key(RUN): "control/stop",
        protocol.status_key(RUN, "worker-1"): "status/worker-1.json",
        protocol.heartbeat_key(RUN, "worker-1"): "heartbeat/worker-1.json",
        protocol.notice_key(RUN, "worker-1"): "notice/worker-1.json",
        protocol.logs_prefix(RUN, "worker-1"): "logs/worker-1/",
        protocol.log_chunk_key(RUN, "worker-1", 42): "logs/worker-1/00000042.log",
        protocol.log_index_key(RUN, "worker-1"): "logs/worker-1/index.json",
        protocol.log_segment_key(
            RUN, "worker-1", 0, 9
        ): "logs/worker-1/segments/00000000-00000009.log",
        protocol.bootstrap_prefix(RUN): "bootstrap/",
        protocol.bootstrap_log_key(RUN, "ps-0"): "bootstrap/ps-0.log",
        protocol.attempt_prefix(RUN, 2): "attempt-2/",
        protocol.registrations_prefix(RUN, 2): "attempt-2/nodes/",
        protocol.registration_key(RUN, 2, "chief-0"): "attempt-2/nodes/chief-0.json",
        protocol.checkpoints_ready_key(RUN, 2): "attempt-2/checkpoints-ready",
        protocol.archived_bootstrap_log_key(RUN, 1, "ps-0"): "attempt-1/bootstrap/ps-0.log",
        protocol.checkpoints_prefix(RUN): "checkpoints/",
        protocol.model_prefix(RUN): "model/",
        protocol.bundle_key(RUN, "ab12"): "bundle/ab12.tar.gz",
    }
    for key, rel in keys.items():
        assert key == P + rel


def test_log_chunks_sort_in_sequence_order_and_parse_back() -> None:
    keys = [protocol.log_chunk_key(RUN, "chief-0", n) for n in (10, 2, 100_000, 0)]
    assert [protocol.log_seq(k) for k in sorted(keys)] == [0, 2, 10, 100_000]
    assert protocol.log_seq(P + "logs/chief-0/notes.txt") == -1


@pytest.mark.parametrize(
    ("rel", "found"),
    [
        ("status/worker-1.json", ("status", "worker-1")),
        ("heartbeat/chief-0.json", ("heartbeat", "chief-0")),
        ("notice/ps-0.json", ("notice", "ps-0")),
        ("bootstrap/evaluator-0.log", ("bootstrap", "evaluator-0")),
        ("logs/worker-0/00000003.log", ("log", "worker-0")),
        ("cluster.json", None),
        ("control/stop", None),
        ("attempt-1/bootstrap/ps-0.log", None),  # archived: no longer the node's
        ("attempt-1/nodes/chief-0.json", None),
        ("checkpoints/status/x.json", None),
        ("status/a/b.json", None),
        ("logs/worker-0.log", None),
    ],
)
def test_classify_names_what_the_controller_reads(rel: str, found: tuple[str, str] | None) -> None:
    assert protocol.classify(RUN, P + rel) == found
    assert protocol.classify(RUN, f"cloudtrain/runs/other-run/{rel}") is None


# --- documents ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", DOCUMENTS, ids=lambda k: k.__name__)
def test_every_document_round_trips(kind: type[Document]) -> None:
    doc = EXAMPLES[kind]
    again = kind.from_json(doc.to_json())
    assert type(again) is kind
    assert dataclasses.astuple(again) == dataclasses.astuple(doc)
    assert again.version == PROTOCOL_VERSION
    assert json.loads(doc.to_json()) == doc == doc.to_dict()  # also the dict it reads from


def test_every_document_has_an_example() -> None:
    assert set(EXAMPLES) == set(DOCUMENTS)


@pytest.mark.parametrize("kind", DOCUMENTS, ids=lambda k: k.__name__)
def test_a_document_older_than_the_version_field_still_reads(kind: type[Document]) -> None:
    old = EXAMPLES[kind].to_dict()
    del old["version"]
    doc = kind.from_json(json.dumps(old))
    assert doc.version == UNVERSIONED
    assert dataclasses.replace(doc, version=PROTOCOL_VERSION).to_dict() == EXAMPLES[kind]


def test_the_agents_documents_of_before_the_protocol_module_read() -> None:
    # byte for byte what the agent and the controller wrote before jobs/protocol.py existed
    status = NodeStatus.from_json(b'{"state": "running", "attempt": 1, "time": 5.0, "pid": 7}')
    assert (status.state, status.attempt, status.pid, status.reason) == ("running", 1, 7, None)
    assert status.state is NodeState.RUNNING
    beat = Heartbeat.from_json(b'{"time": 1.0, "attempt": 1}')
    assert (beat.time, beat.epoch, beat.last_line) == (1.0, None, "")
    cluster = ClusterDoc.from_json(
        b'{"run_id": "r", "roles": {"chief": 1}, "port": 2222, "attempt": 1,'
        b' "entrypoint": "true", "setup": null, "deadline": 9.5}'
    )
    assert (cluster.setup, cluster.deadline, cluster.heartbeat_s) == ("", 9.5, 2.0)


@pytest.mark.parametrize("kind", DOCUMENTS, ids=lambda k: k.__name__)
def test_unknown_fields_are_ignored(kind: type[Document]) -> None:
    newer = {**EXAMPLES[kind].to_dict(), "version": PROTOCOL_VERSION + 1, "from_the_future": [1]}
    doc = kind.from_json(json.dumps(newer))
    assert "from_the_future" not in doc and not hasattr(doc, "from_the_future")
    assert doc.version == PROTOCOL_VERSION + 1
    assert dataclasses.replace(doc, version=PROTOCOL_VERSION) == EXAMPLES[kind]


def test_a_newer_agents_unknown_state_stays_a_string() -> None:
    status = NodeStatus.from_json(b'{"state": "draining", "attempt": 1}')
    assert status.state == "draining" and status.state not in FINAL_STATES


@pytest.mark.parametrize("body", [b"", b'{"state": "runn', b"\xff\xfe", b"[1, 2]", b'"text"'])
def test_unreadable_bytes_are_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        NodeStatus.from_json(body)
    assert isinstance(caught.value, ValueError)  # the readers' "not there yet"


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (NodeStatus, {"state": "failed", "attempt": "two"}),
        (NodeStatus, {"state": "failed", "tail": "not a list"}),
        (NodeStatus, {"state": "failed", "attempt": True}),
        (ClusterDoc, {**EXAMPLES[ClusterDoc].to_dict(), "roles": ["chief"]}),
        (ClusterDoc, {**EXAMPLES[ClusterDoc].to_dict(), "port": 2.5}),
        (Heartbeat, {"time": {"t": 1}}),
    ],
)
def test_a_field_of_the_wrong_type_is_a_protocol_error(
    kind: type[Document], data: dict[str, Any]
) -> None:
    with pytest.raises(ProtocolError, match=r"\."):
        kind.from_dict(data)


def test_a_missing_required_field_is_named() -> None:
    data = EXAMPLES[ClusterDoc].to_dict()
    del data["attempt"]
    with pytest.raises(MissingField) as caught:
        ClusterDoc.from_dict(data)
    assert caught.value.field == "attempt"
    with pytest.raises(MissingField, match="'state'"):
        NodeStatus.from_json(b'{"attempt": 1}')


def test_a_document_is_read_only() -> None:
    status = EXAMPLES[NodeStatus]
    with pytest.raises(TypeError, match="read-only"):
        status["state"] = "running"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.state = "running"  # type: ignore[misc]
    moved = dataclasses.replace(EXAMPLES[ClusterDoc], attempt=4)
    assert (moved.attempt, moved["attempt"], EXAMPLES[ClusterDoc]["attempt"]) == (4, 4, 3)


def test_a_registration_without_slots_leaves_them_out() -> None:
    assert "slots" not in json.loads(Registration(address="h:1").to_json())
    assert json.loads(Registration(address="h:1", slots=2).to_json())["slots"] == 2


def test_the_rendezvous_timeout_has_one_default() -> None:
    # the agent's 300 s and the controller's 600 s were two defaults; the controller writes
    # RunOptions' value, and a document without one reads as ClusterDoc's
    data = EXAMPLES[ClusterDoc].to_dict()
    del data["rendezvous_timeout_s"]
    assert ClusterDoc.from_dict(data).rendezvous_timeout_s == ClusterDoc.rendezvous_timeout_s
    assert ClusterDoc.rendezvous_timeout_s == 600.0


def test_final_states() -> None:
    assert {"succeeded", "failed", "stopped"} == FINAL_STATES
    assert all(isinstance(s, NodeState) for s in FINAL_STATES)
    assert NodeState.RUNNING not in FINAL_STATES and "running" not in FINAL_STATES


# --- nothing else spells a key --------------------------------------------------------------------
SPELLINGS = ("control/stop", "cluster.json", "cloudtrain/runs/")
SOURCES = ("cloudtrain", "jobs", "providers")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def key_spellings(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line: text` of every string in the module's code (not its comments or docstrings)
    that spells one of SPELLINGS as a key does: a string (or f-string part) without whitespace
    (a message that names a key for a person, "... before cluster.json", is prose, not a key)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in skip:
            continue
        text = node.value
        if any(s in text for s in SPELLINGS) and not any(c.isspace() for c in text):
            out.append(f"{path.relative_to(root)}:{node.lineno}: {text[:60]!r}")
    return out


def test_no_module_but_the_protocol_spells_a_key() -> None:
    own = ROOT / "jobs" / "protocol_keys.py"  # the protocol's key layout (protocol.py re-exports)
    found = [
        hit
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != own
        for hit in key_spellings(path)
    ]
    assert found == [], "build these keys with cloudtrain.jobs.protocol:\n" + "\n".join(found)
    assert key_spellings(own)  # the scan does see a key where one is spelled


def test_the_scan_sees_keys_in_f_strings_and_not_in_prose(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        '"""A docstring may say cluster.json."""\n'
        "# so may a comment: control/stop\n"
        'STOP = f"{PREFIX}control/stop"\n'
        'MESSAGE = "written before cluster.json"\n'
        'ROOT = "cloudtrain/runs/" + RUN\n'
    )
    hits = key_spellings(module, tmp_path)
    assert sorted(h.split(":")[1] for h in hits) == ["3", "5"]


def test_the_controller_does_not_import_the_node_agent() -> None:
    importers = []
    for path in sorted((ROOT / "cloudtrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "cloudtrain.jobs.agent":
                importers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert importers == []


def test_the_protocol_imports_only_the_standard_library() -> None:
    """Both sides import jobs/protocol.py: it and its parts (every jobs/protocol_*.py) may
    depend on nothing of the project but each other, jobs/protocol_base.py and
    jobs/protocol_streams.py on nothing at all, and none on anything a node's bare Python
    lacks."""
    import sys

    names = sorted(path.name for path in (ROOT / "jobs").glob("protocol*.py"))
    assert {"protocol.py", "protocol_base.py", "protocol_keys.py"} <= set(names)
    parts = {f"cloudtrain.jobs.{name.removesuffix('.py')}" for name in names}
    for name in names:
        source = (ROOT / "jobs" / name).read_text()
        imported = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                leaf = name in ("protocol_base.py", "protocol_streams.py")
                ours = not leaf and node.module in parts
                imported |= set() if ours else {node.module.split(".")[0]}
        assert imported, f"the scan found no import at all in {name}"
        assert sorted(imported - set(sys.stdlib_module_names)) == [], name


def test_the_protocol_re_exports_every_public_name_of_its_parts() -> None:
    """Callers import jobs/protocol.py only: its `__all__` holds every public name of every
    part (jobs/protocol_*.py), so a name added to a part is reachable without naming the part,
    and nothing more (each name in `__all__` is one of theirs, or the protocol's DOCUMENTS)."""
    import importlib

    names = sorted(path.stem for path in (ROOT / "jobs").glob("protocol_*.py"))
    public: set[str] = set()
    for name in names:
        module = importlib.import_module(f"cloudtrain.jobs.{name}")
        tree = ast.parse((ROOT / "jobs" / f"{name}.py").read_text())
        defined = {
            target.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            for target in ast.walk(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            if isinstance(target, ast.Name)
        } | {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        public |= {n for n in defined if not n.startswith("_") and hasattr(module, n)}
    assert sorted(public - set(protocol.__all__)) == []
    assert sorted(set(protocol.__all__) - public) == ["DOCUMENTS"]
    assert len(protocol.__all__) == len(set(protocol.__all__))
    assert all(getattr(protocol, n) is not None for n in protocol.__all__)
