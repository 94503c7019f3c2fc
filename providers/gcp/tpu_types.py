"""Cloud TPU accelerator types and TensorFlow runtime versions: what cloudtrain knows of a TPU
before anything is created (the spec's rules, the plan, the catalog build, the TPU API calls).

Standard library only, no SDK, importing nothing of the project: `cloudtrain plan`, the spec's
validation, the catalog build and the box's fakes read it (`ProviderInfo.tpu_types` names it).
Pure data and pure functions.

Sources (read 2026-11-29 through the `search` tool's stored copies of Google's pages):
- Accelerator types, chips, TensorCores and hosts (TPU VMs) per slice:
  - v5e: "TPU v5e" (https://cloud.google.com/tpu/docs/v5e): one TensorCore per chip; slice
    shapes 1x1 (1 chip), 2x2 (4), 2x4 (8, one host), 4x4 (16), ...; the VM types of a slice hold
    1, 4 or 8 chips (ct5lp-hightpu-1t 24 vCPU/48 GB, -4t 112/192, -8t 224/384). The page's
    table counts 2 physical hosts for 4x4; a multi-host v5e slice is made of 4-chip VMs
    (ct5lp-hightpu-4t), so v5litepod-16 is 4 TPU VMs, each running the program. Either count
    makes it multi-host, which is what cloudtrain refuses; the VM count is what we show.
  - v6e (Trillium): "TPU v6e" (https://cloud.google.com/tpu/docs/v6e): one TensorCore per chip,
    v6e-1/-4/-8 single-host, v6e-16 (4x4) and larger multi-host (4-chip VMs, so 4 of them).
  - v5p: "TPU v5p" (https://cloud.google.com/tpu/docs/v5p): topology 2x2x1 = 8 cores, 4 chips,
    1 machine (v5p-8); 2x2x2 = 16 cores, 8 chips, 2 machines (v5p-16); a VM holds 4 chips,
    208 vCPU, 448 GB. The number in a v5p (and v4) type's name counts TensorCores.
  - v4: "TPU v4" (https://cloud.google.com/tpu/docs/v4) and the pricing page
    (https://cloud.google.com/tpu/pricing: "configurations ranging from four chips (one TPU VM)"):
    v4-8 = 4 chips, 8 TensorCores, one VM; v4-16 = 8 chips on 2 VMs.
- Zones: "TPU regions and zones" (https://cloud.google.com/tpu/docs/regions-zones, the
  revision of 2025-09; its North America and Europe tables). Only the zones those tables show
  are listed: a zone elsewhere (an AI zone of the newer revision, a zone the excerpt cut off) is
  left out, so cloudtrain offers less than Google sells, never more.
- Runtime versions: "TPU software versions" (https://cloud.google.com/tpu/docs/runtimes, 2025-09,
  and its earlier revision https://cloud.google.com/tpu/docs/supported-tpu-versions): TensorFlow
  runtimes are named `tpu-vm-tf-x.y.z[-pod][-{device_api}]`; from TF 2.15.0 on a runtime names
  its device API, `-pjrt` or `-se` (stream executor); "TPU v6e, v5e and v5p support TensorFlow
  2.15.0 and newer", with the `-pjrt` runtimes; v4 with TF >= 2.10.1 takes the v2/v3 runtimes.
  The newest TensorFlow runtime that list names is `tpu-vm-tf-2.16.1-pjrt`. Runtimes named
  `...-2.18.0-pjrt-v5e-and-v6` / `-v5p-and-below` exist in public scripts, but no Google page in
  reach lists them, so they are not here (a runtime missing here is refused at plan time; add it
  with its source when one is found). `-pod` runtimes are for multi-host slices, which cloudtrain
  refuses, so none is listed.
"""

from __future__ import annotations

from dataclasses import dataclass

# the provider option (`providers.gcp.tpu_runtime`, providers/gcp/options.py) naming the runtime
RUNTIME_OPTION = "tpu_runtime"
# the generations, as Google's pages name them
V4, V5E, V5P, V6E = "v4", "v5e", "v5p", "v6e"

# "TPU regions and zones" (revision 2025-09), North America and Europe tables
_ZONES: dict[str, tuple[str, ...]] = {
    V6E: ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
    V5P: ("us-central1-a", "us-east5-a"),
    V5E: ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    V4: ("us-central2-b",),
}


@dataclass(frozen=True)
class TpuType:
    """One accelerator type of the TPU API (`acceleratorType`, e.g. `v5litepod-8`): its
    generation, chips, TensorCores, TPU VMs (hosts) and the zones that sell it."""

    name: str
    generation: str
    chips: int
    cores: int
    hosts: int  # TPU VMs in the slice: 1 is a single-host slice, more a multi-host one
    zones: tuple[str, ...]

    @property
    def single_host(self) -> bool:
        """True when one TPU VM holds the whole slice (what cloudtrain runs)."""
        return self.hosts == 1

    @property
    def regions(self) -> tuple[str, ...]:
        """The regions of `zones`, in order, without repeats."""
        return tuple(dict.fromkeys(zone.rsplit("-", 1)[0] for zone in self.zones))


