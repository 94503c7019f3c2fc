"""The TPU types and runtime table (providers/gcp/tpu_types.py): the facts of Google's pages the
module cites, the single-host rule's message, and the runtime defaults and refusals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cloudtrain.providers.gcp import tpu_types
from cloudtrain.providers.gcp.tpu_types import (
    RUNTIMES,
    TPU_TYPES,
    default_runtime,
    multi_host_problem,
    resolved_runtime,
    runtime_problem,
    runtime_tensorflow,
    runtimes_for,
    single_host_types,
    tpu_type,
)

MODULE = Path(tpu_types.__file__)


def test_the_types_the_issue_names_with_their_chips_and_hosts() -> None:
    # (chips, cores, hosts): v5e/v6e count chips in the name, v4/v5p TensorCores (2 per chip)
    expected = {
        "v5litepod-1": (1, 1, 1),
        "v5litepod-4": (4, 4, 1),
        "v5litepod-8": (8, 8, 1),
        "v5litepod-16": (16, 16, 4),
        "v6e-1": (1, 1, 1),
        "v6e-4": (4, 4, 1),
        "v6e-8": (8, 8, 1),
        "v6e-16": (16, 16, 4),
        "v5p-8": (4, 8, 1),
        "v5p-16": (8, 16, 2),
        "v4-8": (4, 8, 1),
        "v4-16": (8, 16, 2),
    }
    got = {name: (t.chips, t.cores, t.hosts) for name, t in TPU_TYPES.items()}
    assert got == expected
    assert all(t.name == name for name, t in TPU_TYPES.items())


def test_zones_are_the_regions_and_zones_page() -> None:
    assert tpu_type("v5litepod-8").zones == (  # type: ignore[union-attr]
        "us-central1-a",
        "us-south1-a",
        "us-west1-c",
        "us-west4-a",
    )
    assert tpu_type("v4-8").regions == ("us-central2",)  # type: ignore[union-attr]
    assert tpu_type("v6e-8").regions == (  # type: ignore[union-attr]
        "us-central1",
        "us-east1",
        "us-east5",
        "europe-west4",
    )
    assert tpu_type("v5p-8").zones == ("us-central1-a", "us-east5-a")  # type: ignore[union-attr]


def test_lookup_is_exact() -> None:
    assert tpu_type("v5litepod-8") is TPU_TYPES["v5litepod-8"]
    assert tpu_type("V5LITEPOD-8") is None  # the TPU API's names are lowercase
    assert tpu_type("v5litepod-2") is None
    assert tpu_type("V100") is None


def test_single_host_types_leave_out_the_slices() -> None:
    assert single_host_types() == [
        "v5litepod-1",
        "v5litepod-4",
        "v5litepod-8",
        "v6e-1",
        "v6e-4",
        "v6e-8",
        "v5p-8",
        "v4-8",
    ]


def test_a_multi_host_slice_is_refused_naming_the_largest_single_host_type() -> None:
    assert multi_host_problem(TPU_TYPES["v5litepod-16"]) == (
        "v5litepod-16 is a multi-host slice (4 hosts): cloudtrain runs single-host TPU slices"
        " only; use v5litepod-8 or smaller"
    )
    assert "(2 hosts)" in (multi_host_problem(TPU_TYPES["v4-16"]) or "")
    assert "use v4-8 or smaller" in (multi_host_problem(TPU_TYPES["v4-16"]) or "")
    assert multi_host_problem(TPU_TYPES["v6e-8"]) is None


def test_default_runtime_is_the_newest_tensorflow_of_the_generation() -> None:
    for name in single_host_types():
        tpu = TPU_TYPES[name]
        runtime = default_runtime(tpu)
        assert runtime == "tpu-vm-tf-2.16.1-pjrt", name  # PJRT before SE at the same TF
        assert runtime_tensorflow(runtime) == "2.16.1"
        assert runtime_problem(tpu, runtime) is None


def test_stream_executor_runtimes_only_on_v4() -> None:
    assert runtimes_for(TPU_TYPES["v4-8"]) == [
        "tpu-vm-tf-2.16.1-pjrt",
        "tpu-vm-tf-2.16.1-se",
        "tpu-vm-tf-2.15.1-pjrt",
        "tpu-vm-tf-2.15.1-se",
        "tpu-vm-tf-2.15.0-pjrt",
        "tpu-vm-tf-2.15.0-se",
    ]
    assert runtimes_for(TPU_TYPES["v5litepod-4"]) == [
        "tpu-vm-tf-2.16.1-pjrt",
        "tpu-vm-tf-2.15.1-pjrt",
        "tpu-vm-tf-2.15.0-pjrt",
    ]


def test_runtime_refusals_name_the_valid_ones() -> None:
    v5e = TPU_TYPES["v5litepod-8"]
    valid = "tpu-vm-tf-2.16.1-pjrt, tpu-vm-tf-2.15.1-pjrt, tpu-vm-tf-2.15.0-pjrt"
    assert runtime_problem(v5e, "tpu-vm-tf-2.16.1-se") == (
        f"'tpu-vm-tf-2.16.1-se' does not run on TPU v5e; v5litepod-8 takes one of: {valid}"
    )
    assert runtime_problem(v5e, "v2-alpha-tpuv5-lite") == (
        "'v2-alpha-tpuv5-lite' is not a TensorFlow TPU runtime cloudtrain knows;"
        f" v5litepod-8 takes one of: {valid}"
    )
    with pytest.raises(ValueError, match="does not run on TPU v5e"):
        resolved_runtime(v5e, "tpu-vm-tf-2.15.0-se")
    assert resolved_runtime(v5e, None) == "tpu-vm-tf-2.16.1-pjrt"
    assert resolved_runtime(v5e, "tpu-vm-tf-2.15.1-pjrt") == "tpu-vm-tf-2.15.1-pjrt"
    with pytest.raises(KeyError):
        runtime_tensorflow("tpu-vm-tf-9.9.9")


def test_every_runtime_name_says_its_tensorflow_and_no_pod_runtime_is_listed() -> None:
    for name, runtime in RUNTIMES.items():
        assert name.startswith(f"tpu-vm-tf-{runtime.tensorflow}-"), name
        assert "-pod" not in name  # multi-host slices are refused, so are their runtimes


def test_standard_library_only() -> None:
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    imported = {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    } | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "dataclasses"}, imported
