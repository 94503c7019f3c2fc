"""A small cloud-neutral model of an inbound firewall, rendered as one node's nftables ruleset.

Each cloud's compiler (tests/fakes/firewall_aws.py, firewall_gcp.py, firewall_azure.py) turns the
network resources its cloud holds into, per node, a list of `Layer`s of ordered `Rule`s; `render`
makes the ruleset that `Host.apply_nft` (tests/fakes/netns.py) loads into the node's namespace:

    table inet cloud {
        chain input {
            type filter hook input priority filter; policy drop;
            ct state established,related accept     # every cloud's firewall is stateful
            iif "lo" accept                         # a VM's loopback is never filtered
            jump layer0                              # e.g. Azure: the subnet's NSG, then the NIC's
        }
        chain layer0 { ...rules, first match wins...; drop }
        chain output { type filter hook output priority filter; policy accept; }
    }

Semantics shared by the three clouds (each compiler cites its cloud's own source):
- inbound is denied unless a rule allows it (policy drop; each layer ends in a drop);
- the firewall is stateful: replies to a node's own connections come back (ct established);
- outbound is unrestricted (the egress defaults of a security group, GCP's implied
  allow-egress, Azure's AllowInternetOutBound/AllowVnetOutBound);
- a layer's rules are tried in order and the first that matches decides. A node with several
  layers (Azure: an NSG on the subnet and one on the NIC) passes a packet only when every layer
  allows it: in a layer that is not the last, an allow `return`s to the next layer.

Addresses: the clouds' fakes give their VMs cloud addresses (moto 172.31.x.y, GCE 10.128.x.y,
Azure 10.0.0.x), while in the box a node's address is its namespace's (10.213.x.y). `Addresses`
translates: a rule's CIDR matches itself AND the box address of every VM whose cloud address is
in it, so a rule for the VPC/VNet range admits the nodes in the box as it would on the cloud.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ACCEPT, DROP = "accept", "drop"
TABLE = "cloud"
ANY = None  # a Rule's `sources`/`protocol` of ANY matches every source/protocol
PORTED = ("tcp", "udp", "sctp")  # protocols with ports (nft's `th dport` covers them all)


@dataclass(frozen=True)
class Rule:
    """One ordered rule: `action` (ACCEPT or DROP) for packets of `protocol` (a name nft knows
    such as "tcp", "icmp", or a number as a string; ANY: all) to one of `ports` (inclusive
    ranges; () = every port), from one of `sources` (addresses/CIDRs; ANY: everywhere; () =
    nobody, so the rule matches nothing) and not from one of `exclude`."""

    action: str
    protocol: str | None = ANY
    ports: tuple[tuple[int, int], ...] = ()
    sources: tuple[str, ...] | None = ANY
    exclude: tuple[str, ...] = ()
    comment: str = ""


@dataclass(frozen=True)
class Layer:
    """One firewall a packet must pass (a security group set, a firewall policy, an NSG): its
    rules in evaluation order; a packet no rule matches is dropped."""

    name: str
    rules: tuple[Rule, ...]


class Addresses:
    """Cloud address -> box address of the VMs in the box; translates a cloud CIDR into the
    sources it stands for in the box. Pure."""

    def __init__(self, cloud_to_box: Mapping[str, str]) -> None:
        self.cloud_to_box = {k: v for k, v in cloud_to_box.items() if k and v}

    def translate(self, cidrs: Iterable[str]) -> tuple[str, ...]:
        """The CIDRs themselves plus the box address of every VM whose cloud address is in
        one of them (sorted, without duplicates). "0.0.0.0/0" stays the whole internet."""
        out: set[str] = set()
        for raw in cidrs:
            net = ipaddress.ip_network(raw, strict=False)
            out.add(str(net))
            if net.prefixlen == 0:
                continue  # the whole family holds every box address already
            for cloud, box in self.cloud_to_box.items():
                if ipaddress.ip_address(cloud) in net:
                    out.add(box)
        return tuple(sorted(out, key=_sort_key))


def _sort_key(addr: str) -> tuple[int, int, int]:
    net = ipaddress.ip_network(addr, strict=False)
    return net.version, int(net.network_address), net.prefixlen


def is_any(cidr: str) -> bool:
    """Whether `cidr` is a whole address family (0.0.0.0/0 or ::/0). Pure."""
    return ipaddress.ip_network(cidr, strict=False).prefixlen == 0


def _family(addrs: Iterable[str], version: int) -> list[str]:
    return [a for a in addrs if ipaddress.ip_network(a, strict=False).version == version]


def _set(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _ports(ports: tuple[tuple[int, int], ...]) -> str:
    return _set([str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in sorted(set(ports))])


def _proto_match(rule: Rule) -> str:
    if rule.ports:
        proto = rule.protocol
        if proto is None:
            return f"meta l4proto {_set(list(PORTED))} th dport {_ports(rule.ports)}"
        return f"meta l4proto {proto} th dport {_ports(rule.ports)}"
    return "" if rule.protocol is None else f"meta l4proto {rule.protocol}"


def _comment(text: str) -> str:
    clean = text.replace('"', "'").replace("\n", " ")[:120]
    return f' comment "{clean}"' if clean else ""


def rule_lines(rule: Rule, allow_verdict: str) -> list[str]:
    """The nft lines of one rule: one per address family it names (IPv4 `ip`, IPv6 `ip6`),
    or one for both when its sources are ANY; none when its sources are empty, i.e. nobody in
    the box (a `#` line says so). `allow_verdict` is what ACCEPT becomes (`accept`, or
    `return` in a layer that is not the last). Pure."""
    verdict = allow_verdict if rule.action == ACCEPT else DROP
    if rule.sources is not None and not rule.sources:
        return [f"# no source in the box: {rule.comment}"]
    proto = _proto_match(rule)
    # (family word, its nfproto, the source set or None for the whole family)
    picks: list[tuple[str, str, list[str] | None]] = []
    for version, word, nfproto in ((4, "ip", "ipv4"), (6, "ip6", "ipv6")):
        if rule.sources is None:
            picks.append((word, nfproto, None))
            continue
        chosen = _family(rule.sources, version)
        if chosen:
            picks.append((word, nfproto, None if any(is_any(a) for a in chosen) else chosen))
    if rule.sources is None and not rule.exclude:
        picks = [("", "", None)]  # one line for both families
    lines = []
    for word, nfproto, sources in picks:
        parts = []
        excluded = _family(rule.exclude, 4 if word == "ip" else 6) if word else []
        if sources is not None:
            parts.append(f"{word} saddr {_set(sources)}")
        if excluded:
            parts.append(f"{word} saddr != {_set(excluded)}")
        if sources is None and not excluded and word:
            parts.append(f"meta nfproto {nfproto}")
        if proto:
            parts.append(proto)
        parts.append(verdict)
        lines.append(" ".join(parts) + _comment(rule.comment))
    return lines


def render(layers: Sequence[Layer], node: str = "") -> str:
    """The node's whole nftables ruleset (table `inet cloud`): default deny inbound, stateful,
    loopback open, then every layer in order; outbound open. Pure; no layer at all means
    nothing is allowed in but replies."""
    out = [f"# the cloud's inbound firewall of {node or 'a node'}, compiled by tests/fakes"]
    out.append(f"table inet {TABLE} {{")
    out.append("    chain input {")
    out.append("        type filter hook input priority filter; policy drop;")
    out.append("        ct state established,related accept")
    out.append('        iif "lo" accept')
    for i, _layer in enumerate(layers):
        out.append(f"        jump layer{i}")
    out.append("    }")
    for i, layer in enumerate(layers):
        allow = "accept" if i == len(layers) - 1 else "return"
        out.append(f"    chain layer{i} {{  # {layer.name}")
        for rule in layer.rules:
            out += [f"        {line}" for line in rule_lines(rule, allow)]
        out.append('        drop comment "no rule matched"')
        out.append("    }")
    out.append("    chain output {")
    out.append("        type filter hook output priority filter; policy accept;")
    out.append("    }")
    out.append("}")
    return "\n".join(out) + "\n"


def port_range(text: str) -> tuple[int, int] | None:
    """A port range as clouds write it: "2222" -> (2222, 2222), "2222-2232" -> (2222, 2232),
    "*" -> None (every port). Raises ValueError for anything else. Pure."""
    text = text.strip()
    if text in ("*", ""):
        return None
    low, _, high = text.partition("-")
    lo, hi = int(low), int(high or low)
    if not 0 <= lo <= hi <= 65535:
        raise ValueError(f"bad port range {text!r}")
    return lo, hi
