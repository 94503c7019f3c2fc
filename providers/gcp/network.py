"""The run's firewall rules: its nodes reach each other on the run's ports, and nothing else.

One rule per run, `cloudtrain-<run_id>`, on the project's network (default `default`): TCP on the
run's port range, from the run's network tag to the run's network tag, so no address outside
the run's own nodes is ever allowed. With `ssh: true`, a second rule `cloudtrain-<run_id>-ssh`
allows TCP 22 from the `ssh_cidr` option only. Never 0.0.0.0/0. Firewall rules carry no labels
on GCE, so the names are how `list_resources` finds them.

Note: GCP's auto-created `default` network has its own `default-allow-ssh` rule (0.0.0.0/0 on
port 22). cloudtrain neither adds nor removes it; set the `network` option to a network
without it to keep SSH closed.

The options come from the provider's config (`providers.gcp` in job.yaml or config.yaml; the
deprecated variables still set them, read only by `cloudtrain.jobspec.provider_config`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from cloudtrain.core.errors import NotFound, ProviderError
from cloudtrain.providers.access import check_port_range, ssh_cidr
from cloudtrain.providers.base import Resource, RunInfo, Tagged
from cloudtrain.providers.gcp.clients import (
    ComputeClients,
    operation_name,
    wait_global_operation,
)
from cloudtrain.providers.gcp.errors import already_exists, gcp_errors

KIND_FIREWALL = "firewall"
SSH_SUFFIX = "-ssh"


def network_name(configured: str | None = None) -> str:
    """The VPC network the run's nodes and firewall use: `configured` (the `network` option,
    which the deprecated variable still sets through provider_config), else default. Pure."""
    return (configured or "").strip() or "default"


def network_url(project: str, network: str | None = None) -> str:
    """The network's relative resource URL (`network`: the option, see `network_name`)."""
    return f"projects/{project}/global/networks/{network_name(network)}"


def run_tag(run_id: str) -> str:
    """The network tag every node of the run carries (the firewall's source and target)."""
    return f"cloudtrain-{run_id}"


def rule_names(run: RunInfo) -> list[str]:
    """The names of the run's firewall rules (the cluster rule, then SSH if asked). Pure."""
    base = run_tag(run.run_id)
    return [base, base + SSH_SUFFIX] if run.ssh else [base]


def firewall_bodies(
    run: RunInfo, project: str, network: str | None = None, cidr: str | None = None
) -> list[dict[str, Any]]:
    """The run's firewall rules as GCE JSON, on `network` with SSH from `cidr` (the options;
    None: unset). Raises ProviderError for a bad port range or a missing/open SSH CIDR, before
    anything is created. Pure."""
    low, high = run.port_range
    check_port_range(low, high, run.run_id)
    tag = run_tag(run.run_id)
    rules: list[dict[str, Any]] = [
        {
            "name": tag,
            "network": network_url(project, network),
            "direction": "INGRESS",
            "priority": 1000,
            "description": f"cloudtrain run {run.run_id}: TensorFlow ports between its nodes",
            "allowed": [{"IPProtocol": "tcp", "ports": [f"{low}-{high}"]}],
            "sourceTags": [tag],
            "targetTags": [tag],
        }
    ]
    if run.ssh:
        rules.append(
            {
                "name": tag + SSH_SUFFIX,
                "network": network_url(project, network),
                "direction": "INGRESS",
                "priority": 1000,
                "description": f"cloudtrain run {run.run_id}: SSH from one address",
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                "sourceRanges": [ssh_cidr(cidr)],
                "targetTags": [tag],
            }
        )
    return rules


def ensure_firewalls(
    clients: ComputeClients, run: RunInfo, network: str | None = None, cidr: str | None = None
) -> list[Resource]:
    """Create the run's rules on `network` (SSH from `cidr`; see `firewall_bodies`); an
    existing rule is fine: names are the idempotency keys. Waits until they are in force.
    Idempotent; blocks."""
    from google.cloud import compute_v1

    project = clients.auth.project
    bodies = firewall_bodies(run, project, network, cidr)
    out = []
    for body in bodies:
        name = body["name"]
        what = f"create firewall rule {name} on network {network_name(network)}"
        resource = compute_v1.Firewall.from_json(json.dumps(body))
        try:
            with gcp_errors(what):
                op = clients.firewalls.insert(project=project, firewall_resource=resource)
            wait_global_operation(clients, operation_name(op), what)
        except ProviderError as err:
            if not already_exists(err):
                raise
        out.append(Resource("gcp", KIND_FIREWALL, name, "global", run.run_id))
    return out


def find_firewalls(clients: ComputeClients, run_id: str) -> list[Resource]:
    """The run's firewall rules that exist, found by name. Blocks."""
    project = clients.auth.project
    base = run_tag(run_id)
    wanted = {base, base + SSH_SUFFIX}
    with gcp_errors(f"list the firewall rules of run {run_id}"):
        request = {"project": project, "filter": f'name eq "{base}.*"'}
        rules = list(clients.firewalls.list(request=request))
    return [
        Resource("gcp", KIND_FIREWALL, r.name, "global", run_id, str(r.id) if r.id else None)
        for r in rules
        if r.name in wanted
    ]


def rfc3339_epoch(value: str | None) -> float | None:
    """Epoch seconds of a GCE timestamp such as `2024-05-01T12:00:00.000-07:00`, or None. Pure."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def tagged_firewalls(clients: ComputeClients) -> list[Tagged]:
    """Every firewall rule of the project that cloudtrain made for some run, as Tagged (region
    `global`, with GCE's creationTimestamp). Rules carry no labels, so a rule counts only when
    its name, its target tag and its description all name the same run. Blocks; read-only."""
    project = clients.auth.project
    with gcp_errors("list cloudtrain's firewall rules"):
        request = {"project": project, "filter": 'name eq "cloudtrain-.*"'}
        rules = list(clients.firewalls.list(request=request))
    out = []
    for rule in rules:
        tags = [str(t) for t in rule.target_tags if str(t).startswith(run_tag(""))]
        if len(tags) != 1:
            continue
        run_id = tags[0][len(run_tag("")) :]
        if not run_id or rule.name not in (tags[0], tags[0] + SSH_SUFFIX):
            continue
        if not str(rule.description or "").startswith(f"cloudtrain run {run_id}:"):
            continue
        created = rfc3339_epoch(rule.creation_timestamp or None)
        out.append(Tagged(run_id, KIND_FIREWALL, str(rule.name), created, region="global"))
    return out


def delete_firewall(clients: ComputeClients, name: str) -> None:
    """Delete one rule and wait until it is gone. Idempotent: a missing rule is fine. A rule
    still in use (RESOURCE_IN_USE_BY_ANOTHER_RESOURCE) raises TransientError. Blocks."""
    project = clients.auth.project
    what = f"delete firewall rule {name}"
    try:
        with gcp_errors(what):
            op = clients.firewalls.delete(project=project, firewall=name)
        wait_global_operation(clients, operation_name(op), what)
    except NotFound:
        return
