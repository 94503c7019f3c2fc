"""The AWS account, asked read-only before anything exists (issue 30): `AwsAccountProbe`.

- `credentials()`: the link of botocore's own chain that gave the credentials
  (`Credentials.method`: "env", "shared-credentials-file", "iam-role", "assume-role", "sso", ...)
  and the caller from sts:GetCallerIdentity (which needs no permission: STS API Reference);
- `apis()`: whether EC2, IAM, SSM, STS and Service Quotas answer in the region (an opt-in
  region not enabled for the account answers `OptInRequired`; EC2 User Guide, "Enable or
  disable AWS Regions in your account");
- `missing_rights()`: `RUN_RIGHTS` that IAM's policy simulator (iam:SimulatePrincipalPolicy on
  the caller's own user or role) does not answer "allowed";
- `quotas(region, needs)`: EC2's vCPU quotas the needs count against (Service Quotas, service
  code `ec2`: L-1216C47A Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances,
  L-DB2E81BA Running On-Demand G and VT instances, L-417A185B Running On-Demand P instances,
  L-34B43A08 / L-3819A6DF / L-7212CCBC the Standard / G and VT / P Spot Instance Requests),
  with their usage counted as AWS counts it: the vCPUs of the region's running (and pending)
  instances of the quota's families and market (EC2 User Guide, "On-Demand Instance quotas":
  "usage towards each quota based on the total number of vCPUs ... assigned to the running
  On-Demand Instances"; "Spot Instance quotas": in vCPUs, running and requested).

The rights a run needs (`RUN_RIGHTS`) come from one place for the controller's part: the
managed controller node's policy (`controller_identity.controller_policy`), its wildcard
`ec2:Describe*` spelt out as the Describe calls the adapters make, plus `SETUP_RIGHTS`, what
only the laptop does (the bucket, the security group, the run's IAM roles, which the controller
node only deletes). boto3 is imported only when a probe is made.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cloudtrain.core.errors import CredentialsError, ProviderError
from cloudtrain.providers.account import (
    AccountProbe,
    ApiState,
    CredentialSource,
    QuotaLine,
    QuotaNeed,
)
from cloudtrain.providers.aws.vcpu_quotas import vcpu_quota

# botocore's Credentials.method (botocore/credentials.py providers' METHOD) -> words
SOURCES = {
    "env": "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
    "shared-credentials-file": "shared credentials file (~/.aws/credentials), profile {profile}",
    "config-file": "config file (~/.aws/config), profile {profile}",
    "assume-role": "assumed role of profile {profile} (~/.aws/config role_arn)",
    "assume-role-with-web-identity": "web identity token (AWS_WEB_IDENTITY_TOKEN_FILE)",
    "sso": "IAM Identity Center (SSO) of profile {profile}",
    "custom-process": "credential_process of profile {profile}",
    "container-role": "container credentials (ECS/EKS task role)",
    "iam-role": "instance metadata (the EC2 instance's role)",
    "explicit": "credentials passed to the session",
}
# EC2's Describe calls the adapters make (compute.py, network.py, zones.py, pricing.py): the
# controller's policy grants them as `ec2:Describe*`, which the simulator does not take
DESCRIBES = (
    "ec2:DescribeAvailabilityZones",
    "ec2:DescribeInstances",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeVpcs",
)
# what the laptop does that the controller node does not: storage.py makes the bucket,
# network.py the security group, identity.py the run's roles and instance profiles
SETUP_RIGHTS = (
    "ec2:AuthorizeSecurityGroupIngress",
    "ec2:CreateSecurityGroup",
    "iam:AddRoleToInstanceProfile",
    "iam:CreateInstanceProfile",
    "iam:CreateRole",
    "iam:DetachRolePolicy",
    "iam:PutRolePolicy",
    "iam:TagRole",
    "s3:AbortMultipartUpload",
    "s3:CreateBucket",
    "s3:GetLifecycleConfiguration",
    "s3:PutBucketPublicAccessBlock",
    "s3:PutEncryptionConfiguration",
    "s3:PutLifecycleConfiguration",
)


def run_rights() -> list[str]:
    """The IAM actions a run needs of the laptop's identity, sorted. Pure."""
    from cloudtrain.providers.aws.controller_identity import controller_policy

    policy = controller_policy("probe", "s3://probe/", "us-east-1", "arn:aws:iam::0:role/probe")
    actions: set[str] = set(SETUP_RIGHTS)
    for statement in policy["Statement"]:
        listed = statement["Action"]
        for action in [listed] if isinstance(listed, str) else listed:
            actions.update(DESCRIBES if action == "ec2:Describe*" else [action])
    return sorted(actions)


