"""The node agent reads what other nodes (running other user code) can write as untrusted input
(issue 29): every GET it makes is bounded by the document's cap (jobs/bucket_reads.py), a
document too large, too deep or ill-typed is skipped with ONE warning naming its key (in the
node's log stream), and a peer's registration it cannot read fails the rendezvous naming the
peer. A real Agent on a real LocalStore (a folder), the store's reads recorded. Node-side: runs
on Python 3.10-3.12 (tests/node-side-tests.txt)."""

# ruff: noqa: F811 - the fixtures (`store`, `work`...) are agent_kit's, taken by name

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.jobs import protocol as proto
from cloudtrain.jobs.bucket_reads import LOG_CHUNK_MAX_BYTES
from cloudtrain.jobs.checkpoints import SMALL_FILE, inside_folder
from cloudtrain.jobs.log_chunks import get_chunks
from cloudtrain.jobs.logpump import LogPump
from cloudtrain.providers.local import LocalStore
from tests.unit.agent_kit import (
    RUN_ID,
    child_groups,  # noqa: F401 - an autouse fixture: imported, it applies here
    make_agent,
    node_env,  # noqa: F401 - an autouse fixture: imported, it applies here
    put_json,
    work,  # noqa: F401 - a fixture, taken by name
)
from tests.unit.bounded_kit import DEEP, MIB, Recording, huge

ROUND_MAX_BYTES = 16 * MIB  # LOG_ROUND_MAX_BYTES: what one round of chunk GETs may hold


@pytest.fixture
def store(tmp_path: Path) -> Recording:
    bucket = Recording(f"file://{tmp_path / 'bucket'}")
    bucket.ensure_bucket()
    return bucket


def warnings_about(store: LocalStore, node: str, key: str) -> list[str]:
    """The lines of `node`'s log stream (its chunks, in order) that name `key`."""
    chunks = get_chunks(store, proto.logs_prefix(RUN_ID, node), 0)
    text = b"".join(data for _seq, data in chunks).decode()
    return [line for line in text.splitlines() if key in line]


# --- the rendezvous: every peer's registration --------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [huge({"address": "127.0.0.1:2223"}), DEEP, b'{"address": {"a": 1}}'],
    ids=["50 MiB", "nested", "ill-typed"],
)
def test_a_peer_registration_that_cannot_be_read_fails_the_rendezvous_naming_it(
    store: Recording, work: Path, body: bytes
) -> None:
    agent = make_agent(store, work, roles={"chief": 1, "worker": 1})
    key = proto.registration_key(RUN_ID, 1, "worker-0")
    store.put(key, body)
    with pytest.raises(RuntimeError, match="worker-0"):
        agent.rendezvous()
    assert store.unbounded() == []
    assert store.largest <= proto.Registration.MAX_BYTES + 1
    agent.logs.flush(final=True)
    assert len(warnings_about(store, "chief-0", key)) == 1


# --- the control documents: cluster.json, control/lease, a peer's status -------------------------
def test_a_huge_cluster_json_is_skipped_with_one_warning_and_the_attempt_goes_on(
    store: Recording, work: Path
) -> None:
    agent = make_agent(store, work)
    key = proto.cluster_key(RUN_ID)
    cluster = dict(agent.cluster.to_dict(), attempt=2)
    store.put(key, huge(cluster))
    for _ in range(3):
        agent.check_control()  # no NewAttempt: the document cannot be read
    assert agent.attempt == 1
    assert store.unbounded() == []
    assert store.largest <= proto.ClusterDoc.MAX_BYTES + 1
    agent.logs.flush(final=True)
    assert len(warnings_about(store, "chief-0", key)) == 1


def test_a_huge_or_deep_lease_is_skipped_and_no_orphan_is_reported(
    store: Recording, work: Path
) -> None:
    agent = make_agent(store, work)
    key = proto.lease_key(RUN_ID)
    store.put(key, huge({"owner": "x", "term": 3, "expires": 1.0}))
    agent.check_lease(now=1e9)
    store.put(key, DEEP)
    agent.check_lease(now=1e9)
    assert store.list(proto.orphaned_key(RUN_ID)) == []
    assert store.unbounded() == []
    assert store.largest <= proto.LeaseDoc.MAX_BYTES + 1


def test_a_huge_chief_status_is_not_a_final_one(store: Recording, work: Path) -> None:
    agent = make_agent(store, work, roles={"chief": 1, "ps": 1}, strategy="parameter_server")
    store.put(proto.status_key(RUN_ID, "chief-0"), huge({"state": "succeeded", "attempt": 1}))
    assert agent.chief_final() is False
    assert store.unbounded() == []
    assert store.largest <= proto.NodeStatus.MAX_BYTES + 1


