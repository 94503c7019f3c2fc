"""The run's IAM identity: a role its nodes assume, limited to the run's own prefix in the bucket.

Role and instance profile are both `cloudtrain-<run_id>`; the role trusts ec2.amazonaws.com and
carries one inline policy, `cloudtrain-<run_id>-s3`: Get/Put/DeleteObject under
`<prefix>cloudtrain/runs/<run_id>/` and ListBucket restricted to that prefix. Nothing else, so a
node can neither read another run's data nor call any other AWS API. Inside the prefix, explicit
Deny statements keep the run's key (`control/key`) from the nodes altogether and the
controller's documents (the lease, stop, yield, launch document, cluster.json, the journal and
the bundle) from their writes (issue 29). The policy itself is `node_policy.s3_policy`.

The run's controller node (issue 17) has its own role and instance profile,
`cloudtrain-<run_id>-controller` (kinds controller-role, controller-instance-profile), whose one
inline policy (`controller_policy`) reaches this run's instances, security group, IAM entities and
bucket prefix only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cloudtrain.errors import ProviderError
from cloudtrain.jobs import protocol
from cloudtrain.providers.aws.errors import aws_errors
from cloudtrain.providers.aws.network import TAG_RUN, call, resource_name, tag_dict, tag_list
from cloudtrain.providers.aws.node_policy import parse_s3_uri, s3_policy
from cloudtrain.providers.base import Resource, Tagged
from cloudtrain.providers.ownership import Refusals

KIND_ROLE, KIND_PROFILE = "iam-role", "instance-profile"
KIND_CONTROLLER_ROLE, KIND_CONTROLLER_PROFILE = "controller-role", "controller-instance-profile"
CONTROLLER_KINDS = {KIND_ROLE: KIND_CONTROLLER_ROLE, KIND_PROFILE: KIND_CONTROLLER_PROFILE}
NAME_PREFIX = resource_name("")  # every role and profile cloudtrain makes starts so
GONE = {"NoSuchEntity"}
TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}


def policy_name(run_id: str) -> str:
    """The name of the role's inline S3 policy."""
    return f"{resource_name(run_id)}-s3"


def ensure_identity(iam: Any, run_id: str, store_uri: str) -> tuple[str, str]:
    """Create (or complete) the run's role, inline policy and instance profile; returns
    (role ARN, instance profile ARN). Idempotent: existing entities are fine. Blocks."""
    name = resource_name(run_id)
    policy = json.dumps(s3_policy(store_uri, run_id))  # a bad URI fails before any create
    description = f"cloudtrain run {run_id}: its nodes' access to the run's S3 prefix"
    return ensure_role_and_profile(iam, run_id, name, description, policy_name(run_id), policy)


def ensure_role_and_profile(
    iam: Any, run_id: str, name: str, description: str, policy_name: str, policy: str
) -> tuple[str, str]:
    """Create (or complete) role `name` (EC2 may assume it) with its one inline policy, tagged
    with the run, and the instance profile of the same name holding it; returns (role ARN,
    instance profile ARN). Idempotent: existing entities are fine. Blocks."""
    tags = tag_list({TAG_RUN: run_id})
    call(
        f"create IAM role {name}",
        lambda: iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(TRUST_POLICY),
            Description=description,
            Tags=tags,
        ),
        ok={"EntityAlreadyExists"},
    )
    with aws_errors(f"tag IAM role {name}"):
        iam.tag_role(RoleName=name, Tags=tags)
    with aws_errors(f"put the policy of IAM role {name}"):
        iam.put_role_policy(RoleName=name, PolicyName=policy_name, PolicyDocument=policy)
    call(
        f"create instance profile {name}",
        lambda: iam.create_instance_profile(InstanceProfileName=name, Tags=tags),
        ok={"EntityAlreadyExists"},
    )
    with aws_errors(f"read instance profile {name}"):
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    if not any(r.get("RoleName") == name for r in profile.get("Roles", [])):
        call(
            f"add role {name} to instance profile {name}",
            lambda: iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name),
            ok={"LimitExceeded", "EntityAlreadyExists"},  # a concurrent call added it
        )
    with aws_errors(f"read IAM role {name}"):
        role_arn = iam.get_role(RoleName=name)["Role"]["Arn"]
    return str(role_arn), str(profile["Arn"])


def role_arn(iam: Any, name: str) -> str | None:
    """The ARN of role `name`, or None if it does not exist. Blocks."""
    role = call(f"read IAM role {name}", lambda: iam.get_role(RoleName=name), ok=GONE)
    return str(role["Role"]["Arn"]) if role else None


def instance_profile_arn(iam: Any, name: str) -> str | None:
    """The ARN of instance profile `name`, or None if it does not exist. Blocks."""
    profile = call(
        f"read instance profile {name}",
        lambda: iam.get_instance_profile(InstanceProfileName=name),
        ok=GONE,
    )
    return str(profile["InstanceProfile"]["Arn"]) if profile else None