def role_arn_of(caller: str) -> str:
    """The IAM ARN the policy simulator takes for a caller ARN: an assumed role's session
    `arn:aws:sts::A:assumed-role/R/S` is role `arn:aws:iam::A:role/R` (a role at a path needs
    its path: see `AwsAccountProbe._source_arn`). Pure."""
    match = re.fullmatch(r"arn:([^:]+):sts::(\d+):assumed-role/([^/]+)/.+", caller)
    if match:
        return f"arn:{match.group(1)}:iam::{match.group(2)}:role/{match.group(3)}"
    return caller


class AwsAccountProbe(AccountProbe):
    """AWS's answers for one region's clients (`clients.client`); read-only; each method
    blocks on AWS and raises CredentialsError / ProviderError (errors.translate)."""

    def __init__(self, region: str) -> None:
        self.region = region

    def _client(self, service: str, region: str | None = None) -> Any:
        from cloudtrain.providers.aws.clients import client

        return client(service, region or self.region)

    def credentials(self) -> CredentialSource:
        """Where botocore's chain found credentials, and the caller (sts:GetCallerIdentity)."""
        from cloudtrain.providers.aws.clients import session
        from cloudtrain.providers.aws.errors import aws_errors

        sess = session(self.region)
        found = sess.get_credentials()
        if found is None:
            raise CredentialsError(
                "no AWS credentials found",
                hint="run `aws configure`, set AWS_PROFILE, or use an instance role",
            )
        profile = sess.profile_name or "default"
        method = str(getattr(found, "method", "") or "")
        source = SOURCES.get(method, method or "unknown").format(profile=profile)
        with aws_errors("look up the AWS caller (sts:GetCallerIdentity)"):
            ident = self._client("sts").get_caller_identity()
        return CredentialSource(source, str(ident["Arn"]), str(ident["Account"]))

    def apis(self) -> list[ApiState]:
        """EC2, IAM, SSM, STS and Service Quotas in the region, each asked one read a run
        makes; a refusal of the read still shows the API answers (missing_rights names it)."""
        from botocore.exceptions import BotoCoreError, ClientError

        calls = [
            ("sts", lambda c: c.get_caller_identity()),
            ("ec2", lambda c: c.describe_availability_zones()),
            ("iam", lambda c: c.list_roles(MaxItems=1)),
            ("ssm", lambda c: c.describe_parameters(MaxResults=1)),
            (
                "servicequotas",
                lambda c: c.get_service_quota(ServiceCode="ec2", QuotaCode="L-1216C47A"),
            ),
        ]
        out = []
        for name, call in calls:
            service = "service-quotas" if name == "servicequotas" else name
            try:
                call(self._client(service))
                out.append(ApiState(f"{name}.amazonaws.com", True))
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                denied = code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")
                detail = f"{code}: {exc.response.get('Error', {}).get('Message', '')}"
                out.append(ApiState(f"{name}.amazonaws.com", denied, detail))
            except BotoCoreError as exc:
                out.append(ApiState(f"{name}.amazonaws.com", False, str(exc)))
        return out

    def _source_arn(self, caller: str) -> str:
        """The user or role ARN (with its path) to simulate for the caller."""
        from cloudtrain.providers.aws.errors import aws_errors

        arn = role_arn_of(caller)
        if arn != caller:
            name = arn.rsplit("/", 1)[1]
            with aws_errors(f"look up the caller's role {name} (iam:GetRole)"):
                return str(self._client("iam").get_role(RoleName=name)["Role"]["Arn"])
        return arn

    def missing_rights(self) -> list[str]:
        """`run_rights()` that IAM's policy simulator does not allow the caller, sorted. The
        account's root user may do everything (the simulator does not take it): []."""
        from cloudtrain.providers.aws.errors import aws_errors

        caller = self.credentials().principal
        if caller.endswith(":root"):
            return []
        source = self._source_arn(caller)
        rights = run_rights()
        missing: set[str] = set()
        with aws_errors(f"ask IAM's policy simulator about {source}"):
            pages = self._client("iam").get_paginator("simulate_principal_policy")
            for page in pages.paginate(PolicySourceArn=source, ActionNames=rights):
                for result in page["EvaluationResults"]:
                    if result["EvalDecision"] != "allowed":
                        missing.add(str(result["EvalActionName"]))
        return sorted(missing)

    def quotas(self, region: str, needs: Sequence[QuotaNeed]) -> list[QuotaLine]:
        """The vCPU quotas of `region` the needs count against, with limit (Service Quotas'
        GetServiceQuota), usage (the region's pending and running instances' vCPUs) and need
        (vCPUs x nodes, summed per quota). A family with a quota of its own: no line."""
        from cloudtrain.providers.aws.errors import aws_errors

        wanted: dict[str, float] = {}
        for need in needs:
            quota = vcpu_quota(need.instance_type, need.spot)
            if quota is not None:
                code = quota[0]
                wanted[code] = wanted.get(code, 0.0) + need.vcpus * need.nodes
        if not wanted:
            return []
        usage = self._usage(region)
        lines = []
        sq = self._client("service-quotas", region)
        for code, need in sorted(wanted.items()):
            with aws_errors(f"read EC2 quota {code} in {region} (servicequotas:GetServiceQuota)"):
                quota = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
            name = f"{code} {quota.get('QuotaName', '')}".strip()
            limit = float(quota.get("Value", 0.0))
            lines.append(QuotaLine(region, name, "vCPU", limit, usage.get(code, 0.0), need))
        return lines

    def _usage(self, region: str) -> dict[str, float]:
        """vCPUs of `region`'s pending and running instances, per quota code."""
        from cloudtrain.providers.aws.errors import aws_errors

        ec2 = self._client("ec2", region)
        live = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
        instances: list[dict[str, Any]] = []
        with aws_errors(f"list the instances of {region} (ec2:DescribeInstances)"):
            for page in ec2.get_paginator("describe_instances").paginate(Filters=live):
                for reservation in page["Reservations"]:
                    instances += reservation["Instances"]
        bare = {str(i["InstanceType"]) for i in instances if not i.get("CpuOptions")}
        vcpus = self._vcpus(ec2, bare, region)
        usage: dict[str, float] = {}
        for inst in instances:
            quota = vcpu_quota(str(inst["InstanceType"]), inst.get("InstanceLifecycle") == "spot")
            if quota is None:
                continue
            code = quota[0]
            cpu = inst.get("CpuOptions") or {}
            count = cpu.get("CoreCount", 0) * cpu.get("ThreadsPerCore", 0)
            usage[code] = usage.get(code, 0.0) + (count or vcpus[str(inst["InstanceType"])])
        return usage

    def _vcpus(self, ec2: Any, types: set[str], region: str) -> dict[str, int]:
        """Each instance type's default vCPUs (ec2:DescribeInstanceTypes)."""
        from cloudtrain.providers.aws.errors import aws_errors

        out: dict[str, int] = {}
        names = sorted(types)
        for start in range(0, len(names), 100):  # DescribeInstanceTypes takes up to 100
            with aws_errors(f"describe instance types in {region} (ec2:DescribeInstanceTypes)"):
                found = ec2.describe_instance_types(InstanceTypes=names[start : start + 100])
            for item in found["InstanceTypes"]:
                out[str(item["InstanceType"])] = int(item["VCpuInfo"]["DefaultVCpus"])
        missing = [t for t in names if t not in out]
        if missing:
            raise ProviderError(f"EC2 did not describe instance types {missing} in {region}")
        return out
