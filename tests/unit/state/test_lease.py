"""The run's control lease (cloudtrain/state/lease.py) and fencing (cloudtrain/state/fencing.py),
on the
local store (a real folder bucket, lock + atomic rename) and, for the race of a paused process,
under the faults wrapper's store latency. The conditional writes of the cloud stores are
tests/unit/providers/test_conditional_writes.py's."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.core.errors import LeaseHeld, LeaseLost
from cloudtrain.jobs import protocol
from cloudtrain.providers.base import NodeRequest, ObjectStore, RunInfo
from cloudtrain.providers.faults import FaultyStore, _Injector
from cloudtrain.providers.local import LocalStore
from cloudtrain.state import run_key
from cloudtrain.state.fencing import FencedCompute
from cloudtrain.state.lease import Lease, LeaseKeeper, read_lease
from tests.fakes.memory_provider import MemoryCompute
from tests.unit.bounded_kit import MIB, Recording, huge

RUN = "lease-run-1"


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return LocalStore("file://" + str(tmp_path / "bucket"))


def _request(name_index: int = 1) -> NodeRequest:
    return NodeRequest(RUN, "worker", name_index, "cpu", "#!/bin/sh\n")


INFO = RunInfo(RUN, "mem-1", None, (2222, 2222))


def test_a_new_lease_is_term_one_and_a_live_one_is_refused(store: ObjectStore) -> None:
    first = Lease(store, RUN, "run:a", ttl_s=30)
    assert first.acquire() == 1
    with pytest.raises(LeaseHeld, match=r"controlled by run:a \(term 1"):
        Lease(store, RUN, "attach:b", ttl_s=30).acquire()
    doc = read_lease(store, RUN)
    assert doc is not None and (doc.owner, doc.term) == ("run:a", 1)
    first.renew()  # same term, later expiry
    assert read_lease(store, RUN).term == 1  # type: ignore[union-attr]


def test_an_expired_lease_is_taken_with_the_next_term_and_the_old_owner_is_fenced(
    store: ObjectStore,
) -> None:
    old = Lease(store, RUN, "controller:x", ttl_s=1.0)
    old.acquire()
    compute = MemoryCompute()
    fenced = FencedCompute(compute, old)
    fenced.create_node(INFO, _request(0))  # while it holds: acts
    time.sleep(1.1)
    new = Lease(store, RUN, "attach:y", ttl_s=30)
    assert new.acquire() == 2
    with pytest.raises(LeaseLost):
        fenced.create_node(INFO, _request(1))
    with pytest.raises(LeaseLost):
        fenced.delete_nodes(RUN)
    assert compute.creations == {f"ct-{RUN}-worker-0": 1}  # nothing after the takeover
    assert set(compute.nodes) == {f"ct-{RUN}-worker-0"}


def test_a_handover_names_the_successor_who_alone_takes_it_while_live(store: ObjectStore) -> None:
    laptop = Lease(store, RUN, "run:laptop", ttl_s=30)
    laptop.acquire()
    laptop.release("controller:ct-x", ttl_s=30)
    with pytest.raises(LeaseHeld):
        Lease(store, RUN, "attach:other", ttl_s=30).acquire()
    assert Lease(store, RUN, "controller:ct-x", ttl_s=30).acquire() == 2
    with pytest.raises(LeaseLost):  # released: the laptop acts no more
        laptop.check()


def test_a_release_without_successor_expires_now(store: ObjectStore) -> None:
    a = Lease(store, RUN, "run:a", ttl_s=30)
    a.acquire()
    a.release()
    assert Lease(store, RUN, "attach:b", ttl_s=30).acquire() == 2


def test_down_takes_a_live_lease_by_force_and_fences_its_holder(store: ObjectStore) -> None:
    holder = Lease(store, RUN, "controller:c", ttl_s=30)
    holder.acquire()
    assert Lease(store, RUN, "down:d", ttl_s=30).acquire(force=True) == 2
    with pytest.raises(LeaseLost, match="now down:d"):
        holder.check()


def test_the_keeper_renews_and_reports_a_loss(store: ObjectStore) -> None:
    lease = Lease(store, RUN, "run:k", ttl_s=1.2)
    lease.acquire()
    lost: list[str] = []
    keeper = LeaseKeeper(lease, lost.append).start()
    time.sleep(2.0)  # past the ttl: alive only because the keeper renewed it
    with pytest.raises(LeaseHeld):
        Lease(store, RUN, "attach:z", ttl_s=30).acquire()
    Lease(store, RUN, "down:d", ttl_s=30).acquire(force=True)
    assert keeper.lost.wait(2.0)
    keeper.stop()
    assert lost and "lost the lease" in lost[0]


def test_the_keeper_yields_when_asked(store: ObjectStore) -> None:
    lease = Lease(store, RUN, "controller:c", ttl_s=1.2)
    lease.acquire()
    key = protocol.yield_key(RUN)
    keeper = LeaseKeeper(lease, should_yield=lambda: store.get_tagged(key) is not None).start()
    store.put(key, b"attach:me")
    assert keeper.lost.wait(2.0)
    assert Lease(store, RUN, "attach:me", ttl_s=30).acquire() == 2  # expired at once


def test_a_paused_controller_that_resumes_late_does_nothing(store: ObjectStore) -> None:
    """Two controllers race for the lease. A's renewal is held up in the store (the faults
    wrapper's latency: a process paused mid-call) until after its lease expired and B took it.
    When A's write lands, its tag is stale: A learns its term is old and acts no more."""
    slow = FaultyStore(store, _Injector(latency_s=2.0, error_rate=0.0, seed=0))
    a = Lease(slow, RUN, "controller:a", ttl_s=3.0)
    a.acquire()  # its expiry: written ~2 s before it lands
    compute = MemoryCompute()
    fenced_a = FencedCompute(compute, a)
    b = Lease(store, RUN, "attach:b", ttl_s=30.0)
    took: list[int] = []

    def race() -> None:  # B takes the lease the moment it expires
        while True:
            try:
                took.append(b.acquire())
                return
            except LeaseHeld:
                time.sleep(0.05)

    racer = threading.Thread(target=race)
    racer.start()
    with pytest.raises(LeaseLost):
        fenced_a.create_node(INFO, _request(1))  # its check's renewal lands after B's takeover
    racer.join(10)
    assert took == [2]
    with pytest.raises(LeaseLost):
        fenced_a.delete_listed(list(compute.nodes.values()))
    assert compute.creations == {}  # A never acted after the takeover
    FencedCompute(compute, b).create_node(INFO, _request(1))  # B does
    assert list(compute.creations.values()) == [1]


