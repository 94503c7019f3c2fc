"""The bootstrap script on real GPU images, without a GPU: jobs/startup.sh.j2 run under bash with
shims for the machine (tests/fakes/bootstrap_shims.py), with AWS's real provider blocks.

Cases (issue 7): a GPU with no driver gets the driver, then the pip stack, then the agent; a ready
GPU image installs nothing and boots in under a second; no GPU touches no driver; a module that
does not load reboots once, then fails clearly; TensorFlow seeing fewer GPUs fails with the
diagnostics; an unsupported OS fails naming it; every failure uploads the log through the PUT URL;
a horovod job fails unless horovod imports. Then shellcheck on every rendered variant: each
provider's real blocks, GPU or not, spot or not, horovod or not (the OS family is a runtime branch).

What this cannot show: real apt packages, a real kernel module, real pip wheels, real TensorFlow
on a GPU. The package names and commands are asserted as the script would run them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest

from cloudtrain.providers.aws.compute import AwsCompute
from cloudtrain.providers.azure.startup import startup_blocks as azure_blocks
from cloudtrain.providers.base import NodeRequest, RunInfo, StartupBlocks
from cloudtrain.providers.gcp.clients import GcpAuth
from cloudtrain.providers.gcp.compute import GcpCompute
from cloudtrain.providers.local import LocalCompute
from cloudtrain.run.bundle import Bundle
from cloudtrain.run.startup import NVIDIA_BRANCH, TF_VERSION, StartupParams, render_startup
from cloudtrain.state.bootlog import parse
from tests.fakes.bootstrap_shims import Boot, FakeNode, Machine, make_bundle
from tests.fakes.shell import require_tool

RUN = RunInfo("shim-run", "us-east-1", None, (2222, 2230))
GPU_REQUEST = NodeRequest("shim-run", "worker", 0, "g4dn.xlarge", "", accelerator_count=1)
CPU_REQUEST = NodeRequest("shim-run", "worker", 0, "m5.xlarge", "")
DURATIONS_LINE = re.compile(r"cloudtrain-bootstrap\[worker-0\]: durations( [a-z]+=\d+s)+$")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("bundle"))


def aws_blocks() -> StartupBlocks:
    return AwsCompute("us-east-1").startup_blocks(RUN, GPU_REQUEST)


@pytest.fixture
def node(tmp_path: Path, bundle: Bundle) -> FakeNode:
    """A GPU node (one T4 expected) with AWS's blocks."""
    return FakeNode(tmp_path / "node", bundle, aws_blocks(), gpu_count=1)


def assert_agent_started(boot: Boot, node: FakeNode) -> None:
    assert boot.returncode == 0, boot.console
    assert boot.agent_argv is not None, boot.console
    assert boot.agent_argv[:4] == ["-m", "cloudtrain.jobs.agent", "--run-id", "shim-run"]
    assert "shutdown -h now" in boot.calls, "the node powers off after the agent"
    info = parse(boot.uploaded_log or "")
    assert info.failed is None
    assert list(info.durations) == ["driver", "python", "bundle", "agent"], boot.uploaded_log
    assert DURATIONS_LINE.search(boot.boot_log.splitlines()[-1]), boot.boot_log


def assert_failed(boot: Boot, node: FakeNode, *needles: str) -> str:
    """A clear failure: non-zero, no agent, and the log (FAILED line, then the durations line)
    uploaded through the presigned PUT URL. Returns the FAILED reason."""
    assert boot.returncode == 1, boot.console
    assert boot.agent_argv is None, "the agent must not start"
    puts = [c for c in boot.called("curl") if " -T " in f" {c} "]
    assert puts and all(c.endswith(f" {node.log_url}") for c in puts), boot.calls
    assert boot.uploaded_log is not None and boot.uploaded_log == boot.boot_log
    lines = boot.uploaded_log.splitlines()
    assert sum("]: FAILED: " in line for line in lines) == 1, boot.uploaded_log
    assert "]: FAILED: " in lines[-2] and DURATIONS_LINE.search(lines[-1]), (
        "the log ends with the FAILED line, then the durations"
    )
    reason = parse(boot.uploaded_log).failed or ""
    for needle in needles:
        assert needle in reason, reason
    return reason


# --- the cases -----------------------------------------------------------------------


