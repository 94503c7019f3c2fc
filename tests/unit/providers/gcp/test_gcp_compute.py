"""GcpCompute against the GCE fake, through the real google-cloud-compute REST client.

The insert body as GCE receives it (accelerators, scheduling, spot, labels, tags, metadata, the
service account), the firewall (the run's tag to itself, never 0.0.0.0/0), operation errors
turned into NoCapacityError/QuotaError, listing by label, replacing a stopped node, the serial
console, the region's zones, credentials and project resolution, and the startup blocks under
shellcheck.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.core.errors import CredentialsError, NoCapacityError, ProviderError, QuotaError
from cloudtrain.providers.base import NodeRequest, ProviderConfig, RunInfo
from cloudtrain.providers.gcp.bodies import STORAGE_RW_SCOPE, instance_body
from cloudtrain.providers.gcp.compute import GcpCompute
from cloudtrain.providers.gcp.images import DLVM_2204, image_for
from cloudtrain.providers.gcp.network import firewall_bodies
from cloudtrain.providers.gcp.provider import GcpProvider
from cloudtrain.providers.retrying import RetryingCompute
from cloudtrain.run.startup import StartupParams, render_startup
from tests.fakes.gce_fake import GceFake, gce_fake
from tests.fakes.shell import check_script, run_with_curl_shim

__all__ = ["gce_fake"]  # fixture, for pytest
PROJECT = "ct-unit-project"
REGION = "us-central1"
ZONE = "us-central1-a"
RUN = "unit-abc123"


@pytest.fixture
def compute(gce_fake: GceFake, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcpCompute]:
    monkeypatch.setenv("CLOUDTRAIN_GCE_ENDPOINT", gce_fake.url)
    monkeypatch.setenv("CLOUDTRAIN_IAM_ENDPOINT", gce_fake.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    monkeypatch.delenv("CLOUDTRAIN_SSH_CIDR", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_GCP_SERVICE_ACCOUNT", raising=False)
    gce_fake.operation_polls_to_done = 2
    gce_fake.require_known_service_accounts = True
    yield GcpProvider(ProviderConfig(name="gcp", region=REGION, zone=ZONE)).compute


NODES = ("worker-0", "worker-1", "worker-2")  # each its own service account


def run_info(ssh: bool = False, deadline: float | None = None) -> RunInfo:
    return RunInfo(RUN, REGION, ZONE, (2222, 2232), ssh=ssh, deadline=deadline, nodes=NODES)


def request(
    role: str = "worker",
    index: int = 0,
    instance_type: str = "n1-standard-8",
    accelerator: str | None = "T4",
    count: int = 1,
    spot: bool = False,
    image: str | None = None,
) -> NodeRequest:
    return NodeRequest(
        RUN,
        role,
        index,
        instance_type,
        "#!/bin/bash\necho boot\n",
        zone=ZONE,
        spot=spot,
        image=image,
        disk_gb=120,
        accelerator=accelerator,
        accelerator_count=count if accelerator else 0,
    )


def stored(fake: GceFake, name: str) -> dict[str, Any]:
    (inst,) = [i for i in fake.instances() if i["name"] == name]
    return inst


# --- the insert body ---------------------------------------------------------------------------


def test_n1_gpu_insert_body_as_gce_receives_it(compute: GcpCompute, gce_fake: GceFake) -> None:
    compute.ensure_network(run_info())
    deadline = time.time() + 3600
    node = compute.create_node(run_info(deadline=deadline), request())
    assert node.state == "running" and node.zone == ZONE and node.private_ip
    inst = stored(gce_fake, node.name)
    assert inst["machineType"].endswith(f"/zones/{ZONE}/machineTypes/n1-standard-8")
    (acc,) = inst["guestAccelerators"]
    assert acc["acceleratorType"].endswith(f"/zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4")
    assert int(acc["acceleratorCount"]) == 1
    sched = inst["scheduling"]
    assert sched["onHostMaintenance"] == "TERMINATE" and sched["automaticRestart"] is False
    assert sched["instanceTerminationAction"] == "DELETE"
    seconds = int(sched["maxRunDuration"]["seconds"])
    assert 3600 + 500 < seconds <= 3600 + 600, "the deadline plus a grace period"
    assert sched.get("provisioningModel", "STANDARD") == "STANDARD"
    assert inst["labels"] == {
        "cloudtrain-run": RUN,
        "cloudtrain-role": "worker",
        "cloudtrain-index": "0",
    }
    assert inst["tags"]["items"] == [f"cloudtrain-{RUN}"]
    items = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    assert items == {"startup-script": "#!/bin/bash\necho boot\n", "install-nvidia-driver": "True"}
    (disk,) = inst["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"].endswith(DLVM_2204.ref.split("projects/", 1)[1])
    assert DLVM_2204.ref.endswith("/family/common-cu129-ubuntu-2204-nvidia-580")
    assert int(disk["initializeParams"]["diskSizeGb"]) == 120
    (sa,) = inst["serviceAccounts"]
    assert sa["scopes"] == [STORAGE_RW_SCOPE]
    assert inst["networkInterfaces"][0]["network"].endswith("/global/networks/default")


def test_spot_built_in_gpus_and_cpu_nodes() -> None:
    spot = instance_body(request(spot=True), PROJECT, ZONE, "n", "t", None)
    assert spot["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
    }
    a2 = instance_body(
        request(instance_type="a2-highgpu-1g", accelerator="A100"), PROJECT, ZONE, "n", "t", None
    )
    assert "guestAccelerators" not in a2, "a2/a3/g2 GPUs come with the machine"
    assert a2["scheduling"]["onHostMaintenance"] == "TERMINATE"
    cpu = instance_body(
        request(role="ps", instance_type="n2-standard-4", accelerator=None),
        PROJECT,
        ZONE,
        "n",
        "t",
        120.0,
    )
    assert "guestAccelerators" not in cpu
    assert cpu["scheduling"]["onHostMaintenance"] == "MIGRATE"
    assert cpu["scheduling"]["maxRunDuration"] == {"seconds": "120"}
    keys = [i["key"] for i in cpu["metadata"]["items"]]
    assert keys == ["startup-script"], "no driver install on a CPU node"
    ubuntu = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
    assert cpu["disks"][0]["initializeParams"]["sourceImage"] == ubuntu


def test_gpus_only_attach_to_n1_and_images_are_checked() -> None:
    with pytest.raises(ProviderError, match="n1 machine types only"):
        instance_body(request(instance_type="n2-standard-8"), PROJECT, ZONE, "n", "t", None)
    with pytest.raises(ProviderError, match="cannot be attached"):
        instance_body(request(accelerator="H100"), PROJECT, ZONE, "n", "t", None)
    with pytest.raises(ProviderError, match="unknown image"):
        image_for("T4", True, "my-image")
    assert image_for("T4", True, "ubuntu-24.04").driver_by == "bootstrap"
    assert image_for("T4", True, "dlvm-ubuntu-24.04").ref.endswith("cu129-ubuntu-2404-nvidia-580")
    explicit = "projects/acme/global/images/family/tf-gpu"
    assert image_for("T4", True, explicit).ref == explicit
    plain = instance_body(request(image="debian-12"), PROJECT, ZONE, "n", "t", None)
    keys = [i["key"] for i in plain["metadata"]["items"]]
    assert keys == ["startup-script"], "plain images get the bootstrap's driver install"


# --- the firewall ------------------------------------------------------------------------------


def test_firewall_is_the_run_tag_to_itself_and_never_the_internet(
    compute: GcpCompute, gce_fake: GceFake
) -> None:
    compute.ensure_network(run_info())
    (rule,) = gce_fake.firewalls()
    assert rule["name"] == f"cloudtrain-{RUN}"
    assert rule["sourceTags"] == rule["targetTags"] == [f"cloudtrain-{RUN}"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["2222-2232"]}]
    assert "sourceRanges" not in rule and "0.0.0.0/0" not in str(rule)
    assert "22" not in rule["allowed"][0]["ports"], "no SSH unless asked"


def test_ssh_needs_a_cidr_and_opens_22_to_it_only(
    compute: GcpCompute, gce_fake: GceFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProviderError, match="CLOUDTRAIN_SSH_CIDR"):
        compute.ensure_network(run_info(ssh=True))
    assert gce_fake.firewalls() == [], "nothing is created before the check"
    with pytest.raises(ProviderError, match="whole internet"):
        firewall_bodies(run_info(ssh=True), PROJECT, cidr="0.0.0.0/0")
    options = {"ssh_cidr": "203.0.113.7"}  # the option (provider_config reads the old variable)
    monkeypatch.setattr(compute, "config", dataclasses.replace(compute.config, options=options))
    made = compute.ensure_network(run_info(ssh=True))
    rules = {r.id for r in made if r.kind == "firewall"}
    assert rules == {f"cloudtrain-{RUN}", f"cloudtrain-{RUN}-ssh"}
    ssh = next(r for r in gce_fake.firewalls() if r["name"].endswith("-ssh"))
    assert ssh["sourceRanges"] == ["203.0.113.7/32"]
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["targetTags"] == [f"cloudtrain-{RUN}"]
    found = compute.list_resources(RUN)
    assert {r.id for r in found} == {r.id for r in made}
    compute.delete_resources(found)
    assert gce_fake.firewalls() == [] and gce_fake.service_accounts() == []


# --- operations, listing, deletion -------------------------------------------------------------


def test_capacity_and_quota_operation_errors(compute: GcpCompute, gce_fake: GceFake) -> None:
    compute.ensure_network(run_info())
    gce_fake.fail_next_insert(ZONE, "ZONE_RESOURCE_POOL_EXHAUSTED")
    with pytest.raises(NoCapacityError) as full:
        compute.create_node(run_info(), request())
    assert full.value.zone == ZONE
    gce_fake.fail_next_insert(
        ZONE,
        "QUOTA_EXCEEDED",
        message="Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
    )
    with pytest.raises(QuotaError, match="NVIDIA_T4_GPUS"):
        compute.create_node(run_info(), request())
    assert gce_fake.instances() == [], "a failed insert leaves no instance"


def test_nodes_are_listed_by_label_across_zones_and_deleted(
    compute: GcpCompute, gce_fake: GceFake
) -> None:
    compute.ensure_network(run_info())
    reqs = [request(index=i) for i in range(3)]
    other = NodeRequest("other-run", "worker", 0, "n1-standard-4", "x", zone="us-central1-b")
    compute.create_nodes(run_info(), reqs)
    other_run = RunInfo("other-run", REGION, None, (2222, 2223), nodes=("worker-0",))
    compute.ensure_network(other_run)  # its own service account
    compute.create_node(other_run, other)
    nodes = compute.list_nodes(RUN)
    assert [n.name for n in nodes] == [r.name for r in reqs]
    assert all(n.run_id == RUN and n.role == "worker" for n in nodes)
    assert [n.index for n in nodes] == [0, 1, 2]
    compute.delete_nodes(RUN)
    assert compute.list_nodes(RUN) == []
    assert [i["name"] for i in gce_fake.instances()] == [other.name]


def test_a_stopped_node_is_replaced_and_a_live_one_kept(
    compute: GcpCompute, gce_fake: GceFake
) -> None:
    compute.ensure_network(run_info())
    first = compute.create_node(run_info(), request())
    again = compute.create_node(run_info(), request())
    assert again.cloud_id == first.cloud_id, "the name is the idempotency key"
    gce_fake.set_instance_status(first.name, "TERMINATED")  # stopped by the cloud
    assert compute.list_nodes(RUN)[0].state == "stopped"
    (fresh,) = RetryingCompute(compute).create_nodes(run_info(), [request()])
    assert fresh.cloud_id != first.cloud_id and fresh.alive


def test_console_output_and_zones(compute: GcpCompute, gce_fake: GceFake) -> None:
    compute.ensure_network(run_info())
    node = compute.create_node(run_info(), request())
    gce_fake.set_serial(node.name, "cloudtrain-bootstrap[worker-0]: FAILED: no driver\n")
    assert "FAILED: no driver" in compute.console_output(node)
    compute.delete_node(node)
    assert compute.console_output(node) == ""
    gce_fake.set_region_zones(REGION, ["us-central1-c", "us-central1-a"])
    assert compute.zones() == ["us-central1-a", "us-central1-c"]


# --- credentials and project -------------------------------------------------------------------


def test_no_credentials_and_no_project_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("CLOUDTRAIN_GCE_ENDPOINT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    provider = GcpProvider(ProviderConfig(name="gcp", region=REGION))
    provider.store("gs://cloudtrain-x-bucket")  # building a store reads no credentials
    with pytest.raises(CredentialsError, match="credentials") as err:
        provider.compute  # noqa: B018
    assert "gcloud auth application-default login" in (err.value.hint or "")
    monkeypatch.setenv("CLOUDTRAIN_GCE_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ProviderError, match="no Google Cloud project"):
        GcpProvider(ProviderConfig(name="gcp", region=REGION)).compute  # noqa: B018
    named = GcpProvider(ProviderConfig(name="gcp", region=REGION, account="ct-spec-project"))
    assert named.account() == "ct-spec-project"
    assert named.default_store_uri("r") == f"gs://cloudtrain-ct-spec-project-{REGION}"
    assert named.owns_bucket(f"gs://cloudtrain-ct-spec-project-{REGION}/")
    assert not named.owns_bucket("gs://my-own-bucket")


# --- startup blocks ----------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-dlvm", "cpu"])
def test_startup_blocks_pass_shellcheck(compute: GcpCompute, gpu: bool, tmp_path: Path) -> None:
    req = request() if gpu else request(role="ps", instance_type="n2-standard-4", accelerator=None)
    blocks = compute.startup_blocks(run_info(), req)
    assert ("Deep Learning VM driver" in blocks.metadata) is gpu
    assert blocks.env == {"GOOGLE_CLOUD_PROJECT": PROJECT}
    params = StartupParams(
        run_id=RUN,
        role=req.role,
        index=0,
        node_name=req.name,
        store_uri="gs://cloudtrain-b",
        bundle_url="https://storage.googleapis.com/b/k?X-Goog-Signature=ab",
        bundle_sha256="ab" * 32,
        log_put_url="https://storage.googleapis.com/b/l?X-Goog-Signature=cd",
        version="0.1.0",
        deadline_epoch=1767225600,
        gpu_count=req.accelerator_count,
        pip_extra="gcp",
    )
    script = tmp_path / "startup.sh"
    script.write_text(render_startup(params, blocks))
    check_script(script)


# --- URLs the controller cannot sign -----------------------------------------------------------

CURL_SHIM = """#!/usr/bin/env bash
# records its arguments; answers the metadata server's token request
printf '%s\\n' "$*" >> "$SHIM_LOG"
case "$*" in
  *computeMetadata/v1/instance/service-accounts/default/token*)
    if [ -n "${SHIM_FAIL:-}" ]; then exit 7; fi
    echo '{"access_token":"ya29.node-token","expires_in":3599,"token_type":"Bearer"}' ;;
