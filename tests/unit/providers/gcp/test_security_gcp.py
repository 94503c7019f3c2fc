"""Security guarantees of the GCP provider, on the GCE fake and the GCS emulator: one detached
`cloudtrain run` (the real CLI, orchestrator and adapter) with secret env values and canary
credentials, then every guarantee checked against what the fakes stored and what the
controller sent, printed and kept.

See tests/unit/test_security.py for the list of guarantees and the other providers.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")
pytest.importorskip("google.cloud.storage")

from tests.fakes import gcs_iam_conditions as cel
from tests.fakes.gce_fake import start_gce_fake
from tests.fakes.gcp_cloud import ENDPOINT_ENV, IAM_ENDPOINT_ENV
from tests.fakes.gcs_emulator import (
    TEST_PROJECT,
    GcsEmulator,
    gcs_emulator_session,
    use_gcs_emulator,
)
from tests.unit import security_kit as kit

__all__ = ["gcs_emulator_session"]  # fixtures, for pytest
REGION = "us-central1"
SSH_CIDR = "203.0.113.7/32"
STORAGE_RW_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


@dataclass
class GcpSeen:
    """What one detached run left in the fakes, and what the controller sent and kept."""

    run: kit.CliRun
    bucket: str
    prefix: str
    instances: list[dict[str, Any]]
    firewalls: list[dict[str, Any]]
    ssh_firewalls: list[dict[str, Any]]
    bucket_insert: dict[str, Any]
    bucket_stored: dict[str, Any]
    cluster_json: dict[str, Any]
    signed_scripts: list[str]  # rendered with a service-account key: V4 signed URLs
    fallback_scripts: list[str]  # rendered with user credentials: the node-identity URLs
    gce_requests: list[str]
    accounts: list[dict[str, Any]]  # the fake IAM's service accounts after the runs
    bucket_policy: dict[str, Any]  # the run bucket's IAM policy after the runs
    ssh_run_id: str

    def scripts(self) -> list[str]:
        """The startup-script metadata of the run's instances."""
        return [_metadata(i)["startup-script"] for i in self.instances]

    def cloud_dump(self) -> str:
        """Everything the GCE fake keeps about the run (bodies, labels, metadata, requests)."""
        parts = [self.instances, self.firewalls, self.ssh_firewalls, self.gce_requests]
        return json.dumps(parts) + json.dumps(self.bucket_stored)


def _metadata(instance: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in instance.get("metadata", {}).get("items", [])}


def _rule_names(run_id: str) -> set[str]:
    return {f"cloudtrain-{run_id}", f"cloudtrain-{run_id}-ssh"}


def _bucket_insert(sent: kit.SentRequests, bucket: str) -> dict[str, Any]:
    """The body of the controller's `buckets.insert` for `bucket`."""
    for api, what, body in sent.items:
        path = urllib.parse.urlsplit(what.split(" ", 1)[1]).path
        if api == "http" and what.startswith("POST ") and path.endswith("/storage/v1/b"):
            data = json.loads(body)
            if data.get("name") == bucket:
                return dict(data)
    raise AssertionError(f"no buckets.insert for {bucket}")


