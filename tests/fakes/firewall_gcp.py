"""GCP VPC firewall rules, enforced: read back what the GCE fake holds and compile them to nftables.

    snapshot = read_gcp(fake.url, project)               # the REST API the adapter uses
    rulesets = compile_gcp(snapshot, {str(inst["id"]): host.ip})
    host.apply_nft(rulesets[instance_id])

Keys are GCE's numeric instance ids as strings (what the box's boot harness calls a VM's id).
The semantics, from "VPC firewall rules" (https://cloud.google.com/firewall/docs/firewalls):
- a rule applies to one network and one direction; only INGRESS rules are compiled, egress
  stays GCP's implied allow-egress. Disabled rules do not apply;
- targets: the instances carrying one of `targetTags` (or running as one of
  `targetServiceAccounts`); with neither, every instance of the network;
- sources: `sourceRanges` OR `sourceTags` OR `sourceServiceAccounts`; a source tag (or
  account) stands for "the primary internal IP address of the primary network interface" of the
  matching instances of the same network; with no source at all, 0.0.0.0/0 (gcloud's
  `--source-ranges` default);
- `allowed`/`denied` entries: `IPProtocol` ("tcp", "udp", "icmp", a number, or "all") with
  `ports` ("22", "2222-2232"; none: every port);
- the lowest priority number wins (0..65535, default 1000); "a rule with a deny action
  overrides another rule with an allow action only if the two rules have the same priority";
- the implied deny-ingress rule at 65535 is last; rules are stateful (replies get back in).

In the box, an instance's primary internal IP is its namespace's (`vm_to_ip`); a source range is
itself plus the box address of every instance of the same network whose `networkIP` falls in
it (firewall_nft.Addresses; networks are isolated unless peered).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.firewall_nft import ACCEPT, DROP, Addresses, Layer, Rule, port_range, render

DEFAULT_PRIORITY = 1000  # GCE's default when a rule gives none
IMPLIED_DENY_PRIORITY = 65535
PROTOCOLS = {"6": "tcp", "17": "udp", "1": "icmp", "132": "sctp"}


@dataclass(frozen=True)
class GcpSnapshot:
    """The project's firewall rules and instances as the Compute Engine REST API answers them."""

    firewalls: list[dict[str, Any]]
    instances: list[dict[str, Any]]


def _pages(url: str) -> Iterator[dict[str, Any]]:
    token = ""
    while True:
        query = {"maxResults": "500", **({"pageToken": token} if token else {})}
        with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode(query)}", timeout=30) as r:
            page = json.loads(r.read())
        yield page
        token = page.get("nextPageToken") or ""
        if not token:
            return


def read_gcp(endpoint: str, project: str) -> GcpSnapshot:
    """Every firewall rule (`global/firewalls` list) and instance (`aggregated/instances`) of
    `project`, read back over the Compute Engine REST API at `endpoint` (the fake's url), as
    the adapter's client reads it. Blocks; read-only."""
    base = f"{endpoint.rstrip('/')}/compute/v1/projects/{project}"
    firewalls = [f for page in _pages(f"{base}/global/firewalls") for f in page.get("items", [])]
    instances = [
        inst
        for page in _pages(f"{base}/aggregated/instances")
        for scoped in (page.get("items") or {}).values()
        for inst in scoped.get("instances", [])
    ]
    return GcpSnapshot(firewalls, instances)


def network_of(url: str) -> str:
    """`.../projects/p/global/networks/default` -> `projects/p/global/networks/default`. Pure."""
    return url[url.index("projects/") :] if "projects/" in url else url


def _primary(inst: Mapping[str, Any]) -> Mapping[str, Any]:
    return (inst.get("networkInterfaces") or [{}])[0]


def _tags(inst: Mapping[str, Any]) -> set[str]:
    return set((inst.get("tags") or {}).get("items") or [])


def _accounts(inst: Mapping[str, Any]) -> set[str]:
    return {a.get("email", "") for a in inst.get("serviceAccounts") or []}


