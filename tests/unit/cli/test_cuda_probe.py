"""A node planned without a GPU does not look broken (issue 31): TensorFlow's CUDA probe lines
(`failed call to cuInit`, on every CPU-only machine) fold into one quiet note in the live view;
a node that planned a GPU shows them, and every other line, errors included, is shown as is."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from cloudtrain import api
from cloudtrain.cli.ui import ConsoleObserver, gpu_less_roles, is_cuda_probe

EXAMPLES = Path(__file__).resolve().parents[3] / "jobs" / "examples"
# what TensorFlow 2.21 prints on a CPU-only machine (TF_CPP_MIN_LOG_LEVEL=1, as the agent sets)
PROBE = [
    "I0000 00:00:1795906741.246135   18825 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1795906717.137472   17242 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "E0000 00:00:1795906717.137472   17242 cuda_dnn.cc:8310] Unable to register cuDNN factory: "
    "Attempting to register factory for plugin cuDNN when one has already been registered",
    "W0000 00:00:1795906717.137472   17242 gpu_device.cc:2344] Cannot dlopen some GPU libraries."
    " Please make sure the missing libraries mentioned above are installed properly.",
    "Skipping registering GPU devices...",
]
OTHER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795906741.245603   18825 port.cc:153] oneDNN custom operations are on.",
    "E0000 00:00:1795906717.137472   17242 op_kernel.cc:1841] OP_REQUIRES failed: OOM when "
    "allocating tensor",
    "Epoch 1/4",
    "Traceback (most recent call last):",
    "RuntimeError: CUDA is not what failed here",  # a Python error that names CUDA: shown
]


def shown_lines(gpu_less: tuple[str, ...], lines: list[str], node: str = "worker-0") -> list[str]:
    out = io.StringIO()
    observer = ConsoleObserver(Console(file=out, width=400, color_system=None), gpu_less=gpu_less)
    for line in lines:
        observer.log_line(node, line)
    return out.getvalue().splitlines()


def test_a_gpu_less_nodes_cuda_probe_is_one_note_and_every_other_line_is_shown() -> None:
    printed = shown_lines(("worker",), PROBE[:2] + OTHER + PROBE[2:])
    notes = [line for line in printed if "found none, as planned" in line]
    assert len(notes) == 1 and "cloudtrain logs" in notes[0], printed
    assert not any(probe in "\n".join(printed) for probe in PROBE), printed
    assert printed == ["[worker-0] " + line for line in [notes[0][11:], *OTHER]]


def test_a_node_that_planned_a_gpu_shows_its_cuda_probe() -> None:
    lines = PROBE + OTHER
    assert shown_lines(("ps",), lines) == ["[worker-0] " + line for line in lines]
    assert shown_lines((), lines) == ["[worker-0] " + line for line in lines]


@pytest.mark.parametrize("line", PROBE)
def test_the_probe_lines_are_recognised(line: str) -> None:
    assert is_cuda_probe(line)


@pytest.mark.parametrize("line", OTHER)
def test_other_lines_are_not_the_probe(line: str) -> None:
    assert not is_cuda_probe(line)


def test_roles_without_a_gpu_come_from_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUDTRAIN_HOME", str(tmp_path))
    job = EXAMPLES / "digits-ps" / "job.yaml"  # T4 workers and chief, a CPU parameter server
    assert gpu_less_roles(api.plan(job, provider="aws")) == {"ps"}
    assert gpu_less_roles(api.plan(job)) == {"chief", "worker", "ps"}  # local: no GPU
