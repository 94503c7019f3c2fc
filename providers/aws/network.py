"""The run's security group: its nodes reach each other on the run's ports, and nothing else.

One group per run, `cloudtrain-<run_id>`, in the region's default VPC, tagged `cloudtrain:run`.
Ingress is the run's TCP port range from the group itself (a self-referencing rule), plus TCP 22
from one caller CIDR when the spec asks for SSH. Never 0.0.0.0/0. Egress stays EC2's default
(nodes fetch packages and reach S3).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from cloudtrain.core.errors import ProviderError, TransientError
from cloudtrain.providers.access import SSH_CIDR_ENV as SSH_CIDR_ENV  # re-exported
from cloudtrain.providers.access import check_port_range, ssh_cidr
from cloudtrain.providers.aws.errors import aws_errors, error_code
from cloudtrain.providers.base import Resource, RunInfo, Tagged

T = TypeVar("T")

KIND_GROUP = "security-group"
TAG_RUN = "cloudtrain:run"
TAG_ROLE = "cloudtrain:role"
TAG_INDEX = "cloudtrain:index"
# how long one delete_security_group call waits out DependencyViolation (ENIs of just-terminated
# instances) before it gives up with a TransientError; the caller's retry policy bounds the rest
SG_DEPENDENCY_WAIT_S = 30.0
SG_DEPENDENCY_POLL_S = 2.0


def call(what: str, fn: Callable[[], T], ok: Collection[str] = ()) -> T | None:
    """`fn()` inside `aws_errors(what)`; None when AWS answers one of the error codes `ok`
    (e.g. a duplicate on create, a not-found on delete). Other errors are translated."""
    with aws_errors(what):
        try:
            return fn()
        except ClientError as exc:
            if error_code(exc) in ok:
                return None
            raise


def resource_name(run_id: str) -> str:
    """The deterministic name of the run's security group, IAM role and instance profile."""
    return f"cloudtrain-{run_id}"


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    """EC2/IAM tag list form of a dict."""
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    """Dict form of an EC2/IAM tag list (None -> {})."""
    return {t["Key"]: t["Value"] for t in tags or []}


def default_vpc_id(ec2: Any, region: str) -> str:
    """The id of the region's default VPC. Raises ProviderError (with a hint) if there is none."""
    with aws_errors(f"find the default VPC in {region}"):
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise ProviderError(
            f"no default VPC in {region}: cloudtrain puts its nodes in the default VPC",
            hint=f"create one with `aws ec2 create-default-vpc --region {region}`",
        )
    return str(vpcs[0]["VpcId"])


def find_security_groups(ec2: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's security groups, found by the `cloudtrain:run` tag. Blocks; never NotFound."""
    with aws_errors(f"list the security groups of run {run_id}"):
        pages = ec2.get_paginator("describe_security_groups").paginate(
            Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [run_id]}]
        )
        return [g for page in pages for g in page["SecurityGroups"]]


def security_group_id(ec2: Any, run_id: str) -> str | None:
    """The id of the run's group `cloudtrain-<run_id>` (by name and tag), or None."""
    name = resource_name(run_id)
    groups = [g for g in find_security_groups(ec2, run_id) if g.get("GroupName") == name]
    return str(groups[0]["GroupId"]) if groups else None


def ingress_rules(group_id: str, run: RunInfo, cidr: str | None = None) -> list[dict[str, Any]]:
    """The group's ingress: the port range from itself; TCP 22 from `cidr` (the `ssh_cidr`
    option; None: the deprecated $CLOUDTRAIN_SSH_CIDR) if ssh. Pure apart from the environment."""
    low, high = run.port_range
    check_port_range(low, high, run.run_id)
    rules: list[dict[str, Any]] = [
        {
            "IpProtocol": "tcp",
            "FromPort": low,
            "ToPort": high,
            "UserIdGroupPairs": [{"GroupId": group_id, "Description": "cloudtrain cluster"}],
        }
    ]
    if run.ssh:
        cidr = ssh_cidr(cidr)
        ranges = {"CidrIp": cidr, "Description": "cloudtrain ssh"}
        key = "IpRanges"
        if ipaddress.ip_network(cidr).version == 6:
            ranges, key = {"CidrIpv6": cidr, "Description": "cloudtrain ssh"}, "Ipv6Ranges"
        rules.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, key: [ranges]})
    return rules


