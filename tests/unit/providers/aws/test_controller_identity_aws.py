"""The controller node's identity on AWS (issue 17), on moto: what AwsCompute really sends.

The inline policy is taken from the PutRolePolicy request the adapter sends (and read back from
moto, which validates IAM's policy grammar), then evaluated (security_kit.iam_allows) on this
run's and another run's instances, tags, roles and objects. The controller node's RunInstances
request is checked for the controller's instance profile, on-demand, the CPU image; teardown
through `list_resources` + `delete_resources` leaves no controller-* entity in IAM.
"""

from __future__ import annotations

import json
from typing import Any

from tests.unit import security_kit as kit
from tests.unit.aws_kit import CPU_AMI, REGION, RUN, aws, ct, policy_doc, request, run_info

__all__ = ["aws", "ct"]  # fixtures, for pytest
CONTROLLER = f"cloudtrain-{RUN}-controller"
NODE_ROLE = f"cloudtrain-{RUN}-worker-0"  # one of the run's node roles (run_info's nodes)
NODE_PATH = f"cloudtrain/{RUN}/"  # their IAM path
OTHER = "other-run-abc123"


def _setup(ct: Any) -> tuple[dict[str, Any], list[Any], kit.SentRequests]:
    info = run_info()
    ct.ensure_network(info)
    with kit.record_requests() as sent:
        made = ct.ensure_controller_identity(info)
    (body,) = sent.calls("iam", "PutRolePolicy")
    params = json.loads(body)
    assert params["RoleName"] == CONTROLLER and params["PolicyName"] == CONTROLLER
    return json.loads(params["PolicyDocument"]), made, sent


