"""What the TPU API fake sells where: accelerator types per zone, runtime versions, quota names.

The fake's own small table (the provider's `providers/gcp/tpu_types.py` is production's; a
fake that read it could never catch it being wrong). Sources:

- zones per TPU generation: Google's "TPU regions and zones" (cloud.google.com/tpu/docs/
  regions-zones, North America and Europe tables): v6e us-central1-b, us-east1-d, us-east5-a,
  us-east5-b, europe-west4-a; v5p us-central1-a, us-east5-a; v5e ("All v5litepod
  configurations") us-central1-a, us-south1-a, us-west1-c, us-west4-a; v4 us-central2-b;
  v3-8 us-central1-a, us-central1-b; v2-8 us-central1-b, us-central1-c; v2-32 and larger
  us-central1-a. Zones outside those tables are left out (the fake sells less, never more).
- slice sizes and topologies: v5e/v6e 1x1 (1 chip), 2x2 (4), 2x4 (8, one host), 4x4 (16),
  4x8 (32), 8x8 (64), 8x16 (128), 16x16 (256) ("TPU v5e configurations",
  cloud.google.com/tpu/docs/supported-versions); v2-8/v3-8 2x2, v4-8/v5p-8 2x2x1. The number
  in a type's name counts TensorCores for v2-v4 and v5p and chips for v5e and v6e
  (cloud.google.com/tpu/docs/runtimes, accelerator types), which is also the unit of the TPU
  quota of that family.
- `AcceleratorConfig.type` enum names and numbers (V2=2, V3=4, V4=7, V5LITE_POD=9, V5P=10,
  V6E=11): google-cloud-tpu, google/cloud/tpu_v2/types/cloud_tpu.py; the REST client sends
  them as numbers (`$alt=json;enum-encoding=int`).
- runtime versions: "TPU software versions" (cloud.google.com/tpu/docs/runtimes and
  /supported-tpu-versions): the TensorFlow ones `tpu-vm-tf-x.y.z[-{pod}][-{device_api}]`
  listed there (2.16.1-pjrt/-se down to 2.7.3), and the framework-less ones v2-alpha-tpuv6e,
  v2-alpha-tpuv5, v2-alpha-tpuv5-lite, tpu-ubuntu2204-base. Which fit which generation
  (`runtime_fits`): "TPU v6e, v5e and v5p support TensorFlow 2.15.0 and later" with the `-pjrt`
  runtimes (same pages); v4 takes the v2/v3 TensorFlow runtimes from 2.10.1 on; each
  framework-less runtime is its generation's (v2-alpha-tpuv6e: v6e, -tpuv5: v5p, -tpuv5-lite:
  v5e, tpu-ubuntu2204-base: v4 and older). A zone lists every runtime; a create pairing a type
  with a runtime that does not fit it is refused (400): stricter than Google may be, which
  documents the pairs, not the refusal.
- quota limit names: `TPUV6EPreemptiblePerProjectPerRegionForTPUAPI` is quoted from a real
  429 (marin-community/marin#1612: "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI'
  has been exceeded. Limit: 0 in region us-east5."); the other families' names follow that
  pattern (an inference, not a quote).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

V5E_TOPOLOGIES = {
    1: "1x1",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}
# generation -> (AcceleratorConfig.type name, its enum number, quota token, zones by size)
_US_C1A = ("us-central1-a",)
GENERATIONS: dict[str, tuple[str, int, str]] = {
    "v2": ("V2", 2, "V2"),
    "v3": ("V3", 4, "V3"),
    "v4": ("V4", 7, "V4"),
    "v5litepod": ("V5LITE_POD", 9, "V5sLitepod"),
    "v5p": ("V5P", 10, "V5P"),
    "v6e": ("V6E", 11, "V6E"),
}
_ZONES: dict[str, dict[int, tuple[str, ...]]] = {
    "v6e": dict.fromkeys(
        V5E_TOPOLOGIES,
        ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
    ),
    "v5litepod": dict.fromkeys(
        V5E_TOPOLOGIES, ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a")
    ),
    "v5p": dict.fromkeys((8, 16, 32), ("us-central1-a", "us-east5-a")),
    "v4": dict.fromkeys((8, 16, 32), ("us-central2-b",)),
    "v3": {8: ("us-central1-a", "us-central1-b")},
    "v2": {8: ("us-central1-b", "us-central1-c"), **dict.fromkeys((32, 128, 256, 512), _US_C1A)},
}
_3D = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4"}
_2D = {8: "2x2", 32: "4x4", 128: "8x8", 256: "8x16", 512: "16x16"}
TF_RUNTIMES = (
    "tpu-vm-tf-2.16.1-pjrt",
    "tpu-vm-tf-2.16.1-se",
    "tpu-vm-tf-2.15.1-pjrt",
    "tpu-vm-tf-2.15.1-se",
    "tpu-vm-tf-2.15.0-pjrt",
    "tpu-vm-tf-2.15.0-se",
    "tpu-vm-tf-2.14.1",
    "tpu-vm-tf-2.14.0",
    "tpu-vm-tf-2.13.1",
    "tpu-vm-tf-2.13.0",
    "tpu-vm-tf-2.12.1",
    "tpu-vm-tf-2.12.0",
    "tpu-vm-tf-2.11.1",
    "tpu-vm-tf-2.11.0",
    "tpu-vm-tf-2.10.1",
    "tpu-vm-tf-2.10.0",
    "tpu-vm-tf-2.9.3",
    "tpu-vm-tf-2.9.1",
    "tpu-vm-tf-2.8.4",
    "tpu-vm-tf-2.8.3",
    "tpu-vm-tf-2.8.0",
    "tpu-vm-tf-2.7.4",
    "tpu-vm-tf-2.7.3",
)
BASE_RUNTIMES = ("v2-alpha-tpuv6e", "v2-alpha-tpuv5", "v2-alpha-tpuv5-lite", "tpu-ubuntu2204-base")
TYPE_RE = re.compile(r"(v2|v3|v4|v5litepod|v5p|v6e)-(\d+)")
TF_RUNTIME_RE = re.compile(r"tpu-vm-tf-(\d+\.\d+\.\d+)(?:-pod)?(?:-(?:pjrt|se))?")


@dataclass(frozen=True)
class AcceleratorType:
    """One TPU type the fake sells: `v5litepod-8` = generation v5litepod, size 8."""

    name: str
    generation: str
    size: int  # TensorCores (v2-v4, v5p) or chips (v5e, v6e): the quota's unit
    topology: str
    zones: tuple[str, ...]

    @property
    def config_type(self) -> str:
        """The `AcceleratorConfig.type` enum name (`V5LITE_POD`)."""
        return GENERATIONS[self.generation][0]


def _topology(generation: str, size: int) -> str:
    if generation in ("v5litepod", "v6e"):
        return V5E_TOPOLOGIES[size]
    return (_3D if generation in ("v4", "v5p") else _2D)[size]


ACCELERATOR_TYPES: dict[str, AcceleratorType] = {
    f"{gen}-{size}": AcceleratorType(f"{gen}-{size}", gen, size, _topology(gen, size), zones)
    for gen, sizes in _ZONES.items()
    for size, zones in sizes.items()
}


def types_in_zone(zone: str) -> list[AcceleratorType]:
    """The accelerator types sold in `zone`, by name. Pure."""
    return sorted((t for t in ACCELERATOR_TYPES.values() if zone in t.zones), key=lambda t: t.name)


def tpu_zones() -> list[str]:
    """Every zone that sells some TPU type. Pure."""
    return sorted({z for t in ACCELERATOR_TYPES.values() for z in t.zones})


def runtimes_in_zone(zone: str) -> list[str]:
    """The runtime versions a TPU zone offers (every listed one), or [] outside TPU zones."""
    return sorted((*TF_RUNTIMES, *BASE_RUNTIMES)) if zone in tpu_zones() else []


_BASE_FOR = {
    "v2-alpha-tpuv6e": ("v6e",),
    "v2-alpha-tpuv5": ("v5p",),
    "v2-alpha-tpuv5-lite": ("v5litepod",),
    "tpu-ubuntu2204-base": ("v2", "v3", "v4"),
}


def runtime_fits(runtime: str, generation: str) -> bool:
    """Whether `runtime` (a listed one) runs on TPUs of `generation` (module docstring). Pure."""
    if runtime in _BASE_FOR:
        return generation in _BASE_FOR[runtime]
    version = tf_version_of(runtime)
    if version is None:
        return False
    numbers = tuple(int(x) for x in version.split("."))
    if generation in ("v5litepod", "v5p", "v6e"):
        return numbers >= (2, 15, 0) and runtime.endswith("-pjrt")
    return numbers >= (2, 10, 1) if generation == "v4" else True


def config_type_name(value: object) -> str | None:
    """An `AcceleratorConfig.type` given by enum name or number -> its name, else None."""
    for name, number, _ in GENERATIONS.values():
        if value in (name, number, str(number)):
            return name
    return None


def type_for_config(config_type: str, topology: str) -> AcceleratorType | None:
    """The accelerator type an `acceleratorConfig` {type, topology} names, or None."""
    for accel in ACCELERATOR_TYPES.values():
        if accel.config_type == config_type and accel.topology == topology:
            return accel
    return None


def quota_limit_name(generation: str, preemptible: bool) -> str:
    """`TPUV6EPreemptiblePerProjectPerRegionForTPUAPI` (see the module docstring). Pure."""
    token = GENERATIONS[generation][2]
    return f"TPU{token}{'Preemptible' if preemptible else ''}PerProjectPerRegionForTPUAPI"


def tf_version_of(runtime: str) -> str | None:
    """`2.16.1` for `tpu-vm-tf-2.16.1-pjrt`; None for a runtime without TensorFlow. Pure."""
    match = TF_RUNTIME_RE.fullmatch(runtime)
    return match[1] if match else None
