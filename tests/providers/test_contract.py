"""The provider contract (providers/base.py), run against every provider in conftest's `CASES`.

Stores: idempotent bucket creation, round trips (bytes and a 3 MB file), NotFound, sorted listings
with plain key-prefix semantics, idempotent deletes, and presigned URLs that curl can use.
Compute (network first, as the orchestrator does): parallel create, nodes found by the run's
tags, create idempotency per (run, role, index), deleting some/all/already-gone nodes, and the
network resources' lifecycle. For providers whose nodes are processes, nothing of a deleted node
may survive.
"""

from __future__ import annotations

import os
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cloudtrain.core.errors import NotFound, TooLarge
from cloudtrain.providers.base import (
    ALIVE_STATES,
    Compute,
    NodeRequest,
    ObjectStore,
    Resource,
    RunInfo,
    node_name,
)
from tests.fakes.shell import require_tool

if TYPE_CHECKING:
    from tests.providers.conftest import Harness

SLEEPER = "#!/usr/bin/env bash\nsleep 300\n"
LAYOUT = [("chief", 0), ("worker", 0), ("worker", 1)]


def make_store(provider: Harness) -> ObjectStore:
    store = provider.provider.store(provider.store_uri)
    store.ensure_bucket()
    return store


def run_info(run_id: str, provider: Harness) -> RunInfo:
    """The run as the orchestrator describes it: its store URI is the case's bucket."""
    return RunInfo(
        run_id=run_id,
        region=None,
        zone=None,
        port_range=(2222, 2230),
        store_uri=provider.store_uri,
        # the plan's node ids (each may have its own identity): LAYOUT's and the lone ps-0
        nodes=(*(f"{role}-{index}" for role, index in LAYOUT), "ps-0"),
    )


def requests_for(run_id: str) -> list[NodeRequest]:
    return [NodeRequest(run_id, role, index, "small", SLEEPER) for role, index in LAYOUT]


def fetch(url: str) -> bytes:
    """GET a presigned URL the way a node does (curl; fails without it: `require_tool`)."""
    return subprocess.run(
        [require_tool("curl"), "-fsS", url], check=True, capture_output=True, timeout=30
    ).stdout


def upload(url: str, path: Path, *headers: str) -> None:
    """PUT a file to a presigned URL the way the bootstrap script does (`curl -T`), with the
    headers the provider's PUT needs (Azure: `x-ms-blob-type: BlockBlob`)."""
    extra = [arg for header in headers for arg in ("-H", header)]
    curl = require_tool("curl")
    subprocess.run([curl, "-fsS", *extra, "-T", str(path), url], check=True, timeout=30)


# --- ObjectStore -------------------------------------------------------------------------------


def test_ensure_bucket_is_idempotent(provider: Harness) -> None:
    store = provider.provider.store(provider.store_uri)
    first = store.ensure_bucket()
    second = store.ensure_bucket()
    assert first == second
    assert first.kind == "bucket"
    store.put("k", b"v")
    store.ensure_bucket()
    assert store.get("k") == b"v", "ensuring an existing bucket keeps its objects"


def test_put_get_round_trip(provider: Harness) -> None:
    store = make_store(provider)
    payload = bytes(range(256)) * 3
    store.put("runs/r/cluster.json", payload)
    assert store.get("runs/r/cluster.json") == payload
    store.put("runs/r/cluster.json", b"{}")  # overwrite
    assert store.get("runs/r/cluster.json") == b"{}"
    store.put("empty", b"")
    assert store.get("empty") == b""
    # a second handle on the same URI sees the same objects
    assert provider.provider.store(provider.store_uri).get("runs/r/cluster.json") == b"{}"


def test_a_bounded_get_reads_at_most_its_bound(provider: Harness) -> None:
    """`get`/`get_tagged` with `max_bytes` (issue 29): an object within the bound reads whole
    (an empty one too), one past it raises TooLarge, a missing one is still NotFound/None."""
    store = make_store(provider)
    payload = bytes(range(256)) * 40  # 10,240 bytes
    store.put("runs/r/status/chief-0.json", payload)
    store.put("runs/r/empty", b"")
    assert store.get("runs/r/status/chief-0.json", max_bytes=len(payload)) == payload
    assert store.get("runs/r/empty", max_bytes=10) == b""
    with pytest.raises(TooLarge):
        store.get("runs/r/status/chief-0.json", max_bytes=len(payload) - 1)
    found = store.get_tagged("runs/r/status/chief-0.json", max_bytes=len(payload))
    assert found is not None and found[0] == payload
    empty = store.get_tagged("runs/r/empty", max_bytes=10)
    assert empty is not None and empty[0] == b""
    with pytest.raises(TooLarge) as too_large:
        store.get_tagged("runs/r/status/chief-0.json", max_bytes=100)
    # with the object's tag, which a conditional write takes (a huge lease is replaced)
    assert too_large.value.tag == found[1]
    store.put_if("runs/r/status/chief-0.json", b"{}", too_large.value.tag)
    assert store.get("runs/r/status/chief-0.json", max_bytes=10) == b"{}"
    with pytest.raises(NotFound):
        store.get("runs/r/missing.json", max_bytes=10)
    assert store.get_tagged("runs/r/missing.json", max_bytes=10) is None


