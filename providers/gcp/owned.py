"""Whether a resource named in a run's record is the run's, before GCP deletes it (issue 29).

A ledger row may come from a forged journal entry, an edited ledger or an older cloudtrain, so
`GcpCompute.delete_resources` asks `not_runs` first and refuses (providers/ownership.py) what it
names. A firewall rule has no labels and a service account no tags, so:
- the name must be the one the run's id derives (`cloudtrain-<run>`, `...-ssh`; the accounts'
  emails from a hash of the run id (and of a node id, `identity.is_node_email`) in this
  project; a binding's member the same);
- what carries that name must have been made for the run, read first: a rule targets the run's
  network tag, an account's display name names the run (`identity.run_of`,
  `controller_identity.controller_run_of`); a binding follows its account.
A resource already gone is not refused (there is nothing to delete).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cloudtrain.core.errors import NotFound
from cloudtrain.providers.base import Resource
from cloudtrain.providers.gcp import controller_identity, identity, network
from cloudtrain.providers.gcp.clients import ComputeClients
from cloudtrain.providers.gcp.errors import gcp_errors


def name_not_runs(project: str, res: Resource) -> str | None:
    """Why `res` is not its run's by name, or None (the run's own name, or a kind this adapter
    ignores). Pure."""
    run_id = res.run_id
    tag = network.run_tag(run_id)
    ctl = controller_identity.controller_email(project, run_id)
    if res.kind in (identity.KIND_SERVICE_ACCOUNT, controller_identity.KIND_ACCOUNT_BINDING):
        if run_id and identity.is_node_email(project, run_id, res.id):
            return None
        shape = f"{identity.node_account_prefix(run_id)}<5 hex>@{identity.email_domain(project)}"
        return f"not the run's name (a node account {shape} expected)"
    expected = {
        network.KIND_FIREWALL: {tag, tag + network.SSH_SUFFIX},
        controller_identity.KIND_ACCOUNT: {ctl},
        controller_identity.KIND_PROJECT_BINDING: {ctl},
    }.get(res.kind)
    if expected is None or (run_id and res.id in expected):
        return None
    return f"not the run's name ({' or '.join(sorted(expected))} expected)"


def not_runs(clients: ComputeClients, iam: identity.IamClient, res: Resource) -> str | None:
    """Why `res` is not its run's (`name_not_runs`, then what carries the name, read from the
    cloud), or None when it is, is gone, or is a kind this adapter ignores. Blocks for one
    read; errors other than NotFound propagate."""
    why = name_not_runs(clients.auth.project, res)
    if why is not None:
        return why
    if res.kind == network.KIND_FIREWALL:
        return _rule_not_runs(clients, res)
    if res.kind in (identity.KIND_SERVICE_ACCOUNT, controller_identity.KIND_ACCOUNT_BINDING):
        return _account_not_runs(iam, res, identity.run_of, "a run's nodes")
    if res.kind in (controller_identity.KIND_ACCOUNT, controller_identity.KIND_PROJECT_BINDING):
        return _account_not_runs(
            iam, res, controller_identity.controller_run_of, "a run's controller"
        )
    return None


def _rule_not_runs(clients: ComputeClients, res: Resource) -> str | None:
    tag = network.run_tag(res.run_id)
    try:
        with gcp_errors(f"read firewall rule {res.id}"):
            rule = clients.firewalls.get(project=clients.auth.project, firewall=res.id)
    except NotFound:
        return None
    targets = [str(t) for t in rule.target_tags]
    if targets != [tag]:
        return f"it targets {targets!r}, not the run's tag {tag!r}"
    return None


def _account_not_runs(
    iam: identity.IamClient,
    res: Resource,
    run_of: Callable[[dict[str, Any]], str | None],
    what: str,
) -> str | None:
    account = iam.get(res.id)
    if account is None:
        return None
    if run_of(account) != res.run_id:
        shown = str(account.get("displayName") or "")[:100]
        return f"an account not made for {what} {res.run_id!r} (shown as {shown!r})"
    return None
