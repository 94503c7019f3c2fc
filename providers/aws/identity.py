"""The run's IAM identities: one role per node of the run, limited to that node's own keys.

Each node id of the run ("chief-0", "worker-1", ...) has a role and an instance profile, both
`node_name(run, node)` = `cloudtrain-<run_id>-<node>` (IAM allows 64 characters for a role
name, 128 for a profile: a longer node id is cut and hashed), at the IAM path
`/cloudtrain/<run_id>/` (`node_path`: so the controller may pass exactly this run's node roles,
and `down` lists them, by one ARN pattern), tagged `cloudtrain:run` and `cloudtrain:node`. A
replacement of a node boots with the same profile. The role trusts ec2.amazonaws.com and carries
one inline policy, `cloudtrain-<run_id>-s3` (`node_policy.s3_policy`): reads of the run's prefix
except its key, ListBucket of that prefix, writes of the node's own keys only
(`jobs/node_rights.py`), never the controller's documents (issue 29). Nothing else, so a node
can neither read another run's data, nor write a peer's status, nor call any other AWS API.
Runs made before one role per node have one role `cloudtrain-<run_id>` (path `/`): `down` and
`gc` still find and delete it.

The run's controller node (issue 17) has its own role and instance profile,
`cloudtrain-<run_id>-controller` (kinds controller-role, controller-instance-profile), whose one
inline policy (controller_identity.py) reaches this run's instances, security group, IAM
entities and bucket prefix only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from cloudtrain.core.errors import ProviderError
from cloudtrain.jobs.node_rights import chief_of
from cloudtrain.providers.aws.errors import aws_errors
from cloudtrain.providers.aws.network import TAG_RUN, call, resource_name, tag_dict, tag_list
from cloudtrain.providers.aws.node_policy import s3_policy
from cloudtrain.providers.base import Resource, Tagged
from cloudtrain.providers.ownership import Refusals

KIND_ROLE, KIND_PROFILE = "iam-role", "instance-profile"
KIND_CONTROLLER_ROLE, KIND_CONTROLLER_PROFILE = "controller-role", "controller-instance-profile"
CONTROLLER_KINDS = {KIND_ROLE: KIND_CONTROLLER_ROLE, KIND_PROFILE: KIND_CONTROLLER_PROFILE}
NAME_PREFIX = resource_name("")  # every role and profile cloudtrain makes starts so
GONE = {"NoSuchEntity"}
TAG_NODE = "cloudtrain:node"  # a node role's node id
ROLE_NAME_MAX = 64  # IAM quotas: a role name has at most 64 characters, a profile's 128
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


def node_path(run_id: str) -> str:
    """The IAM path of the run's node roles and profiles: `/cloudtrain/<run_id>/`. Pure."""
    return f"/cloudtrain/{run_id}/"


def node_name(run_id: str, node: str) -> str:
    """The role and instance profile of node `node` of the run: `cloudtrain-<run>-<node>`, at
    most 64 characters (a longer node id is cut and 8 hex digits of its hash appended). Pure."""
    name = f"{resource_name(run_id)}-{node}"
    if len(name) <= ROLE_NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    keep = max(ROLE_NAME_MAX - len(resource_name(run_id)) - 2 - len(digest), 1)
    return f"{resource_name(run_id)}-{node[:keep]}-{digest}"


def ensure_identities(
    iam: Any, run_id: str, store_uri: str, nodes: Sequence[str]
) -> dict[str, tuple[str, str]]:
    """Create (or complete) each node's role, inline policy (`node_policy.s3_policy`, the
    chief's rights for `chief_of(nodes)`) and instance profile; returns node id -> (role ARN,
    instance profile ARN). Idempotent: existing entities are fine. Blocks. Raises
    ProviderError for a non-s3:// store or no nodes, before any create."""
    if not nodes:
        raise ProviderError(f"run {run_id} has no nodes to make IAM roles for")
    chief = chief_of(nodes)
    policies = {n: json.dumps(s3_policy(store_uri, run_id, n, chief=n == chief)) for n in nodes}
    out = {}
    for node in nodes:
        out[node] = ensure_role_and_profile(
            iam,
            run_id,
            node_name(run_id, node),
            f"cloudtrain run {run_id}: node {node}'s access to its keys in the run's S3 prefix",
            policy_name(run_id),
            policies[node],
            path=node_path(run_id),
            node=node,
        )
    return out


