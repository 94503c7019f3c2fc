"""The box's AWS account, as stingy as a new one: EC2's vCPU quotas per region, usage, zones
that are sold out, and callers who lack rights. The test-side API of tests/fakes/aws_front.py,
which answers with AWS's own shapes.

    account = moto_server.account        # tests/fakes/moto_server.MotoServer
    account.new_account(["us-east-1"])   # G/VT and P vCPU quotas 0, as AWS gives a new account
    account.set_quota("us-east-1", "L-DB2E81BA", 8)
    account.occupy("us-east-1", "g5.xlarge")   # another program's instance: 4 vCPUs of usage
    account.sell_out("us-east-1a")       # every RunInstances there: InsufficientInstanceCapacity
    account.restore("us-east-1a")
    account.deny("iam:CreateRole")       # the box's own key (the laptop) lacks that right
    key, secret = account.narrow_caller("alice", ["ec2:Describe*", "sts:GetCallerIdentity"])

Untouched, the account lets every run fit (each quota DEFAULT_LIMIT vCPUs, no zone sold out,
the box's key may do everything), as the box always did. `reset()` (called by
MotoServer.reset) forgets everything.

The EC2 On-Demand and Spot quotas are counted in vCPUs of the running instances of a class of
families, per region (EC2 User Guide, "On-Demand Instance quotas", docs.aws.amazon.com/AWSEC2/
latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits: "Amazon EC2 measures
usage towards each quota based on the total number of vCPUs ... assigned to the running
On-Demand Instances"; "Spot Instance quotas", using-spot-limits.html: running and requested
Spot Instances, in vCPUs). Quota codes and names: the Service Quotas console for Amazon EC2.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

DEFAULT_LIMIT = 4096.0  # vCPUs: an account that fits every box run
# code -> (name, class of families, spot); the classes are the quotas' own groupings
_STANDARD = "Standard (A, C, D, H, I, M, R, T, Z)"
QUOTAS: dict[str, tuple[str, str, bool]] = {
    "L-1216C47A": (f"Running On-Demand {_STANDARD} instances", "std", False),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", "g", False),
    "L-417A185B": ("Running On-Demand P instances", "p", False),
    "L-34B43A08": (f"All {_STANDARD} Spot Instance Requests", "std", True),
    "L-3819A6DF": ("All G and VT Spot Instance Requests", "g", True),
    "L-7212CCBC": ("All P Spot Instance Requests", "p", True),
}
# the usage metric each quota names in Service Quotas (UsageMetric: AWS/Usage ResourceCount,
# dimensions Class/Resource/Service/Type), per class and market
USAGE_CLASS = {("std", False): "Standard/OnDemand", ("g", False): "G/OnDemand",
               ("p", False): "P/OnDemand", ("std", True): "Standard/Spot",
               ("g", True): "G/Spot", ("p", True): "P/Spot"}  # fmt: skip
# families with quotas of their own (DL, HPC, Inf, Trn, F, X, U, Mac): none of the six above
_OWN_QUOTA = {"dl", "hpc", "inf", "trn", "f", "x", "u", "mac"}
_GPU = {"g": "g", "vt": "g", "p": "p"}
LIVE_STATES = ("pending", "running")  # what a vCPU quota counts


def quota_class(instance_type: str) -> str | None:
    """The class of vCPU quota ("std", "g", "p") an instance type counts against, from its
    family letters (g4dn.xlarge -> "g", vt1.3xlarge -> "g", im4gn.large -> "std"); None for
    the families with quotas of their own. Pure."""
    letters = re.match(r"[a-z]+", instance_type.lower())
    family = letters.group(0) if letters else ""
    if family in _GPU:
        return _GPU[family]
    if family in _OWN_QUOTA or not family or family[0] not in "acdhimrtz":
        return None
    return "std"


def vcpus_of(instance_type: str) -> int:
    """The default vCPUs of `instance_type`, from moto's copy of DescribeInstanceTypes; for a
    type moto lacks (p3.*), EC2's size rule (large 2, xlarge 4, Nxlarge 4N). Pure."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    info = INSTANCE_TYPES.get(instance_type)
    if info:
        return int(info["VCpuInfo"]["DefaultVCpus"])
    size = instance_type.split(".", 1)[-1]
    match = re.fullmatch(r"(\d*)xlarge", size)
    if match:
        return 4 * int(match.group(1) or 1)
    return {"large": 2, "medium": 2, "small": 2, "micro": 2, "nano": 2}.get(size, 2)


def quota_code(instance_type: str, spot: bool) -> str | None:
    """The code of the vCPU quota `instance_type` counts against on spot or on demand."""
    klass = quota_class(instance_type)
    return next((c for c, (_, k, s) in QUOTAS.items() if k == klass and s == spot), None)


