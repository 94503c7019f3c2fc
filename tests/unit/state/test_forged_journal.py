"""Records the nodes cannot forge (issue 29): a node writes the run's prefix (it runs the user's
code), so an entry it puts under `ledger/`, a `control/yield` or a `control/launch.json` of its
own must change nothing. Through the real Journal, Ledger and import_journal on a real local
bucket (a folder). Controller-side: the node Pythons run test_journal.py's checks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cloudtrain.jobs.protocol import journal_prefix
from cloudtrain.providers.base import Resource
from cloudtrain.providers.local import LocalStore
from cloudtrain.state.journal import Journal, entry_key, import_journal
from cloudtrain.state.ledger import Ledger

RUN = "mnist-0a1b2c"


def laptop_run(tmp_path: Path, store: LocalStore) -> Ledger:
    """A run as the laptop records it, mirrored to the bucket: it failed; one node."""
    led = Ledger(tmp_path / "laptop" / "ledger.db")
    journal = Journal(store, RUN, "laptop")
    led.journal_to(RUN, journal)
    led.create_run(RUN, "mnist", "aws", "us-east-1", None, None, store.uri, None)
    led.record_intent(Resource("aws", "node", f"ct-{RUN}-chief-0", "us-east-1", RUN), 1.0)
    led.mark_created(RUN, "node", f"ct-{RUN}-chief-0", "i-1")
    led.set_status(RUN, "running")
    led.set_status(RUN, "stopping", "failed", "the chief exited 1")
    journal.close()
    return led


def forge(store: LocalStore, entry: dict[str, object], writer: str = "node", seq: int = 1) -> str:
    """What a node can do: put an entry of its own making under the run's ledger/ prefix."""
    name = entry_key(time.time_ns(), seq, writer)
    store.put(journal_prefix(RUN) + name, json.dumps(entry).encode())
    return name


FOREIGN_ROLE = {
    "op": "record_intent",
    "at": 1.0,
    "run_id": RUN,
    "provider": "aws",
    "kind": "iam-role",
    "resource_id": "prod-admin",
    "region": "us-east-1",
    "cloud_id": None,
    "price_hourly": 0.0,
}
SUCCEEDED = {
    "op": "set_status",
    "at": 2.0,
    "run_id": RUN,
    "status": "stopping",
    "outcome": "succeeded",
    "detail": "all good",
}


def test_a_node_forged_journal_entry_is_not_replayed(tmp_path: Path) -> None:
    store = LocalStore((tmp_path / "bucket").as_uri())
    laptop_run(tmp_path, store)
    forge(store, FOREIGN_ROLE, seq=1)
    forge(store, SUCCEEDED, seq=2)
    # a signed entry copied under a new name (a replay at a later time)
    first = sorted(i.key for i in store.list(journal_prefix(RUN)))[0]
    copied = json.loads(store.get(first))
    forge(store, copied, writer="node2", seq=3)

    other = Ledger(tmp_path / "other" / "ledger.db")
    warnings: list[str] = []
    applied = import_journal(other, store, RUN, warn=warnings.append)
    rec = other.get_run(RUN)
    assert rec is not None and rec.outcome == "failed", rec
    assert [r.resource_id for r in other.resources(RUN)] == [f"ct-{RUN}-chief-0"]
    assert applied == 5  # the laptop's five writes, nothing of the node's
    # one warning for the three, naming the key they were checked against
    refused = [w for w in warnings if "MAC" in w]
    assert len(refused) == 1 and "key sha256:" in refused[0] and "3 entries" in refused[0]
    assert import_journal(other, store, RUN, warn=warnings.append) == 0  # still refused


