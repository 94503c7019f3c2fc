"""Security guarantees of the Azure provider, on the ARM fake and Azurite: one detached
`cloudtrain run` (the real CLI, orchestrator and adapter) with secret env values and canary
credentials, then every guarantee checked against what the fakes stored and what the
controller sent, printed and kept.

See tests/unit/test_security.py for the list of guarantees and the other providers.
"""

from __future__ import annotations

import base64
import datetime
import json
from dataclasses import dataclass
from typing import Any

import pytest

from cloudtrain.providers.azure import node_role
from tests.fakes.arm_fake import start_arm_fake
from tests.fakes.arm_testkit import SUB
from tests.fakes.azure_cloud import (
    ACCOUNT_ENV,
    CA_ENV,
    CLOSED_IMDS,
    ENDPOINT_ENV,
    IMDS_ENV,
    SUBSCRIPTION_ENV,
    azure_config,
    azure_missing,
)
from tests.fakes.azurite import ACCOUNT, ACCOUNT_KEY, Azurite, azurite_session, use_azurite
from tests.unit import security_kit as kit

__all__ = ["azurite_session"]  # fixtures, for pytest
REGION = "eastus"
SSH_CIDR = "203.0.113.7/32"
OFFLINE_TOKEN = "cloudtrain-offline-token"  # providers/azure/clients.py StaticToken
BLOB_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"  # Storage Blob Data Contributor
if azure_missing():
    pytest.skip(str(azure_missing()), allow_module_level=True)


@dataclass
class AzureSeen:
    """What one detached run left in the fakes, and what the controller sent and kept."""

    run: kit.CliRun
    container: str
    vms: list[dict[str, Any]]
    custom_data: list[str]
    nsg: dict[str, Any]
    ssh_nsg: dict[str, Any]
    account: dict[str, Any]
    container_access: str | None
    assignments: list[dict[str, Any]]
    resources: list[dict[str, Any]]
    arm_requests: list[str]
    cluster_json: dict[str, Any]
    signed_by: datetime.datetime

    def cloud_dump(self) -> str:
        """Everything the ARM fake keeps (every resource body, tags, requests, assignments)."""
        return json.dumps([self.resources, self.assignments, self.arm_requests], default=str)


def _nsg(fake: Any, run_id: str) -> dict[str, Any]:
    group = f"/resourcegroups/cloudtrain-{run_id}/".lower()
    (nsg,) = [n for n in fake.resources(kind="networkSecurityGroups") if group in n["id"].lower()]
    return dict(nsg)


@pytest.fixture(scope="module")
def azure(azurite_session: Azurite, tmp_path_factory: pytest.TempPathFactory) -> AzureSeen:
    """One detached run of a two-worker job on the fakes; then its traces, read back."""
    from cloudtrain.providers.azure.provider import AzureProvider
    from cloudtrain.providers.base import RunInfo

    home = tmp_path_factory.mktemp("azure-home")
    fake = start_arm_fake()
    try:
        with pytest.MonkeyPatch.context() as mp:
            azurite_session.wipe()
            use_azurite(mp, azurite_session)
            for name, value in (
                (ENDPOINT_ENV, fake.url),
                (CA_ENV, fake.ca_path),
                (SUBSCRIPTION_ENV, SUB),
                (ACCOUNT_ENV, ACCOUNT),
                (IMDS_ENV, CLOSED_IMDS),
            ):
                mp.setenv(name, value)
            kit.set_canaries(mp, home)
            mp.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
            job = kit.write_job(home / "job", kit.spec_text("azure", REGION))
            run = kit.run_detached(home, job)
            signed_by = datetime.datetime.now(datetime.UTC)  # every URL was signed before this
            container = f"ct-{run.run_id}"
            service = azurite_session.client()
            props = service.get_container_client(container).get_container_properties()
            blob = service.get_blob_client(container, f"cloudtrain/runs/{run.run_id}/cluster.json")
            vms = [
                v
                for v in fake.resources(kind="virtualMachines")
                if (v.get("tags") or {}).get("cloudtrain-run") == run.run_id
            ]
            store = kit.first_json(run.outputs["status"])["store"]
            ssh_run = RunInfo(f"ssh{run.run_id}", REGION, None, (2222, 2232), True, store)
            AzureProvider(azure_config(REGION, ssh_cidr=SSH_CIDR)).compute.ensure_network(ssh_run)
            (account,) = fake.resources(kind="storageAccounts")
            return AzureSeen(
                run=run,
                container=container,
                vms=vms,
                custom_data=[
                    base64.b64decode(v["properties"]["osProfile"]["customData"]).decode()
                    for v in vms
                ],
                nsg=_nsg(fake, run.run_id),
                ssh_nsg=_nsg(fake, ssh_run.run_id),
                account=account,
                container_access=props.public_access,
                assignments=fake.role_assignments(),
                resources=fake.resources(),
                arm_requests=list(fake.requests),
                cluster_json=json.loads(blob.download_blob().readall()),
                signed_by=signed_by,
            )
    finally:
        fake.stop()


def _canaries() -> list[str]:
    return kit.canaries(ACCOUNT_KEY, OFFLINE_TOKEN)


# 1. no secret or credential in custom data, tags, requests, the ledger or the CLI output -------


def test_secrets_reach_the_nodes_only_through_cluster_json(azure: AzureSeen) -> None:
    assert len(azure.vms) == 2
    env = azure.cluster_json["env"]
    assert env["WANDB_API_KEY"] == kit.SECRET_FROM_ENV and env["HF_TOKEN"] == kit.SECRET_INLINE
    assert sorted(azure.cluster_json["secrets"]) == ["HF_TOKEN", "WANDB_API_KEY"]


