"""The box refuses IAM policy writes that real IAM refuses: the limits of IAM Conditions.

Real clients against the fakes: google-auth's `AuthorizedSession` (what the adapter's
`IamClient` sends) posting Resource Manager's `projects.setIamPolicy` to the GCE fake, and
google-cloud-storage's `Bucket.set_iam_policy` to the GCS emulator. IAM refuses, with 400
INVALID_ARGUMENT (GCS: 400 `invalid`), a condition of more than 12 logical operators (`&&`,
`||`, unary `!`), an expression over 12,800 characters, a title over 100 or a description over
256 characters, and more than 20 conditional bindings of one role and one principal. Not
refused: more than 100 conditional bindings in one policy (Google advises against it, nothing
more). Sources: tests/fakes/iam_limits.py.

Commit a032f12 fixed a controller condition of 15 logical operators that the box had taken;
`test_the_controller_grant_before_a032f12_is_refused` rebuilds that condition and sees it refused.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("google.cloud.storage")

from google.api_core import exceptions as api
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage

from cloudtrain.providers.gcp import controller_identity as ctl
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures, for pytest
ROLE = "roles/compute.instanceAdmin.v1"
ALICE, BOB = "user:alice@example.com", "user:bob@example.com"
BUCKET = "ct-policy-limits"
OBJECT_ROLE = "roles/storage.objectViewer"


def expression(operators: int) -> str:
    """A condition of exactly `operators` logical operators: `operators + 1` startsWith tests
    joined by `||`. Pure."""
    prefix = "projects/_/buckets/b/objects"
    tests = [f'resource.name.startsWith("{prefix}/{n}/")' for n in range(1 + operators)]
    return " || ".join(tests)


def condition(expr: str, title: str = "t", description: str = "") -> dict[str, str]:
    return {"title": title, "description": description, "expression": expr}


def binding(expr: str, member: str = ALICE, role: str = ROLE, **fields: str) -> dict[str, Any]:
    return {"role": role, "members": [member], "condition": condition(expr, **fields)}


# --- the project policy, through Resource Manager's setIamPolicy ---------------------------------


def set_project_policy(cloud: GcpCloud, bindings: list[dict[str, Any]]) -> Any:
    """POST projects.setIamPolicy to the fake with the current etag; the response."""
    session = AuthorizedSession(AnonymousCredentials())
    base = f"{cloud.gce.url}/v1/projects/{cloud.project}"
    read = session.post(f"{base}:getIamPolicy", json={"options": {"requestedPolicyVersion": 3}})
    etag = read.json()["etag"]
    policy = {"version": 3, "etag": etag, "bindings": bindings}
    return session.post(f"{base}:setIamPolicy", json={"policy": policy})


def assert_refused(cloud: GcpCloud, bindings: list[dict[str, Any]], words: str) -> None:
    before = cloud.gce.iam_policy("project", cloud.project)
    answer = set_project_policy(cloud, bindings)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert words in error["message"]
    assert cloud.gce.iam_policy("project", cloud.project) == before  # nothing written
    assert cloud.gce.policy_writes() == []


def assert_taken(cloud: GcpCloud, bindings: list[dict[str, Any]]) -> None:
    answer = set_project_policy(cloud, bindings)
    assert answer.status_code == 200, answer.text
    assert len(cloud.gce.iam_policy("project", cloud.project)["bindings"]) == len(bindings)


def test_a_condition_of_13_logical_operators_is_refused(gcp_cloud: GcpCloud) -> None:
    assert_refused(gcp_cloud, [binding(expression(13))], "13 logical operators")
    assert_taken(gcp_cloud, [binding(expression(12))])


def test_not_and_and_count_as_operators_but_inequality_and_strings_do_not(
    gcp_cloud: GcpCloud,
) -> None:
    # 12 operators: 10 `||`, one `&&`, one `!`; then `!=` and operators inside string literals
    counted = expression(10) + ' && !resource.name.endsWith("x")'
    free = " && resource.type != \"a && b || !c\" && resource.name.endsWith('|| !')"
    assert_refused(gcp_cloud, [binding(counted + free)], "14 logical operators")
    assert_taken(gcp_cloud, [binding(counted)])
    tolerated = expression(10) + ' && resource.type != "a && b || !c" || x == "\\" && !"'
    assert_taken(gcp_cloud, [binding(tolerated)])


def test_21_conditional_bindings_of_one_role_and_principal_are_refused(
    gcp_cloud: GcpCloud,
) -> None:
    many = [binding(expression(1) + f' && resource.name.endsWith("{n}")') for n in range(21)]
    assert_refused(gcp_cloud, many, "21 conditional role bindings")
    # 20 of them, and another principal's in the same role, and an unconditional binding
    taken = [*many[:20], binding(expression(0), member=BOB), {"role": ROLE, "members": [ALICE]}]
    assert_taken(gcp_cloud, taken)


def test_a_principal_named_in_a_shared_binding_counts_there_too(gcp_cloud: GcpCloud) -> None:
    shared = {"role": ROLE, "members": [BOB, ALICE], "condition": condition("a == b")}
    many = [binding(f'resource.name.endsWith("{n}")') for n in range(20)]
    assert_refused(gcp_cloud, [*many, shared], f"{ROLE} and {ALICE}")


def test_more_than_100_conditional_bindings_in_one_policy_are_taken(gcp_cloud: GcpCloud) -> None:
    # Google advises at most 100 ("Overview of IAM Conditions"), IAM does not refuse them
    members = [f"user:u{n}@example.com" for n in range(101)]
    assert_taken(gcp_cloud, [binding('resource.name.endsWith("x")', member=m) for m in members])


@pytest.mark.parametrize(
    ("field", "size", "words"),
    [
        ("expression", 12801, "12801 characters"),
        ("title", 101, "title"),
        ("description", 257, "description"),
    ],
)
def test_a_condition_field_over_its_length_is_refused(
    gcp_cloud: GcpCloud, field: str, size: int, words: str
) -> None:
    fields = {"expression": "a == b", "title": "t", "description": ""}
    fields[field] = ("a == " + "b" * size)[:size] if field == "expression" else "x" * size
    refused = {"role": ROLE, "members": [ALICE], "condition": fields}
    assert_refused(gcp_cloud, [refused], words)
    fields[field] = fields[field][:-1]
    assert_taken(gcp_cloud, [{"role": ROLE, "members": [ALICE], "condition": fields}])


@pytest.mark.parametrize("zones", [1, 2, 3, 4, 5, 8, 12, 30])
def test_the_controller_grant_of_a_region_is_taken(gcp_cloud: GcpCloud, zones: int) -> None:
    # what GcpCompute.ensure_controller_identity writes (controller_identity.project_bindings)
    names = [f"us-central1-{n}" for n in range(zones)]
    email = "cc-run-0123abcd@p.iam.gserviceaccount.com"
    wanted = ctl.project_bindings(gcp_cloud.project, names, "run-abc123", email, ["fw-a", "fw-b"])
    for b in wanted:
        b["members"] = [ALICE]  # the fake refuses service accounts its IAM does not hold
    assert_taken(gcp_cloud, wanted)


def test_the_controller_grant_before_a032f12_is_refused(gcp_cloud: GcpCloud) -> None:
    # one instanceAdmin.v1 condition over all of us-central1's 4 zones: 2 * 4 + 1 + 6 = 15
    zones = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    old = ctl._instances_expression(gcp_cloud.project, zones, "run-abc123", others=True)
    assert_refused(gcp_cloud, [binding(old, title="cloudtrain-run")], "15 logical operators")


# --- the bucket policy, through GCS's setIamPolicy -----------------------------------------------


@pytest.fixture
def bucket(gcp_cloud: GcpCloud) -> storage.Bucket:
    """A bucket with uniform bucket-level access (GCS takes conditions only then)."""
    made = storage.Client().create_bucket(BUCKET)
    made.iam_configuration.uniform_bucket_level_access_enabled = True
    made.patch()
    return made


def set_bucket_policy(bucket: storage.Bucket, bindings: list[dict[str, Any]]) -> None:
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings = bindings
    bucket.set_iam_policy(policy)


def assert_bucket_refuses(
    gcp_cloud: GcpCloud, bucket: storage.Bucket, bindings: list[dict[str, Any]], words: str
) -> None:
    before = gcp_cloud.gcs.iam_policy(BUCKET)
    with pytest.raises(api.BadRequest) as caught:
        set_bucket_policy(bucket, bindings)
    assert words in str(caught.value)
    assert caught.value.errors and caught.value.errors[0]["reason"] == "invalid"
    assert gcp_cloud.gcs.iam_policy(BUCKET) == before  # nothing written


def bucket_binding(expr: str, member: str = ALICE, **fields: str) -> dict[str, Any]:
    return binding(expr, member=member, role=OBJECT_ROLE, **fields)


def test_the_bucket_refuses_a_condition_of_13_logical_operators(
    gcp_cloud: GcpCloud, bucket: storage.Bucket
) -> None:
    assert_bucket_refuses(gcp_cloud, bucket, [bucket_binding(expression(13))], "13 logical")
    set_bucket_policy(bucket, [bucket_binding(expression(12))])
    assert len(gcp_cloud.gcs.iam_policy(BUCKET)["bindings"]) == 1


def test_the_bucket_refuses_21_conditional_bindings_of_one_role_and_principal(
    gcp_cloud: GcpCloud, bucket: storage.Bucket
) -> None:
    many = [bucket_binding(f'resource.name.endsWith("{n}")') for n in range(21)]
    assert_bucket_refuses(gcp_cloud, bucket, many, "21 conditional role bindings")
    set_bucket_policy(bucket, [*many[:20], bucket_binding("a == b", member=BOB)])
    assert len(gcp_cloud.gcs.iam_policy(BUCKET)["bindings"]) == 21


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"expression": "a" * 12801}, "12801 characters"),
        ({"expression": "a == b", "title": "x" * 101}, "title"),
        ({"expression": "a == b", "description": "x" * 257}, "description"),
    ],
)
def test_the_bucket_refuses_a_condition_field_over_its_length(
    gcp_cloud: GcpCloud, bucket: storage.Bucket, fields: dict[str, str], words: str
) -> None:
    refused = {"role": OBJECT_ROLE, "members": [ALICE], "condition": {"title": "t", **fields}}
    assert_bucket_refuses(gcp_cloud, bucket, [refused], words)