class _Clock:
    """A wall clock the test moves: a process paused (a closed lid) sees time jump."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_controller_paused_past_its_expiry_takes_its_untouched_lease_back(
    store: ObjectStore,
) -> None:
    """A laptop's lid closes for twice the ttl and nobody else wants the run: the lease in the
    bucket still carries this process's last write, so the conditional renewal proves that nobody
    acted meanwhile. The controller carries on with the same term (issue 29)."""
    clock = _Clock()
    lease = Lease(store, RUN, "run:laptop", ttl_s=30, clock=clock)
    assert lease.acquire() == 1
    compute = MemoryCompute()
    fenced = FencedCompute(compute, lease)
    clock.now += 60  # the lid was closed
    fenced.create_node(INFO, _request(0))  # its fence renews: untouched, so it is still its own
    doc = read_lease(store, RUN)
    assert doc is not None and (doc.owner, doc.term) == ("run:laptop", 1)
    assert doc.expires == pytest.approx(clock.now + 30)
    assert set(compute.nodes) == {f"ct-{RUN}-worker-0"}


def test_a_paused_controller_whose_lease_was_taken_is_fenced_and_names_the_holder(
    store: ObjectStore,
) -> None:
    clock = _Clock()
    lease = Lease(store, RUN, "run:laptop", ttl_s=30, clock=clock)
    lease.acquire()
    clock.now += 60
    assert Lease(store, RUN, "attach:desk", ttl_s=30, clock=clock).acquire() == 2
    with pytest.raises(LeaseLost, match=r"now attach:desk \(term 2"):
        lease.renew()
    assert read_lease(store, RUN).owner == "attach:desk"  # type: ignore[union-attr]


def test_the_keeper_keeps_the_loss_naming_the_new_holder(store: ObjectStore) -> None:
    lease = Lease(store, RUN, "run:k", ttl_s=1.2)
    lease.acquire()
    keeper = LeaseKeeper(lease).start()
    Lease(store, RUN, "attach:desk", ttl_s=30).acquire(force=True)
    assert keeper.lost.wait(5.0)
    keeper.stop()
    assert "now attach:desk (term 2" in keeper.reason


# --- a lease a node forged (issue 29): the run's key signs every controller's write ----------


def _forge(store: ObjectStore, **fields: object) -> None:
    """What a node's user code can do: put any bytes at control/lease (no key, no tag)."""
    doc = {"owner": "attach:evil", "term": 99, "expires": time.time() + 3600, "version": 1}
    doc.update(fields)
    store.put(protocol.lease_key(RUN), json.dumps(doc).encode())