def test_no_secret_or_credential_in_custom_data_tags_or_resources(azure: AzureSeen) -> None:
    assert kit.leaks(azure.cloud_dump(), _canaries()) == []
    for script in azure.custom_data:
        assert kit.leaks(script, _canaries()) == []
        assert "WANDB_API_KEY" not in script and "HF_TOKEN" not in script


def test_no_secret_in_requests_except_the_cluster_json_upload(azure: AzureSeen) -> None:
    uploads = [i for i in azure.run.sent.items if "cluster.json" in i[1]]
    assert len(uploads) == 1 and kit.leaks(repr(uploads), list(kit.SECRETS)) == list(kit.SECRETS)
    others = [i for i in azure.run.sent.items if i not in uploads]
    assert kit.leaks(repr(others), _canaries()) == []


def test_no_secret_or_credential_in_the_ledger_or_cli_output(azure: AzureSeen) -> None:
    assert kit.leaks(azure.run.text(), _canaries()) == []
    assert azure.run.run_id in azure.run.ledger


# 2. the storage account and the container deny public access ---------------------------------


def test_storage_account_is_https_tls12_and_never_public(azure: AzureSeen) -> None:
    props = azure.account["properties"]
    assert props["allowBlobPublicAccess"] is False
    assert props["supportsHttpsTrafficOnly"] is True
    assert props["minimumTlsVersion"] == "TLS1_2"


def test_run_container_has_no_public_access(azure: AzureSeen) -> None:
    assert azure.container_access is None  # neither "blob" nor "container"


# 3 and 4. TF ports only from inside the network, all else denied; SSH only when asked ---------


def _rules(nsg: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["properties"] | {"name": r["name"]} for r in nsg["properties"]["securityRules"]]


def _allows(rule: dict[str, Any], port: int) -> bool:
    ports = rule["destinationPortRange"]
    if rule["access"] != "Allow" or rule["direction"] != "Inbound":
        return False
    if ports == "*":
        return True
    low, _, high = ports.partition("-")
    return int(low) <= port <= int(high or low)


def test_tf_ports_open_only_from_the_virtual_network_and_the_rest_denied(
    azure: AzureSeen,
) -> None:
    rules = _rules(azure.nsg)
    allows = [r for r in rules if r["access"] == "Allow"]
    assert len(allows) == 1
    (tf,) = allows
    assert tf["destinationPortRange"] == "2222-2232" and tf["protocol"] == "Tcp"
    assert tf["sourceAddressPrefix"] in ("VirtualNetwork", "10.0.0.0/16")
    assert "0.0.0.0/0" not in json.dumps(rules) and "Internet" not in json.dumps(rules)
    (deny,) = [r for r in rules if r["access"] == "Deny"]
    assert deny["sourceAddressPrefix"] == "VirtualNetwork"
    assert deny["destinationPortRange"] == "*" and deny["protocol"] == "*"
    assert deny["priority"] > tf["priority"] and deny["priority"] < 65000  # AllowVnetInBound


def test_ssh_closed_by_default(azure: AzureSeen) -> None:
    assert [r["name"] for r in _rules(azure.nsg) if _allows(r, 22)] == []


def test_ssh_when_asked_only_from_the_configured_cidr(azure: AzureSeen) -> None:
    ssh = [r for r in _rules(azure.ssh_nsg) if _allows(r, 22)]
    assert len(ssh) == 1
    assert ssh[0]["destinationPortRange"] == "22" and ssh[0]["sourceAddressPrefix"] == SSH_CIDR


# 5 (IMDSv2) is AWS only: Azure's IMDS always needs the Metadata header.

# 6. presigned URLs live at most an hour -------------------------------------------------------


def test_sas_urls_in_custom_data_expire_within_an_hour(azure: AzureSeen) -> None:
    for script in azure.custom_data:
        urls = kit.startup_urls(script)
        for url in urls.values():
            assert "sig=" in url
            lifetime = kit.url_lifetime_s(url, now=azure.signed_by)  # no `st`: valid at once
            assert lifetime is not None and 0 < lifetime <= kit.MAX_URL_TTL_S, url


# 7. the node identity reaches only the run's container --------------------------------------


def test_node_identity_reaches_only_the_runs_container(azure: AzureSeen) -> None:
    vm_ids = {v["id"].lower() for v in azure.vms}
    principals = {v["identity"]["principalId"] for v in azure.vms}
    assert all(v["identity"]["type"] == "SystemAssigned" for v in azure.vms)
    held = [
        a["properties"] for a in azure.assignments if a["properties"]["principalId"] in principals
    ]
    storage = [a for a in held if "/containers/" in a["scope"]]
    assert len(storage) == 2
    for assignment in storage:
        # the node role (data actions only), never the built-in with container Actions
        role = assignment["roleDefinitionId"]
        assert role.rsplit("/", 1)[1] == node_role.role_guid(role.split("/")[2]), role
        assert not role.endswith(BLOB_CONTRIBUTOR)
        scope = assignment["scope"]
        assert scope.endswith(f"/blobServices/default/containers/{azure.container}"), scope
        assert f"/storageAccounts/{ACCOUNT}/" in scope
    others = [a for a in held if a not in storage]
    assert others and all(a["scope"].lower() in vm_ids for a in others)  # each VM: itself only
