"""The controller's remaining readers of the bucket take what is there as untrusted input (issue
29): a node can overwrite cluster.json, control/key, control/launch.json, control/yield, the
wheelhouse manifest and put anything under ledger/, so every such GET is bounded by its cap
(jobs/bucket_reads.py), and a document too large, too deep or ill-typed is skipped with one
warning naming its key, or refused with a clear error where the read is essential: never a
crash, never an unbounded read into memory. Real LocalStores (folders), their reads recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from cloudtrain.core.errors import UsageError
from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.bucket_reads import (
    JOURNAL_ENTRY_MAX_BYTES,
    LAUNCH_MAX_BYTES,
    RUN_KEY_MAX_BYTES,
    WHEELHOUSE_MANIFEST_MAX_BYTES,
    Skips,
)
from cloudtrain.managed import adopt
from cloudtrain.run import teardown, wheelhouse
from cloudtrain.run.teardown import scrub_secrets
from cloudtrain.run.wheelhouse import manifest_key, read_manifest, stack_pins, tag, tar_key
from cloudtrain.state import launch_doc, run_key
from cloudtrain.state.journal import entry_key, import_journal
from cloudtrain.state.ledger import Ledger
from tests.fakes.memory_provider import MemoryProvider
from tests.unit.bounded_kit import DEEP, Recording, huge
from tests.unit.state.test_forged_journal import RUN, laptop_run


@pytest.fixture
def store(tmp_path: Path) -> Recording:
    bucket = Recording((tmp_path / "bucket").as_uri())
    bucket.ensure_bucket()
    return bucket


@pytest.fixture(autouse=True)
def fresh_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own record of warned keys: the readers warn once per key per process, and
    another test in this worker may have read the same key (the same wheelhouse tag, say)."""
    monkeypatch.setattr(wheelhouse, "SKIPS", Skips())
    monkeypatch.setattr(teardown, "SKIPS", Skips())


def warned(caplog: pytest.LogCaptureFixture, key: str) -> int:
    return sum(key in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


class OneStore(MemoryProvider):
    """The test provider, its every store the one given (teardown opens it by URI)."""

    def __init__(self, store: Recording) -> None:
        super().__init__()
        self.only = store

    def store(self, uri: str) -> Recording:  # type: ignore[override]
        return self.only


def test_scrubbing_secrets_reads_a_huge_cluster_json_bounded_and_warns_once(
    store: Recording, caplog: pytest.LogCaptureFixture
) -> None:
    key = proto.cluster_key(RUN)
    cluster = {"run_id": RUN, "roles": {"chief": 1}, "port": 1, "attempt": 1, "entrypoint": "x"}
    store.put(key, huge({**cluster, "env": {"TOKEN": "s"}, "secrets": ["TOKEN"]}))
    with caplog.at_level(logging.WARNING):
        assert scrub_secrets(OneStore(store), store.uri, RUN) is False
        assert scrub_secrets(OneStore(store), store.uri, RUN) is False
    assert store.unbounded() == []
    assert store.largest <= proto.ClusterDoc.MAX_BYTES + 1
    assert warned(caplog, key) == 1


@pytest.mark.parametrize("body", [huge({"run_id": RUN}), DEEP], ids=["50 MiB", "nested"])
def test_adopting_a_run_refuses_a_cluster_json_it_cannot_read(
    store: Recording, body: bytes
) -> None:
    store.put(proto.cluster_key(RUN), body)
    with pytest.raises(UsageError, match=r"cluster\.json"):
        adopt.read_cluster(store, RUN)
    assert store.unbounded() == []
    assert store.largest <= proto.ClusterDoc.MAX_BYTES + 1


@pytest.mark.parametrize(
    "python, body", [("3.10", DEEP), ("3.11", huge({"tag": "x"}, 8 << 20))], ids=["nested", "8 MiB"]
)
def test_a_hostile_wheelhouse_manifest_is_no_wheelhouse(
    store: Recording, python: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    wheel_tag = tag(python, "x86_64", stack_pins(False))  # a key of its own: warned once
    store.put(tar_key(wheel_tag), b"x" * 1000)
    store.put(manifest_key(wheel_tag), body)
    with caplog.at_level(logging.WARNING):
        assert read_manifest(store, wheel_tag) is None
    assert store.unbounded() == []
    assert store.largest <= WHEELHOUSE_MANIFEST_MAX_BYTES + 1
    assert warned(caplog, manifest_key(wheel_tag)) == 1
    # a whole one is still read
    good = {"tag": wheel_tag, "sha256": hashlib.sha256(b"x" * 1000).hexdigest(), "size": 1000}
    pins = stack_pins(False)
    store.put(manifest_key(wheel_tag), json.dumps({**good, "pins": pins, "files": []}).encode())
    assert read_manifest(store, wheel_tag) is not None


def test_a_huge_or_nested_journal_entry_is_skipped_naming_it(
    tmp_path: Path, store: Recording
) -> None:
    laptop_run(tmp_path, store)
    names = []
    for seq, body in enumerate([huge({"op": "event"}), DEEP], start=1):
        names.append(entry_key(1, seq, "node"))
        store.put(proto.journal_prefix(RUN) + names[-1], body)
    other = Ledger(tmp_path / "other" / "ledger.db")
    warnings: list[str] = []
    assert import_journal(other, store, RUN, warn=warnings.append) == 5  # the laptop's writes
    for name in names:
        assert sum(name in w for w in warnings) == 1, (name, warnings)
    assert store.unbounded() == []
    assert store.largest <= JOURNAL_ENTRY_MAX_BYTES + 1


def test_a_huge_control_key_is_no_key(store: Recording) -> None:
    store.put(run_key.key_object(RUN), b"ab" * (5 * 1024 * 1024))
    assert run_key.fetch(store, RUN) is None
    assert store.unbounded() == []
    assert store.largest <= RUN_KEY_MAX_BYTES + 1


def test_a_huge_yield_is_no_yield(store: Recording) -> None:
    key = run_key.generate()
    store.put(proto.yield_key(RUN), huge({"owner": "attach:x:1"}))
    assert run_key.yield_asked(store, RUN, key, 1) is False
    assert store.unbounded() == []


@pytest.mark.parametrize("body", [huge({"run_id": RUN}), DEEP], ids=["50 MiB", "nested"])
def test_a_launch_doc_that_cannot_be_read_is_refused_naming_it(
    store: Recording, body: bytes
) -> None:
    store.put(proto.launch_key(RUN), body)
    with pytest.raises(UsageError, match=r"control/launch\.json"):
        launch_doc.read(store, RUN, run_key.generate())
    assert store.unbounded() == []
    assert store.largest <= LAUNCH_MAX_BYTES + 1


def test_a_signed_but_ill_typed_launch_doc_is_refused(store: Recording) -> None:
    key = run_key.generate()
    data = {"run_id": RUN, "spec": ["not", "a", "spec"], "options": {}, "started": 1.0}
    data |= {"bundle_sha256": "ab" * 32, "store_uri": store.uri}
    signed = run_key.sign_doc(key, run_key.LAUNCH, data)
    store.put(proto.launch_key(RUN), json.dumps(signed).encode())
    with pytest.raises(UsageError, match="spec"):
        launch_doc.read(store, RUN, key)