@pytest.fixture(scope="module")
def gcp(gcs_emulator_session: GcsEmulator, tmp_path_factory: pytest.TempPathFactory) -> GcpSeen:
    """One detached run of a two-worker job on the fakes; then its traces, read back."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.oauth2.credentials import Credentials

    from cloudtrain.providers.base import ProviderConfig, RunInfo
    from cloudtrain.providers.gcp.provider import GcpProvider
    from cloudtrain.providers.gcp.storage import GcsStore
    from tests.unit.gcs_kit import service_account_credentials

    home = tmp_path_factory.mktemp("gcp-home")
    fake = start_gce_fake()
    fake.require_known_service_accounts = True
    try:
        with pytest.MonkeyPatch.context() as mp:
            gcs_emulator_session.wipe()
            use_gcs_emulator(mp, gcs_emulator_session)
            mp.setenv(ENDPOINT_ENV, fake.url)
            mp.setenv(IAM_ENDPOINT_ENV, fake.url)
            mp.delenv("CLOUDTRAIN_GCP_SERVICE_ACCOUNT", raising=False)
            kit.set_canaries(mp, home)
            mp.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
            job = kit.write_job(home / "job", kit.spec_text("gcp", REGION))
            run = kit.run_detached(home, job)
            store = kit.first_json(run.outputs["status"])["store"]
            bucket, _, prefix = store.removeprefix("gs://").partition("/")
            client = storage.Client(credentials=AnonymousCredentials(), project=TEST_PROJECT)
            stored = client.get_bucket(bucket)._properties
            key = f"{prefix}/cloudtrain/runs/{run.run_id}/cluster.json".lstrip("/")
            cluster_json = json.loads(client.bucket(bucket).blob(key).download_as_bytes())
            instances = [
                i
                for i in fake.instances()
                if (i.get("labels") or {}).get("cloudtrain-run") == run.run_id
            ]
            options = {"ssh_cidr": SSH_CIDR}
            provider = GcpProvider(ProviderConfig(name="gcp", region=REGION, options=options))
            ssh_run = RunInfo(
                f"ssh{run.run_id}", REGION, None, (2222, 2232), True, store, nodes=("worker-0",)
            )
            provider.compute.ensure_network(ssh_run)
            signer = GcsStore(store, credentials=service_account_credentials())
            signed = kit.render_requests(job, provider, home, signer)
            mp.delenv("STORAGE_EMULATOR_HOST")  # a user's ADC: no key, nothing to sign with
            user = GcsStore(
                store,
                credentials=Credentials(token=kit.CREDENTIAL_CANARIES["GOOGLE_OAUTH_ACCESS_TOKEN"]),
                node_identity_fallback=True,
            )
            fallback = kit.render_requests(job, provider, home, user)
            firewalls = fake.firewalls()
            return GcpSeen(
                run=run,
                bucket=bucket,
                prefix=prefix,
                instances=instances,
                firewalls=[f for f in firewalls if f["name"] in _rule_names(run.run_id)],
                ssh_firewalls=[f for f in firewalls if f["name"] in _rule_names(ssh_run.run_id)],
                bucket_insert=_bucket_insert(run.sent, bucket),
                bucket_stored=stored,
                cluster_json=cluster_json,
                signed_scripts=[r.startup_script for r in signed],
                fallback_scripts=[r.startup_script for r in fallback],
                gce_requests=list(fake.requests),
                accounts=fake.service_accounts(),
                bucket_policy=gcs_emulator_session.iam_policy(bucket),
                ssh_run_id=ssh_run.run_id,
            )
    finally:
        fake.stop()


# 1. no secret or credential in metadata, labels, requests, the ledger or the CLI output --------


def test_secrets_reach_the_nodes_only_through_cluster_json(gcp: GcpSeen) -> None:
    assert len(gcp.instances) == 2
    env = gcp.cluster_json["env"]
    assert env["WANDB_API_KEY"] == kit.SECRET_FROM_ENV and env["HF_TOKEN"] == kit.SECRET_INLINE
    assert sorted(gcp.cluster_json["secrets"]) == ["HF_TOKEN", "WANDB_API_KEY"]


def test_no_secret_or_credential_in_metadata_labels_or_requests(gcp: GcpSeen) -> None:
    assert kit.leaks(gcp.cloud_dump(), kit.canaries()) == []
    for script in [*gcp.scripts(), *gcp.signed_scripts, *gcp.fallback_scripts]:
        assert kit.leaks(script, kit.canaries()) == []
        assert "WANDB_API_KEY" not in script and "HF_TOKEN" not in script
    uploads = [i for i in gcp.run.sent.items if "cluster.json" in i[1] + i[2]]
    assert len(uploads) == 1 and kit.leaks(repr(uploads), list(kit.SECRETS)) == list(kit.SECRETS)
    others = [i for i in gcp.run.sent.items if i not in uploads]
    assert kit.leaks(repr(others), kit.canaries()) == []


def test_no_secret_or_credential_in_the_ledger_or_cli_output(gcp: GcpSeen) -> None:
    assert kit.leaks(gcp.run.text(), kit.canaries()) == []
    assert gcp.run.run_id in gcp.run.ledger


# 2. the bucket denies public access -------------------------------------------------------------


def test_bucket_is_created_private_and_kept_private(gcp: GcpSeen) -> None:
    """The insert asks for both settings; the emulator drops them on insert (it keeps
    iamConfiguration only from a PATCH), so the stored bucket shows the adapter's follow-up
    PATCH took effect too."""
    for where in (gcp.bucket_insert, gcp.bucket_stored):
        iam = where["iamConfiguration"]
        assert iam["uniformBucketLevelAccess"]["enabled"] is True, where
        assert iam["publicAccessPrevention"] == "enforced", where
    assert "acl" not in gcp.bucket_insert and "defaultObjectAcl" not in gcp.bucket_insert


# 3 and 4. TF ports only between the run's nodes; SSH closed unless asked, then one CIDR --------


def test_tf_ports_open_only_from_the_run_tag_to_the_run_tag(gcp: GcpSeen) -> None:
    tag = f"cloudtrain-{gcp.run.run_id}"
    (rule,) = gcp.firewalls
    assert rule["direction"] == "INGRESS"
    assert rule["sourceTags"] == [tag] and rule["targetTags"] == [tag]
    assert "sourceRanges" not in rule or rule["sourceRanges"] == []
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["2222-2232"]}]
    for instance in gcp.instances:
        assert instance["tags"]["items"] == [tag]


def test_ssh_closed_by_default(gcp: GcpSeen) -> None:
    ports = [p for r in gcp.firewalls for a in r["allowed"] for p in a.get("ports", ["all"])]
    assert "22" not in ports and "all" not in ports
    assert "0.0.0.0/0" not in json.dumps(gcp.firewalls)


def test_ssh_when_asked_only_from_the_configured_cidr(gcp: GcpSeen) -> None:
    ssh = [r for r in gcp.ssh_firewalls if r["name"].endswith("-ssh")]
    assert len(ssh) == 1
    assert ssh[0]["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh[0]["sourceRanges"] == [SSH_CIDR] and "sourceTags" not in ssh[0]
    assert ssh[0]["targetTags"] == [f"cloudtrain-ssh{gcp.run.run_id}"]
    assert "0.0.0.0/0" not in json.dumps(gcp.ssh_firewalls)


# 5 (IMDSv2) is AWS only: GCE's metadata server always needs the Metadata-Flavor header.

# 6. presigned URLs live at most an hour -------------------------------------------------------


def test_signed_urls_in_the_startup_script_expire_within_an_hour(gcp: GcpSeen) -> None:
    for script in gcp.signed_scripts:
        for url in kit.startup_urls(script).values():
            assert "X-Goog-Signature=" in url
            lifetime = kit.url_lifetime_s(url)
            assert lifetime is not None and 0 < lifetime <= kit.MAX_URL_TTL_S, url


def test_unsignable_urls_carry_no_credential(gcp: GcpSeen) -> None:
    """With credentials that cannot sign (a user's ADC), the script gets plain GCS URLs that
    only the node's own service account token opens: nothing in them grants access."""
    for script in gcp.fallback_scripts:
        for url in kit.startup_urls(script).values():
            parts = urllib.parse.urlsplit(url)
            assert parts.scheme == "https" and parts.netloc == "storage.googleapis.com"
            assert parts.query == "", url


def test_emulator_urls_are_unsigned_object_paths(gcp: GcpSeen) -> None:
    """On the emulator the URLs are its object paths (it checks no signature): exempt."""
    for script in gcp.scripts():
        for url in kit.startup_urls(script).values():
            assert url.startswith("http://127.0.0.1:") and "?" not in url


# 7. the node identity -------------------------------------------------------------------------


def test_nodes_get_only_the_storage_read_write_scope(gcp: GcpSeen) -> None:
    for instance in gcp.instances:
        (account,) = instance["serviceAccounts"]
        assert account["scopes"] == [STORAGE_RW_SCOPE]  # no cloud-platform, no compute


def _grants(policy: dict[str, Any], email: str) -> list[dict[str, Any]]:
    """The bindings of a bucket policy that name the service account `email`."""
    member = f"serviceAccount:{email}"
    return [b for b in policy.get("bindings") or [] if member in b.get("members", [])]


def _node_accounts(gcp: GcpSeen, run_id: str) -> dict[str, dict[str, Any]]:
    """Node id -> its service account, of run `run_id` (display `cloudtrain run R node N`)."""
    shown = f"cloudtrain run {run_id} node "
    return {
        a["displayName"].removeprefix(shown): a
        for a in gcp.accounts
        if a["displayName"].startswith(shown)
    }


def test_node_identity_reaches_only_the_runs_prefix(gcp: GcpSeen) -> None:
    """Each node runs as its own service account (made for its node id, named for it), whose
    bucket bindings are conditioned on the run's prefix: objects under it, listings inside it,
    writes of its own keys only."""
    run_id = gcp.run.run_id
    accounts = _node_accounts(gcp, run_id)
    assert len(accounts) == len(gcp.instances) >= 2
    for instance in gcp.instances:
        (used,) = instance["serviceAccounts"]
        node_id = instance["name"].removeprefix(f"ct-{run_id}-")
        assert used["email"] == accounts[node_id]["email"], "not the node's own service account"
    root = f"{gcp.prefix}/" if gcp.prefix else ""
    run_prefix = f"{root}cloudtrain/runs/{run_id}/"
    policy, bucket = gcp.bucket_policy, gcp.bucket
    assert policy["version"] == 3
    for node_id, account in accounts.items():
        email = account["email"]
        # reads and writes, evaluated (each key: test_gcp_node_bucket_rights.py)
        node = f"serviceAccount:{email}"
        roles = {b["role"] for b in _grants(policy, email)}
        assert roles == {"roles/storage.objectAdmin", "roles/storage.objectViewer"}
        assert cel.can_read(policy, node, bucket, run_prefix + "cluster.json")
        assert cel.can_write(policy, node, bucket, run_prefix + f"status/{node_id}.json")
        for peer in accounts:
            if peer != node_id:
                assert not cel.can_write(policy, node, bucket, run_prefix + f"status/{peer}.json")
        assert cel.can_list(policy, node, bucket, run_prefix)
        other = f"{root}cloudtrain/runs/{gcp.ssh_run_id}/"
        assert not cel.can_read(policy, node, bucket, other + "cluster.json")
        assert not cel.can_write(policy, node, bucket, other + f"status/{node_id}.json")
        assert not cel.can_list(policy, node, bucket, f"{root}cloudtrain/runs/"), "wider"


def test_each_run_has_its_own_identity(gcp: GcpSeen) -> None:
    """The second run's account is another one, bound to its own prefix only."""
    mine = _node_accounts(gcp, gcp.run.run_id)
    (theirs,) = _node_accounts(gcp, gcp.ssh_run_id).values()
    assert theirs["email"] not in {a["email"] for a in mine.values()}
    node = f"serviceAccount:{theirs['email']}"
    assert len(_grants(gcp.bucket_policy, theirs["email"])) == 3  # reads, a chief's 2 writes
    root = f"{gcp.prefix}/" if gcp.prefix else ""
    for run_id, reached in ((gcp.ssh_run_id, True), (gcp.run.run_id, False)):
        key = f"{root}cloudtrain/runs/{run_id}/cluster.json"
        assert cel.can_read(gcp.bucket_policy, node, gcp.bucket, key) is reached, key