def applies_to(rule: Mapping[str, Any], inst: Mapping[str, Any]) -> bool:
    """Whether an INGRESS, enabled `rule` targets `inst` (same network, then target tags or
    accounts, else every instance of the network). Pure."""
    if rule.get("direction", "INGRESS") != "INGRESS" or rule.get("disabled"):
        return False
    if network_of(rule.get("network", "")) != network_of(_primary(inst).get("network", "")):
        return False
    tags, accounts = rule.get("targetTags"), rule.get("targetServiceAccounts")
    if tags:
        return bool(set(tags) & _tags(inst))
    if accounts:
        return bool(set(accounts) & _accounts(inst))
    return True


def rule_sources(
    rule: Mapping[str, Any],
    members: list[Mapping[str, Any]],
    box: Mapping[str, str],
    addresses: Addresses,
) -> tuple[str, ...]:
    """The rule's sources in the box: its ranges (translated), and the box addresses of the
    instances of its network that carry a source tag or run as a source account. Pure."""
    ranges = list(rule.get("sourceRanges") or [])
    tags, accounts = set(rule.get("sourceTags") or []), set(rule.get("sourceServiceAccounts") or [])
    if not (ranges or tags or accounts):
        ranges = ["0.0.0.0/0"]
    found = set(addresses.translate(ranges)) if ranges else set()
    network = network_of(rule.get("network", ""))
    for inst in members:
        if network_of(_primary(inst).get("network", "")) != network:
            continue
        if (tags & _tags(inst)) or (accounts & _accounts(inst)):
            found.add(box[str(inst["id"])])
    return tuple(sorted(found))


def rule_entries(rule: Mapping[str, Any], sources: tuple[str, ...]) -> list[Rule]:
    """One Rule per `allowed`/`denied` entry of a firewall rule, with its sources. Pure."""
    out = []
    name = str(rule.get("name", ""))
    for key, action in (("denied", DROP), ("allowed", ACCEPT)):
        for entry in rule.get(key) or []:
            raw = str(entry.get("IPProtocol", "all")).lower()
            proto = None if raw == "all" else PROTOCOLS.get(raw, raw)
            ports = tuple(p for p in (port_range(str(x)) for x in entry.get("ports") or []) if p)
            what = f"{name} p{rule.get('priority', DEFAULT_PRIORITY)} {key} {raw}"
            out.append(Rule(action, proto, ports, sources, (), what))
    return out


def layers_gcp(snapshot: GcpSnapshot, vm_to_ip: Mapping[str, str]) -> dict[str, list[Layer]]:
    """Per instance id in `vm_to_ip` (GCE's numeric id as a string -> its box address), its
    firewall as one Layer: the INGRESS rules that target it, by priority (deny first among
    equals), then the implied deny. Pure."""
    members = [i for i in snapshot.instances if str(i.get("id")) in vm_to_ip]
    box = {str(i["id"]): vm_to_ip[str(i["id"])] for i in members}
    ordered = sorted(
        snapshot.firewalls,
        key=lambda r: (int(r.get("priority", DEFAULT_PRIORITY)), 0 if r.get("denied") else 1),
    )
    out: dict[str, list[Layer]] = {}
    for inst in members:
        # only instances of the same network reach its internal IPs (VPC networks are isolated
        # unless peered): they alone stand behind a source range
        network = network_of(_primary(inst).get("network", ""))
        addresses = Addresses(
            {
                _primary(i).get("networkIP", ""): box[str(i["id"])]
                for i in members
                if network_of(_primary(i).get("network", "")) == network
            }
        )
        rules: list[Rule] = []
        for fw in ordered:
            if applies_to(fw, inst):
                rules += rule_entries(fw, rule_sources(fw, members, box, addresses))
        implied = Rule(DROP, comment=f"implied deny ingress p{IMPLIED_DENY_PRIORITY}")
        out[str(inst["id"])] = [Layer(f"firewall rules of {inst['name']}", (*rules, implied))]
    return out


def compile_gcp(snapshot: GcpSnapshot, vm_to_ip: Mapping[str, str]) -> dict[str, str]:
    """Per instance id in `vm_to_ip`, its nftables ruleset (`layers_gcp` rendered). Pure."""
    return {vm: render(layers, vm) for vm, layers in layers_gcp(snapshot, vm_to_ip).items()}


def gcp_rulesets(endpoint: str, project: str, vm_to_ip: Mapping[str, str]) -> dict[str, str]:
    """`compile_gcp(read_gcp(endpoint, project), vm_to_ip)`. Blocks; read-only."""
    return compile_gcp(read_gcp(endpoint, project), vm_to_ip)