def test_get_of_a_missing_key_is_not_found(provider: Harness, tmp_path: Path) -> None:
    store = make_store(provider)
    with pytest.raises(NotFound):
        store.get("nope/missing.json")
    with pytest.raises(NotFound):
        store.get_file("nope/missing.json", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_put_file_get_file_with_3mb(provider: Harness, tmp_path: Path) -> None:
    store = make_store(provider)
    src = tmp_path / "big.bin"
    data = os.urandom(3 * 1024 * 1024)
    src.write_bytes(data)
    store.put_file("blobs/big.bin", str(src))
    dest = tmp_path / "deep" / "er" / "copy.bin"
    store.get_file("blobs/big.bin", str(dest))
    assert dest.read_bytes() == data
    assert [(o.key, o.size) for o in store.list("blobs/")] == [("blobs/big.bin", len(data))]
    store.put_file("blobs/big.bin", str(src))  # idempotent
    assert store.get("blobs/big.bin") == data


def test_list_is_sorted_and_prefix_exact(provider: Harness) -> None:
    store = make_store(provider)
    keys = ["b", "a/bcd/x", "a/b/y/z", "ab", "a/bc", "a/b/x"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * (i + 1))

    def listed(prefix: str) -> list[str]:
        objs = store.list(prefix)
        names = [o.key for o in objs]
        assert names == sorted(names), f"list({prefix!r}) is not sorted"
        return names

    assert listed("") == sorted(keys)
    assert listed("a/b/") == ["a/b/x", "a/b/y/z"]
    assert listed("a/bc") == ["a/bc", "a/bcd/x"]
    assert listed("a/b") == ["a/b/x", "a/b/y/z", "a/bc", "a/bcd/x"]
    assert listed("a/b/y/z") == ["a/b/y/z"]
    assert listed("a") == ["a/b/x", "a/b/y/z", "a/bc", "a/bcd/x", "ab"]
    assert listed("nope/") == []
    sizes = {o.key: o.size for o in store.list("")}
    assert sizes == {key: i + 1 for i, key in enumerate(keys)}
    assert all(o.updated > 0 for o in store.list(""))


def test_delete_and_delete_prefix_are_idempotent(provider: Harness) -> None:
    store = make_store(provider)
    for key in ["logs/w-0/1.log", "logs/w-0/2.log", "logs/w-01/1.log", "status/w-0.json"]:
        store.put(key, b"x")
    store.delete("status/w-0.json")
    store.delete("status/w-0.json")
    store.delete("never/existed")
    with pytest.raises(NotFound):
        store.get("status/w-0.json")
    assert store.delete_prefix("logs/w-0/") == 2
    assert store.delete_prefix("logs/w-0/") == 0
    assert store.delete_prefix("nothing/here/") == 0
    assert [o.key for o in store.list("")] == ["logs/w-01/1.log"]


def test_presign_get_is_readable_by_curl(provider: Harness) -> None:
    if not provider.case.fetchable_urls:
        pytest.skip(f"{provider.name}: presigned URLs of an in-memory fake are not fetchable")
    store = make_store(provider)
    data = os.urandom(100_000)
    store.put("cloudtrain/runs/r/bundle/abc.tar.gz", data)
    url = store.presign_get("cloudtrain/runs/r/bundle/abc.tar.gz", ttl_s=600)
    assert urllib.parse.urlparse(url).scheme in ("file", "http", "https")
    assert fetch(url) == data


def test_presign_put_is_writable_by_curl(provider: Harness, tmp_path: Path) -> None:
    if not provider.case.fetchable_urls:
        pytest.skip(f"{provider.name}: presigned URLs of an in-memory fake are not fetchable")
    store = make_store(provider)
    log = tmp_path / "bootstrap.log"
    log.write_text("phase 1\nFAILED: something\n")
    url = store.presign_put("cloudtrain/runs/r/bootstrap/worker-0.log", ttl_s=600)
    headers = getattr(provider.case, "put_headers", ())  # a bare case (unit tests) has none
    upload(url, log, *headers)
    assert store.get("cloudtrain/runs/r/bootstrap/worker-0.log") == log.read_bytes()
    log.write_text("second upload replaces the first\n")
    upload(url, log, *headers)
    assert store.get("cloudtrain/runs/r/bootstrap/worker-0.log") == log.read_bytes()


# --- Compute -----------------------------------------------------------------------------------


def summary(compute: Compute, run_id: str) -> list[tuple[str, str, int]]:
    return sorted((n.name, n.role, n.index) for n in compute.list_nodes(run_id))


def test_nodes_lifecycle(provider: Harness) -> None:
    compute = provider.compute
    run_id = provider.run_id()
    other = provider.run_id()
    run = run_info(run_id, provider)
    expected = sorted((node_name(run_id, role, i), role, i) for role, i in LAYOUT)

    compute.ensure_network(run)  # the orchestrator's order: network, then nodes
    created = compute.create_nodes(run, requests_for(run_id))
    assert sorted((n.name, n.role, n.index) for n in created) == expected
    assert all(n.run_id == run_id and n.state in ALIVE_STATES for n in created)

    listed = compute.list_nodes(run_id)
    assert sorted((n.name, n.role, n.index) for n in listed) == expected
    assert all(n.state in ("running", "pending") for n in listed)
    assert compute.list_nodes(other) == [], "nodes are found by their own run's tags only"
    ids = {n.name: n.cloud_id for n in listed}
    if provider.case.runs_scripts:
        assert all(provider.case.leftovers(n) for n in listed), "each node runs its script"

    # the same requests again make no duplicate: same names, same machines
    again = compute.create_nodes(run, requests_for(run_id))
    assert sorted(n.name for n in again) == [e[0] for e in expected]
    relisted = compute.list_nodes(run_id)
    assert summary(compute, run_id) == expected
    assert {n.name: n.cloud_id for n in relisted} == ids

    # delete one by name: only that one goes; on a gang compute (one allocation) all go
    victim = next(n for n in relisted if n.role == "worker" and n.index == 1)
    compute.delete_nodes(run_id, names=[victim.name])
    kept = [] if compute.gang else [e for e in expected if e[0] != victim.name]
    assert summary(compute, run_id) == kept
    assert provider.case.leftovers(victim) == []
    compute.delete_node(victim)  # already gone: fine
    compute.delete_nodes(run_id, names=[victim.name, node_name(run_id, "worker", 9)])

    # delete the rest, twice
    compute.delete_nodes(run_id)
    assert compute.list_nodes(run_id) == []
    compute.delete_nodes(run_id)
    assert compute.list_nodes(run_id) == []
    for node in relisted:
        assert provider.case.leftovers(node) == [], f"{node.name} left processes behind"
        compute.delete_node(node)  # stale handle of a deleted node: fine
    compute.delete_nodes(other)  # a run that never had nodes


def test_delete_of_a_run_without_nodes_is_fine(provider: Harness) -> None:
    compute = provider.compute
    run_id = provider.run_id()
    compute.delete_nodes(run_id)
    compute.delete_nodes(run_id, names=[node_name(run_id, "chief", 0)])
    assert compute.list_nodes(run_id) == []


def test_recreate_after_delete_makes_a_fresh_node(provider: Harness) -> None:
    compute = provider.compute
    run_id = provider.run_id()
    request = NodeRequest(run_id, "ps", 0, "small", SLEEPER)
    run = run_info(run_id, provider)
    compute.ensure_network(run)
    (first,) = compute.create_nodes(run, [request])
    compute.delete_nodes(run_id)
    assert compute.list_nodes(run_id) == []
    (second,) = compute.create_nodes(run, [request])
    assert second.name == first.name == node_name(run_id, "ps", 0)
    assert [n.name for n in compute.list_nodes(run_id)] == [first.name]
    if first.cloud_id != second.cloud_id:
        assert provider.case.leftovers(first) == [], "the deleted node's processes are gone"


def test_network_resources_lifecycle(provider: Harness) -> None:
    compute = provider.compute
    run_id = provider.run_id()
    run = run_info(run_id, provider)

    def keys(resources: list[Resource]) -> set[tuple[str, str]]:
        return {(r.kind, r.id) for r in resources}

    planned = compute.planned_network(run)
    assert compute.planned_network(run) == planned, "planned_network is pure"
    ensured = compute.ensure_network(run)
    assert keys(ensured) == keys(planned)
    assert all(r.run_id == run_id for r in ensured)
    assert keys(compute.ensure_network(run)) == keys(ensured), "ensure_network is idempotent"
    assert keys(ensured) <= keys(compute.list_resources(run_id))
    assert compute.list_resources(provider.run_id()) == []

    compute.delete_resources(ensured)
    assert compute.list_resources(run_id) == []
    compute.delete_resources(ensured)  # already deleted: fine
    compute.delete_resources([])
    assert compute.list_resources(run_id) == []