@pytest.mark.parametrize("os_family", ["ubuntu-22.04", "ubuntu-24.04"])
def test_gpu_without_driver_gets_driver_then_stack_then_agent(
    node: FakeNode, os_family: str
) -> None:
    machine = Machine(os=os_family, gpu=True, venv_exists=False, ensurepip=False)
    boot = node.boot(machine)
    assert_agent_started(boot, node)
    driver = boot.index("apt-get -o DPkg::Lock::Timeout=600 install -y -qq linux-headers-")
    assert boot.calls[driver].endswith(
        f"linux-headers-6.8.0-1015-gcp nvidia-driver-{NVIDIA_BRANCH}-server"
    )
    loaded = boot.index("modprobe nvidia")
    venv = boot.index(f"python3 -m venv {node.root / 'venv'}")
    stack = boot.index("pip install")
    gpu_check = boot.index("list_physical_devices")
    agent = boot.index("-m cloudtrain.jobs.agent")
    assert driver < loaded < venv < stack < gpu_check < agent
    # stock images lack ensurepip: python3-venv comes from apt, then the venv at the fixed path
    assert any(c.endswith("install -y -qq python3 python3-venv") for c in boot.called("apt-get"))
    pip = boot.calls[stack]
    assert f"tensorflow[and-cuda]=={TF_VERSION} tf-keras==" in pip
    assert boot.called("reboot") == [], "the module loaded: no reboot"
    assert not (node.ct_state / "driver-reboot").exists()
    log = boot.boot_log
    for line in (
        "phase driver: installing nvidia-driver 580",
        "phase driver: nvidia-smi works (driver 580.95.05)",
        f"phase python: installing tensorflow[and-cuda]=={TF_VERSION}",
        "phase python: checking that TensorFlow sees 1 GPU(s)",
    ):
        assert line in log, log


def test_debian_gpu_without_driver_uses_nvidias_repository(node: FakeNode) -> None:
    boot = node.boot(Machine(os="debian-12", gpu=True, tf=True))
    assert_agent_started(boot, node)
    keyring = boot.index("developer.download.nvidia.com")
    url = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    assert boot.calls[keyring].endswith(url + "cuda-keyring_1.1-1_all.deb")
    dpkg = boot.index("dpkg -i")
    drivers = boot.index(f"install -y -qq cuda-drivers-{NVIDIA_BRANCH}")
    assert keyring < dpkg < drivers < boot.index("modprobe nvidia")
    assert not any("nvidia-driver-" in c for c in boot.called("apt-get")), "not Ubuntu's package"
    assert not any(c.startswith("install") for c in boot.called("python")), "TF was there"


def test_ready_gpu_image_installs_nothing(node: FakeNode) -> None:
    """A ready image is only checked: no install, no reboot (so its boot is quick: the time is
    benchmarks/unit_timings.py's ready_boot_s, not an assert a loaded machine could flake)."""
    node.boot(Machine(gpu=True, driver=True, tf=True))
    boot = node.boot(Machine(gpu=True, driver=True, tf=True), boot_id="boot-2")
    assert_agent_started(boot, node)
    touched = {c.split()[0] for c in boot.calls}
    assert not touched & {"apt-get", "apt-cache", "dpkg", "modprobe", "reboot", "pip", "python3"}
    assert not [c for c in boot.called("python") if "pip install" in c]
    assert boot.index("list_physical_devices") < boot.index("cloudtrain.jobs.agent"), (
        "the GPU check runs on a ready image too"
    )
    assert "installing" not in boot.boot_log


def test_no_gpu_touches_no_driver(tmp_path: Path, bundle: Bundle) -> None:
    cpu = FakeNode(
        tmp_path / "cpu", bundle, AwsCompute("us-east-1").startup_blocks(RUN, CPU_REQUEST)
    )
    boot = cpu.boot(Machine(gpu=False))
    assert_agent_started(boot, cpu)
    touched = {c.split()[0] for c in boot.calls}
    assert not touched & {"apt-get", "apt-cache", "dpkg", "modprobe", "nvidia-smi", "reboot"}
    pip = [c for c in boot.called("python") if "pip install" in c]
    assert len(pip) == 1 and f"tensorflow=={TF_VERSION} tf-keras==" in pip[0], pip
    assert "list_physical_devices" not in " ".join(boot.calls), "no GPU, no GPU check"


