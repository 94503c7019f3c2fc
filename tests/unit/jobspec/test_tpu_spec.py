"""The spec's TPU rules (cloudtrain/jobspec/tpu_rules.py, issue 32): a TPU job names a
single-host TPU type its provider sells, and a runtime of that type's generation; every
refusal is one `FILE:LINE: FIELD: problem` line, raised while the spec loads (nothing exists
yet), and a TPU type under another strategy is refused too."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.core.errors import SpecError
from cloudtrain.jobs.strategies import STRATEGIES
from cloudtrain.jobspec.job import load_spec, load_spec_text
from cloudtrain.jobspec.tpu_rules import sellers, tpu_of
from cloudtrain.providers import infos

TPU = "tpu"  # the strategy under test (a test may name it; the program reads the registry)
HEAD = "name: t\nentrypoint: python train.py\n"


def spec_text(provider: str = "gcp", cluster: str = "", extra: str = "") -> str:
    """A spec with `provider`, then `cluster:` lines (indented), then `extra` lines."""
    body = "".join(f"  {line}\n" for line in cluster.splitlines())
    return f"{HEAD}provider: {provider}\ncluster:\n{body}{extra}"


def load(text: str, tmp_path: Path, **overrides: str) -> object:
    return load_spec_text(text, "job.yaml", tmp_path, **overrides)


def refused(text: str, tmp_path: Path, **overrides: str) -> str:
    with pytest.raises(SpecError) as caught:
        load(text, tmp_path, **overrides)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_single_host_type_on_gcp_is_a_tpu_job(tmp_path: Path) -> None:
    spec = load(spec_text(cluster=f"strategy: {TPU}\naccelerator: v5litepod-8"), tmp_path)
    tpu = tpu_of(spec)  # type: ignore[arg-type]
    assert (tpu.name, tpu.chips, tpu.hosts) == ("v5litepod-8", 8, 1)
    assert spec.cluster.roles() == {"chief": 1}  # type: ignore[attr-defined]
    runtime = "providers:\n  gcp:\n    tpu_runtime: tpu-vm-tf-2.15.1-pjrt\n"
    assert load(spec_text(cluster=f"strategy: {TPU}\naccelerator: v4-8", extra=runtime), tmp_path)


def test_only_gcp_sells_tpus_and_the_others_are_refused_naming_it(tmp_path: Path) -> None:
    assert sellers() == ["gcp"]
    others = [i.name for i in infos() if i.name != "gcp"] + ["cheapest"]
    assert {"local", "aws", "azure", "cheapest"} <= set(others)
    for provider in others:
        text = spec_text(provider, f"strategy: {TPU}\naccelerator: v5litepod-8")
        assert refused(text, tmp_path) == (
            f"job.yaml:5: cluster.strategy: strategy 'tpu' runs on Cloud TPU VMs, which provider"
            f" {provider} does not sell; use provider: gcp"
        )


def test_the_command_line_provider_is_the_one_judged(tmp_path: Path) -> None:
    text = spec_text(cluster=f"strategy: {TPU}\naccelerator: v5litepod-8")
    assert "provider aws does not sell" in refused(text, tmp_path, provider="aws")
    (tmp_path / "job.yaml").write_text(spec_text("local", f"strategy: {TPU}\naccelerator: v6e-8"))
    assert tpu_of(load_spec(tmp_path / "job.yaml", provider="gcp")).name == "v6e-8"  # type: ignore[union-attr]


def test_a_tpu_job_needs_a_tpu_type(tmp_path: Path) -> None:
    singles = "v5litepod-1, v5litepod-4, v5litepod-8, v6e-1, v6e-4, v6e-8, v5p-8, v4-8"
    assert refused(spec_text(cluster=f"strategy: {TPU}"), tmp_path) == (
        f"job.yaml:5: cluster.accelerator: strategy 'tpu' needs a TPU type, one of: {singles}"
    )
    gpu = spec_text(cluster=f"strategy: {TPU}\naccelerator: V100")
    assert refused(gpu, tmp_path) == (
        "job.yaml:6: cluster.accelerator: 'V100' is not a TPU type provider gcp sells;"
        f" strategy 'tpu' takes one of: {singles}"
    )


def test_a_multi_host_slice_is_refused_with_the_largest_single_host_type(tmp_path: Path) -> None:
    text = spec_text(cluster=f"strategy: {TPU}\naccelerator: v5litepod-16")
    assert refused(text, tmp_path) == (
        "job.yaml:6: cluster.accelerator: v5litepod-16 is a multi-host slice (4 hosts):"
        " cloudtrain runs single-host TPU slices only; use v5litepod-8 or smaller"
    )
    for slice_, single in (("v4-16", "v4-8"), ("v5p-16", "v5p-8"), ("v6e-16", "v6e-8")):
        text = spec_text(cluster=f"strategy: {TPU}\naccelerator: {slice_}")
        assert f"use {single} or smaller" in refused(text, tmp_path)


@pytest.mark.parametrize(
    ("line", "field", "says"),
    [
        ("accelerator: v5litepod-8:2", "accelerator", "a TPU type takes no count (v5litepod-8 is"),
        ("instance_type: ct5lp-hightpu-8t", "instance_type", "a TPU VM's machine is its TPU"),
        ("image: ubuntu-2204", "image", "set providers.gcp.tpu_runtime instead"),
    ],
)
def test_what_a_tpu_vm_does_not_take(line: str, field: str, says: str, tmp_path: Path) -> None:
    accelerator = "" if line.startswith("accelerator") else "accelerator: v5litepod-8\n"
    text = spec_text(cluster=f"strategy: {TPU}\n{accelerator}{line}")
    message = refused(text, tmp_path)
    number = text.splitlines().index("  " + line) + 1
    assert message.startswith(f"job.yaml:{number}: cluster.{field}:"), message
    assert says in message


def test_a_runtime_of_another_generation_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    runtime = "providers:\n  gcp:\n    tpu_runtime: tpu-vm-tf-2.16.1-se\n"
    text = spec_text(cluster=f"strategy: {TPU}\naccelerator: v6e-4", extra=runtime)
    assert refused(text, tmp_path) == (
        "job.yaml:9: providers.gcp.tpu_runtime: 'tpu-vm-tf-2.16.1-se' does not run on TPU v6e;"
        " v6e-4 takes one of: tpu-vm-tf-2.16.1-pjrt, tpu-vm-tf-2.15.1-pjrt, tpu-vm-tf-2.15.0-pjrt"
    )
    unknown = "providers:\n  gcp:\n    tpu_runtime: tpu-vm-tf-9.0.0-pjrt\n"
    text = spec_text(cluster=f"strategy: {TPU}\naccelerator: v6e-4", extra=unknown)
    message = refused(text, tmp_path)
    assert message.startswith("job.yaml:9: providers.gcp.tpu_runtime: must be a TensorFlow TPU")
    assert "tpu-vm-tf-2.16.1-pjrt" in message


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != TPU])
def test_a_tpu_type_under_another_strategy_is_refused(strategy: str, tmp_path: Path) -> None:
    workers = "workers: 2\n" if STRATEGIES[strategy].spans_nodes else ""
    ps = "ps: 1\n" if strategy == "parameter_server" else ""
    text = spec_text(cluster=f"strategy: {strategy}\n{workers}{ps}accelerator: v5litepod-8")
    message = refused(text, tmp_path)
    assert message.startswith("job.yaml:"), message
    assert (
        f"cluster.accelerator: v5litepod-8 is a TPU type: it runs only under strategy 'tpu'"
        f" (got {strategy!r})"
    ) in message
    typed = spec_text(cluster=f"strategy: {strategy}\n{workers}{ps}instance_type: v6e-1")
    assert "cluster.instance_type: v6e-1 is a TPU type" in refused(typed, tmp_path)
    # and on a provider without TPUs too (local would ignore the accelerator: still refused)
    assert "is a TPU type" in refused(text.replace("provider: gcp", "provider: local"), tmp_path)
