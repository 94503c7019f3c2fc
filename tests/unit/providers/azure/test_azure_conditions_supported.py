"""The Azure identities' ABAC conditions and the node role use only what Azure documents
(issue 30): every targeted action and suboperation, every attribute (from its documented
source, for every action its clause targets) and every operator (for the attribute's type) is
in authz_reference_azure.py's tables, cited there; the node role's DataActions exist in the
Microsoft.Storage operations and each is narrowed by a clause of the node's condition.

The conditions are the ones the adapter builds for a sample run (`identity.node_bucket_condition`
as AzureCompute's grant calls it, for the chief and a worker, in the body `assignment_body`
sends; `controller_identity.delegation_condition` in the controller's assignment body).
The negative cases alter a real condition and see the check refuse it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cloudtrain.jobs import node_rights
from cloudtrain.providers.azure import controller_identity, identity, node_role
from tests.unit import authz_reference_azure as ref
from tests.unit.node_rights_kit import CHIEF, NODE, NODES

SUB = "00000000-0000-0000-0000-00000000c0de"
PRINCIPAL = "11111111-2222-3333-4444-555555555555"
RUN = "train-abc123"


def node_body(node: str, prefix: str = "team/a") -> dict[str, Any]:
    """The container grant's PUT body for `node`, as AzureCompute._grant builds it."""
    chief = node == node_rights.chief_of(NODES)
    condition = identity.node_bucket_condition(prefix, RUN, node, chief=chief)
    return identity.assignment_body(SUB, node_role.role_guid(SUB), PRINCIPAL, node, condition)


def controller_bodies() -> list[dict[str, Any]]:
    """The controller's conditioned assignment bodies."""
    grants = controller_identity.grants("ct-rg", "/subscriptions/x/container", SUB)
    return [
        controller_identity.body(SUB, role, PRINCIPAL, RUN, conditioned)
        for _scope, role, conditioned in grants
        if conditioned
    ]


@pytest.mark.parametrize("prefix", ["team/a", ""])
@pytest.mark.parametrize("node", [CHIEF, NODE])
def test_the_node_condition_uses_only_documented_actions_and_attributes(
    node: str, prefix: str
) -> None:
    props = node_body(node, prefix)["properties"]
    assert props["conditionVersion"] == "2.0"  # FORMAT: the only version with @Resource etc.
    assert ref.problems(props["condition"]) == []


def test_the_controller_delegation_condition_uses_only_documented_attributes() -> None:
    bodies = controller_bodies()
    assert len(bodies) == 2
    for body in bodies:
        assert body["properties"]["conditionVersion"] == "2.0"
        assert ref.problems(body["properties"]["condition"]) == []


def test_the_node_role_holds_existing_data_actions_only_each_narrowed_by_the_condition() -> None:
    definition = node_role.definition(SUB)
    assert ref.role_problems(definition) == []
    (permission,) = definition["properties"]["permissions"]
    data = set(permission["dataActions"])
    assert data and permission["notDataActions"] == []
    for node in (CHIEF, NODE):
        condition = node_body(node)["properties"]["condition"]
        assert data <= ref.targeted_actions(condition), node  # no DataAction unconditioned


# --- the check refuses what Azure does not document ---------------------------------------

B = ref.BLOBS


def _swap(old: str, new: str) -> Any:
    def brk(condition: str) -> str:
        assert old in condition, old
        return condition.replace(old, new, 1)

    brk.__name__ = f"{old[-24:]}->{new[-24:]}"
    return brk


NODE_BREAKS = [
    # the path attribute for a listing (Blob.List has no path; BLOB "List blobs")
    _swap(
        "AND SubOperationMatches{'Blob.List'}) ) OR ( @Request",
        "AND SubOperationMatches"
        "{'Blob.List'}) ) OR ( @Resource[" + B + ":path] StringStartsWith 'x' OR @Request",
    ),
    # the prefix is a Request attribute, not a Resource one
    _swap(f"@Request[{B}:prefix]", f"@Resource[{B}:prefix]"),
    # a made-up attribute
    _swap(f"@Resource[{B}:path] StringNotEquals", f"@Resource[{B}:name] StringNotEquals"),
    # a made-up action
    _swap(f"{B}/move/action", f"{B}/rename/action"),
    # a made-up suboperation
    _swap("NOT SubOperationMatches{'Blob.List'}", "NOT SubOperationMatches{'Blob.Get'}"),
    # an operator of another type (GUID) on a String attribute
    _swap("StringStartsWith", "GuidEquals"),
    # an operator that does not exist
    _swap("StringStartsWith", "StringBeginsWith"),
    # AND and OR mixed at one level without parentheses (FORMAT: "Grouping and precedence")
    _swap("StringLike", "StringLike 'a' OR @Resource[" + B + ":path] StringLike"),
]


@pytest.mark.parametrize("brk", NODE_BREAKS, ids=lambda f: f.__name__)
def test_a_broken_node_condition_is_refused(brk: Any) -> None:
    condition = node_body(NODE)["properties"]["condition"]
    assert ref.problems(brk(condition)), brk.__name__


A = ref.ASSIGNMENTS
CONTROLLER_BREAKS = [
    # PrincipalType takes only the IgnoreCase string operators (AUTHZ "Principal type")
    _swap("ForAnyOfAnyValues:StringEqualsIgnoreCase", "ForAnyOfAnyValues:StringEquals"),
    # a write's role is a Request attribute; deletes read the Resource's
    _swap(f"@Request[{A}:RoleDefinitionId]", f"@Resource[{A}:RoleDefinitionId]"),
    # a blob attribute under an authorization action
    _swap(f"@Resource[{A}:RoleDefinitionId]", f"@Resource[{B}:path]"),
    # a made-up authorization action
    _swap(f"{A}/delete", f"{A}/remove"),
]


@pytest.mark.parametrize("brk", CONTROLLER_BREAKS, ids=lambda f: f.__name__)
def test_a_broken_delegation_condition_is_refused(brk: Any) -> None:
    condition = controller_bodies()[0]["properties"]["condition"]
    assert ref.problems(brk(condition)), brk.__name__


@pytest.mark.parametrize(
    ("field", "value"),
    [("dataActions", f"{B}/readAll"), ("actions", f"{ref.CONTAINERS}/delete")],
)
def test_a_broken_node_role_is_refused(field: str, value: str) -> None:
    definition = copy.deepcopy(node_role.definition(SUB))
    definition["properties"]["permissions"][0][field].append(value)
    assert ref.role_problems(definition)