def delete_instance_profile(iam: Any, name: str) -> None:
    """Remove the profile's roles, then delete it. Idempotent (missing is fine). Blocks."""
    profile = call(
        f"read instance profile {name}",
        lambda: iam.get_instance_profile(InstanceProfileName=name),
        ok=GONE,
    )
    if profile is None:
        return
    for role in profile["InstanceProfile"].get("Roles", []):
        call(
            f"remove role {role['RoleName']} from instance profile {name}",
            lambda role=role: iam.remove_role_from_instance_profile(
                InstanceProfileName=name, RoleName=role["RoleName"]
            ),
            ok=GONE,
        )
    call(
        f"delete instance profile {name}",
        lambda: iam.delete_instance_profile(InstanceProfileName=name),
        ok=GONE,
    )


def delete_role(iam: Any, name: str) -> None:
    """Delete the role's inline policies, detach managed ones, leave its instance profiles,
    then delete it. Idempotent (missing is fine). Blocks."""
    inline = call(
        f"list the policies of IAM role {name}",
        lambda: [
            p
            for page in iam.get_paginator("list_role_policies").paginate(RoleName=name)
            for p in page["PolicyNames"]
        ],
        ok=GONE,
    )
    if inline is None:
        return
    for policy in inline:
        call(
            f"delete policy {policy} of IAM role {name}",
            lambda policy=policy: iam.delete_role_policy(RoleName=name, PolicyName=policy),
            ok=GONE,
        )
    attached = call(
        f"list the managed policies of IAM role {name}",
        lambda: iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"],
        ok=GONE,
    )
    for policy in attached or []:
        call(
            f"detach policy {policy['PolicyArn']} from IAM role {name}",
            lambda policy=policy: iam.detach_role_policy(
                RoleName=name, PolicyArn=policy["PolicyArn"]
            ),
            ok=GONE,
        )
    profiles = call(
        f"list the instance profiles of IAM role {name}",
        lambda: iam.list_instance_profiles_for_role(RoleName=name)["InstanceProfiles"],
        ok=GONE,
    )
    for profile in profiles or []:
        call(
            f"remove IAM role {name} from instance profile {profile['InstanceProfileName']}",
            lambda profile=profile: iam.remove_role_from_instance_profile(
                InstanceProfileName=profile["InstanceProfileName"], RoleName=name
            ),
            ok=GONE,
        )
    call(f"delete IAM role {name}", lambda: iam.delete_role(RoleName=name), ok=GONE)


def identity_resources(iam: Any, region: str, run_id: str) -> list[Resource]:
    """The run's role and instance profile, then its controller node's (`controller_name`)
    instance profile and role, those that exist, as Resources (by name). The controller's
    profile comes before its role: the controller deleting its own identity one resource at a
    time loses every right with its role's policy, so its profile must go first (what is left
    then is an empty role, which grants nothing, for `down`). Blocks."""
    found = []
    name = resource_name(run_id)
    role = role_arn(iam, name)
    if role:
        found.append(Resource("aws", KIND_ROLE, name, region, run_id, role))
    profile = instance_profile_arn(iam, name)
    if profile:
        found.append(Resource("aws", KIND_PROFILE, name, region, run_id, profile))
    name = controller_name(run_id)
    profile = instance_profile_arn(iam, name)
    if profile:
        found.append(Resource("aws", KIND_CONTROLLER_PROFILE, name, region, run_id, profile))
    role = role_arn(iam, name)
    if role:
        found.append(Resource("aws", KIND_CONTROLLER_ROLE, name, region, run_id, role))
    return found


def _is_runs(iam: Any, res: Resource) -> str | None:
    """Why `res` (a role or instance profile) is not its run's, or None when it is (or is gone):
    its name must be the run's (`resource_name` or `controller_name` for its kind) and the
    entity must carry the tag `cloudtrain:run` = the run id, read from IAM first. Blocks."""
    names = {
        KIND_ROLE: resource_name(res.run_id),
        KIND_PROFILE: resource_name(res.run_id),
        KIND_CONTROLLER_ROLE: controller_name(res.run_id),
        KIND_CONTROLLER_PROFILE: controller_name(res.run_id),
    }
    if not res.run_id or res.id != names[res.kind]:
        return f"not the run's name ({names[res.kind]!r} expected)"
    if res.kind in (KIND_ROLE, KIND_CONTROLLER_ROLE):
        got = call(f"read IAM role {res.id}", lambda: iam.get_role(RoleName=res.id), ok=GONE)
        entity = got["Role"] if got else None
    else:
        got = call(
            f"read instance profile {res.id}",
            lambda: iam.get_instance_profile(InstanceProfileName=res.id),
            ok=GONE,
        )
        entity = got["InstanceProfile"] if got else None
    if entity is None:
        return None  # gone: nothing to delete
    tagged = tag_dict(entity.get("Tags")).get(TAG_RUN)
    if tagged != res.run_id:
        return f"its {TAG_RUN} tag is {tagged!r}, not {res.run_id!r}"
    return None