def test_a_gpu_node_without_a_gpu_never_falls_back_to_the_cpu(node: FakeNode) -> None:
    boot = node.boot(Machine(gpu=False, tf=True))
    assert_failed(boot, node, "GPU(s) expected but no NVIDIA PCI device found")


def test_module_that_does_not_load_reboots_once_then_fails(node: FakeNode) -> None:
    machine = Machine(gpu=True, tf=True, modprobe_fails=True)
    first = node.boot(machine, boot_id="boot-1")
    assert first.returncode == 0, first.console
    assert first.called("reboot") == [""], "exactly one reboot"
    assert first.agent_argv is None
    assert (node.ct_state / "driver-reboot").exists(), "the marker survives the reboot"
    copy = node.perboot / "cloudtrain-bootstrap.sh"
    assert copy.read_text() == node.script_text, "cloud-init runs user data once: a per-boot copy"
    assert first.uploaded_log and "phase driver: rebooting once" in first.uploaded_log
    assert DURATIONS_LINE.search(first.uploaded_log.splitlines()[-1])

    second = node.boot(machine, boot_id="boot-2")
    assert second.called("reboot") == [], "never a second reboot"
    assert_failed(second, node, "still does not load after a reboot", "Secure Boot")
    log = second.uploaded_log or ""
    assert "phase driver: rebooting once" in log, "the log keeps the first boot"
    assert "continuing after a reboot (boot boot-2)" in log
    assert "Key was rejected by service" in log, "modprobe's error is in the log"


def test_module_loading_after_the_reboot_goes_on_and_runs_once_per_boot(node: FakeNode) -> None:
    node.boot(Machine(gpu=True, tf=True, modprobe_fails=True), boot_id="boot-1")
    second = node.boot(Machine(gpu=True, tf=True), boot_id="boot-2")
    assert_agent_started(second, node)
    assert not (node.ct_state / "driver-reboot").exists()
    assert not (node.perboot / "cloudtrain-bootstrap.sh").exists(), "back to run-once"
    # GCE's runner and cloud-init's per-boot copy both start it: the second one leaves at once
    third = node.boot(Machine(gpu=True, tf=True), boot_id="boot-2")
    assert third.returncode == 0 and third.calls == [] and third.agent_argv is None
    assert "another copy already runs the bootstrap on this boot" in third.console


def test_tensorflow_seeing_fewer_gpus_fails_with_diagnostics(
    tmp_path: Path, bundle: Bundle
) -> None:
    two = FakeNode(tmp_path / "two", bundle, aws_blocks(), gpu_count=2)
    boot = two.boot(Machine(gpu=True, driver=True, tf=False, tf_gpus=1))
    reason = assert_failed(boot, two, "TensorFlow sees 1 GPU(s) but this node has 2")
    assert "driver 580.95.05" in reason and "refusing to train on the CPU" in reason
    log = boot.uploaded_log or ""
    diagnostics = log[: log.index("]: FAILED: ")]
    for needle in (
        "--- diagnostics: TensorFlow's GPU check",
        "Cannot dlopen some GPU libraries",
        "--- diagnostics: driver 580.95.05",
        "--- diagnostics: CUDA libraries found by pip",
        "nvidia-cudnn-cu12 9.3.0.75",
        "NVIDIA-SMI 580.95.05",
    ):
        assert needle in diagnostics, log
    assert parse(log).durations.keys() == {"driver", "python"}


def test_a_failed_driver_install_fails_clearly(node: FakeNode) -> None:
    boot = node.boot(Machine(gpu=True, tf=True, apt_fails=True))
    assert_failed(boot, node, "apt-get install linux-headers-6.8.0-1015-gcp nvidia-driver-580")
    assert "E: Unable to locate package" in (boot.uploaded_log or "")
    assert boot.called("modprobe") == [] and boot.called("reboot") == []


def test_unsupported_os_fails_naming_it(node: FakeNode) -> None:
    boot = node.boot(Machine(os="rocky-9", gpu=True, tf=True))
    assert_failed(boot, node, "unsupported OS 'Rocky Linux 9.4 (Blue Onyx)'", "rocky-9.4")
    assert boot.called("apt-get") == [] and boot.called("modprobe") == []


