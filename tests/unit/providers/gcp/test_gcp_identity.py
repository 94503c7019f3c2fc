"""The run's GCP node identities (providers/gcp/identity.py: one service account per node id) on
the GCE fake (which serves IAM's serviceAccounts too) and the GCS emulator (bucket IAM policies
with etags).

The account ids and their bodies, the prefix-conditioned bucket binding, idempotency (ensure twice,
delete twice), read-modify-write retries when the bucket policy changes underneath, waiting for
IAM to propagate a new account to Compute Engine, teardown (binding, then account), finding the
account from the cloud alone (`list_resources`, `inventory`), a user's own account, and IAM
errors through the adapter's translation.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")

from cloudtrain.core.errors import ProviderError, TransientError
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo, Tagged
from cloudtrain.providers.gcp import identity
from cloudtrain.providers.gcp.compute import GcpCompute
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.run.teardown import teardown
from tests.fakes.gcp_cloud import GcpCloud, gcp_cloud, gcs_emulator, gcs_emulator_session

__all__ = ["gcp_cloud", "gcs_emulator", "gcs_emulator_session"]  # fixtures, for pytest
REGION = "us-central1"
ZONE = "us-central1-a"
BUCKET = "ct-identity-test"
STORE = f"gs://{BUCKET}/pfx"
RUN = "digits-multiworker-20250101-abc123"


@pytest.fixture
def provider(gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> GcpProvider:
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.setattr("cloudtrain.core.retry.backoff_s", lambda *a, **k: 0.01)
    gcp_cloud.gce.operation_polls_to_done = 0
    made = GcpProvider(ProviderConfig(name="gcp", region=REGION, zone=ZONE))
    made.store(STORE).ensure_bucket()
    return made


NODES = ("worker-0", "worker-1")


def run_info(run_id: str = RUN, store: str = STORE) -> RunInfo:
    return RunInfo(run_id, REGION, ZONE, (2222, 2230), store_uri=store, nodes=NODES)


def email_of(provider: GcpProvider, node: str = "worker-0", run_id: str = RUN) -> str:
    return identity.node_email(provider.project, run_id, node)


def node(run_id: str = RUN, index: int = 0) -> NodeRequest:
    return NodeRequest(run_id, "worker", index, "n2-standard-4", "#!/bin/bash\n", zone=ZONE)


def member(email: str) -> str:
    return f"serviceAccount:{email}"


def bindings_of(cloud: GcpCloud, email: str) -> list[dict[str, Any]]:
    policy = cloud.gcs.iam_policy(BUCKET)
    return [b for b in policy.get("bindings") or [] if member(email) in b["members"]]


# --- names and bodies (pure) -------------------------------------------------------------------


def test_account_ids_are_valid_deterministic_and_distinct() -> None:
    ids = {r: identity.account_id(r) for r in (RUN, "r", "Run_With.Odd/Chars", "x" * 80, "9lives")}
    for run_id, value in ids.items():
        assert 6 <= len(value) <= 30, value
        assert identity._ACCOUNT_ID_RE.match(value), value
        assert identity.account_id(run_id) == value, "the same run, the same account"
    assert len(set(ids.values())) == len(ids)
    assert identity.account_id(RUN).startswith("ct-digits-multiwork")
    assert identity.service_account_email("p", "r").endswith("@p.iam.gserviceaccount.com")
    scoped = identity.service_account_email("example.com:proj", "r")
    assert scoped.endswith("@proj.example.com.iam.gserviceaccount.com")


def test_node_account_ids_are_valid_deterministic_and_distinct_per_node() -> None:
    runs = (RUN, "r", "Run_With.Odd/Chars", "x" * 80, "9lives")
    nodes = ("chief-0", "worker-0", "worker-1", "worker-10", "ps-3")
    ids = {(r, n): identity.node_account_id(r, n) for r in runs for n in nodes}
    for (run_id, node), value in ids.items():
        assert 6 <= len(value) <= 30, value
        assert identity._ACCOUNT_ID_RE.match(value), value
        assert identity.node_account_id(run_id, node) == value, "the same node, the same account"
        assert value.startswith(identity.node_account_prefix(run_id))
        email = identity.node_email("p", run_id, node)
        assert identity.is_node_email("p", run_id, email)
        assert not identity.is_node_email("p", run_id + "x", email)
        assert not identity.is_node_email("q", run_id, email)
    assert len(set(ids.values())) == len(ids)
    assert identity.node_account_id(RUN, "worker-1").startswith("ct-digits-multi-")


def test_the_binding_is_the_run_prefix_and_listings_inside_it() -> None:
    binding = identity.prefix_binding("sa@p.iam.gserviceaccount.com", "b", "pfx/", "r1")
    assert binding["role"] == "roles/storage.objectAdmin"
    assert binding["members"] == {"serviceAccount:sa@p.iam.gserviceaccount.com"}
    assert binding["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/b/objects/pfx/cloudtrain/runs/r1/") || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
        '.startsWith("pfx/cloudtrain/runs/r1/")'
    )
    assert binding["condition"]["title"] == "cloudtrain-r1"
    about = identity.description("r1", "worker-0", "my.bucket-1")
    assert identity.bucket_of({"description": about}) == "my.bucket-1"
    with pytest.raises(ProviderError, match="too long"):
        identity.description("r1", "worker-0", "a" * 230)


def test_only_accounts_named_for_their_run_are_runs() -> None:
    email = identity.service_account_email("p", "r1")
    assert identity.run_of({"displayName": "cloudtrain run r1", "email": email}) == "r1"
    assert identity.run_of({"displayName": "cloudtrain run r2", "email": email}) is None
    assert identity.run_of({"displayName": "ci deployer", "email": email}) is None
    mine = identity.node_email("p", "r1", "worker-1")
    shown = "cloudtrain run r1 node worker-1"
    assert identity.node_of({"displayName": shown, "email": mine}) == ("r1", "worker-1")
    assert identity.run_of({"displayName": shown, "email": mine}) == "r1"
    other = "cloudtrain run r1 node worker-2"
    assert identity.node_of({"displayName": other, "email": mine}) is None
    assert identity.run_of({"displayName": other, "email": mine}) is None


# --- against the fakes -------------------------------------------------------------------------


def test_ensure_makes_one_account_per_node_with_its_bindings_and_is_idempotent(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute = provider.compute
    emails = [email_of(provider, n) for n in NODES]
    planned = compute.planned_network(run_info())
    first = compute.ensure_network(run_info())
    again = compute.ensure_network(run_info())
    keys = {(r.kind, r.id) for r in first}
    assert keys == {(r.kind, r.id) for r in planned} == {(r.kind, r.id) for r in again}
    assert {("service_account", e) for e in emails} <= keys
    accounts = {a["email"]: a for a in gcp_cloud.gce.service_accounts()}
    assert sorted(accounts) == sorted(emails)
    for name, email in zip(NODES, emails, strict=True):
        assert accounts[email]["displayName"] == f"cloudtrain run {RUN} node {name}"
        about = accounts[email]["description"]
        assert f"gs://{BUCKET}" in about and RUN in about and name in about
        # reads (shared), writes (its own): test_gcp_node_bucket_rights.py checks each key
        bindings = bindings_of(gcp_cloud, email)
        writes = [b for b in bindings if b["role"] == identity.OBJECT_ADMIN]
        assert len(bindings) == 1 + len(writes)
        # worker-0 is the chief of a run without one: its 13 rules take two conditions
        assert len(writes) == (2 if name == "worker-0" else 1)
        for write in writes:
            assert write["members"] == [member(email)]
            assert f"/objects/pfx/cloudtrain/runs/{RUN}/" in write["condition"]["expression"]
    (reads,) = [
        b
        for b in gcp_cloud.gcs.iam_policy(BUCKET)["bindings"]
        if b["role"] == identity.OBJECT_VIEWER
    ]
    assert sorted(reads["members"]) == sorted(member(e) for e in emails)
    assert gcp_cloud.gcs.iam_policy(BUCKET)["version"] == 3
    creates = [r for r in gcp_cloud.gce.requests if r.startswith("POST /v1/projects/")]
    assert len(creates) == 4, "the second creates met 409 ALREADY_EXISTS and read the accounts"
    for index in (0, 1):
        inst = compute.create_node(run_info(), node(index=index))
        stored = next(i for i in gcp_cloud.gce.instances() if i["name"] == inst.name)
        assert stored["serviceAccounts"][0]["email"] == emails[index]


def test_a_policy_changing_underneath_is_read_again(
    provider: GcpProvider, gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    compute = provider.compute
    gcp_cloud.gcs.race_iam_policy(BUCKET, 3)
    compute.ensure_network(run_info())
    email = email_of(provider, "worker-1")
    assert len(bindings_of(gcp_cloud, email)) == 2
    other = "other-run-1"
    monkeypatch.setattr(identity, "POLICY_ATTEMPTS", 2)
    gcp_cloud.gcs.race_iam_policy(BUCKET, 5)
    with pytest.raises(TransientError, match="kept changing"):
        compute.ensure_network(run_info(other))
    gcp_cloud.gcs.race_iam_policy(BUCKET, -3)  # the race is over
    compute.ensure_network(run_info(other))
    assert len(bindings_of(gcp_cloud, email_of(provider, run_id=other)))
    assert len(bindings_of(gcp_cloud, email)) == 2, "the first run's bindings survived"


def test_teardown_removes_the_binding_then_the_account_and_keeps_others(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    compute = provider.compute
    bucket = provider.store(STORE)
    policy = gcp_cloud.gcs.iam_policy(BUCKET)
    client = identity.storage_client(provider.auth())
    users = {"role": "roles/storage.objectViewer", "members": {"user:me@example.com"}}
    identity._update_policy(client, BUCKET, lambda b: b.append(users) or True, "seed")
    assert policy["etag"] != gcp_cloud.gcs.iam_policy(BUCKET)["etag"]
    compute.ensure_network(run_info())
    compute.create_nodes(run_info(), [node(index=0), node(index=1)])
    bucket.put(f"cloudtrain/runs/{RUN}/x", b"1")
    report = teardown(provider, None, RUN)
    for name in NODES:
        email = email_of(provider, name)
        assert f"service_account/{email}" in report.resources_deleted
        assert bindings_of(gcp_cloud, email) == []
    assert gcp_cloud.gce.service_accounts() == []
    kept = gcp_cloud.gcs.iam_policy(BUCKET)["bindings"]
    assert kept == [{"role": "roles/storage.objectViewer", "members": ["user:me@example.com"]}]
    compute.delete_resources(compute.planned_network(run_info()))  # all gone already: fine
    teardown(provider, None, RUN)
    assert compute.list_resources(RUN) == []


def test_a_fresh_process_finds_the_account_from_the_cloud_alone(
    provider: GcpProvider, gcp_cloud: GcpCloud
) -> None:
    provider.compute.ensure_network(run_info())
    provider.compute.ensure_network(run_info("second-run"))
    lookalike = {
        "accountId": "ci-deployer",
        "serviceAccount": {"displayName": "cloudtrain run ci", "description": "not a run's"},
    }
    provider.compute.iam.call(
        "POST", f"projects/{provider.project}/serviceAccounts", "x", lookalike
    )
    fresh = GcpProvider(ProviderConfig(name="gcp", region=REGION, zone=ZONE)).compute
    found = {(r.kind, r.id) for r in fresh.list_resources(RUN)}
    accounts = [t for t in fresh.inventory() if t.kind == "service_account"]
    for name in NODES:
        assert ("service_account", email_of(provider, name)) in found
        assert Tagged(RUN, "service_account", email_of(provider, name), None) in accounts
    assert {t.run_id for t in accounts} == {RUN, "second-run"}, "the look-alike is not a run's"
    fresh.delete_resources(fresh.list_resources(RUN))
    assert {a["displayName"] for a in gcp_cloud.gce.service_accounts()} == {
        *(f"cloudtrain run second-run node {n}" for n in NODES),
        "cloudtrain run ci",
    }


def test_an_account_of_that_id_not_made_for_the_run_is_refused(provider: GcpProvider) -> None:
    accountid = identity.node_account_id(RUN, NODES[1])
    body = {"accountId": accountid, "serviceAccount": {"displayName": "mine"}}
    provider.compute.iam.call("POST", f"projects/{provider.project}/serviceAccounts", "x", body)
    with pytest.raises(ProviderError, match="not cloudtrain's"):
        provider.compute.ensure_network(run_info())


def test_inserts_wait_for_iam_to_propagate_a_new_account(
    provider: GcpProvider, gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    compute = provider.compute
    compute.ensure_network(run_info())
    gcp_cloud.gce.lag_service_accounts(3)
    created = compute.create_node(run_info(), node())
    assert created.alive
    gcp_cloud.gce.lag_service_accounts(1000)
    monkeypatch.setattr(identity, "PROPAGATION_S", 0.05)
    with pytest.raises(TransientError, match="still unknown to Compute Engine"):
        compute.create_node(run_info(), node(index=1))


def test_a_missing_bucket_gets_no_binding(provider: GcpProvider, gcp_cloud: GcpCloud) -> None:
    made = provider.compute.ensure_network(run_info(store="gs://ct-identity-missing/p"))
    assert "service_account" in {r.kind for r in made}
    for account in gcp_cloud.gce.service_accounts():
        assert "ct-identity-missing" in account["description"]
    provider.compute.delete_resources(made)  # the bucket policy to clean does not exist: fine
    assert gcp_cloud.gce.service_accounts() == []


def test_a_users_account_is_used_as_is(
    provider: GcpProvider, gcp_cloud: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = "trainer@acme.iam.gserviceaccount.com"
    gcp_cloud.gce.require_known_service_accounts = False  # the fake's IAM does not hold it
    compute = provider.compute
    the_option = dataclasses.replace(compute.config, options={"service_account": user})
    monkeypatch.setattr(compute, "config", the_option)
    assert {r.kind for r in compute.planned_network(run_info())} == {"firewall"}
    assert {r.kind for r in compute.ensure_network(run_info())} == {"firewall"}
    compute.create_node(run_info(), node())
    (inst,) = gcp_cloud.gce.instances()
    assert inst["serviceAccounts"][0]["email"] == user
    assert gcp_cloud.gce.service_accounts() == []
    assert gcp_cloud.gcs.iam_policy(BUCKET).get("bindings") in (None, [])


class _Unavailable(BaseHTTPRequestHandler):
    """IAM answering 503 (or 429) to everything."""

    def _serve(self) -> None:
        code = 429 if "serviceAccounts/" in self.path else 503
        body = json.dumps({"error": {"code": code, "message": "try later", "status": "X"}})
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, fmt: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def busy_iam(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(identity.IAM_ENDPOINT_ENV, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_throttled_or_failing_iam_is_transient(provider: GcpProvider, busy_iam: None) -> None:
    compute: GcpCompute = provider.compute
    with pytest.raises(TransientError, match="create service account"):
        compute.iam.create(RUN, NODES[0], BUCKET)
    with pytest.raises(TransientError, match="list the service accounts"):
        compute.list_resources(RUN)