def ensure_security_group(ec2: Any, region: str, run: RunInfo, cidr: str | None = None) -> str:
    """Create (or find) the run's group and authorize its rules (SSH from `cidr`, see
    `ingress_rules`); returns the group id. Idempotent: an existing group or rule is fine.
    Blocks."""
    name = resource_name(run.run_id)
    ingress_rules("sg-0", run, cidr)  # a bad port range or missing SSH CIDR fails before any create
    vpc_id = default_vpc_id(ec2, region)
    tags = {TAG_RUN: run.run_id, "Name": name}
    created = call(
        f"create security group {name} in {vpc_id}",
        lambda: ec2.create_security_group(
            GroupName=name,
            Description=f"cloudtrain run {run.run_id}: cluster ports between its nodes only",
            VpcId=vpc_id,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": tag_list(tags)}],
        ),
        ok={"InvalidGroup.Duplicate"},
    )
    if created is not None:
        group_id = str(created["GroupId"])
    else:
        with aws_errors(f"look up security group {name} in {vpc_id}"):
            groups = ec2.describe_security_groups(
                Filters=[
                    {"Name": "group-name", "Values": [name]},
                    {"Name": "vpc-id", "Values": [vpc_id]},
                ]
            )["SecurityGroups"]
        if not groups:
            raise TransientError(f"security group {name} exists but is not visible yet")
        group_id = str(groups[0]["GroupId"])
        with aws_errors(f"tag security group {name}"):
            ec2.create_tags(Resources=[group_id], Tags=tag_list(tags))
    for rule in ingress_rules(group_id, run, cidr):
        call(
            f"authorize ingress on {name} ({group_id})",
            lambda rule=rule: ec2.authorize_security_group_ingress(
                GroupId=group_id, IpPermissions=[rule]
            ),
            ok={"InvalidPermission.Duplicate"},
        )
    return group_id


def delete_security_group(ec2: Any, group_id: str, name: str) -> None:
    """Delete one group. Idempotent (a missing group is fine). Waits out DependencyViolation (the
    ENIs of just-terminated instances) for at most SG_DEPENDENCY_WAIT_S, then raises
    TransientError for the caller's retry policy. Blocks."""
    deadline = time.monotonic() + SG_DEPENDENCY_WAIT_S
    gone = {"InvalidGroup.NotFound", "InvalidGroupId.NotFound"}
    while True:
        try:
            call(
                f"delete security group {name} ({group_id})",
                lambda: ec2.delete_security_group(GroupId=group_id),
                ok=gone,
            )
            return
        except TransientError as exc:
            cause = exc.__cause__
            in_use = isinstance(cause, ClientError) and error_code(cause) == "DependencyViolation"
            if not in_use or time.monotonic() + SG_DEPENDENCY_POLL_S > deadline:
                raise
        time.sleep(SG_DEPENDENCY_POLL_S)


def group_resources(ec2: Any, region: str, run_id: str) -> list[Resource]:
    """The run's security groups as Resources (id: the group name), found by tag. Blocks."""
    return [
        Resource("aws", KIND_GROUP, g["GroupName"], region, run_id, g["GroupId"])
        for g in find_security_groups(ec2, run_id)
    ]


def delete_group_resource(ec2: Any, res: Resource) -> None:
    """Delete a group recorded as a Resource: by its cloud id, else by name (and the run's tag).
    Idempotent; blocks (see `delete_security_group`)."""
    ids = [res.cloud_id] if res.cloud_id else []
    if not ids:
        filters = [{"Name": "group-name", "Values": [res.id]}]
        if res.run_id:
            filters.append({"Name": f"tag:{TAG_RUN}", "Values": [res.run_id]})
        with aws_errors(f"look up security group {res.id}"):
            groups = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
        ids = [str(g["GroupId"]) for g in groups]
    for group_id in ids:
        delete_security_group(ec2, group_id, res.id)


def tagged_groups(ec2: Any, region: str) -> list[Tagged]:
    """Every security group in the region with a `cloudtrain:run` tag, of any run, as Tagged
    (id: the group name, as `group_resources` reports it; EC2 gives no creation time). Blocks;
    read-only."""
    with aws_errors(f"list cloudtrain's security groups in {region}"):
        pages = ec2.get_paginator("describe_security_groups").paginate(
            Filters=[{"Name": "tag-key", "Values": [TAG_RUN]}]
        )
        groups = [g for page in pages for g in page["SecurityGroups"]]
    out = []
    for group in groups:
        run_id = tag_dict(group.get("Tags")).get(TAG_RUN)
        if run_id:
            out.append(Tagged(run_id, KIND_GROUP, str(group["GroupName"]), None, region=region))
    return out
