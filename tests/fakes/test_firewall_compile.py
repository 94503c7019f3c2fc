"""The firewall compilers of the box (tests/fakes/firewall_*.py), on cloud JSON recorded from the
fakes (tests/fixtures/firewall/): which rules each node gets, in which order, from which sources,
and the nftables text they render to. Pure: no namespace and no fake running (the probe tests in
tests/e2e/test_firewall_probes.py send the packets)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.fakes.firewall_aws import AwsSnapshot, compile_aws, layers_aws
from tests.fakes.firewall_azure import DEFAULT_INBOUND, LOAD_BALANCER, AzureSnapshot, layers_azure
from tests.fakes.firewall_gcp import GcpSnapshot, layers_gcp
from tests.fakes.firewall_nft import ACCEPT, DROP, Layer, Rule, port_range, render

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "firewall"
A, B = "10.213.9.2", "10.213.9.3"
SSH_CIDR = "203.0.113.7/32"  # the ssh_cidr the recordings were made with


def recorded(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def summary(layer: Layer) -> list[tuple[str, str | None, tuple, tuple | None]]:
    """(action, protocol, ports, sources) of each rule, in order."""
    return [(r.action, r.protocol, r.ports, r.sources) for r in layer.rules]


# --- the nftables frame ------------------------------------------------------------------------


def test_render_denies_inbound_by_default_and_keeps_replies_and_loopback() -> None:
    text = render([Layer("x", (Rule(ACCEPT, "tcp", ((2222, 2232),), (A, B)),))], "vm-1")
    head = text.split("chain layer0", 1)[0]
    assert "type filter hook input priority filter; policy drop;" in head
    lines = [line.strip() for line in head.splitlines()]
    # stateful: replies to a node's own connections get back in, before any cloud rule
    assert lines.index("ct state established,related accept") < lines.index("jump layer0")
    assert lines.index('iif "lo" accept') < lines.index("jump layer0")
    assert "ip saddr { 10.213.9.2, 10.213.9.3 } meta l4proto tcp th dport 2222-2232 accept" in text
    assert "hook output priority filter; policy accept;" in text  # egress unrestricted


def test_render_layers_must_all_allow_and_first_match_wins() -> None:
    first = Layer("subnet", (Rule(DROP, None, ((22, 22),), ("0.0.0.0/0",)), Rule(ACCEPT)))
    last = Layer("nic", (Rule(ACCEPT, "tcp", ((2222, 2222),), (A,)),))
    text = render([first, last])
    layer0 = text.split("chain layer0", 1)[1].split("chain layer1", 1)[0]
    lines = [line.strip() for line in layer0.splitlines()[1:] if line.strip() not in ("}", "")]
    assert lines == [
        "meta nfproto ipv4 meta l4proto { tcp, udp, sctp } th dport 22 drop",
        "return",  # an allow in a layer that is not the last goes on to the next layer
        'drop comment "no rule matched"',
    ]
    assert "jump layer0\n        jump layer1" in text


def test_render_of_a_rule_with_no_source_in_the_box_matches_nothing() -> None:
    text = render([Layer("x", (Rule(ACCEPT, "tcp", (), (), comment="from an empty group"),))])
    assert "# no source in the box: from an empty group" in text
    assert " accept comment" not in text.split("chain layer0", 1)[1]


def test_port_ranges_as_clouds_write_them() -> None:
    assert port_range("2222") == (2222, 2222)
    assert port_range("2222-2232") == (2222, 2232)
    assert port_range("*") is None


# --- AWS ---------------------------------------------------------------------------------------


def aws_snapshot() -> tuple[AwsSnapshot, list[str]]:
    data = recorded("aws_recorded.json")
    ids = [i["InstanceId"] for i in data["instances"]]
    return AwsSnapshot(data["groups"], data["instances"]), ids


def test_aws_group_rule_admits_the_members_and_ssh_only_its_cidr() -> None:
    snap, (one, two) = aws_snapshot()
    layers = layers_aws(snap, {one: A, two: B})
    assert set(layers) == {one, two}
    for (layer,) in layers.values():
        assert summary(layer) == [
            (ACCEPT, "tcp", ((2222, 2232),), (A, B)),
            (ACCEPT, "tcp", ((22, 22),), (SSH_CIDR,)),
        ]
    text = compile_aws(snap, {one: A, two: B})[one]
    assert "ip saddr 203.0.113.7/32 meta l4proto tcp th dport 22 accept" in text


def test_aws_without_the_ssh_rule_port_22_is_not_opened() -> None:
    snap, (one, two) = aws_snapshot()
    for group in snap.groups:
        group["IpPermissions"] = [p for p in group["IpPermissions"] if p["FromPort"] != 22]
    (layer,) = layers_aws(snap, {one: A, two: B})[one]
    assert summary(layer) == [(ACCEPT, "tcp", ((2222, 2232),), (A, B))]


def test_aws_members_are_live_instances_with_a_box_address() -> None:
    snap, (one, two) = aws_snapshot()
    (layer,) = layers_aws(snap, {one: A})[one]  # the other instance is not in the box
    assert layer.rules[0].sources == (A,)
    dead = copy.deepcopy(snap)
    dead.instances[1]["State"] = {"Code": 48, "Name": "terminated"}
    layers = layers_aws(dead, {one: A, two: B})
    assert set(layers) == {one}
    assert layers[one][0].rules[0].sources == (A,)


def test_aws_an_instance_without_the_group_is_no_source_and_gets_nothing() -> None:
    snap, (one, two) = aws_snapshot()
    default = next(g for g in snap.groups if g["GroupName"] == "default")
    other = snap.instances[1]
    other["SecurityGroups"] = [{"GroupId": default["GroupId"], "GroupName": "default"}]
    for nic in other["NetworkInterfaces"]:
        nic["Groups"] = list(other["SecurityGroups"])
    layers = layers_aws(snap, {one: A, two: B})
    assert layers[one][0].rules[0].sources == (A,)
    assert layers[two][0].rules == ()  # moto's default group holds no ingress: nothing in


def test_aws_cidr_rules_translate_cloud_addresses_and_groups_are_a_union() -> None:
    snap, (one, two) = aws_snapshot()
    private = snap.instances[1]["PrivateIpAddress"]
    default = next(g for g in snap.groups if g["GroupName"] == "default")
    default["IpPermissions"] = [
        {
            "IpProtocol": "-1",
            "UserIdGroupPairs": [],
            "IpRanges": [{"CidrIp": private + "/32"}],
            "Ipv6Ranges": [{"CidrIpv6": "2001:db8::/64"}],
        }
    ]
    snap.instances[0]["SecurityGroups"].append(
        {"GroupId": default["GroupId"], "GroupName": "default"}
    )
    (layer,) = layers_aws(snap, {one: A, two: B})[one]
    assert len(layer.rules) == 3  # the run group's two rules and the default group's one
    everything = next(r for r in layer.rules if r.protocol is None)
    assert everything.ports == ()  # "-1": all protocols, AWS ignores the ports
    assert everything.sources == (B, private + "/32", "2001:db8::/64")


# --- GCP ---------------------------------------------------------------------------------------


def gcp_snapshot() -> tuple[GcpSnapshot, list[str]]:
    data = recorded("gcp_recorded.json")
    return GcpSnapshot(data["firewalls"], data["instances"]), [
        str(i["id"]) for i in data["instances"]
    ]


def test_gcp_tag_rule_admits_the_tagged_instances_then_the_implied_deny() -> None:
    snap, (one, two) = gcp_snapshot()
    layers = layers_gcp(snap, {one: A, two: B})
    assert set(layers) == {one, two}
    for (layer,) in layers.values():
        assert summary(layer) == [
            (ACCEPT, "tcp", ((2222, 2232),), (A, B)),
            (ACCEPT, "tcp", ((22, 22),), (SSH_CIDR,)),
            (DROP, None, (), None),  # the implied deny-ingress, last
        ]


def test_gcp_untagged_instance_is_no_source_and_no_target() -> None:
    snap, (one, two) = gcp_snapshot()
    snap.instances[1]["tags"] = {"items": ["someone-else"]}
    layers = layers_gcp(snap, {one: A, two: B})
    assert layers[one][0].rules[0].sources == (A,)
    assert summary(layers[two][0]) == [(DROP, None, (), None)]


def test_gcp_priority_orders_rules_and_deny_wins_a_tie() -> None:
    snap, (one, two) = gcp_snapshot()
    tag = snap.firewalls[0]["targetTags"][0]
    network = snap.firewalls[0]["network"]
    snap.firewalls.extend(
        [
            {  # no target: every instance of the network; no source: 0.0.0.0/0
                "name": "deny-2230",
                "network": network,
                "priority": 1000,
                "direction": "INGRESS",
                "denied": [{"IPProtocol": "tcp", "ports": ["2230"]}],
            },
            {
                "name": "allow-early",
                "network": network,
                "priority": 900,
                "allowed": [{"IPProtocol": "all"}],
                "sourceTags": [tag],
                "sourceRanges": ["10.128.0.0/9"],
            },
            {  # another network's rule and a disabled one apply to nobody here
                "name": "elsewhere",
                "network": network.replace("/default", "/other"),
                "allowed": [{"IPProtocol": "tcp"}],
            },
            {
                "name": "off",
                "network": network,
                "disabled": True,
                "allowed": [{"IPProtocol": "udp"}],
            },
        ]
    )
    (layer,) = layers_gcp(snap, {one: A, two: B})[one]
    assert [r.comment.split()[0] for r in layer.rules] == [
        "allow-early",
        "deny-2230",
        snap.firewalls[0]["name"],
        snap.firewalls[1]["name"],
        "implied",
    ]
    early, deny = layer.rules[0], layer.rules[1]
    # the range 10.128.0.0/9 holds both instances' networkIP: it stands for their box addresses
    assert early.protocol is None and set(early.sources or ()) == {A, B, "10.128.0.0/9"}
    assert deny.action == DROP and deny.ports == ((2230, 2230),)
    assert deny.sources == ("0.0.0.0/0",)


# --- Azure -------------------------------------------------------------------------------------


def azure_snapshot() -> tuple[AzureSnapshot, list[str]]:
    data = recorded("azure_recorded.json")
    snap = AzureSnapshot(data["nsgs"], data["vnets"], data["nics"], data["vms"])
    return snap, [v["properties"]["vmId"] for v in data["vms"]]


def test_azure_nsg_by_priority_with_the_adapters_deny_and_azures_defaults() -> None:
    snap, (one, two) = azure_snapshot()
    layers = layers_azure(snap, {one: A, two: B})
    assert set(layers) == {one, two}
    (layer,) = layers[one]  # the subnet's NSG; the NICs have none
    assert [r.comment for r in layer.rules] == [
        "cloudtrain-tf p100",
        "cloudtrain-ssh p110",
        "cloudtrain-deny-vnet p4000",
        "AllowVnetInBound p65000",
        "AllowAzureLoadBalancerInBound p65001",
        "DenyAllInBound p65500",
    ]
    assert summary(layer) == [
        # 10.0.0.0/16 as the fake holds it: itself and both VMs (their NICs are in it)
        (ACCEPT, "tcp", ((2222, 2232),), ("10.0.0.0/16", A, B)),
        (ACCEPT, "tcp", ((22, 22),), (SSH_CIDR,)),
        (DROP, None, (), (A, B)),  # VirtualNetwork: the VMs whose NIC is in the VNet
        (ACCEPT, None, (), (A, B)),
        (ACCEPT, None, (), (LOAD_BALANCER,)),
        (DROP, None, (), None),
    ]


def test_azure_defaults_are_the_ones_the_fake_holds() -> None:
    snap, _ = azure_snapshot()
    held = [
        (r["name"], r["properties"]["priority"], r["properties"]["access"])
        for r in snap.nsgs[0]["properties"]["defaultSecurityRules"]
        if r["properties"]["direction"] == "Inbound"
    ]
    assert held == [(name, prio, access) for name, prio, access, _, _ in DEFAULT_INBOUND]


def test_azure_nic_nsg_is_a_second_layer_and_internet_excludes_the_vnet() -> None:
    snap, (one, two) = azure_snapshot()
    nsg_id = snap.nsgs[0]["id"].replace("ct-unit-abc123-nsg", "nic-nsg")
    snap.nsgs.append(
        {
            "id": nsg_id,
            "name": "nic-nsg",
            "properties": {
                "securityRules": [
                    {
                        "name": "web",
                        "properties": {
                            "priority": 200,
                            "direction": "Inbound",
                            "access": "Allow",
                            "protocol": "Tcp",
                            "sourceAddressPrefix": "Internet",
                            "sourcePortRange": "*",
                            "destinationAddressPrefix": "*",
                            "destinationPortRanges": ["80", "443"],
                        },
                    },
                    {  # not for this VM: another address
                        "name": "elsewhere",
                        "properties": {
                            "priority": 300,
                            "direction": "Inbound",
                            "access": "Allow",
                            "protocol": "*",
                            "sourceAddressPrefix": "*",
                            "destinationAddressPrefix": "10.0.9.9",
                            "destinationPortRange": "*",
                        },
                    },
                ]
            },
        }
    )
    snap.nics[0]["properties"]["networkSecurityGroup"] = {"id": nsg_id}
    layers = layers_azure(snap, {one: A, two: B})
    nic_of_one = next(
        n for n in snap.nics if n["properties"]["virtualMachine"]["id"] == snap.vms[0]["id"]
    )
    first = one if nic_of_one is snap.nics[0] else two
    subnet, nic = layers[first]
    assert subnet.name.startswith("subnet") and nic.name == "NIC NSG nic-nsg"
    web = nic.rules[0]
    assert (web.sources, web.exclude, web.ports) == (None, (A, B), ((80, 80), (443, 443)))
    assert [r.comment.split()[0] for r in nic.rules] == [
        "web",
        "AllowVnetInBound",
        "AllowAzureLoadBalancerInBound",
        "DenyAllInBound",
    ]
    assert len(layers[two if first == one else one]) == 1


def test_azure_vm_without_any_nsg_is_unfiltered() -> None:
    snap, (one, two) = azure_snapshot()
    for vnet in snap.vnets:
        for subnet in vnet["properties"]["subnets"]:
            subnet["properties"].pop("networkSecurityGroup", None)
    layers = layers_azure(snap, {one: A, two: B})
    assert summary(layers[one][0]) == [(ACCEPT, None, (), None)]


def test_azure_a_vm_of_another_vnet_is_no_source_even_inside_the_prefix() -> None:
    snap, (one, two) = azure_snapshot()
    # a second run's VNet with the same 10.0.0.0/16 (every run gets one): its VM is 10.0.0.x
    # too, yet cannot reach the first VNet's VMs, whatever their NSG says
    vnet = copy.deepcopy(snap.vnets[0])
    vnet["id"] = vnet["id"].replace("ct-unit-abc123-vnet", "other-vnet")
    subnet = vnet["properties"]["subnets"][0]
    subnet["id"] = subnet["id"].replace("ct-unit-abc123-vnet", "other-vnet")
    snap.vnets.append(vnet)
    moved = snap.nics[1]["properties"]["ipConfigurations"][0]["properties"]
    moved["subnet"] = {"id": subnet["id"]}
    moved_vm = next(
        v["properties"]["vmId"]
        for v in snap.vms
        if v["id"] == snap.nics[1]["properties"]["virtualMachine"]["id"]
    )
    stays = two if moved_vm == one else one
    box = {stays: A, moved_vm: B}
    layers = layers_azure(snap, box)
    tf, _, deny, vnet_in = layers[stays][0].rules[:4]
    assert tf.sources == ("10.0.0.0/16", A)  # not B, though its NIC has 10.0.0.5
    assert deny.sources == (A,) and vnet_in.sources == (A,)
    assert layers[moved_vm][0].rules[0].sources == ("10.0.0.0/16", B)