def test_the_laptop_keeps_its_key_when_a_node_replaces_control_key(tmp_path: Path) -> None:
    from cloudtrain.state import run_key

    store = LocalStore((tmp_path / "bucket").as_uri())
    laptop = laptop_run(tmp_path, store)
    mine = laptop.run_key(RUN)
    assert mine is not None and run_key.fetch(store, RUN) == mine
    # a node (on a cloud whose bucket rules let it) plants its own key and signs with it
    planted = run_key.generate()
    run_key.publish(store, RUN, planted)
    name = entry_key(time.time_ns(), 1, "node")
    signed = run_key.sign_doc(planted, run_key.journal_purpose(name), FOREIGN_ROLE)
    store.put(journal_prefix(RUN) + name, json.dumps(signed).encode())
    warnings: list[str] = []
    assert import_journal(laptop, store, RUN, warn=warnings.append) == 0
    assert "prod-admin" not in [r.resource_id for r in laptop.resources(RUN)]
    assert laptop.run_key(RUN) == mine
    assert warnings and run_key.key_id(mine) in warnings[0]


def test_an_unsigned_journal_of_an_old_run_is_refused_with_one_warning(tmp_path: Path) -> None:
    store = LocalStore((tmp_path / "bucket").as_uri())
    forge(store, {"op": "create_run", "at": 1.0, "run_id": RUN, "name": "m", "provider": "aws"})
    forge(store, FOREIGN_ROLE, seq=2)
    other = Ledger(tmp_path / "other" / "ledger.db")
    warnings: list[str] = []
    assert import_journal(other, store, RUN, warn=warnings.append) == 0
    assert other.get_run(RUN) is None
    assert len(warnings) == 1 and "no key" in warnings[0], warnings


def test_the_ledger_file_and_its_key_are_the_users_alone(tmp_path: Path) -> None:
    store = LocalStore((tmp_path / "bucket").as_uri())
    laptop = laptop_run(tmp_path, store)
    assert laptop.path.stat().st_mode & 0o077 == 0, oct(laptop.path.stat().st_mode)
    # the key is never journaled: no entry holds it
    key_hex = (laptop.run_key(RUN) or b"").hex()
    for info in store.list(journal_prefix(RUN)):
        assert key_hex not in store.get(info.key).decode()


def test_a_yield_is_signed_and_bound_to_the_term(tmp_path: Path) -> None:
    from cloudtrain.state import run_key

    key, other = run_key.generate(), run_key.generate()
    body = run_key.yield_body(key, RUN, "attach:host:1", 3)
    assert run_key.yield_owner(body, key, RUN, 3) == "attach:host:1"
    assert run_key.yield_owner(body, key, RUN, 4) is None  # an old yield copied back
    assert run_key.yield_owner(body, other, RUN, 3) is None
    assert run_key.yield_owner(b"attach:host:1", key, RUN, 3) is None  # unsigned (the old form)
    assert run_key.yield_owner(body, None, RUN, 3) is None
    assert run_key.yield_owner(b"\xff{", key, RUN, 3) is None
    forged = json.loads(body)
    forged["owner"] = "node"
    assert run_key.yield_owner(json.dumps(forged).encode(), key, RUN, 3) is None


def test_a_launch_doc_a_node_rewrote_is_refused(tmp_path: Path) -> None:
    from cloudtrain.core.errors import UsageError
    from cloudtrain.jobs.protocol import launch_key
    from cloudtrain.state import launch_doc, run_key
    from cloudtrain.state.launch_doc import LaunchDoc

    store = LocalStore((tmp_path / "bucket").as_uri())
    key = run_key.generate()
    doc = LaunchDoc(RUN, {"name": "m"}, {"budget_usd": 5.0}, 1.0, "ab" * 32, store.uri)
    launch_doc.write(store, doc, key)
    assert launch_doc.read(store, RUN, key) == doc
    body = json.loads(store.get(launch_key(RUN)))
    body["options"] = {"budget_usd": 5000.0}
    store.put(launch_key(RUN), json.dumps(body).encode())
    with pytest.raises(UsageError, match="MAC"):
        launch_doc.read(store, RUN, key)
    store.put(launch_key(RUN), LaunchDoc(RUN, {}, {}, 1.0, "", store.uri).to_json())  # unsigned
    with pytest.raises(UsageError, match="MAC"):
        launch_doc.read(store, RUN, key)
    with pytest.raises(UsageError, match="no key"):
        launch_doc.read(store, RUN, None)