esac
"""


def test_unsignable_urls_fall_back_to_the_node_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from google.oauth2.credentials import Credentials

    from cloudtrain.providers.gcp.storage import GcsStore

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    user = Credentials(token="user-token")  # user ADC: no key, no service account to sign as
    strict = GcsStore("gs://cloudtrain-b/p", "proj", credentials=user)
    with pytest.raises(CredentialsError, match="sign"):
        strict.presign_get("bundle/x y.tar.gz")
    lenient = GcsStore("gs://cloudtrain-b/p", "proj", credentials=user, node_identity_fallback=True)
    assert lenient.presign_get("bundle/x y.tar.gz") == (
        "https://storage.googleapis.com/cloudtrain-b/p/bundle/x%20y.tar.gz"
    )
    assert lenient.presign_put("log").endswith("/cloudtrain-b/p/log")
    assert "user-token" not in lenient.presign_put("log")


def _curl_run(tmp_path: Path, script: str, **env: str) -> tuple[str, list[str]]:
    rc, calls = run_with_curl_shim(tmp_path, CURL_SHIM, script, **env)
    assert rc == 0
    return "", calls


def test_nodes_send_their_token_to_unsigned_gcs_urls_only(
    compute: GcpCompute, tmp_path: Path
) -> None:
    blocks = compute.startup_blocks(run_info(), request(accelerator=None))
    params = StartupParams(
        run_id=RUN,
        role="worker",
        index=0,
        node_name="n",
        store_uri="gs://b",
        bundle_url="u",
        bundle_sha256="ab" * 32,
        log_put_url="u",
        version="0.1.0",
        deadline_epoch=1767225600,
    )
    rendered = render_startup(params, blocks)
    # the template's curl wrapper, then the provider's storage_headers (its metadata block)
    start = rendered.index("storage_headers() { :; }")
    wrapper = rendered[start : rendered.index("upload_log()")]
    gcp = rendered[rendered.index("storage_headers() {\n  case") :]
    gcp = gcp[: gcp.index("\n}\n") + 3]
    script = wrapper + gcp + 'ct_curl -fsS -o out "$1"\n'
    unsigned = "https://storage.googleapis.com/b/cloudtrain/runs/r/bundle.tar.gz"
    for url, header in [
        (unsigned, "-H Authorization: Bearer ya29.node-token"),
        (unsigned + "?X-Goog-Signature=ab12", None),
        ("http://127.0.0.1:4443/b/k", None),  # the emulator: no token
    ]:
        _, calls = _curl_run(tmp_path, f"set -- {url!r}\n" + script)
        fetch = calls[-1]
        assert fetch.endswith(url)
        if header:
            assert any("computeMetadata" in c and "Metadata-Flavor: Google" in c for c in calls)
            assert fetch.startswith(header)
        else:
            assert len(calls) == 1 and "Authorization" not in fetch
    _, calls = _curl_run(tmp_path, f"set -- {unsigned!r}\n" + script, SHIM_FAIL="1")
    assert calls[-1] == f"-fsS -o out {unsigned}", "no metadata server: plain fetch"