def delete_identity(iam: Any, resources: list[Resource], refusals: Refusals) -> None:
    """Delete the instance profiles among `resources` (the nodes' and the controller's), then
    the roles; other kinds are ignored. Each is first checked to be its run's (its name, and
    its `cloudtrain:run` tag read from IAM): any other goes to `refusals`, never deleted.
    Idempotent; blocks."""
    kinds = (KIND_PROFILE, KIND_CONTROLLER_PROFILE, KIND_ROLE, KIND_CONTROLLER_ROLE)
    mine = []
    for res in resources:
        if res.kind in kinds:
            why = _is_runs(iam, res)
            if why is None:
                mine.append(res)
            else:
                refusals.refuse(res, why)
    for res in mine:
        if res.kind in (KIND_PROFILE, KIND_CONTROLLER_PROFILE):
            delete_instance_profile(iam, res.id)
    for res in mine:
        if res.kind in (KIND_ROLE, KIND_CONTROLLER_ROLE):
            delete_role(iam, res.id)


def _created(entity: dict[str, Any]) -> float | None:
    value = entity.get("CreateDate")
    return value.timestamp() if isinstance(value, datetime) else None


def tagged_identities(iam: Any) -> list[Tagged]:
    """Every cloudtrain IAM role and instance profile of the account (IAM is global, so their
    region is None), of any run: named `cloudtrain-<run_id>` *and* tagged `cloudtrain:run` with
    that run id, so a user's own `cloudtrain-...` role is never taken for a run's. Listings
    omit tags, so each candidate is read once. Carries IAM's CreateDate. Blocks; read-only."""
    return _tagged(
        iam, KIND_ROLE, "list_roles", "Roles", "RoleName", "Role", iam.get_role
    ) + _tagged(
        iam,
        KIND_PROFILE,
        "list_instance_profiles",
        "InstanceProfiles",
        "InstanceProfileName",
        "InstanceProfile",
        iam.get_instance_profile,
    )


def _tagged(
    iam: Any,
    kind: str,
    lister: str,
    items: str,
    name_key: str,
    item_key: str,
    read: Callable[..., Any],
) -> list[Tagged]:
    """One IAM kind's cloudtrain entries (see `tagged_identities`). Blocks; read-only."""
    out: list[Tagged] = []
    with aws_errors(f"list IAM {items}"):
        found = [
            r
            for page in iam.get_paginator(lister).paginate()
            for r in page[items]
            if str(r.get(name_key, "")).startswith(NAME_PREFIX)
        ]
    for item in found:
        name = str(item[name_key])
        tags = item.get("Tags")
        if tags is None:  # listings omit tags: read the entry once
            full = call(f"read IAM {kind} {name}", lambda n=name: read(**{name_key: n}), ok=GONE)
            if full is None:
                continue
            tags = full[item_key].get("Tags")
        run_id = tag_dict(tags).get(TAG_RUN)
        if run_id and resource_name(run_id) == name:
            out.append(Tagged(run_id, kind, name, _created(item), region=None))
        elif run_id and controller_name(run_id) == name:
            out.append(Tagged(run_id, CONTROLLER_KINDS[kind], name, _created(item), region=None))
    return out


# --- the controller node's identity (issue 17) ---------------------------------------------------

CONTROLLER_SUFFIX = "-controller"  # never a run's own name: run ids end in six hex digits
EC2_SERVICE = "ec2.amazonaws.com"


def controller_name(run_id: str) -> str:
    """The controller node's role, instance profile and inline policy: `cloudtrain-<run>-
    controller` (at most 59 characters: IAM allows 64 for a role). Pure."""
    return resource_name(run_id) + CONTROLLER_SUFFIX


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
    and bucket prefix only. Pure; raises ProviderError for a non-s3:// store URI.

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
    names = [resource_name(run_id), controller_name(run_id)]
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
                "Sid": "PassOnlyTheNodeRole",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_role_arn,
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
                + [f"{iam}:instance-profile/{n}" for n in names],
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
    iam: Any, run_id: str, store_uri: str, region: str
) -> tuple[str, str]:
    """Create (or complete) the controller node's role, its inline policy (`controller_policy`)
    and its instance profile, all `controller_name(run_id)`; returns (role ARN, profile ARN).
    The run's node role must exist (`ensure_identity`: its ARN is the only one the controller
    may pass). Idempotent; blocks."""
    node_role = role_arn(iam, resource_name(run_id))
    if node_role is None:
        raise ProviderError(
            f"run {run_id} has no IAM role {resource_name(run_id)} for its controller to pass",
            hint="ensure_network must run before ensure_controller_identity",
        )
    name = controller_name(run_id)
    policy = json.dumps(controller_policy(run_id, store_uri, region, node_role))
    description = f"cloudtrain run {run_id}: its controller node (this run only)"
    return ensure_role_and_profile(iam, run_id, name, description, name, policy)
