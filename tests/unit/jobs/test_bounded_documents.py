"""A document from the bucket is untrusted input (issue 29): every document's `from_json` reads
it through one rule (jobs/protocol_base.py `load_json`): a size cap, a depth cap, typed fields and
finite numbers only. Anything else is a ProtocolError, never a RecursionError, a KeyError later or
a NaN in a figure. Node-side: standard library and pytest only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cloudtrain.jobs.protocol import (
    DOCUMENTS,
    LARGE_DOCUMENT_BYTES,
    ClusterDoc,
    Heartbeat,
    LogIndex,
    NodeStatus,
    ProtocolError,
    load_json,
)
from cloudtrain.jobs.protocol_base import MAX_DEPTH, MAX_DOCUMENT_BYTES


def test_a_document_nested_100k_deep_is_a_protocol_error_not_a_recursion_error() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    for kind in DOCUMENTS:
        with pytest.raises(ProtocolError, match="deep"):
            kind.from_json(body)


def test_a_document_one_level_too_deep_is_refused_and_one_at_the_cap_reads() -> None:
    inner: Any = 1
    for _ in range(MAX_DEPTH - 1):
        inner = [inner]
    assert load_json(json.dumps({"x": inner}).encode(), what="doc") == {"x": inner}
    with pytest.raises(ProtocolError, match="deep"):
        load_json(json.dumps({"x": [inner]}).encode(), what="doc")


def test_a_document_over_its_cap_is_refused_before_it_is_parsed() -> None:
    pad = "x" * MAX_DOCUMENT_BYTES
    with pytest.raises(ProtocolError, match="bytes"):
        Heartbeat.from_json(json.dumps({"time": 1.0, "last_line": pad}).encode())
    big_env = {"K": "v" * LARGE_DOCUMENT_BYTES}
    doc = ClusterDoc(run_id="r", roles={"chief": 1}, port=1, attempt=0, entrypoint="e", env={})
    with pytest.raises(ProtocolError, match="bytes"):
        ClusterDoc.from_json(json.dumps({**doc.to_dict(), "env": big_env}).encode())


@pytest.mark.parametrize(
    "number", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"1e308", b"9" * 5000, b"9" * 40]
)
def test_non_finite_or_extreme_numbers_are_a_protocol_error(number: bytes) -> None:
    with pytest.raises(ProtocolError):
        NodeStatus.from_json(b'{"state": "running", "time": ' + number + b"}")


@pytest.mark.parametrize("number", [b"NaN", b"-Infinity", b"1e308", b"9" * 5000])
def test_a_heartbeats_non_finite_numbers_read_as_null_and_it_is_still_a_heartbeat(
    number: bytes,
) -> None:
    """A heartbeat is the node's liveness: a training whose loss diverged (NaN) still beats,
    and no non-finite figure reaches the live view."""
    beat = Heartbeat.from_json(
        b'{"time": 5.0, "epoch": ' + number + b', "metrics": {"loss": ' + number + b"}}"
    )
    assert beat.time == 5.0 and beat.epoch is None and beat.metrics == {"loss": None}


def test_a_heartbeats_ill_typed_figures_read_as_null() -> None:
    metrics = {"examples_per_s": {"n": 1}, "losses": [1.0, "x", 0.5], "source": ["runtime"]}
    beat = Heartbeat.from_json(json.dumps({"time": 1.0, "metrics": metrics}).encode())
    assert beat.metrics == {"examples_per_s": None, "losses": [1.0, 0.5], "source": None}


def test_a_cluster_doc_without_a_deadline_still_round_trips() -> None:
    """ClusterDoc's default deadline is infinity, which json writes as `Infinity`: the one
    non-finite number a document may hold, where its class says so."""
    doc = ClusterDoc(run_id="r", roles={"chief": 1}, port=1, attempt=0, entrypoint="e")
    assert ClusterDoc.from_json(doc.to_json()).deadline == float("inf")


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (LogIndex, {"node": "chief-0", "segments": "abc"}),
        (LogIndex, {"node": "chief-0", "segments": [{"first_seq": 0}]}),
        (LogIndex, {"node": "chief-0", "segments": [{"first_seq": "x", "last_seq": 1}]}),
        (
            LogIndex,
            {
                "node": "chief-0",
                "segments": [
                    {"first_seq": 0, "last_seq": 1, "first_line": 0, "lines": {}, "bytes": 1}
                ],
            },
        ),
        (Heartbeat, {"time": 1.0, "epoch": [1, 2]}),
        (Heartbeat, {"time": 1.0, "metrics": "fast"}),
        (NodeStatus, {"state": "failed", "exit_code": "x"}),
        (NodeStatus, {"state": "failed", "tail": [{"a": 1}]}),
    ],
)
def test_an_ill_typed_field_is_a_protocol_error(kind: type[Any], data: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        kind.from_json(json.dumps(data).encode())


def test_a_well_typed_heartbeat_keeps_its_figures() -> None:
    metrics = {
        "examples_per_s": 120.5,
        "losses": [1.0, 0.5],
        "source": "runtime",
        "cpu_percent": None,
    }
    beat = Heartbeat.from_json(json.dumps({"time": 1.0, "metrics": metrics}).encode())
    assert beat.metrics == metrics