def ensure_role_and_profile(
    iam: Any,
    run_id: str,
    name: str,
    description: str,
    policy_name: str,
    policy: str,
    *,
    path: str = "/",
    node: str | None = None,
) -> tuple[str, str]:
    """Create (or complete) role `name` at IAM path `path` (EC2 may assume it) with its one
    inline policy, tagged with the run (and `node`, if given), and the instance profile of the
    same name and path holding it; returns (role ARN, instance profile ARN). Idempotent:
    existing entities are fine. Blocks."""
    tags = tag_list({TAG_RUN: run_id, **({TAG_NODE: node} if node else {})})
    call(
        f"create IAM role {name}",
        lambda: iam.create_role(
            Path=path,
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
        lambda: iam.create_instance_profile(InstanceProfileName=name, Path=path, Tags=tags),
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


def _listed(iam: Any, lister: str, items: str, name_key: str, path: str) -> list[tuple[str, str]]:
    """(name, ARN) of the IAM entities of one kind at exactly `path` (roles or instance
    profiles). PathPrefix also matches deeper paths, so each entity's Path is checked too (and
    an emulator that ignores PathPrefix is then harmless). Blocks; read-only."""
    with aws_errors(f"list IAM {items} at {path}"):
        return [
            (str(r[name_key]), str(r["Arn"]))
            for page in iam.get_paginator(lister).paginate(PathPrefix=path)
            for r in page[items]
            if r.get("Path") == path
        ]


def identity_resources(iam: Any, region: str, run_id: str) -> list[Resource]:
    """The run's node roles and instance profiles (at `node_path`, and the one role and profile
    `cloudtrain-<run>` of a run made before one role per node), then its controller node's
    (`controller_name`) instance profile and role, those that exist, as Resources (by name).
    `delete_identity` checks each one's tags before deleting it. The controller's profile comes
    before its role: the controller deleting its own identity one resource at a time loses
    every right with its role's policy, so its profile must go first (what is left then is an
    empty role, which grants nothing, for `down`). Blocks."""
    found = []
    path = node_path(run_id)
    for name, arn in _listed(iam, "list_roles", "Roles", "RoleName", path):
        found.append(Resource("aws", KIND_ROLE, name, region, run_id, arn))
    for name, arn in _listed(
        iam, "list_instance_profiles", "InstanceProfiles", "InstanceProfileName", path
    ):
        found.append(Resource("aws", KIND_PROFILE, name, region, run_id, arn))
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


def _node_named(run_id: str, name: str, tags: Any) -> bool:
    """Whether `name` is the run's node identity of the node its `cloudtrain:node` tag names,
    or the one node role of a run made before one role per node. Pure."""
    node = tag_dict(tags).get(TAG_NODE)
    if node is None:
        return name == resource_name(run_id)
    return name == node_name(run_id, node)


def _is_runs(iam: Any, res: Resource) -> str | None:
    """Why `res` (a role or instance profile) is not its run's, or None when it is (or is gone):
    its name must be the run's (`node_name` of its `cloudtrain:node` tag, `resource_name`, or
    `controller_name` for its kind) and the entity must carry the tag `cloudtrain:run` = the
    run id, read from IAM first. Blocks."""
    controller = res.kind in (KIND_CONTROLLER_ROLE, KIND_CONTROLLER_PROFILE)
    wanted = controller_name(res.run_id) if controller else f"{resource_name(res.run_id)}[-NODE]"
    if controller:
        named = res.id == controller_name(res.run_id)
    else:
        named = res.id.startswith(resource_name(res.run_id)) and res.id != controller_name(
            res.run_id
        )
    if not res.run_id or not named:
        return f"not the run's name ({wanted!r} expected)"
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
    if not controller and not _node_named(res.run_id, res.id, entity.get("Tags")):
        return f"not the name its {TAG_NODE} tag gives ({wanted!r} expected)"
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
    region is None), of any run: tagged `cloudtrain:run` with a run id *and* named as that run's
    (a node's `node_name` by its `cloudtrain:node` tag, the old per-run `cloudtrain-<run_id>`,
    or the controller's), so a user's own `cloudtrain-...` role is never taken for a run's. Listings
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
        if run_id and _node_named(run_id, name, tags):
            out.append(Tagged(run_id, kind, name, _created(item), region=None))
        elif run_id and controller_name(run_id) == name:
            out.append(Tagged(run_id, CONTROLLER_KINDS[kind], name, _created(item), region=None))
    return out


# --- the controller node's identity (issue 17) ---------------------------------------------------

CONTROLLER_SUFFIX = "-controller"  # never a run's own name: run ids end in six hex digits


def controller_name(run_id: str) -> str:
    """The controller node's role, instance profile and inline policy: `cloudtrain-<run>-
    controller` (at most 59 characters: IAM allows 64 for a role). Pure."""
    return resource_name(run_id) + CONTROLLER_SUFFIX