# --- the checkpoints: a restore of what the listing named ----------------------------------------
class Growing(Recording):
    """The bucket as a restore sees it while a node rewrites a checkpoint file: the listing
    names a small object, which is 50 MiB by the time it is read."""

    grow: tuple[str, bytes] | None = None

    def list(self, prefix: str = "") -> list:  # type: ignore[type-arg]
        listed = super().list(prefix)
        if self.grow is not None:
            key, body = self.grow
            self.grow = None
            self.put(key, body)
        return listed


def test_a_checkpoint_file_that_grew_after_the_listing_is_not_read_into_memory(
    tmp_path: Path, work: Path
) -> None:
    bucket = Growing(f"file://{tmp_path / 'grown'}")
    bucket.ensure_bucket()
    key = proto.checkpoints_prefix(RUN_ID) + "ckpt-1.data"
    bucket.put(key, b"small")
    big = b"z" * (SMALL_FILE + 5 * MIB)
    bucket.grow = (key, big)
    agent = make_agent(bucket, work, roles={"chief": 1, "worker": 1})
    assert agent.restore_checkpoints() == 1
    assert (agent.ckpt_dir / "ckpt-1.data").read_bytes() == big  # whole, through get_file
    assert bucket.unbounded() == []
    assert bucket.largest <= SMALL_FILE + 1


@pytest.mark.parametrize(
    "rel, inside",
    [
        *[("ckpt-1.index", True), ("sub/ckpt", True), ("../escape", False)],
        *[("a/../../b", False), ("/etc/passwd", False), ("a//b", False), ("./a", False)],
        ("", False),
    ],
)
def test_a_restore_writes_only_inside_the_checkpoint_folder(rel: str, inside: bool) -> None:
    assert inside_folder(rel) is inside


def test_a_checkpoints_ready_marker_is_only_listed_never_read(
    store: Recording, work: Path
) -> None:
    worker = make_agent(store, work, "worker", 0, roles={"chief": 1, "worker": 1})
    store.put(proto.checkpoints_ready_key(RUN_ID, 1), DEEP)
    worker.checkpoint_barrier()  # present: the barrier is passed, whatever it holds
    assert [k for k, _ in store.bounds if k.endswith("checkpoints-ready")] == []


# --- the log stream at a restart: the index and the chunks ---------------------------------------
def test_a_huge_log_index_is_skipped_and_the_stream_is_read_from_chunk_zero(
    store: Recording,
) -> None:
    node = "chief-0"
    prefix = proto.logs_prefix(RUN_ID, node)
    store.put(proto.log_index_key(RUN_ID, node), huge({"node": node, "segments": []}))
    store.put(prefix + proto.log_chunk_name(0), b"first\n")
    pump = LogPump.resume(store, RUN_ID, node)
    assert pump.last_seq == 0
    assert store.unbounded() == []
    assert store.largest <= proto.LogIndex.MAX_BYTES + 1


def test_a_log_chunk_over_its_cap_resumes_as_a_note(store: Recording) -> None:
    node = "chief-0"
    prefix = proto.logs_prefix(RUN_ID, node)
    store.put(prefix + proto.log_chunk_name(0), b"first\n")
    store.put(prefix + proto.log_chunk_name(1), b"y" * (LOG_CHUNK_MAX_BYTES + 1))
    store.put(prefix + proto.log_chunk_name(2), b"third\n")
    pump = LogPump.resume(store, RUN_ID, node)
    assert pump.last_seq == 2
    assert store.unbounded() == []
    assert store.largest <= LOG_CHUNK_MAX_BYTES + 1
    got = dict(get_chunks(store, prefix, 0, 2))
    assert got[0] == b"first\n" and got[2] == b"third\n"
    assert b"skipped" in got[1] and len(got[1]) < 200


def test_one_round_of_chunk_reads_holds_at_most_its_byte_cap(store: Recording) -> None:
    prefix = proto.logs_prefix(RUN_ID, "chief-0")
    for seq in range(40):
        store.put(prefix + proto.log_chunk_name(seq), b"c" * (LOG_CHUNK_MAX_BYTES - 1) + b"\n")
    chunks = get_chunks(store, prefix, 0, 39)
    first = next(chunks)
    assert first[0] == 0
    assert store.total <= ROUND_MAX_BYTES, f"{store.total / MIB:.0f} MiB read for one round"
    assert sum(1 for _ in chunks) == 39  # the rest still comes, round by round
    assert store.unbounded() == []


def test_the_agent_reads_nothing_of_the_bucket_unbounded(store: Recording, work: Path) -> None:
    agent = make_agent(store, work, roles={"chief": 1, "worker": 1})
    store.put(proto.cluster_key(RUN_ID), agent.cluster.to_json())
    put_json(store, "attempt-1/nodes/worker-0.json", {"address": "127.0.0.1:2223"})
    agent.check_control()
    agent.check_lease(now=1.0)
    agent.rendezvous()
    agent.chief_final()
    assert store.bounds and store.unbounded() == [], store.unbounded()