def test_controller_policy_as_sent_touches_only_this_run(ct: Any) -> None:
    policy, made, sent = _setup(ct)
    acct = ct.iam.get_role(RoleName=NODE_ROLE)["Role"]["Arn"].split(":")[4]
    ec2 = f"arn:aws:ec2:{REGION}:{acct}"
    iam = f"arn:aws:iam::{acct}"
    # moto kept exactly what was sent (its validator accepted the grammar)
    stored = ct.iam.get_role_policy(RoleName=CONTROLLER, PolicyName=CONTROLLER)
    assert policy_doc(stored["PolicyDocument"]) == policy
    allows = lambda a, r, **c: kit.iam_allows(policy, a, r, c)  # noqa: E731
    mine, theirs = {"aws:RequestTag/cloudtrain:run": RUN}, {"aws:RequestTag/cloudtrain:run": OTHER}
    # RunInstances: the created instance and volume only with this run's tag
    for res in (f"{ec2}:instance/*", f"{ec2}:volume/*"):
        assert allows("ec2:RunInstances", res, **mine)
        assert not allows("ec2:RunInstances", res, **theirs)
        assert not allows("ec2:RunInstances", res)
    # ... using an image, subnet, ENI, key pair (not taggable by the launch), and only the run's
    # security group
    assert allows("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/ami-1")
    assert allows("ec2:RunInstances", f"{ec2}:subnet/subnet-1")
    assert allows("ec2:RunInstances", f"{ec2}:spot-instances-request/sir-1")  # spot workers
    own_sg = {"ec2:ResourceTag/cloudtrain:run": RUN}
    assert allows("ec2:RunInstances", f"{ec2}:security-group/sg-1", **own_sg)
    assert not allows(
        "ec2:RunInstances",
        f"{ec2}:security-group/sg-1",
        **{"ec2:ResourceTag/cloudtrain:run": OTHER},
    )
    assert not allows("ec2:RunInstances", f"arn:aws:ec2:eu-west-1:{acct}:instance/*", **mine)
    # CreateTags: the run's tag, and only by the launch (no adopting another instance)
    launch = {**mine, "ec2:CreateAction": "RunInstances"}
    assert allows("ec2:CreateTags", f"{ec2}:instance/i-1", **launch)
    assert not allows("ec2:CreateTags", f"{ec2}:instance/i-1", **mine)
    assert not allows(
        "ec2:CreateTags", f"{ec2}:instance/i-1", **{**theirs, "ec2:CreateAction": "RunInstances"}
    )
    # terminate/stop/start: the run's instances only
    for action in ("ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances"):
        assert allows(action, f"{ec2}:instance/i-1", **{"ec2:ResourceTag/cloudtrain:run": RUN})
        assert not allows(
            action, f"{ec2}:instance/i-1", **{"ec2:ResourceTag/cloudtrain:run": OTHER}
        )
        assert not allows(action, f"{ec2}:instance/i-1")
    assert allows("ec2:DescribeInstances", "*")
    assert not allows("ec2:DeleteVolume", f"{ec2}:volume/vol-1", **own_sg)
    # PassRole: the run's node roles (their ARNs as IAM holds them) to EC2, nothing else
    to_ec2 = {"iam:PassedToService": "ec2.amazonaws.com"}
    for node in ("worker-0", "worker-1", "chief-0"):
        arn = ct.iam.get_role(RoleName=f"cloudtrain-{RUN}-{node}")["Role"]["Arn"]
        assert arn == f"{iam}:role/{NODE_PATH}cloudtrain-{RUN}-{node}"
        assert allows("iam:PassRole", arn, **to_ec2)
    assert not allows("iam:PassRole", f"{iam}:role/{CONTROLLER}", **to_ec2)
    assert not allows("iam:PassRole", f"{iam}:role/cloudtrain-{OTHER}", **to_ec2)
    other = f"{iam}:role/cloudtrain/{OTHER}/cloudtrain-{OTHER}-worker-0"
    assert not allows("iam:PassRole", other, **to_ec2)
    assert not allows("iam:PassRole", f"{iam}:role/cloudtrain/{RUN}x/r", **to_ec2)  # "/" closes
    node_arn = f"{iam}:role/{NODE_PATH}{NODE_ROLE}"
    assert not allows("iam:PassRole", node_arn, **{"iam:PassedToService": "x"})
    # IAM: deleting the run's own entities only
    for role, profile in (
        (node_arn, f"{iam}:instance-profile/{NODE_PATH}{NODE_ROLE}"),
        (f"{iam}:role/{CONTROLLER}", f"{iam}:instance-profile/{CONTROLLER}"),
    ):
        assert allows("iam:DeleteRole", role)
        assert allows("iam:DeleteInstanceProfile", profile)
    assert not allows("iam:DeleteRole", f"{iam}:role/cloudtrain-{OTHER}")
    assert not allows("iam:DeleteRole", other)
    assert not allows("iam:CreateRole", node_arn)
    assert not allows("iam:PutRolePolicy", f"{iam}:role/{CONTROLLER}")
    # S3: the run's prefix of the store only
    bucket = "arn:aws:s3:::ct-test-bucket"
    assert allows("s3:GetObject", f"{bucket}/team/a/cloudtrain/runs/{RUN}/control/lease")
    assert allows("s3:PutObject", f"{bucket}/team/a/cloudtrain/runs/{RUN}/ledger/x")
    assert not allows("s3:GetObject", f"{bucket}/team/a/cloudtrain/runs/{OTHER}/control/lease")
    assert not allows("s3:DeleteBucket", bucket)
    assert allows("s3:ListBucket", bucket, **{"s3:prefix": f"team/a/cloudtrain/runs/{RUN}/"})
    assert not allows("s3:ListBucket", bucket, **{"s3:prefix": "team/a/cloudtrain/runs/"})
    assert not allows("s3:ListBucket", bucket)
    # Resource "*" only for Describe* (no resource-level permissions there)
    # and for the listing of IAM roles and profiles (names only: teardown finds the node roles)
    wide = [s for s in policy["Statement"] if "*" in kit_listed(s["Resource"])]
    assert [s["Action"] for s in wide] == [
        "ec2:Describe*",
        ["iam:ListRoles", "iam:ListInstanceProfiles"],
    ]
    assert {(r.kind, r.id) for r in made} == {
        ("controller-role", CONTROLLER),
        ("controller-instance-profile", CONTROLLER),
    }
    assert {(r.kind, r.id) for r in ct.planned_controller_identity(run_info())} == {
        (r.kind, r.id) for r in made
    }
    # the role trusts EC2 only
    (create,) = sent.calls("iam", "CreateRole")
    trust = json.loads(json.loads(create)["AssumeRolePolicyDocument"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}


def kit_listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def test_controller_node_runs_on_demand_under_the_controller_profile(ct: Any) -> None:
    info = run_info()
    _setup(ct)
    worker = request("worker", 0, spot=True)
    ctl = request("controller", 0, gpus=0, spot=True, instance_type="t3.small")
    with kit.record_requests() as sent:
        ct.create_node(info, worker)
        node = ct.create_node(info, ctl)
    launches = [json.loads(b) for b in sent.calls("ec2", "RunInstances")]
    by_role = {
        next(
            t["Value"] for t in p["TagSpecifications"][0]["Tags"] if t["Key"] == "cloudtrain:role"
        ): p
        for p in launches
    }
    sent_ctl, sent_worker = by_role["controller"], by_role["worker"]
    assert sent_ctl["IamInstanceProfile"] == {"Name": CONTROLLER}
    assert sent_worker["IamInstanceProfile"] == {"Name": NODE_ROLE}  # worker-0's own
    assert "InstanceMarketOptions" not in sent_ctl  # asked spot: never for the controller
    assert "InstanceMarketOptions" in sent_worker
    assert sent_ctl["ImageId"] == CPU_AMI and sent_ctl["InstanceType"] == "t3.small"
    # what EC2 holds
    inst = ct.ec2.describe_instances(InstanceIds=[node.cloud_id])["Reservations"][0]["Instances"][0]
    assert inst["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/{CONTROLLER}")
    assert node.role == "controller" and node.name == f"ct-{RUN}-controller-0" and not node.spot
    # the run's listing finds it (so `down` from anywhere deletes it)
    assert f"ct-{RUN}-controller-0" in {n.name for n in ct.list_nodes(RUN)}


def test_teardown_finds_and_deletes_every_controller_resource(ct: Any) -> None:
    _setup(ct)
    listed = ct.list_resources(RUN)
    kinds = {(r.kind, r.id) for r in listed}
    # one at a time (as the controller deletes its own), the profile must go before the role
    order = [r.kind for r in listed if r.kind.startswith("controller-")]
    assert order == ["controller-instance-profile", "controller-role"]
    assert {("controller-role", CONTROLLER), ("controller-instance-profile", CONTROLLER)} <= kinds
    found = {(t.run_id, t.kind, t.id) for t in ct.inventory()}
    assert (RUN, "controller-role", CONTROLLER) in found
    assert (RUN, "controller-instance-profile", CONTROLLER) in found
    ct.delete_resources(listed)
    ct.delete_resources(listed)  # idempotent
    assert [r for r in ct.list_resources(RUN) if r.kind.startswith("controller-")] == []
    roles = [r["RoleName"] for r in ct.iam.list_roles()["Roles"]]
    profiles = [
        p["InstanceProfileName"] for p in ct.iam.list_instance_profiles()["InstanceProfiles"]
    ]
    assert CONTROLLER not in roles and CONTROLLER not in profiles
    assert NODE_ROLE not in roles


def test_controller_identity_needs_the_node_role_first(ct: Any) -> None:
    import pytest

    from cloudtrain.core.errors import ProviderError

    with pytest.raises(ProviderError, match="ensure_network"):
        ct.ensure_controller_identity(run_info())
