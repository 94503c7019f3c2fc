"""AWS security groups, enforced: read back what moto holds and compile it per instance to nftables.

    snapshot = read_aws(ec2)                                  # boto3 EC2 client on moto
    rulesets = compile_aws(snapshot, {instance_id: host.ip})  # instance id -> ruleset text
    host.apply_nft(rulesets[instance_id])

The semantics, from the VPC user guide's "Security group rules"
(https://docs.aws.amazon.com/vpc/latest/userguide/security-group-rules.html) and "Security groups"
(https://docs.aws.amazon.com/vpc/latest/userguide/vpc-security-groups.html):
- an instance's inbound traffic is allowed by the union of the ingress rules of every group on
  it (its primary network interface's groups); rules are allow-only, so their order is moot;
  with no rule allowing it, inbound is denied;
- security groups are stateful: the answer to allowed traffic, and to the instance's own
  outbound traffic, always gets back in;
- a rule names a protocol (`IpProtocol`: "tcp", "udp", "icmp", a number, or "-1" for all, then
  without ports), a port range `FromPort`-`ToPort` (for ICMP the type and code, not compiled
  here: any ICMP is allowed), and sources: CIDRs (`IpRanges`, `Ipv6Ranges`) and groups
  (`UserIdGroupPairs`): "traffic is allowed based on the private IP addresses of the network
  interfaces that are associated with the source security group";
- outbound: cloudtrain keeps a group's default egress (all traffic), so egress is not compiled.

In the box, an instance's private address is its namespace's (`vm_to_ip`): a group source is the
box addresses of the live instances carrying the group; a CIDR is itself plus the box address of
every instance of the same VPC whose cloud private address falls in it (firewall_nft.Addresses;
VPCs are isolated unless peered). Instances that have no box address are nobody in the box.
Prefix lists (`PrefixListIds`) are not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.firewall_nft import ACCEPT, Addresses, Layer, Rule, render

DEAD = ("shutting-down", "terminated")  # instances whose interfaces are gone (or going)
PROTOCOLS = {"6": "tcp", "17": "udp", "1": "icmp", "58": "icmpv6"}


@dataclass(frozen=True)
class AwsSnapshot:
    """The security groups and instances as DescribeSecurityGroups/DescribeInstances answer."""

    groups: list[dict[str, Any]]
    instances: list[dict[str, Any]]


def read_aws(ec2: Any) -> AwsSnapshot:
    """Every security group and instance of the client's region, read back from the cloud
    (moto) with the same EC2 API the adapter uses. Blocks; read-only."""
    groups = [
        g
        for page in ec2.get_paginator("describe_security_groups").paginate()
        for g in page["SecurityGroups"]
    ]
    instances = [
        inst
        for page in ec2.get_paginator("describe_instances").paginate()
        for reservation in page["Reservations"]
        for inst in reservation["Instances"]
    ]
    return AwsSnapshot(groups, instances)


def instance_groups(inst: Mapping[str, Any]) -> list[str]:
    """The group ids on an instance: its `SecurityGroups` and its interfaces' `Groups`. Pure."""
    ids = [g["GroupId"] for g in inst.get("SecurityGroups") or []]
    for nic in inst.get("NetworkInterfaces") or []:
        ids += [g["GroupId"] for g in nic.get("Groups") or []]
    return sorted(set(ids))


def _live(snapshot: AwsSnapshot) -> list[dict[str, Any]]:
    return [i for i in snapshot.instances if (i.get("State") or {}).get("Name") not in DEAD]


def _protocol_and_ports(perm: Mapping[str, Any]) -> tuple[str | None, tuple[tuple[int, int], ...]]:
    raw = str(perm.get("IpProtocol", "-1")).lower()
    if raw in ("-1", "all"):
        return None, ()  # all traffic: AWS ignores the ports
    proto = PROTOCOLS.get(raw, raw)
    low, high = perm.get("FromPort"), perm.get("ToPort")
    if proto not in ("tcp", "udp") or low is None or int(low) == -1:
        return proto, ()  # ICMP type/code and other protocols: every "port"
    return proto, ((int(low), int(high if high is not None else low)),)


def permission_rules(
    perm: Mapping[str, Any], members: Mapping[str, list[str]], addresses: Addresses, group: str
) -> list[Rule]:
    """One `IpPermissions` entry as allow rules (one for its CIDRs, one per source group).
    `members`: group id -> the box addresses of the instances carrying it. Pure."""
    proto, ports = _protocol_and_ports(perm)
    what = f"{group} {perm.get('IpProtocol')} {perm.get('FromPort')}-{perm.get('ToPort')}"
    rules = []
    cidrs = [r["CidrIp"] for r in perm.get("IpRanges") or []]
    cidrs += [r["CidrIpv6"] for r in perm.get("Ipv6Ranges") or []]
    if cidrs:
        rules.append(Rule(ACCEPT, proto, ports, addresses.translate(cidrs), (), what))
    for pair in perm.get("UserIdGroupPairs") or []:
        source = pair["GroupId"]
        sources = tuple(sorted(members.get(source, [])))
        rules.append(Rule(ACCEPT, proto, ports, sources, (), f"{what} from {source}"))
    return rules


def layers_aws(snapshot: AwsSnapshot, vm_to_ip: Mapping[str, str]) -> dict[str, list[Layer]]:
    """Per instance id in `vm_to_ip` (instance id -> its address in the box) that the snapshot
    holds alive, its firewall as one Layer: the union of its groups' ingress rules. Pure."""
    live = _live(snapshot)
    inside = [i for i in live if i["InstanceId"] in vm_to_ip]
    box = {i["InstanceId"]: vm_to_ip[i["InstanceId"]] for i in inside}
    members: dict[str, list[str]] = {}
    for inst in live:
        if inst["InstanceId"] in box:
            for group in instance_groups(inst):
                members.setdefault(group, []).append(box[inst["InstanceId"]])
    by_id = {g["GroupId"]: g for g in snapshot.groups}
    out: dict[str, list[Layer]] = {}
    for inst in live:
        iid = inst["InstanceId"]
        if iid not in box:
            continue
        # only instances of the same VPC reach its private address (VPCs are isolated unless
        # peered): they alone stand behind a CIDR
        vpc = inst.get("VpcId")
        same = [i for i in inside if i.get("VpcId") == vpc]
        addresses = Addresses({i.get("PrivateIpAddress", ""): box[i["InstanceId"]] for i in same})
        rules: list[Rule] = []
        names = []
        for group_id in instance_groups(inst):
            group = by_id.get(group_id, {})
            names.append(str(group.get("GroupName", group_id)))
            for perm in group.get("IpPermissions") or []:
                rules += permission_rules(perm, members, addresses, group_id)
        out[iid] = [Layer("security groups " + ", ".join(names), tuple(rules))]
    return out


def compile_aws(snapshot: AwsSnapshot, vm_to_ip: Mapping[str, str]) -> dict[str, str]:
    """Per instance id in `vm_to_ip` (instance id -> its address in the box) that the snapshot
    holds alive, its nftables ruleset (`layers_aws` rendered by firewall_nft.render). Pure."""
    return {iid: render(layers, iid) for iid, layers in layers_aws(snapshot, vm_to_ip).items()}


def aws_rulesets(ec2: Any, vm_to_ip: Mapping[str, str]) -> dict[str, str]:
    """`compile_aws(read_aws(ec2), vm_to_ip)`: read back, then compile. Blocks; read-only."""
    return compile_aws(read_aws(ec2), vm_to_ip)
