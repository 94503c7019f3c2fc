"""The run's IAM identity: a role its nodes assume, limited to the run's own prefix in the bucket.

Role and instance profile are both `cloudtrain-<run_id>`; the role trusts ec2.amazonaws.com and
carries one inline policy, `cloudtrain-<run_id>-s3`: Get/Put/DeleteObject under
`<prefix>cloudtrain/runs/<run_id>/` and ListBucket restricted to that prefix. Nothing else, so a
node can neither read another run's data nor call any other AWS API.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cloudtrain.errors import ProviderError
from cloudtrain.jobs import protocol
from cloudtrain.providers.aws.errors import aws_errors
from cloudtrain.providers.aws.network import TAG_RUN, call, resource_name, tag_dict, tag_list
from cloudtrain.providers.base import Resource, Tagged

KIND_ROLE, KIND_PROFILE = "iam-role", "instance-profile"
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


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix ending in '/' or '') of an s3:// URI. Raises ProviderError. Pure."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ProviderError(
            f"the AWS provider needs an s3:// store URI, not {uri!r}",
            hint="set checkpoint: s3://BUCKET/PREFIX in job.yaml, or leave it out",
        )
    prefix = parsed.path.strip("/")
    return parsed.netloc, f"{prefix}/" if prefix else ""


def s3_policy(store_uri: str, run_id: str) -> dict[str, Any]:
    """The inline policy: objects under the run's prefix only, listing of that prefix only. Pure."""
    bucket, prefix = parse_s3_uri(store_uri)
    run_prefix = f"{prefix}{protocol.run_prefix(run_id)}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "RunObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": f"arn:aws:s3:::{bucket}/{run_prefix}*",
            },
            {
                "Sid": "ListRunPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{run_prefix}*"}},
            },
        ],
    }


def ensure_identity(iam: Any, run_id: str, store_uri: str) -> tuple[str, str]:
    """Create (or complete) the run's role, inline policy and instance profile; returns
    (role ARN, instance profile ARN). Idempotent: existing entities are fine. Blocks."""
    name = resource_name(run_id)
    policy = json.dumps(s3_policy(store_uri, run_id))  # a bad URI fails before any create
    tags = tag_list({TAG_RUN: run_id})
    call(
        f"create IAM role {name}",
        lambda: iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(TRUST_POLICY),
            Description=f"cloudtrain run {run_id}: its nodes' access to the run's S3 prefix",
            Tags=tags,
        ),
        ok={"EntityAlreadyExists"},
    )
    with aws_errors(f"tag IAM role {name}"):
        iam.tag_role(RoleName=name, Tags=tags)
    with aws_errors(f"put the S3 policy of IAM role {name}"):
        iam.put_role_policy(RoleName=name, PolicyName=policy_name(run_id), PolicyDocument=policy)
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
    """The run's role and instance profile that exist, as Resources (by name). Blocks."""
    name = resource_name(run_id)
    found = []
    role = role_arn(iam, name)
    if role:
        found.append(Resource("aws", KIND_ROLE, name, region, run_id, role))
    profile = instance_profile_arn(iam, name)
    if profile:
        found.append(Resource("aws", KIND_PROFILE, name, region, run_id, profile))
    return found


def delete_identity(iam: Any, resources: list[Resource]) -> None:
    """Delete the instance profiles among `resources`, then the roles; other kinds are ignored.
    Idempotent; blocks."""
    for res in resources:
        if res.kind == KIND_PROFILE:
            delete_instance_profile(iam, res.id)
    for res in resources:
        if res.kind == KIND_ROLE:
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
    return out
