"""The controller's side of the wheelhouse (cloudtrain/run/wheelhouse.py) against a real store.

The planner reads manifests from a LocalStore bucket (a folder) and presigns file:// URLs that
curl reads and writes, as the node's script does; the tag's hash is checked against what bash's
sha256sum computes, the script's own way. The last tests render real startup scripts through the
Orchestrator (`security_kit.render_requests`) for the AWS provider under moto: the first node of
a bare-image run is asked to publish, the others install from the index, and once a wheelhouse is
published every node of a later run fetches it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.core.errors import UsageError
from cloudtrain.providers.base import NodeRequest
from cloudtrain.providers.local import LocalStore
from cloudtrain.run.startup import HOROVOD_STACK, TF_KERAS_VERSION, TF_VERSION
from cloudtrain.run.wheelhouse import (
    IMAGE_MACHINE,
    TAG_ENV,
    WheelhousePlanner,
    image_python,
    manifest_key,
    read_manifest,
    stack_pins,
    tag,
    tar_key,
)

CPU_TAG = tag("3.10", "x86_64", stack_pins(False))


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    bucket = LocalStore(f"file://{tmp_path / 'bucket'}")
    bucket.ensure_bucket()
    return bucket


def test_tag_hash_is_the_scripts_sha256sum_of_the_pins() -> None:
    for gpu in (False, True):
        pins = stack_pins(gpu)
        shell = subprocess.run(
            ["bash", "-c", 'printf "%s\\n" "$@" | sha256sum | cut -c1-12', "-", *pins],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert tag("3.11", "x86_64", pins) == f"py3.11-x86_64-{shell}"
    assert stack_pins(False) == [f"tensorflow=={TF_VERSION}", f"tf-keras=={TF_KERAS_VERSION}"]
    assert stack_pins(True)[0] == f"tensorflow[and-cuda]=={TF_VERSION}"
    # a change of a pin or of the CUDA extra is another wheelhouse
    assert len({CPU_TAG, tag("3.10", "x86_64", stack_pins(True)), tag("3.11", "x86_64", [])}) == 3
    assert tag("3.10", "x86_64", ["tensorflow==2.20.0", f"tf-keras=={TF_KERAS_VERSION}"]) != CPU_TAG


def test_cold_then_nothing_then_warm(store: LocalStore, tmp_path: Path) -> None:
    planner = WheelhousePlanner(store, "local", 3600)
    cold = planner.offer_for_tag(CPU_TAG)
    assert cold is not None and cold.mode == "cold" and cold.tag == CPU_TAG
    assert cold.url == "" and cold.sha256 == ""
    assert cold.put_url.endswith(f"/cloudtrain/wheelhouse/{CPU_TAG}/wheels.tar")
    assert cold.manifest_put_url.endswith(f"/cloudtrain/wheelhouse/{CPU_TAG}/manifest.json")
    # one publisher per tag and run: the other nodes install from the index
    assert planner.offer_for_tag(CPU_TAG) is None
    # the node publishes through the PUT URLs with curl, the tar first, the manifest last
    tar = tmp_path / "wheels.tar"
    tar.write_bytes(b"\0" * 4096)
    sha = hashlib.sha256(tar.read_bytes()).hexdigest()
    manifest = tmp_path / "manifest.json"
    pins = stack_pins(False)
    body = {"tag": CPU_TAG, "sha256": sha, "size": 4096, "pins": pins, "files": ["t.whl"]}
    manifest.write_text(json.dumps(body))
    for path, url in ((tar, cold.put_url), (manifest, cold.manifest_put_url)):
        subprocess.run(["curl", "-fsS", "-T", str(path), url], check=True, timeout=30)
    warm = planner.offer_for_tag(CPU_TAG)
    assert warm is not None and warm.mode == "warm" and warm.sha256 == sha
    assert warm.put_url == "" and warm.manifest_put_url == ""
    fetched = subprocess.run(["curl", "-fsS", warm.url], capture_output=True, check=True)
    assert fetched.stdout == tar.read_bytes()
    # a later run's planner finds it too
    again = WheelhousePlanner(store, "local", 3600).offer_for_tag(CPU_TAG)
    assert again is not None and again.mode == "warm" and again.sha256 == sha


@pytest.mark.parametrize(
    "broken",
    ["no manifest", "no tar", "tar of another size", "not json", "short sha", "other pins"],
)
def test_an_incomplete_or_foreign_wheelhouse_is_not_offered(store: LocalStore, broken: str) -> None:
    data = b"x" * 1000
    sha = hashlib.sha256(data).hexdigest()
    doc = {"tag": CPU_TAG, "sha256": sha, "size": 1000, "pins": stack_pins(False), "files": []}
    if broken == "tar of another size":
        doc["size"] = 999
    if broken == "short sha":
        doc["sha256"] = sha[:40]
    if broken == "other pins":
        doc["pins"] = stack_pins(True)
    if broken != "no tar":
        store.put(tar_key(CPU_TAG), data)
    if broken != "no manifest":
        text = b"{not json" if broken == "not json" else json.dumps(doc).encode()
        store.put(manifest_key(CPU_TAG), text)
    assert read_manifest(store, CPU_TAG) is None
    offer = WheelhousePlanner(store, "local", 3600).offer_for_tag(CPU_TAG)
    assert offer is not None and offer.mode == "cold", "an incomplete one is published again"


def _request(instance_type: str, gpus: int, image: str | None = None) -> NodeRequest:
    return NodeRequest(
        "r1", "worker", 0, instance_type, "", image=image,
        accelerator="T4" if gpus else None, accelerator_count=gpus,
    )  # fmt: skip


def test_image_python_comes_from_the_providers_images() -> None:
    assert image_python("aws", _request("m5.large", 0)) == "3.10"  # Canonical's Ubuntu 22.04
    assert image_python("aws", _request("g4dn.xlarge", 1, "ubuntu-24.04")) == "3.12"
    assert image_python("gcp", _request("n1-standard-4", 1)) == "3.10"  # a Deep Learning VM
    assert image_python("gcp", _request("n2-standard-4", 0, "debian-12")) == "3.11"
    assert image_python("azure", _request("Standard_D4s_v5", 0)) == "3.10"
    # unknown: a custom image, an image the provider refuses, a provider without images
    assert image_python("aws", _request("m5.large", 0, "ami-0123456789abcdef0")) is None
    assert image_python("aws", _request("m5.large", 0, "no-such-image")) is None
    assert image_python("local", _request("local", 0)) is None


def test_offer_for_a_node_and_the_tag_override(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TAG_ENV, raising=False)
    planner = WheelhousePlanner(store, "aws", 3600)
    assert planner.offer_for(_request("m5.large", 0, "ami-0123456789abcdef0")) is None
    offer = planner.offer_for(_request("m5.large", 0))
    assert offer is not None and offer.tag == CPU_TAG and offer.mode == "cold"
    gpu = planner.offer_for(_request("g4dn.xlarge", 1))
    assert gpu is not None and gpu.tag == tag("3.10", "x86_64", stack_pins(True))
    # the override names the tag of an image the controller cannot know
    debian = tag("3.11", "x86_64", stack_pins(False))
    monkeypatch.setenv(TAG_ENV, debian)
    forced = WheelhousePlanner(store, "aws", 3600).offer_for(_request("g4dn.xlarge", 1, "ami-1"))
    assert forced is not None and forced.tag == debian
    monkeypatch.setenv(TAG_ENV, "../../runs/x")
    with pytest.raises(UsageError, match=f"{TAG_ENV}=.* is not a wheelhouse tag"):
        planner.offer_for(_request("m5.large", 0))


def test_a_strategy_with_a_stack_of_its_own_has_its_own_wheelhouse(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # horovod's stack (cloudtrain/run/startup.py: HOROVOD_STACK): its TensorFlow and tf-keras,
    # and the package the first node builds, whose wheel the tar keeps
    monkeypatch.delenv(TAG_ENV, raising=False)
    module = HOROVOD_STACK.module
    pins = ["tensorflow==2.15.1", "tf-keras==2.15.1", "horovod==0.28.1"]
    assert stack_pins(False, module) == pins
    assert stack_pins(True, module)[0] == "tensorflow[and-cuda]==2.15.1"
    assert stack_pins(False, "some.module") == stack_pins(False)  # no stack of its own
    planner = WheelhousePlanner(store, "aws", 3600)
    offer = planner.offer_for(_request("m5.large", 0), module)
    assert offer is not None and offer.mode == "cold"
    assert offer.tag == tag("3.10", "x86_64", pins) != CPU_TAG
    # the pinned stack's first node is still offered its own build
    plain = planner.offer_for(_request("m5.large", 0))
    assert plain is not None and (plain.tag, plain.mode) == (CPU_TAG, "cold")


def _script_value(script: str, name: str) -> str:
    found = re.search(rf"^{name}='([^']*)'$", script, re.M)
    assert found, f"{name} not in the script"
    return found.group(1)


def _aws_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: str, store: LocalStore
) -> Callable[[], list[NodeRequest]]:
    """A renderer of the node requests the orchestrator makes for an AWS job with `cluster`
    (YAML lines), on moto with the images' parameters seeded. Call this outside moto.mock_aws()
    and what it returns inside: monkeypatching the keys inside moto's fake ones restores moto's
    keys when the test ends, leaving them in this process for the tests after it."""
    from cloudtrain.providers.aws.provider import AwsProvider
    from cloudtrain.providers.base import ProviderConfig
    from tests.unit import security_kit as kit
    from tests.unit.aws_kit import (
        CPU_AMI,
        CPU_IMAGE_PARAM,
        GPU_AMI,
        GPU_IMAGE_PARAM,
        REGION,
        _seed_ssm,
    )

    monkeypatch.delenv(TAG_ENV, raising=False)
    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    job = kit.write_job(
        tmp_path / "job",
        f"name: wh\nprovider: aws\nregion: {REGION}\nentrypoint: python train.py\n{cluster}",
    )

    def render() -> list[NodeRequest]:
        _seed_ssm({GPU_IMAGE_PARAM: GPU_AMI, CPU_IMAGE_PARAM: CPU_AMI})
        provider = AwsProvider(ProviderConfig(name="aws", region=REGION))
        return kit.render_requests(job, provider, tmp_path, store)

    return render


def test_the_orchestrator_offers_the_first_node_the_build_and_later_runs_the_tar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto = pytest.importorskip("moto")
    store = LocalStore(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    cluster = "cluster:\n  strategy: multi_worker_mirrored\n  workers: 2\n"
    render = _aws_requests(tmp_path, monkeypatch, cluster, store)
    with moto.mock_aws():
        first = render()
        modes = [_script_value(r.startup_script, "CT_WHEELHOUSE_MODE") for r in first]
        assert modes == ["cold", ""], modes
        wheel_tag = _script_value(first[0].startup_script, "CT_WHEELHOUSE_TAG")
        put = _script_value(first[0].startup_script, "CT_WHEELHOUSE_PUT_URL")
        assert put.endswith(f"cloudtrain/wheelhouse/{wheel_tag}/wheels.tar")
        # the node published it (tar, then manifest): every node of the next run fetches it
        data = b"published wheels"
        sha = hashlib.sha256(data).hexdigest()
        store.put(tar_key(wheel_tag), data)
        doc = {"tag": wheel_tag, "sha256": sha, "size": len(data), "files": ["t.whl"]}
        doc["pins"] = stack_pins(first[0].accelerator_count > 0)
        store.put(manifest_key(wheel_tag), json.dumps(doc).encode())
        later = render()
    for req in later:
        script = req.startup_script
        assert _script_value(script, "CT_WHEELHOUSE_MODE") == "warm"
        assert _script_value(script, "CT_WHEELHOUSE_SHA256") == sha
        assert _script_value(script, "CT_WHEELHOUSE_URL").endswith(f"/{wheel_tag}/wheels.tar")
        assert _script_value(script, "CT_WHEELHOUSE_PUT_URL") == ""


def test_the_orchestrator_offers_a_horovod_node_its_own_stacks_wheelhouse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without it, horovod nodes were offered the standard stack's tar and compiled horovod
    # each, from the index
    moto = pytest.importorskip("moto")
    store = LocalStore(f"file://{tmp_path / 'bucket'}")
    store.ensure_bucket()
    cluster = "cluster:\n  strategy: horovod\n  workers: 2\n"
    render = _aws_requests(tmp_path, monkeypatch, cluster, store)  # outside moto: see its doc
    with moto.mock_aws():
        first = render()
    gpu = first[0].accelerator_count > 0
    python = image_python("aws", first[0])
    assert python is not None
    expected = tag(python, IMAGE_MACHINE, stack_pins(gpu, HOROVOD_STACK.module))
    assert expected != tag(python, IMAGE_MACHINE, stack_pins(gpu))
    assert _script_value(first[0].startup_script, "CT_WHEELHOUSE_TAG") == expected


def test_on_s3_under_a_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    moto = pytest.importorskip("moto")
    from cloudtrain.providers.aws.storage import S3Store

    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with moto.mock_aws():
        s3 = S3Store("s3://ct-wheels/team/a", "us-east-1")
        s3.ensure_bucket()
        cold = WheelhousePlanner(s3, "aws", 3600).offer_for_tag(CPU_TAG)
        assert cold is not None and cold.mode == "cold"
        assert f"/team/a/cloudtrain/wheelhouse/{CPU_TAG}/wheels.tar?" in cold.put_url
        assert "X-Amz-Expires=3600" in cold.put_url
        data = b"w" * 2048
        s3.put(tar_key(CPU_TAG), data)
        assert read_manifest(s3, CPU_TAG) is None, "a tar without its manifest is no wheelhouse"
        doc = {"tag": CPU_TAG, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        doc.update(pins=stack_pins(False), files=["t.whl"])
        s3.put(manifest_key(CPU_TAG), json.dumps(doc).encode())
        warm = WheelhousePlanner(s3, "aws", 3600).offer_for_tag(CPU_TAG)
    assert warm is not None and warm.mode == "warm" and warm.sha256 == doc["sha256"]
    assert f"/team/a/cloudtrain/wheelhouse/{CPU_TAG}/wheels.tar?" in warm.url


def test_a_store_that_cannot_be_read_offers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheelhouse is an optimisation: a bucket the controller cannot read (here nothing
    listens at its endpoint) makes the node install from the index, never fails the run."""
    from cloudtrain.core.errors import CloudtrainError
    from cloudtrain.providers.aws.storage import S3Store

    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: refused
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3 = S3Store("s3://ct-wheels", "us-east-1")
    with pytest.raises(CloudtrainError):
        read_manifest(s3, CPU_TAG)
    assert WheelhousePlanner(s3, "aws", 3600).offer_for_tag(CPU_TAG) is None