@dataclass
class AwsAccount:
    """The box account's quotas, capacity and rights (the module docstring). Thread-safe."""

    limits: dict[tuple[str, str], float] = field(default_factory=dict)
    sold_out: set[str] = field(default_factory=set)
    denied: set[str] = field(default_factory=set)
    # (code, region, message) of each refusal the front answered, for tests to read
    refused: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        """Back to an account that fits every run. Idempotent."""
        with self.lock:
            self.limits.clear()
            self.sold_out.clear()
            self.denied.clear()
            self.refused.clear()

    def set_quota(self, region: str, code: str, limit: float) -> None:
        """Set quota `code` (one of QUOTAS) in `region` to `limit` vCPUs."""
        if code not in QUOTAS:
            raise ValueError(f"not an EC2 vCPU quota code the box knows: {code}")
        with self.lock:
            self.limits[(region, code)] = float(limit)

    def new_account(self, regions: list[str]) -> None:
        """What AWS gives a new account in `regions`: 0 vCPUs of G/VT and P, on demand and
        spot (the standard quotas keep their value)."""
        for region in regions:
            for code, (_, klass, _spot) in QUOTAS.items():
                if klass != "std":
                    self.set_quota(region, code, 0)

    def limit(self, region: str, code: str) -> float:
        """Quota `code`'s value in `region`."""
        with self.lock:
            return self.limits.get((region, code), DEFAULT_LIMIT)

    def occupy(self, region: str, instance_type: str, count: int = 1, spot: bool = False) -> None:
        """Usage the run did not make: `count` running instances of `instance_type` in
        `region`, untagged (another program's), made in moto's EC2 as RunInstances would; a
        probe sees them with DescribeInstances as it would see them on AWS."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        from tests.fakes.moto_server import moto_amis

        ec2_backends[DEFAULT_ACCOUNT_ID][region].run_instances(
            moto_amis(1)[0],
            count,
            None,
            [],
            **_run_kwargs(region, instance_type, spot),
        )

    def usage(self, region: str, code: str) -> float:
        """vCPUs counted against `code` in `region`: moto's pending and running instances of
        the quota's families and market."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        _, klass, spot = QUOTAS[code]
        total = 0.0
        for inst in ec2_backends[DEFAULT_ACCOUNT_ID][region].all_instances():
            if inst.state not in LIVE_STATES or quota_class(inst.instance_type) != klass:
                continue
            if (inst.lifecycle == "spot") == spot:
                total += vcpus_of(inst.instance_type)
        return total

    def sell_out(self, zone: str) -> None:
        """Every RunInstances in `zone` is refused for capacity until `restore(zone)`."""
        with self.lock:
            self.sold_out.add(zone)

    def restore(self, zone: str) -> None:
        """Give `zone` its capacity back. Idempotent."""
        with self.lock:
            self.sold_out.discard(zone)

    def is_sold_out(self, zone: str) -> bool:
        with self.lock:
            return zone in self.sold_out

    def deny(self, right: str) -> None:
        """The box's own key (the laptop's identity, the account owner otherwise) lacks
        `right` (an IAM action, e.g. "iam:CreateRole"): an explicit Deny in its policies."""
        with self.lock:
            self.denied.add(right)

    def allow(self, right: str) -> None:
        """Undo `deny(right)`. Idempotent."""
        with self.lock:
            self.denied.discard(right)

    def owner_policies(self) -> list[dict[str, Any]]:
        """The box key's identity policies: everything, minus `deny`'s rights."""
        with self.lock:
            denied = sorted(self.denied)
        statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": "*", "Resource": "*"}]
        if denied:
            statements.append({"Effect": "Deny", "Action": denied, "Resource": "*"})
        return [{"Version": "2012-10-17", "Statement": statements}]

    def narrow_caller(self, name: str, actions: list[str]) -> tuple[str, str]:
        """An IAM user `name` in moto whose one inline policy allows `actions` on every
        resource; returns its (access key id, secret). The front authenticates its SigV4
        signatures and refuses whatever the policy does not allow."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.iam.models import iam_backends

        iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
        iam.create_user(region_name="us-east-1", user_name=name, path="/", tags=[])
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
        }
        iam.put_user_policy(name, "cloudtrain-test", json.dumps(policy))
        key = iam.create_access_key(name)
        return key.access_key_id, key.secret_access_key


def _run_kwargs(region: str, instance_type: str, spot: bool) -> dict[str, Any]:
    """The keyword arguments moto's RunInstances handler passes its backend
    (moto/ec2/responses/instances.py, run_instances), for an untagged instance."""
    return {
        "instance_type": instance_type,
        "is_instance_type_default": False,
        "placement": None,
        "placement_hostid": None,
        "region_name": region,
        "subnet_id": None,
        "key_name": None,
        "security_group_ids": [],
        "nics": [],
        "private_ip": None,
        "associate_public_ip": None,
        "tags": {},
        "ebs_optimized": False,
        "disable_api_stop": False,
        "instance_market_options": "spot" if spot else {},
        "instance_initiated_shutdown_behavior": None,
        "launch_template": {},
        "hibernation_options": {},
        "iam_instance_profile_name": None,
        "iam_instance_profile_arn": None,
        "monitoring_state": "disabled",
        "ipv6_address_count": None,
        "metadata_options": {},
        "client_token": None,
    }
