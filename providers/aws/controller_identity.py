"""The run's controller node's IAM policy (issue 17): `controller_policy`, and
`ensure_controller_identity`, which puts it on the controller's role (`identity.controller_name`)
beside the nodes' roles of `identity.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.jobs import protocol
from cloudtrain.providers.aws.identity import (
    controller_name,
    ensure_role_and_profile,
    node_name,
    node_path,
    role_arn,
)
from cloudtrain.providers.aws.network import TAG_RUN, resource_name
from cloudtrain.providers.aws.node_policy import parse_s3_uri

EC2_SERVICE = "ec2.amazonaws.com"


def _arn_parts(node_role_arn: str) -> tuple[str, str]:
    """(partition, account id) of an IAM ARN `arn:PART:iam::ACCOUNT:role/NAME`. Pure."""
    parts = node_role_arn.split(":")
    if len(parts) < 6 or parts[0] != "arn" or parts[2] != "iam" or not parts[4]:
        raise ProviderError(f"not an IAM role ARN: {node_role_arn!r}")
    return parts[1], parts[4]


def controller_policy(
    run_id: str, store_uri: str, region: str, node_role_arn: str
) -> dict[str, Any]:
    """The controller role's inline policy: this run's instances, security group, IAM entities
    and bucket prefix only; `node_role_arn` is one of the run's node roles (its partition and
    account). Pure; raises ProviderError for a non-s3:// store URI.

    The node roles it may pass (and delete) are those at the run's IAM path, `node_path`: a
    path ARN pattern `role/cloudtrain/<run>/*` names exactly this run's (the run id is closed
    by `/`), whatever the number of nodes (IAM User Guide, "IAM identifiers": paths in ARNs;
    "Granting a user permissions to pass a role to an AWS service").

    The grammar and the keys are the IAM ones (IAM User Guide, "IAM JSON policy elements
    reference"; Service Authorization Reference, "Actions, resources, and condition keys for
    Amazon EC2"). Launch rules follow the EC2 User Guide's examples, "Example policies to control
    access the Amazon EC2 API", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    ExamplePolicies_EC2.html: RunInstances is authorised on every resource it touches, so the
    instance and volume it creates must carry `aws:RequestTag/cloudtrain:run` = the run, while
    the image, subnet, network interface and key pair it uses need their own unconditioned
    statement ("Launch instances (RunInstances)"); tags may only be written by the launch itself
    (`ec2:CreateAction` = RunInstances, "Tag resources"): a plain CreateTags with the run's tag
    would let the controller adopt, then terminate, any instance of the account."""
    bucket, root = parse_s3_uri(store_uri)
    part, account = _arn_parts(node_role_arn)
    ec2 = f"arn:{part}:ec2:{region}:{account}"
    iam = f"arn:{part}:iam::{account}"
    run_prefix = f"{root}{protocol.run_prefix(run_id)}"
    this_run = {"StringEquals": {f"ec2:ResourceTag/{TAG_RUN}": run_id}}
    created = [f"{ec2}:instance/*", f"{ec2}:volume/*"]
    names = [controller_name(run_id)]
    node_roles = f"{iam}:role{node_path(run_id)}*"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "LaunchTaggedForThisRun",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": created,
                "Condition": {"StringEquals": {f"aws:RequestTag/{TAG_RUN}": run_id}},
            },
            {
                "Sid": "LaunchUsesTheseUntaggedResources",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": [
                    f"arn:{part}:ec2:{region}::image/*",  # public AMIs: no account in the ARN
                    f"{ec2}:subnet/*",
                    f"{ec2}:network-interface/*",
                    f"{ec2}:key-pair/*",
                    # a spot node's one-time request (untagged; the instance carries the tag):
                    # RunInstances with InstanceMarketOptions is authorised on it too (Service
                    # Authorization Reference, EC2, RunInstances: resource type
                    # spot-instances-request)
                    f"{ec2}:spot-instances-request/*",
                ],
            },
            {
                "Sid": "LaunchInTheRunsSecurityGroup",
                "Effect": "Allow",
                "Action": "ec2:RunInstances",
                "Resource": f"{ec2}:security-group/*",
                "Condition": this_run,
            },
            {
                "Sid": "TagOnlyAtLaunch",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": created,
                "Condition": {
                    "StringEquals": {
                        f"aws:RequestTag/{TAG_RUN}": run_id,
                        "ec2:CreateAction": "RunInstances",
                    }
                },
            },
            {
                "Sid": "TheRunsInstances",
                "Effect": "Allow",
                "Action": [
                    "ec2:TerminateInstances",
                    "ec2:StartInstances",
                    "ec2:StopInstances",
                    "ec2:GetConsoleOutput",
                ],
                "Resource": f"{ec2}:instance/*",
                "Condition": this_run,
            },
            {
                "Sid": "TheRunsSecurityGroup",
                "Effect": "Allow",
                "Action": "ec2:DeleteSecurityGroup",
                "Resource": f"{ec2}:security-group/*",
                "Condition": this_run,
            },
            {
                # Describe* cannot be narrowed: EC2's Describe actions support no resource-level
                # permissions, so Resource must be "*" (Service Authorization Reference, EC2
                # actions table: no resource types for Describe*; EC2 User Guide, "Example
                # policies...": "Read-only access"). They read, never change.
                "Sid": "ReadOnly",
                "Effect": "Allow",
                "Action": "ec2:Describe*",
                "Resource": "*",
            },
            {
                "Sid": "PassOnlyTheNodeRoles",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_roles,
                "Condition": {"StringEquals": {"iam:PassedToService": EC2_SERVICE}},
            },
            {
                "Sid": "TearDownTheRunsIdentity",
                "Effect": "Allow",
                "Action": [
                    "iam:GetRole",
                    "iam:GetInstanceProfile",
                    "iam:ListRolePolicies",
                    "iam:ListAttachedRolePolicies",
                    "iam:ListInstanceProfilesForRole",
                    "iam:DeleteRolePolicy",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile",
                    "iam:DeleteRole",
                ],
                "Resource": [f"{iam}:role/{n}" for n in names]
                + [f"{iam}:instance-profile/{n}" for n in names]
                + [node_roles, f"{iam}:instance-profile{node_path(run_id)}*"],
            },
            {
                # teardown finds the node roles by their path (`identity_resources`); the list
                # actions take no resource narrower than "*" here (Service Authorization
                # Reference, "Actions, resources, and condition keys for AWS Identity and
                # Access Management": ListRoles, ListInstanceProfiles). They read names only.
                "Sid": "ListTheRunsIdentities",
                "Effect": "Allow",
                "Action": ["iam:ListRoles", "iam:ListInstanceProfiles"],
                "Resource": "*",
            },
            {
                # the AMIs of the default images are public SSM parameters (images.py)
                "Sid": "PublicImageParameters",
                "Effect": "Allow",
                "Action": "ssm:GetParameter",
                "Resource": f"arn:{part}:ssm:{region}::parameter/aws/service/*",
            },
            {
                "Sid": "RunObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": f"arn:{part}:s3:::{bucket}/{run_prefix}*",
            },
            {
                "Sid": "ListRunPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:{part}:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{run_prefix}*"}},
            },
        ],
    }


def ensure_controller_identity(
    iam: Any, run_id: str, store_uri: str, region: str, nodes: Sequence[str]
) -> tuple[str, str]:
    """Create (or complete) the controller node's role, its inline policy (`controller_policy`)
    and its instance profile, all `controller_name(run_id)`; returns (role ARN, profile ARN).
    The run's node roles must exist (`ensure_identities`: those at the run's path are the only
    ones the controller may pass). Idempotent; blocks."""
    first = node_name(run_id, nodes[0]) if nodes else resource_name(run_id)
    node_role = role_arn(iam, first)
    if node_role is None:
        raise ProviderError(
            f"run {run_id} has no IAM role {first} for its controller to pass",
            hint="ensure_network must run before ensure_controller_identity",
        )
    name = controller_name(run_id)
    policy = json.dumps(controller_policy(run_id, store_uri, region, node_role))
    description = f"cloudtrain run {run_id}: its controller node (this run only)"
    return ensure_role_and_profile(iam, run_id, name, description, name, policy)
