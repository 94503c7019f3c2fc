"""The script's side of the wheelhouse (jobs/wheelhouse.sh.j2) under FakeNode's shims, with offers
made by the real controller code (cloudtrain/run/wheelhouse.py) on the node's bucket (a LocalStore).

Real: bash, curl on file:// URLs (the fetch, and the publishing PUTs), sha256sum, tar. Shimmed:
apt-get, and the venv's pip (`pip wheel -w DIR` writes two fake wheels; `pip install --no-index
--find-links DIR` fails unless DIR holds them). Paths: cold (build, install with no index, publish
tar then manifest in the background), warm (fetch, verify, install with no index), and every
fallback to the index with its line: another platform's tag, a bad hash, a failed download, a
publish that cannot upload. The python phase reports its steps (apt, venv, fetch, pip).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cloudtrain.providers.aws.compute import AwsCompute
from cloudtrain.providers.base import NodeRequest, RunInfo
from cloudtrain.run.bundle import Bundle
from cloudtrain.run.startup import HOROVOD_STACK, TF_KERAS_VERSION, TF_VERSION, WheelhouseOffer
from cloudtrain.run.wheelhouse import (
    WheelhousePlanner,
    manifest_key,
    read_manifest,
    stack_pins,
    tag,
    tar_key,
)
from cloudtrain.state.bootlog import parse
from tests.fakes.bootstrap_shims import Boot, FakeNode, Machine, make_bundle

RUN = RunInfo("shim-run", "us-east-1", None, (2222, 2230))
CPU_REQUEST = NodeRequest("shim-run", "worker", 0, "m5.xlarge", "")
TAG = tag("3.10", "x86_64", stack_pins(False))  # the FakeNode's: Python 3.10.12, x86_64, no GPU
BARE = Machine(venv_exists=False, ensurepip=False)  # a stock image: apt, venv, pip
PINS = f"tensorflow=={TF_VERSION} tf-keras=={TF_KERAS_VERSION}"
DURATIONS_LINE = re.compile(r"cloudtrain-bootstrap\[worker-0\]: durations( [a-z]+=\d+s)+$")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("bundle"))


def cpu_node(root: Path, bundle: Bundle) -> FakeNode:
    return FakeNode(root, bundle, AwsCompute("us-east-1").startup_blocks(RUN, CPU_REQUEST))


def boot_ok(node: FakeNode, offer: WheelhouseOffer | None) -> Boot:
    node.wheelhouse = offer
    boot = node.boot(BARE)
    assert boot.returncode == 0, boot.console
    assert boot.agent_argv is not None, "the agent starts"
    assert DURATIONS_LINE.search(boot.boot_log.splitlines()[-1]), boot.boot_log
    assert boot.uploaded_log == boot.boot_log
    return boot


def pip_calls(boot: Boot) -> list[str]:
    return [c for c in boot.called("python") if c.startswith("-m pip ") and "tensorflow" in c]


def index_installs(boot: Boot) -> list[str]:
    return [c for c in pip_calls(boot) if c.startswith("-m pip install") and "--no-index" not in c]


def publish_cold(tmp_path: Path, bundle: Bundle) -> tuple[FakeNode, Boot]:
    node = cpu_node(tmp_path / "cold", bundle)
    offer = WheelhousePlanner(node.store, "aws", 3600).offer_for_tag(TAG)
    assert offer is not None and offer.mode == "cold"
    return node, boot_ok(node, offer)


def test_cold_builds_installs_without_the_index_and_publishes(
    tmp_path: Path, bundle: Bundle
) -> None:
    node, boot = publish_cold(tmp_path, bundle)
    wheels = f"{node.work}/wheelhouse/wheels"
    assert pip_calls(boot) == [
        f"-m pip wheel -q --disable-pip-version-check -w {wheels} {PINS}",
        f"-m pip install -q --disable-pip-version-check --no-index --find-links {wheels} {PINS}",
    ]
    assert boot.index("apt-get") < boot.index("pip wheel") < boot.index("--no-index")
    # published: the tar, then the manifest that describes it, which the controller accepts
    manifest = read_manifest(node.store, TAG)
    assert manifest is not None, "a whole wheelhouse: the manifest matches the tar"
    assert manifest.pins == stack_pins(False)
    assert sorted(manifest.files) == [
        "tensorflow-2.21.0-cp310-cp310-manylinux_x86_64.whl",
        "tf_keras-2.21.0-py3-none-any.whl",
    ]
    log = boot.boot_log
    assert f"phase python: building the wheelhouse {TAG}" in log
    assert re.search(rf"\]: wheelhouse: published {TAG} \(2 wheels, \d+ bytes\)$", log, re.M), log
    offer = node.wheelhouse
    assert offer is not None
    for url in (offer.put_url, offer.manifest_put_url):
        assert url not in log and url not in boot.console, "no presigned URL in the logs"
    # the phase table: apt, venv, pip as steps of the python phase
    info = parse(log)
    assert list(info.steps["python"]) == ["apt", "venv", "pip"], log
    assert list(info.durations) == ["driver", "python", "bundle", "agent"]
    assert info.wheelhouse.startswith(f"wheelhouse: published {TAG}")


def test_warm_fetches_verifies_and_installs_with_no_index(tmp_path: Path, bundle: Bundle) -> None:
    cold, _ = publish_cold(tmp_path, bundle)
    node = cpu_node(tmp_path / "warm", bundle)  # a node of a later run, on the same bucket
    for key in (tar_key(TAG), manifest_key(TAG)):
        node.store.put(key, cold.store.get(key))
    offer = WheelhousePlanner(node.store, "aws", 3600).offer_for_tag(TAG)
    assert offer is not None and offer.mode == "warm"
    boot = boot_ok(node, offer)
    wheels = f"{node.work}/wheelhouse/wheels"
    assert pip_calls(boot) == [
        f"-m pip install -q --disable-pip-version-check --no-index --find-links {wheels} {PINS}"
    ]
    fetches = [c for c in boot.called("curl") if c.endswith(f" {offer.url}")]
    assert len(fetches) == 1 and " -o " in fetches[0], boot.calls
    log = boot.boot_log
    assert f"phase python: fetching the wheelhouse {TAG}" in log
    assert "from the wheelhouse (no index)" in log and "wheelhouse not used" not in log
    assert list(parse(log).steps["python"]) == ["apt", "venv", "fetch", "pip"], log
    assert not (node.work / "wheelhouse").exists(), "the wheels are removed after the install"


def fallback(tmp_path: Path, bundle: Bundle, offer: WheelhouseOffer, needle: str) -> Boot:
    node = cpu_node(tmp_path / "node", bundle)
    boot = boot_ok(node, offer)
    assert index_installs(boot) == [f"-m pip install -q --disable-pip-version-check {PINS}"]
    lines = [line for line in boot.boot_log.splitlines() if "wheelhouse not" in line]
    assert len(lines) == 1 and needle in lines[0], boot.boot_log
    assert lines[0].endswith("installing from the index")
    assert parse(boot.boot_log).wheelhouse.startswith("wheelhouse not"), "status shows it"
    return boot


def test_a_warm_offer_for_another_platform_falls_back_to_the_index(
    tmp_path: Path, bundle: Bundle
) -> None:
    other = tag("3.11", "x86_64", stack_pins(False))
    offer = WheelhouseOffer("warm", other, url="file:///nonexistent/wheels.tar", sha256="0" * 64)
    boot = fallback(tmp_path, bundle, offer, f"offered {other}, this node is {TAG}")
    assert not [c for c in boot.called("curl") if "wheels.tar" in c], "nothing fetched"


def test_a_bad_hash_falls_back_to_the_index(tmp_path: Path, bundle: Bundle) -> None:
    cold, _ = publish_cold(tmp_path, bundle)
    offer = WheelhousePlanner(cold.store, "aws", 3600).offer_for_tag(TAG)
    assert offer is not None and offer.mode == "warm"
    bad = dataclasses.replace(offer, sha256="f" * 64)
    boot = fallback(tmp_path, bundle, bad, f"sha256 mismatch (expected {'f' * 64})")
    assert not [c for c in pip_calls(boot) if "--no-index" in c], "unverified wheels never used"


def test_a_failed_download_falls_back_to_the_index(tmp_path: Path, bundle: Bundle) -> None:
    offer = WheelhouseOffer("warm", TAG, url=f"file://{tmp_path}/missing.tar", sha256="0" * 64)
    fallback(tmp_path, bundle, offer, "download failed (curl exit 37)")


def test_a_cold_offer_for_another_platform_builds_nothing(tmp_path: Path, bundle: Bundle) -> None:
    other = tag("3.10", "aarch64", stack_pins(False))
    put = f"file://{tmp_path}/bucket-x/wheels.tar"
    offer = WheelhouseOffer("cold", other, put_url=put, manifest_put_url=put + ".json")
    boot = fallback(tmp_path, bundle, offer, f"asked for {other}, this node is {TAG}")
    assert not [c for c in pip_calls(boot) if "pip wheel" in c]
    assert not (tmp_path / "bucket-x").exists()


def test_a_publish_that_cannot_upload_is_said_and_the_boot_goes_on(
    tmp_path: Path, bundle: Bundle
) -> None:
    node = cpu_node(tmp_path / "node", bundle)
    put = f"file://{tmp_path}/no-such-folder/wheels.tar"
    offer = WheelhouseOffer("cold", TAG, put_url=put, manifest_put_url=put + ".json")
    boot = boot_ok(node, offer)
    assert re.search(r"\]: wheelhouse: not published: upload failed \(curl exit \d+\)$",
                     boot.boot_log, re.M), boot.boot_log  # fmt: skip
    assert put not in boot.boot_log
    assert read_manifest(node.store, TAG) is None


def test_steps_and_wheelhouse_lines_leave_phase_and_durations_as_they_were() -> None:
    from cloudtrain.state.bootlog import durations_text

    head = "2026-11-25T10:00:00Z cloudtrain-bootstrap[worker-0]: "
    log = "".join(
        head + line + "\n"
        for line in (
            "phase python: checking",
            f"phase python: wheelhouse not used: sha256 mismatch (expected {'f' * 64}); "
            "installing from the index",
            "steps python: apt=12s venv=3s pip=80s",
            "phase python: done in 95s",
            "durations driver=1s python=95s",
            "phase bundle: fetching",
            "wheelhouse: published py3.10-x86_64-0123456789ab (2 wheels, 10 bytes)",
        )
    )
    info = parse(log)
    assert info.phase == "bundle: fetching", "a steps or wheelhouse line is no phase"
    assert info.durations == {"driver": 1.0, "python": 95.0}
    assert info.steps == {"python": {"apt": 12.0, "venv": 3.0, "pip": 80.0}}
    assert info.step_durations() == {"python.apt": 12.0, "python.venv": 3.0, "python.pip": 80.0}
    assert info.wheelhouse.startswith("wheelhouse: published py3.10-x86_64-0123456789ab (2 wheels")
    assert durations_text(info.durations, info.steps) == (
        "driver 1s, python 95s (apt 12s, venv 3s, pip 80s)"
    )
    assert durations_text(info.durations) == "driver 1s, python 95s"


def test_the_node_waits_for_a_slow_publish_before_powering_off(
    tmp_path: Path, bundle: Bundle
) -> None:
    node = cpu_node(tmp_path / "node", bundle)
    node.extra_env["SHIM_SLOW_URL"] = "/wheels.tar"  # the tar's upload outlasts the agent
    offer = WheelhousePlanner(node.store, "aws", 3600).offer_for_tag(TAG)
    boot = boot_ok(node, offer)  # the durations line still ends the log
    lines = boot.boot_log.splitlines()
    agent_end = next(i for i, line in enumerate(lines) if "phase agent: exited with 0" in line)
    published = next(i for i, line in enumerate(lines) if "]: wheelhouse: published" in line)
    assert agent_end < published, "the publish outlasted the agent"
    assert boot.index(offer.manifest_put_url) < boot.index("shutdown -h now"), boot.calls
    assert read_manifest(node.store, TAG) is not None


# --- a strategy's stack of its own: horovod's wheel is built once and kept in the tar ------------
HVD_PINS = stack_pins(False, HOROVOD_STACK.module)
HVD_TAG = tag("3.10", "x86_64", HVD_PINS)


def hvd_node(root: Path, bundle: Bundle) -> FakeNode:
    blocks = AwsCompute("us-east-1").startup_blocks(RUN, CPU_REQUEST)
    return FakeNode(root, bundle, blocks, require_horovod=True)


def test_horovod_cold_builds_horovod_into_the_wheelhouse_and_warm_builds_nothing(
    tmp_path: Path, bundle: Bundle
) -> None:
    cold = hvd_node(tmp_path / "cold", bundle)
    offer = WheelhousePlanner(cold.store, "aws", 3600).offer_for_tag(HVD_TAG)
    boot = boot_ok(cold, offer)
    wheels = f"{cold.work}/wheelhouse/wheels"
    builds = [c for c in boot.called("python") if c.startswith("-m pip wheel")]
    assert builds[0].endswith(f"-w {wheels} tensorflow==2.15.1 tf-keras==2.15.1"), builds
    assert builds[1].endswith(f"--no-build-isolation -w {wheels} horovod==0.28.1"), builds
    assert "building horovod==0.28.1 against tensorflow 2.15.1" in boot.boot_log
    manifest = read_manifest(cold.store, HVD_TAG)
    assert manifest is not None and manifest.pins == HVD_PINS
    assert "horovod-0.28.1-cp310-cp310-linux_x86_64.whl" in manifest.files, manifest.files
    # a later node (the lost one's replacement, a later run) fetches it: no build, no index
    warm = hvd_node(tmp_path / "warm", bundle)
    for key in (tar_key(HVD_TAG), manifest_key(HVD_TAG)):
        warm.store.put(key, cold.store.get(key))
    offer = WheelhousePlanner(warm.store, "aws", 3600).offer_for_tag(HVD_TAG)
    assert offer is not None and offer.mode == "warm"
    boot = boot_ok(warm, offer)
    pips = [c for c in boot.called("python") if c.startswith("-m pip")]
    wheels = f"{warm.work}/wheelhouse/wheels"
    assert pips[0] == (
        f"-m pip install -q --disable-pip-version-check --no-index --find-links {wheels} "
        + " ".join(HVD_PINS)
    ), pips
    assert not [c for c in pips if c.startswith("-m pip wheel")], pips
    assert "building horovod" not in boot.boot_log
