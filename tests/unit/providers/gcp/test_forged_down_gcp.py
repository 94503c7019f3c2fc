"""`down` never deletes what is not the run's (issue 29), on GCP through the real clients on the
GCE fake (which serves IAM's serviceAccounts too) and the GCS emulator: a firewall rule or
service account named in the run's ledger (a forged or stale record) that is not the run's is
refused, never deleted, while the run's own are. A firewall rule has no labels and an account
no tags: the name must be the one the run's id derives, and what carries that name must have
been made for the run (the rule's target tag, the account's display name), read first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.compute_v1")

from cloudtrain.core.errors import NotTheRuns
from cloudtrain.providers.base import Resource
from cloudtrain.providers.gcp import controller_identity, identity
from cloudtrain.providers.gcp.network import network_url, run_tag
from cloudtrain.providers.gcp.provider import GcpProvider
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session
from tests.unit.providers.gcp.test_gcp_identity import REGION, RUN, STORE, provider, run_info

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session", "provider"]  # fixtures
OTHER = "other-run-def456"


def firewall(provider: GcpProvider, name: str, target: str) -> None:
    """A rule of the project, made outside cloudtrain: SSH from anywhere to `target`."""
    from google.cloud import compute_v1

    compute = provider.compute
    body = {
        "name": name,
        "network": network_url(compute.project),
        "direction": "INGRESS",
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        "sourceRanges": ["10.0.0.0/8"],
        "targetTags": [target],
    }
    rule = compute_v1.Firewall.from_json(json.dumps(body))
    op = compute.clients.firewalls.insert(project=compute.project, firewall_resource=rule)
    op.result()


def account(provider: GcpProvider, account_id: str, shown: str) -> str:
    """A service account of the project; returns its email."""
    body = {"accountId": account_id, "serviceAccount": {"displayName": shown}}
    made = provider.compute.iam.call(
        "POST", f"projects/{provider.project}/serviceAccounts", "x", body
    )
    return str(made["email"])


def rules(cloud: GcpCloud) -> set[str]:
    return {r["name"] for r in cloud.gce.firewalls()}


def accounts(cloud: GcpCloud) -> set[str]:
    return {a["email"] for a in cloud.gce.service_accounts()}


def res(kind: str, name: str) -> Resource:
    return Resource("gcp", kind, name, "global", RUN)


def test_teardown_leaves_foreign_rules_and_accounts_its_ledger_names(
    provider: GcpProvider, gcp_cloud: GcpCloud, tmp_path: Path
) -> None:
    from cloudtrain.run.teardown import teardown
    from cloudtrain.state.ledger import Ledger

    compute = provider.compute
    own = compute.ensure_network(run_info())
    firewall(provider, "default-allow-ssh", "web")
    firewall(provider, run_tag(OTHER), run_tag(OTHER))
    deployer = account(provider, "prod-deployer", "CI deployer")
    others = account(provider, identity.account_id(OTHER), identity.DISPLAY_PREFIX + OTHER)
    # another run's node account, named for it: not this run's by name
    peer = account(
        provider,
        identity.node_account_id(OTHER, "worker-0"),
        identity.display_name(OTHER, "worker-0"),
    )
    foreign = [
        res("firewall", "default-allow-ssh"),
        res("firewall", run_tag(OTHER)),
        res(identity.KIND_SERVICE_ACCOUNT, deployer),
        res(identity.KIND_SERVICE_ACCOUNT, others),
        res(identity.KIND_SERVICE_ACCOUNT, peer),
        res(controller_identity.KIND_ACCOUNT, deployer),
        res(controller_identity.KIND_PROJECT_BINDING, deployer),
    ]
    led = Ledger(tmp_path / "ledger.db")
    led.create_run(RUN, "unit", "gcp", REGION, None, None, STORE, None)
    for r in [*own, *foreign]:
        led.record_intent(r)
    said: list[str] = []
    report = teardown(provider, led, RUN, said.append)

    assert {"default-allow-ssh", run_tag(OTHER)} <= rules(gcp_cloud), said
    assert run_tag(RUN) not in rules(gcp_cloud), "the run's own rule went"
    assert {deployer, others, peer} <= accounts(gcp_cloud)
    mine = {r.id for r in own if r.kind == identity.KIND_SERVICE_ACCOUNT}
    assert len(mine) == 2 and not mine & accounts(gcp_cloud), "the run's node accounts went"
    refused = " ".join(e.message for e in led.events(RUN) if e.kind == "refused")
    for r in foreign:
        assert r.id in refused, (r, refused)
    assert f"firewall/{run_tag(RUN)}" in report.resources_deleted
    live = {(r.kind, r.resource_id) for r in led.resources(RUN, live_only=True)}
    assert not live & {(r.kind, r.id) for r in foreign}, "refused rows leave the run's record"


def test_the_runs_names_on_what_was_not_made_for_it_are_refused(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    # the run's derived names, taken by resources made outside cloudtrain (not for this run)
    firewall(provider, run_tag(RUN), "web")
    node = account(provider, identity.account_id(RUN), "someone's build account")
    # a node account's derived id, made for something else
    shaped = account(provider, identity.node_account_id(RUN, "worker-3"), "someone's other one")
    ctl = account(provider, controller_identity.controller_account_id(RUN), "not a controller")
    forged = [
        res("firewall", run_tag(RUN)),
        res(identity.KIND_SERVICE_ACCOUNT, node),
        res(identity.KIND_SERVICE_ACCOUNT, shaped),
        res(controller_identity.KIND_ACCOUNT_BINDING, shaped),
        res(controller_identity.KIND_ACCOUNT, ctl),
    ]
    with pytest.raises(NotTheRuns) as refused:
        provider.compute.delete_resources(forged)
    assert set(refused.value.refused) == {(r.kind, r.id) for r in forged}
    assert run_tag(RUN) in rules(gcp_cloud)
    assert {node, shaped, ctl} <= accounts(gcp_cloud)
