"""What an Azure node's identity may do in the run's container (issue 29, least privilege).

The node's Storage Blob Data Contributor assignment is taken from the ARM fake as AzureCompute
really created it (through the real azure-mgmt clients; the fake parses its ABAC condition),
and its condition is EVALUATED (tests/fakes/arm_conditions.py) for every key of the bucket
protocol, built with jobs/protocol.py's key builders: the node may not read `control/key`, nor
write or delete the controller's documents (`control/*` but `control/orphaned`, `cluster.json`,
`ledger/`, `bundle/`), and keeps every read and write the agent makes. Listing is not narrowed
(it names blobs, it reads none), and nothing outside the run's prefix is read or written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cloudtrain import run_key
from cloudtrain.jobs import protocol as proto
from cloudtrain.providers.azure import identity
from cloudtrain.providers.azure.bodies import STORAGE_BLOB_DATA_CONTRIBUTOR
from cloudtrain.providers.azure.compute import AzureCompute
from tests.fakes.arm_conditions import BLOBS, ConditionError, Request, evaluate, like, parse
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azurite, azurite_session
from tests.unit.node_rights_kit import node_rights
from tests.unit.test_azure_compute import RUN, compute, request, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session", "compute"]  # fixtures, for pytest
ME, PEER = proto.node_id("worker", 0), proto.node_id("worker", 1)
WRITES = ("write", "add/action", "delete", "move/action")  # the role's data actions but read


def may(condition: str, action: str, path: str | None, sub: str | None = None) -> bool:
    """Whether the condition lets the node do `action` (a blob data action) on `path`."""
    resource = {} if path is None else {"path": path}
    return evaluate(condition, Request(f"{BLOBS}/{action}", {}, resource, sub))


@pytest.fixture
def condition(compute: AzureCompute, azure_cloud: AzureCloud) -> Iterator[str]:
    """The condition of the worker's container grant, as the ARM fake holds it."""
    compute.ensure_network(run_info())
    compute.create_node(run_info(), request(0, gpu=False))
    (vm,) = azure_cloud.arm.resources(kind="virtualMachines")
    principal = vm["identity"]["principalId"]
    blob: list[dict[str, Any]] = [
        a["properties"]
        for a in azure_cloud.arm.role_assignments()
        if a["properties"]["principalId"] == principal
        and a["properties"]["roleDefinitionId"].endswith(STORAGE_BLOB_DATA_CONTRIBUTOR)
    ]
    assert len(blob) == 1 and blob[0]["scope"].endswith(f"/containers/ct-{RUN}")
    assert blob[0]["conditionVersion"] == "2.0", blob[0]
    yield str(blob[0]["condition"])


def test_the_node_is_refused_the_run_key_and_the_controllers_documents(condition: str) -> None:
    wrong = []
    for key, (read, write) in node_rights(RUN).items():
        if may(condition, "read", key) != read:
            wrong.append(f"read {key}: {not read}")
        for action in WRITES:
            if may(condition, action, key) != write:
                wrong.append(f"{action} {key}: {not write}")
    assert wrong == []


def test_listing_stays_open_and_nothing_outside_the_run_is_reached(condition: str) -> None:
    listing = "Blob.List"
    assert may(condition, "read", None, listing), "a listing names blobs, it has no path"
    assert not may(condition, "read", None), "a blob read without a path is refused"
    other = "unit-def456"
    for key in (run_key.key_object(other), proto.status_key(other, ME), "cloudtrain/x"):
        assert not may(condition, "read", key), key
        assert not any(may(condition, a, key) for a in WRITES), key
    # a name that only starts like a controller document is the node's to write
    assert may(condition, "write", proto.run_prefix(RUN) + "controlx/notes.txt")


def test_a_store_prefix_moves_every_rule_under_it() -> None:
    cond = identity.node_bucket_condition("team/a*b", RUN)
    parse(cond)  # the fake's grammar: what ARM accepts
    root = "team/a*b/"
    assert not may(cond, "read", root + run_key.key_object(RUN))
    assert may(cond, "read", root + proto.cluster_key(RUN))
    assert not may(cond, "write", root + proto.lease_key(RUN))
    assert may(cond, "write", root + proto.status_key(RUN, PEER))  # per node: out of scope
    assert not may(cond, "write", "team/aXb/" + proto.status_key(RUN, ME)), "* is literal"
    assert not may(cond, "read", proto.cluster_key(RUN)), "outside the prefix"


def test_the_fakes_like_is_azures() -> None:
    assert like("abcd", "a*c?") and not like("abcd", "A*C?") and not like("abcd", "a*c")
    assert like("a/b/c", "a/*") and like("a*b", "a\\*b") and not like("axb", "a\\*b")


def test_the_fake_refuses_what_arm_refuses() -> None:
    path = f"@Resource[{BLOBS}:path]"
    for bad in (
        f"{path} StringLike 'a' AND {path} StringLike 'b' OR {path} StringLike 'c'",  # parens
        f"@Request[{BLOBS}:path] StringLike 'a'",  # path is a resource attribute
        f"{path} StringStartsWith 'a'",  # not in the subset
        f"{path} StringLike {{'a', 'b'}}",  # one value without a cross-product operator
        "SubOperationMatches{'Blob.Write.Tier'}",
    ):
        with pytest.raises(ConditionError):
            parse(bad)