def _type(name: str, generation: str, chips: int, cores: int, hosts: int) -> TpuType:
    return TpuType(name, generation, chips, cores, hosts, _ZONES[generation])


TPU_TYPES: dict[str, TpuType] = {
    t.name: t
    for t in (
        _type("v5litepod-1", V5E, 1, 1, 1),
        _type("v5litepod-4", V5E, 4, 4, 1),
        _type("v5litepod-8", V5E, 8, 8, 1),
        _type("v5litepod-16", V5E, 16, 16, 4),
        _type("v6e-1", V6E, 1, 1, 1),
        _type("v6e-4", V6E, 4, 4, 1),
        _type("v6e-8", V6E, 8, 8, 1),
        _type("v6e-16", V6E, 16, 16, 4),
        _type("v5p-8", V5P, 4, 8, 1),
        _type("v5p-16", V5P, 8, 16, 2),
        _type("v4-8", V4, 4, 8, 1),
        _type("v4-16", V4, 8, 16, 2),
    )
}


@dataclass(frozen=True)
class Runtime:
    """A TensorFlow runtime version (the TPU VM's image): the TensorFlow it ships and the
    generations it runs on."""

    name: str
    tensorflow: str
    generations: frozenset[str]


_PJRT = frozenset({V4, V5E, V5P, V6E})  # "v6e, v5e and v5p support TF 2.15.0 and newer" (+ v4)
_SE = frozenset({V4})  # stream executor: not on v5e, v5p, v6e (they take -pjrt)
RUNTIMES: dict[str, Runtime] = {
    r.name: r
    for r in (
        Runtime("tpu-vm-tf-2.16.1-pjrt", "2.16.1", _PJRT),
        Runtime("tpu-vm-tf-2.16.1-se", "2.16.1", _SE),
        Runtime("tpu-vm-tf-2.15.1-pjrt", "2.15.1", _PJRT),
        Runtime("tpu-vm-tf-2.15.1-se", "2.15.1", _SE),
        Runtime("tpu-vm-tf-2.15.0-pjrt", "2.15.0", _PJRT),
        Runtime("tpu-vm-tf-2.15.0-se", "2.15.0", _SE),
    )
}


def tpu_type(name: str) -> TpuType | None:
    """The TPU type called `name` (exact, case-sensitive as the TPU API's), or None. Pure."""
    return TPU_TYPES.get(name)


def single_host_types() -> list[str]:
    """The names of the single-host types, in table order (what a TPU job may ask for). Pure."""
    return [t.name for t in TPU_TYPES.values() if t.single_host]


def multi_host_problem(tpu: TpuType) -> str | None:
    """Why cloudtrain cannot run `tpu` (a multi-host slice runs the program on every host),
    naming the largest single-host type of its generation; None for a single-host type. Pure."""
    if tpu.single_host:
        return None
    same = [t for t in TPU_TYPES.values() if t.generation == tpu.generation and t.single_host]
    largest = max(same, key=lambda t: t.chips).name
    return (
        f"{tpu.name} is a multi-host slice ({tpu.hosts} hosts): cloudtrain runs single-host TPU"
        f" slices only; use {largest} or smaller"
    )


def runtimes_for(tpu: TpuType) -> list[str]:
    """The runtime versions that run on `tpu`'s generation, newest TensorFlow first. Pure."""
    fit = [r for r in RUNTIMES.values() if tpu.generation in r.generations]
    return [r.name for r in sorted(fit, key=lambda r: _version(r.tensorflow), reverse=True)]


def default_runtime(tpu: TpuType) -> str:
    """The runtime a TPU job of `tpu` gets when the spec names none: the newest TensorFlow
    runtime of its generation (PJRT before stream executor at the same TensorFlow). Pure."""
    return runtimes_for(tpu)[0]


def runtime_tensorflow(runtime: str) -> str:
    """The TensorFlow version `runtime` ships (`2.16.1`). Pure; KeyError for a runtime not in
    RUNTIMES."""
    return RUNTIMES[runtime].tensorflow


def runtime_problem(tpu: TpuType, runtime: str) -> str | None:
    """Why `runtime` cannot run on `tpu` (unknown here, or not for its generation), naming the
    ones that can; None when it fits. Pure."""
    known = RUNTIMES.get(runtime)
    if known is not None and tpu.generation in known.generations:
        return None
    why = "is not a TensorFlow TPU runtime cloudtrain knows"
    if known is not None:
        why = f"does not run on TPU {tpu.generation}"
    return f"{runtime!r} {why}; {tpu.name} takes one of: {', '.join(runtimes_for(tpu))}"


def resolved_runtime(tpu: TpuType, given: str | None) -> str:
    """The runtime a job of `tpu` runs: `given` when it fits, else the default when None. Pure;
    ValueError (the `runtime_problem` text) for a given runtime that does not fit."""
    if given is None:
        return default_runtime(tpu)
    problem = runtime_problem(tpu, given)
    if problem:
        raise ValueError(problem)
    return given


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