def test_unsupported_os_fails_before_installing_python(tmp_path: Path, bundle: Bundle) -> None:
    cpu = FakeNode(
        tmp_path / "cpu", bundle, AwsCompute("us-east-1").startup_blocks(RUN, CPU_REQUEST)
    )
    boot = cpu.boot(Machine(os="rocky-9"))
    assert_failed(boot, cpu, "unsupported OS 'Rocky Linux 9.4 (Blue Onyx)'", "tensorflow")
    assert not [c for c in boot.called("python") if "pip install" in c]


def test_any_os_boots_when_nothing_needs_installing(node: FakeNode) -> None:
    boot = node.boot(Machine(os="rocky-9", gpu=True, driver=True, tf=True))
    assert_agent_started(boot, node)


@pytest.mark.parametrize("venv_exists", [False, True])
def test_a_python_older_than_the_agent_needs_fails_naming_it(
    node: FakeNode, venv_exists: bool
) -> None:
    # Ubuntu 20.04's python3 is 3.8: pip would refuse the wheel (requires-python) with a riddle;
    # the script says which interpreter and what it needs, before installing anything
    boot = node.boot(Machine(gpu=True, driver=True, venv_exists=venv_exists, python="3.8.10"))
    assert_failed(boot, node, "is Python 3.8.10", "needs Python >= 3.10")
    assert not [c for c in boot.called("python") if "pip install" in c]
    assert not [c for c in boot.called("python3") if "venv" in c]


def test_the_images_python_is_named_in_the_log(node: FakeNode) -> None:
    boot = node.boot(Machine(gpu=True, driver=True, tf=True, python="3.12.3"))
    assert_agent_started(boot, node)
    assert "is Python 3.12.3" in boot.boot_log


def test_deep_learning_image_python_is_reused_through_the_venv(node: FakeNode) -> None:
    boot = node.boot(Machine(gpu=True, driver=True, venv_exists=False, system_tf=True))
    assert_agent_started(boot, node)
    assert any("--system-site-packages" in c for c in boot.called("python3"))
    assert not [c for c in boot.called("python") if "pip install" in c]
    assert boot.called("apt-get") == []


def test_horovod_job_uses_an_image_that_ships_horovod(tmp_path: Path, bundle: Bundle) -> None:
    # its own TensorFlow (the pinned 2.21 here) and horovod: used as it is, nothing installed
    hvd = FakeNode(tmp_path / "hvd", bundle, aws_blocks(), gpu_count=1, require_horovod=True)
    boot = hvd.boot(Machine(gpu=True, driver=True, tf=True, horovod=True))
    assert_agent_started(boot, hvd)
    assert "has horovod.tensorflow (tensorflow 2.21.0): using it as it is" in boot.boot_log
    assert not [c for c in boot.called("python") if " pip " in f" {c} "]


def test_horovod_job_installs_its_stack_and_builds_horovod(tmp_path: Path, bundle: Bundle) -> None:
    # the image lacks horovod: tensorflow 2.15.1 and tf-keras 2.15.1 from the index, then
    # horovod 0.28.1 built against them (no wheelhouse offered), installed from its wheel
    hvd = FakeNode(tmp_path / "hvd", bundle, aws_blocks(), gpu_count=1, require_horovod=True)
    boot = hvd.boot(Machine(gpu=True, driver=True, tf=True))
    assert_agent_started(boot, hvd)
    pips = [c for c in boot.called("python") if c.startswith("-m pip")]
    stack = "tensorflow[and-cuda]==2.15.1 tf-keras==2.15.1"
    assert any(c.startswith("-m pip install") and c.endswith(stack) for c in pips), pips
    (build,) = [c for c in pips if c.startswith("-m pip wheel")]
    assert "--no-build-isolation" in build and build.endswith(" horovod==0.28.1"), build
    assert any("--no-index" in c and c.endswith(" horovod==0.28.1") for c in pips), pips
    assert "building horovod==0.28.1 against tensorflow 2.15.1" in boot.boot_log
    assert boot.called("apt-get") == []  # the compiler, cmake and the headers are there


def test_horovod_build_installs_pythons_headers_with_apt(tmp_path: Path, bundle: Bundle) -> None:
    hvd = FakeNode(tmp_path / "hvd", bundle, aws_blocks(), gpu_count=1, require_horovod=True)
    boot = hvd.boot(Machine(gpu=True, driver=True, tf=True, headers=False))
    assert_agent_started(boot, hvd)
    assert any("install" in c and c.endswith("python3-dev") for c in boot.called("apt-get"))
    assert "installing python3-dev with apt to build horovod==0.28.1" in boot.boot_log


