"""What an Azure node's identity may do in the run's container (issue 29, least privilege).

Each node's container assignment (the node role, node_role.py) is taken from the ARM fake as
AzureCompute really created it for that node's VM (through the real azure-mgmt clients; the
fake parses its ABAC condition), and its condition is EVALUATED (tests/fakes/arm_conditions.py)
for every key of node_rights_kit's table for that node (chief-0, worker-0, worker-1, worker-10
of one run): the node may not read `control/key`, nor write or delete the controller's
documents or another node's keys, and keeps every read and write its agent makes (the chief
also its checkpoints, model, TensorBoard, orphan notice and restore marker). A listing (no
path) is narrowed by its request's prefix to the run's, and nothing outside the run's prefix is
read or written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from cloudtrain.core.errors import ProviderError
from cloudtrain.jobs import protocol as proto
from cloudtrain.providers.azure import identity, node_role
from cloudtrain.providers.azure.compute import AzureCompute
from cloudtrain.providers.base import NodeRequest
from cloudtrain.state import run_key
from tests.fakes.arm_conditions import BLOBS, ConditionError, Request, evaluate, like, parse
from tests.fakes.azure_cloud import AzureCloud, azure_cloud, azurite, azurite_session
from tests.unit.node_rights_kit import NODES, node_rights, other_runs
from tests.unit.providers.azure.test_azure_compute import RUN, compute, run_info

__all__ = ["azure_cloud", "azurite", "azurite_session", "compute"]  # fixtures, for pytest
ME, PEER = proto.node_id("worker", 0), proto.node_id("worker", 1)
WRITES = ("write", "add/action", "delete", "move/action")  # the role's data actions but read


def may(
    condition: str,
    action: str,
    path: str | None,
    sub: str | None = None,
    prefix: str | None = None,
) -> bool:
    """Whether the condition lets the node do `action` (a blob data action) on `path` (a
    listing: suboperation Blob.List with the request's `prefix`, if any)."""
    resource = {} if path is None else {"path": path}
    request = {} if prefix is None else {"prefix": prefix}
    return evaluate(condition, Request(f"{BLOBS}/{action}", request, resource, sub))


def lists(condition: str, prefix: str | None) -> bool:
    """Whether the condition lets the node list with `prefix` (None: no prefix at all)."""
    return may(condition, "read", None, "Blob.List", prefix)


def node_request(node: str) -> NodeRequest:
    role, _, index = node.rpartition("-")
    return NodeRequest(RUN, role, int(index), "Standard_D4s_v5", "#!/bin/bash\n", spot=True)


@pytest.fixture
def conditions(compute: AzureCompute, azure_cloud: AzureCloud) -> Iterator[dict[str, str]]:
    """Node id -> the condition of its VM identity's container grant, as the ARM fake holds
    it, for the nodes of node_rights_kit's run (RunInfo.nodes names them all)."""
    run = dataclasses.replace(run_info(), nodes=NODES)
    compute.ensure_network(run)
    for node in NODES:
        compute.create_node(run, node_request(node))
    found = {}
    role = node_role.role_guid(compute.subscription)  # data actions only (node_role.py)
    for vm in azure_cloud.arm.resources(kind="virtualMachines"):
        principal = vm["identity"]["principalId"]
        blob: list[dict[str, Any]] = [
            a["properties"]
            for a in azure_cloud.arm.role_assignments()
            if a["properties"]["principalId"] == principal
            and a["properties"]["roleDefinitionId"].endswith(role)
        ]
        assert len(blob) == 1 and blob[0]["scope"].endswith(f"/containers/ct-{RUN}")
        assert blob[0]["conditionVersion"] == "2.0", blob[0]
        tags = vm["tags"]
        found[proto.node_id(tags["cloudtrain-role"], int(tags["cloudtrain-index"]))] = str(
            blob[0]["condition"]
        )
    assert sorted(found) == sorted(NODES)
    yield found


@pytest.fixture
def condition(conditions: dict[str, str]) -> str:
    """The condition of worker-0's container grant."""
    return conditions[ME]


def wrong_rights(condition: str, table: dict[str, tuple[bool, bool]]) -> list[str]:
    """Where the condition disagrees with a key -> (read, write) table."""
    wrong = []
    for key, (read, write) in table.items():
        if may(condition, "read", key) != read:
            wrong.append(f"read {key}: {not read}")
        for action in WRITES:
            if may(condition, action, key) != write:
                wrong.append(f"{action} {key}: {not write}")
    return wrong


@pytest.mark.parametrize("node", NODES)
def test_each_node_writes_its_own_keys_and_its_roles_only(
    conditions: dict[str, str], node: str
) -> None:
    table = {**node_rights(RUN, node), **other_runs(RUN)}
    assert wrong_rights(conditions[node], table) == [], node


def test_a_node_lists_only_under_its_runs_prefix(condition: str) -> None:
    # List Blobs has no path; its Request attribute blobs:prefix is compared instead
    assert lists(condition, proto.status_prefix(RUN))
    assert lists(condition, proto.run_prefix(RUN))
    assert lists(condition, proto.stop_key(RUN)), "the agent lists one key to see if it is there"
    assert not lists(condition, proto.run_prefix("unit-def456")), "another run's names"
    assert not lists(condition, proto.RUNS_ROOT), "every run's names"
    assert not lists(condition, ""), "the whole container"
    assert not lists(condition, None), "no prefix: nothing to compare, refused"
    assert not lists(condition, proto.run_prefix(RUN)[:-1]), "a run whose id extends this one's"


def test_nothing_outside_the_run_is_reached(condition: str) -> None:
    assert not may(condition, "read", None), "a blob read without a path is refused"
    other = "unit-def456"
    for key in (run_key.key_object(other), proto.status_key(other, ME), "cloudtrain/x"):
        assert not may(condition, "read", key), key
        assert not any(may(condition, a, key) for a in WRITES), key
    # inside the run, nothing but its own keys: no new folder of its own making
    assert not may(condition, "write", proto.run_prefix(RUN) + "controlx/notes.txt")


def test_a_store_prefix_moves_every_rule_under_it() -> None:
    cond = identity.node_bucket_condition("team/a*b", RUN, ME, chief=False)
    parse(cond)  # the fake's grammar: what ARM accepts
    root = "team/a*b/"
    assert not may(cond, "read", root + run_key.key_object(RUN))
    assert may(cond, "read", root + proto.cluster_key(RUN))
    assert not may(cond, "write", root + proto.lease_key(RUN))
    assert may(cond, "write", root + proto.status_key(RUN, ME))
    assert not may(cond, "write", root + proto.status_key(RUN, PEER))
    assert not may(cond, "write", "team/aXb/" + proto.status_key(RUN, ME)), "* is literal"
    assert not may(cond, "read", proto.cluster_key(RUN)), "outside the prefix"
    assert lists(cond, root + proto.status_prefix(RUN))
    assert not lists(cond, proto.status_prefix(RUN)), "a listing outside the store's folder"


def test_the_condition_stays_within_azures_limit() -> None:
    # "A condition can be up to 8 KB long" (conditions-faq): the chief's, the longest, with a
    # long store prefix still fits; one that would not is refused before ARM sees it
    long_prefix = "team/" + "p" * 200
    cond = identity.node_bucket_condition(long_prefix, RUN, proto.node_id("chief", 0), chief=True)
    assert len(cond.encode()) <= identity.MAX_CONDITION_BYTES
    with pytest.raises(ProviderError, match="8192"):
        identity.node_bucket_condition("p" * 700, RUN, proto.node_id("chief", 0), chief=True)


def test_the_fakes_like_is_azures() -> None:
    assert like("abcd", "a*c?") and not like("abcd", "A*C?") and not like("abcd", "a*c")
    assert like("a/b/c", "a/*") and like("a*b", "a\\*b") and not like("axb", "a\\*b")


def test_the_fake_refuses_what_arm_refuses() -> None:
    path = f"@Resource[{BLOBS}:path]"
    for bad in (
        f"{path} StringLike 'a' AND {path} StringLike 'b' OR {path} StringLike 'c'",  # parens
        f"@Request[{BLOBS}:path] StringLike 'a'",  # path is a resource attribute
        f"{path} StringEndsWith 'a'",  # not an operator of Azure's
        f"@Resource[{BLOBS}:prefix] StringStartsWith 'a'",  # prefix is a request attribute
        f"{path} StringLike {{'a', 'b'}}",  # one value without a cross-product operator
        "SubOperationMatches{'Blob.Write.Tier'}",
    ):
        with pytest.raises(ConditionError):
            parse(bad)
