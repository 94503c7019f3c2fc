"""Property tests of the bucket protocol's documents (`cloudtrain.jobs.protocol`): any document a
writer can make reads back the same, with or without its `version`, and beside fields it does not
know. (The examples, the keys and the one-spelling rule are in test_protocol.py, which the
node-side Pythons run too; hypothesis is the controller's test dependency only.)"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cloudtrain.jobs.protocol import (
    DOCUMENTS,
    HEARTBEAT_METRICS,
    UNVERSIONED,
    Document,
    NodeState,
)
from cloudtrain.jobs.protocol_base import MAX_MAGNITUDE

TEXT = st.text(max_size=30)
# the numbers a document may hold (protocol_base.load_json): finite, within MAX_MAGNITUDE
FINITE = st.floats(min_value=-MAX_MAGNITUDE, max_value=MAX_MAGNITUDE)
INTS = st.integers(min_value=-(2**53), max_value=2**53)
BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "int": INTS,
    "float": FINITE,
    "str": TEXT,
    "list[str]": st.lists(TEXT, max_size=5),
    "dict[str, int]": st.dictionaries(TEXT, INTS, max_size=4),
    "dict[str, str]": st.dictionaries(TEXT, TEXT, max_size=4),
    # any JSON object (the heartbeat's metrics): numbers, strings, nulls and lists of numbers
    "dict[str, Any]": st.dictionaries(
        TEXT, st.none() | INTS | FINITE | TEXT | st.lists(FINITE, max_size=4), max_size=4
    ),
}
# a list of JSON objects
BY_TYPE["list[dict[str, Any]]"] = st.lists(BY_TYPE["dict[str, Any]"], max_size=3)
COUNT = st.integers(min_value=0, max_value=2**40)
# the fields whose readers check more than their type (protocol.FIELD_READERS)
BY_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "segments": st.lists(
        st.builds(
            lambda first, more, line, lines, size: {
                "first_seq": first,
                "last_seq": first + more,
                "first_line": line,
                "lines": lines,
                "bytes": size,
            },
            COUNT,
            COUNT,
            COUNT,
            COUNT,
            FINITE,
        ),
        max_size=3,
    ),
    "metrics": st.fixed_dictionaries(
        {},
        optional={
            **{name: st.none() | INTS | FINITE for name in HEARTBEAT_METRICS},
            "source": TEXT,
            "losses": st.lists(FINITE, max_size=4),
            "x_newer": st.none() | INTS | FINITE | TEXT,
        },
    ),
}


def field_strategy(f: dataclasses.Field[Any]) -> st.SearchStrategy[Any]:
    kind = str(f.type)
    if f.name == "state":
        return st.sampled_from(list(NodeState))
    if f.name in BY_FIELD:
        return (st.none() if kind.endswith(" | None") else st.nothing()) | BY_FIELD[f.name]
    if kind.endswith(" | None"):
        return st.none() | BY_TYPE[kind.removesuffix(" | None")]
    return BY_TYPE[kind]


def documents() -> st.SearchStrategy[Document]:
    """Any document of any kind, every field drawn from its type."""
    return st.one_of(
        *(
            st.builds(kind, **{f.name: field_strategy(f) for f in dataclasses.fields(kind)})
            for kind in DOCUMENTS
        )
    )


@given(documents())
def test_any_document_round_trips(doc: Document) -> None:
    again = type(doc).from_json(doc.to_json())
    assert dataclasses.astuple(again) == dataclasses.astuple(doc)
    assert again == doc


@given(documents())
def test_any_document_without_its_version_reads_as_version_0(doc: Document) -> None:
    old = {k: v for k, v in doc.to_dict().items() if k != "version"}
    again = type(doc).from_json(json.dumps(old))
    assert again.version == UNVERSIONED
    assert dataclasses.replace(again, version=doc.version) == doc


@given(documents(), st.dictionaries(st.text(min_size=1).map(lambda s: "x_" + s), TEXT))
def test_any_document_ignores_fields_it_does_not_know(doc: Document, extra: dict[str, str]) -> None:
    again = type(doc).from_dict({**extra, **doc.to_dict()})
    assert again == doc
    assert not set(extra) & set(again)