def test_a_lease_a_node_forged_is_taken_back_and_said(store: ObjectStore) -> None:
    key = run_key.generate()
    forged: list[str] = []
    lease = Lease(store, RUN, "run:laptop", ttl_s=30, key=key, on_forged=forged.append)
    assert lease.acquire() == 1
    _forge(store)
    lease.renew()  # not a takeover: nobody with the run's key wrote it
    doc = read_lease(store, RUN)
    assert doc is not None and (doc.owner, doc.term) == ("run:laptop", 1)
    assert len(forged) == 1 and "attach:evil" in forged[0]
    FencedCompute(MemoryCompute(), lease).create_node(INFO, _request(0))  # and it still acts


def test_an_old_signed_lease_copied_back_is_a_forgery_too(store: ObjectStore) -> None:
    key = run_key.generate()
    lease = Lease(store, RUN, "run:laptop", ttl_s=30, key=key)
    lease.acquire()
    old = store.get(protocol.lease_key(RUN))  # signed, this term, an earlier expiry
    lease.renew()
    store.put(protocol.lease_key(RUN), old)  # a node replays it
    lease.renew()
    assert read_lease(store, RUN).owner == "run:laptop"  # type: ignore[union-attr]


def test_a_signed_takeover_still_fences_the_old_holder(store: ObjectStore) -> None:
    key = run_key.generate()
    lease = Lease(store, RUN, "run:laptop", ttl_s=30, key=key)
    lease.acquire()
    assert Lease(store, RUN, "down:d", ttl_s=30, key=key).acquire(force=True) == 2
    with pytest.raises(LeaseLost, match="now down:d"):
        lease.renew()


def test_a_forged_live_lease_does_not_keep_a_controller_out(store: ObjectStore) -> None:
    key = run_key.generate()
    Lease(store, RUN, "run:laptop", ttl_s=30, key=key).acquire()
    _forge(store, term=7)
    assert Lease(store, RUN, "attach:desk", ttl_s=30, key=key).acquire() > 7


def test_a_huge_forged_lease_is_never_read_whole_and_is_taken_back(tmp_path: Path) -> None:
    """A node puts 20 MiB at control/lease: every read of the lease is bounded (the store reads
    at most the cap and one byte), the holder still takes its lease back over it, and another
    controller counts it as expired, not as a holder's."""
    store = Recording("file://" + str(tmp_path / "bucket"))
    key = run_key.generate()
    lease = Lease(store, RUN, "run:laptop", ttl_s=30, key=key)
    lease.acquire()
    store.put(protocol.lease_key(RUN), huge({"owner": "attach:evil", "term": 99}, 20 * MIB))
    lease.renew()
    assert read_lease(store, RUN).owner == "run:laptop"  # type: ignore[union-attr]
    store.put(protocol.lease_key(RUN), huge({"owner": "attach:evil", "term": 99}, 20 * MIB))
    assert Lease(store, RUN, "attach:desk", ttl_s=30, key=key).acquire() > 1
    with pytest.raises(LeaseLost, match="now attach:desk"):
        lease.renew()
    assert store.unbounded() == [] and store.largest < MIB


def test_a_takeover_over_a_forged_lease_outranks_every_earlier_term(store: ObjectStore) -> None:
    """A forgery says nothing true of the term: the node may write term 0 (or an unreadable
    lease). The next controller's term must still exceed the last genuine one, or the old
    holder would take its lease back from a genuine takeover, and both would act."""
    key = run_key.generate()
    laptop = Lease(store, RUN, "run:laptop", ttl_s=30, key=key)
    laptop.acquire()
    _forge(store, term=0, expires=0)
    desk = Lease(store, RUN, "attach:desk", ttl_s=30, key=key)
    assert desk.acquire() > 1
    with pytest.raises(LeaseLost, match="now attach:desk"):
        laptop.renew()
    desk.renew()  # and the new holder keeps it
