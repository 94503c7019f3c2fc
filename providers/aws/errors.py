"""botocore exceptions -> cloudtrain errors. The only place AWS error codes are interpreted.

Use `with aws_errors("create instance ct-x-worker-0 in us-east-1a"):` around every SDK call; the
`what` names the resource, so the message tells the user what failed and the hint what to do.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from cloudtrain.core.errors import (
    AlreadyExists,
    CloudtrainError,
    CredentialsError,
    NoCapacityError,
    NotFound,
    PreconditionFailed,
    ProviderError,
    QuotaError,
    TransientError,
)

CAPACITY_CODES = frozenset({"InsufficientInstanceCapacity", "Unsupported", "InsufficientCapacity"})
QUOTA_CODES = {
    "VcpuLimitExceeded": "EC2 'Running On-Demand instances' vCPU quota (Service Quotas: L-1216C47A "
    "for standard, L-DB2E81BA for G/VT, L-417A185B for P instances)",
    "MaxSpotInstanceCountExceeded": "EC2 'All Spot Instance Requests' vCPU quota",
    "InstanceLimitExceeded": "EC2 instance count quota",
    "LimitExceeded": "IAM quota (roles or instance profiles)",
    "RulesPerSecurityGroupLimitExceeded": "VPC rules-per-security-group quota",
    "SecurityGroupLimitExceeded": "VPC security-groups-per-region quota",
    "TooManyBuckets": "S3 buckets-per-account quota",
}
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "SlowDown",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "RequestTimeout",
        "DependencyViolation",  # a security group still referenced by terminating instances
        "IncorrectInstanceState",
    }
)
NOT_FOUND_CODES = frozenset(
    {
        "NoSuchKey",
        "NoSuchBucket",
        "NoSuchEntity",
        "404",
        "NotFound",
        "InvalidInstanceID.NotFound",
        "InvalidGroup.NotFound",
        "InvalidPermission.NotFound",
        "ParameterNotFound",
    }
)

# A conditional write (PutObject If-Match / If-None-Match) that lost: 412 PreconditionFailed, or
# 409 ConditionalRequestConflict when another conditional write to the key was in flight ("fetch
# the object's ETag and retry": the S3 API reference of PutObject, botocore's service model).
PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})

# a create that found its resource there already (S3, IAM, EC2 security groups and rules)
ALREADY_EXISTS_CODES = frozenset(
    {
        "BucketAlreadyOwnedByYou",
        "EntityAlreadyExists",
        "InvalidGroup.Duplicate",
        "InvalidPermission.Duplicate",
    }
)


ACCESS_DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
# the right a refusal names: IAM, STS and (since it names it) EC2 say "User: <arn> is not
# authorized to perform: <action> on resource: ..." (IAM User Guide, "Troubleshoot access
# denied error messages"); an older EC2 message carries it only encoded
_PERFORM = re.compile(r"not authorized to perform:? ([A-Za-z0-9-]+:[A-Za-z0-9*]+)")
_ZONE_NAME = re.compile(r"\b([a-z]{2}(?:-[a-z]+)+-\d)[a-z]\b")
_INSTANCE_TYPE = re.compile(r"\(([a-z][a-z0-9-]*\.[a-z0-9-]+)\)")


def denied_right(exc: ClientError) -> str:
    """The IAM action an access-denied answer names; else EC2's for an EC2 refusal
    (`UnauthorizedOperation` is EC2's code), else the refused operation's name. Pure."""
    message = str(exc.response.get("Error", {}).get("Message", ""))
    found = _PERFORM.search(message)
    if found:
        return found.group(1)
    operation = str(getattr(exc, "operation_name", "") or "")
    return f"ec2:{operation}" if error_code(exc) == "UnauthorizedOperation" else operation


def quota_named(code: str, what: str, zone: str | None) -> str:
    """The quota a quota refusal of `what` (which names the instance type in parentheses, as
    compute.py's create does) counts against, with its region: "EC2 quota L-DB2E81BA 'Running
    On-Demand G and VT instances' in us-east-1", else QUOTA_CODES' words. Pure."""
    from cloudtrain.providers.aws.vcpu_quotas import vcpu_quota

    found = _INSTANCE_TYPE.search(what)
    spot = code == "MaxSpotInstanceCountExceeded"
    quota = vcpu_quota(found.group(1), spot) if found and code in _VCPU_CODES else None
    names = _ZONE_NAME.findall(f"{zone or ''} {what}")  # a zone name: its region and a letter
    region = f" in {names[0]}" if names else ""
    if quota is None:
        return QUOTA_CODES[code] + region
    return f"EC2 quota {quota[0]} '{quota[1]}' (vCPUs){region}"


_VCPU_CODES = frozenset({"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"})


def error_code(exc: ClientError) -> str:
    """The AWS error code of a ClientError ('' if none)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(exc: Exception, what: str, zone: str | None = None) -> CloudtrainError:
    """The cloudtrain error for an SDK exception raised while doing `what`. A ClientError's
    code and HTTP status are its `codes`; a duplicate of the caller's own resource
    (ALREADY_EXISTS_CODES) is an AlreadyExists, a ProviderError; a lost conditional write
    (PRECONDITION_CODES, HTTP 412) a PreconditionFailed. Pure."""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return CredentialsError(
            f"{what}: no AWS credentials found",
            hint="run `aws configure`, set AWS_PROFILE, or use an instance role",
        )
    if isinstance(exc, NoRegionError):
        return ProviderError(f"{what}: no AWS region", hint="set region: in job.yaml or AWS_REGION")
    if isinstance(exc, EndpointConnectionError):
        return TransientError(f"{what}: cannot reach the AWS endpoint ({exc})")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "") or str(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"{what}: {code}: {message}"
        codes = frozenset(c for c in (code, str(status) if status else "") if c)
        if code in CAPACITY_CODES:
            return NoCapacityError(
                text, zone=zone, hint="cloudtrain tries the region's next zone", codes=codes
            )
        if code in QUOTA_CODES:
            quota = quota_named(code, what, zone)
            return QuotaError(
                f"{what}: {code} ({quota}): {message}",
                hint=f"ask AWS to raise the {quota} (Service Quotas console)",
                codes=codes,
            )
        if code in PRECONDITION_CODES or status == 412:
            return PreconditionFailed(text, codes=codes)
        if code in NOT_FOUND_CODES or status == 404:
            return NotFound(text, codes=codes)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientError(text, codes=codes)
        if code in (
            "AuthFailure",
            "UnrecognizedClientException",
            "InvalidClientTokenId",
            "ExpiredToken",
            "SignatureDoesNotMatch",
        ):
            return CredentialsError(text, hint="refresh your AWS credentials", codes=codes)
        if code in ACCESS_DENIED_CODES:
            right = denied_right(exc)
            return CredentialsError(
                f"{what}: {code}: the AWS identity lacks {right}: {message}",
                hint=f"grant {right} (`cloudtrain check` lists every right a run lacks)",
                codes=codes,
            )
        if code in ALREADY_EXISTS_CODES:
            return AlreadyExists(text, codes=codes)
        return ProviderError(text, codes=codes)
    if isinstance(exc, BotoCoreError):
        return TransientError(f"{what}: {exc}")
    raise exc


@contextlib.contextmanager
def aws_errors(what: str, zone: str | None = None) -> Iterator[None]:
    """Translate SDK exceptions raised inside the block (see `translate`)."""
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, what, zone) from exc