def test_horovod_build_refuses_without_pythons_headers(tmp_path: Path, bundle: Bundle) -> None:
    hvd = FakeNode(tmp_path / "hvd", bundle, aws_blocks(), gpu_count=1, require_horovod=True)
    boot = hvd.boot(Machine(gpu=True, driver=True, tf=True, headers=False, apt_fails=True))
    assert_failed(boot, hvd, "apt-get install python3-dev failed")
    assert not [c for c in boot.called("python") if c.startswith("-m pip wheel")]


def test_horovod_stack_refuses_a_python_tensorflow_215_has_no_wheel_for(
    tmp_path: Path, bundle: Bundle
) -> None:
    # Ubuntu 24.04's python3 is 3.12: tensorflow 2.15.1 has wheels for 3.9-3.11 only
    hvd = FakeNode(tmp_path / "hvd", bundle, aws_blocks(), gpu_count=1, require_horovod=True)
    boot = hvd.boot(Machine(os="ubuntu-24.04", gpu=True, driver=True, python="3.12.3"))
    assert_failed(
        boot,
        hvd,
        "tensorflow 2.15.1 (for horovod==0.28.1) has wheels for Python 3.9 3.10 3.11 only",
        "is Python 3.12.3",
        "ships horovod",
    )
    assert not [c for c in boot.called("python") if "pip" in c]


# --- shellcheck over every rendered variant ---------------------------------------------------


def _gcp_blocks(request: NodeRequest) -> StartupBlocks:
    return GcpCompute(
        GcpAuth(credentials=None, project="p", endpoint=None), "us-central1"
    ).startup_blocks(RUN, request)


def _variants() -> dict[str, tuple[StartupParams, StartupBlocks]]:
    out = {}
    for spot in (False, True):
        for gpus in (0, 1):
            request = dataclasses.replace(
                GPU_REQUEST if gpus else CPU_REQUEST, spot=spot, accelerator_count=gpus
            )
            blocks = {
                "aws": AwsCompute("us-east-1").startup_blocks(RUN, request),
                "gcp": _gcp_blocks(request),
                "gcp-plain-image": _gcp_blocks(dataclasses.replace(request, image="ubuntu-22.04")),
                "azure": azure_blocks(False),
                "azure-extension": azure_blocks(bool(gpus)),
                "local": LocalCompute(Path("/nonexistent")).startup_blocks(RUN, request),
            }
            for name, block in blocks.items():
                for horovod in (False, True):
                    params = StartupParams(
                        run_id="v",
                        role="worker",
                        index=0,
                        node_name="ct-v-worker-0",
                        store_uri="s3://b",
                        bundle_url="https://b/x.tar.gz",
                        bundle_sha256="ab" * 32,
                        log_put_url="https://b/log",
                        version="0.1.0",
                        deadline_epoch=1767225600,
                        gpu_count=gpus,
                        **(
                            {"require_module": "horovod.tensorflow", "require_for": "horovod"}
                            if horovod
                            else {}
                        ),
                    )
                    key = f"{name}-{'spot' if spot else 'ondemand'}-gpu{gpus}-hvd{int(horovod)}"
                    out[key] = (params, block)
    return out


def test_every_rendered_variant_passes_shellcheck(tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    variants = _variants()
    assert len(variants) == 2 * 2 * 6 * 2
    # variants that render the same script (e.g. a block that ignores spot) are checked once:
    # each distinct script under the first variant's name that renders it
    scripts: dict[str, Path] = {}
    for key, (params, blocks) in variants.items():
        script = render_startup(params, blocks)
        if script not in scripts:
            scripts[script] = tmp_path / f"{key}.sh"
            scripts[script].write_text(script)
    paths = list(scripts.values())
    assert len(paths) > 2 * 6, len(paths)  # 20 distinct when written: the variants still differ
    # shellcheck uses one core: one process per core, each checking its share of the files
    n = max(1, min(os.cpu_count() or 1, 4))
    shares = [paths[i::n] for i in range(n)]
    assert sorted(p for share in shares for p in share) == sorted(paths)
    procs = [
        subprocess.Popen(
            [shellcheck, "-S", "warning", "-s", "bash", *map(str, share)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, out[-4000:] + err
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for path in paths:
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, (path.name, syntax.stderr)
