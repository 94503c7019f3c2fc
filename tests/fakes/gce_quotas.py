"""Quotas and capacity of the GCE fake: `QuotasMixin` (region and project quotas, sold-out
zones, and the insert's check).

What an instance counts against, as Compute Engine counts it:

- its GPUs, per region, against the GPU model's metric (`NVIDIA_T4_GPUS`, `NVIDIA_L4_GPUS`,
  `NVIDIA_A100_GPUS`, `NVIDIA_A100_80GB_GPUS`, `NVIDIA_H100_GPUS`, ...: the `Quota.Metric` enum
  of google-cloud-compute, compute.v1 discovery doc `Quota.metric`), and across the project
  against `GPUS_ALL_REGIONS` (a new project's limit is 0: "Quota 'GPUS_ALL_REGIONS' exceeded.
  Limit: 0.0 globally.", fastai/course-v3#165);
- its vCPUs, per region, against its family's metric where the enum has one (`A2_CPUS`,
  `N2_CPUS`, `N2D_CPUS`, `C2_CPUS`, `C2D_CPUS`, `C3_CPUS`), else `CPUS` (N1 and the rest);
- a Spot (or preemptible) VM counts against the `PREEMPTIBLE_*` twin of each metric where the
  project was granted it (limit above 0), else against the regular one: "To prevent Spot VMs
  from consuming your quotas for standard VMs' CPUs, GPUs, and disks, consider requesting
  preemptible quota for Spot VMs" (docs.cloud.google.com/compute/docs/instances/create-use-spot,
  "Before you begin"). A new project's PREEMPTIBLE_* limits are 0 (not granted).

Usage is counted from the instances the fake holds (every one not TERMINATED: a stopped VM
holds no vCPU or GPU quota), plus what `AccountRules.extra_usage` adds. Limits are scripted per
region (or "*": every region) and metric in `AccountRules.limits`, else `DEFAULT_LIMITS`:
generous, so a test that scripts nothing is never refused.

A zone `AccountRules.sold_out` names ("*": every zone) refuses every insert (or every Spot
insert) there with ZONE_RESOURCE_POOL_EXHAUSTED until a test restores it.

Served: `regions/{region}` carries `quotas[]` (`{metric, limit, usage}`, as
`compute_v1.Quota`), and `GET /compute/v1/projects/{project}` (projects.get) answers a
compute#project with the project's `quotas[]` (`GPUS_ALL_REGIONS`, `CPUS_ALL_REGIONS`). An
insert over a quota is accepted and its operation ends DONE with QUOTA_EXCEEDED (gce_faults:
`quotaInfo` with the metric, limit name, dimensions and limit). Methods run under the fake's
lock.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from tests.fakes.gce_faults import Fault
from tests.fakes.gce_formats import API_ROOT
from tests.fakes.gce_state import State

GLOBAL = "global"
EVERY_REGION = "*"
# GCE accelerator types -> their quota metric (compute.v1 `Quota.metric` enum values)
GPU_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-k80": "NVIDIA_K80_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
}
# machine families whose vCPUs have their own regional metric; the others count against CPUS
FAMILY_CPU_METRICS = {f: f"{f.upper()}_CPUS" for f in ("a2", "n2", "n2d", "c2", "c2d", "c3")}
# machine series with built-in GPUs (docs.cloud.google.com/compute/docs/gpus: a2-highgpu and
# a2-megagpu carry A100 40GB, a2-ultragpu A100 80GB, a3 H100 80GB, g2 L4), and vCPUs per GPU
BUILT_IN_GPUS = {
    "a2-highgpu": ("nvidia-tesla-a100", 12),
    "a2-megagpu": ("nvidia-tesla-a100", 6),
    "a2-ultragpu": ("nvidia-a100-80gb", 12),
    "a3-highgpu": ("nvidia-h100-80gb", 26),
    "a3-megagpu": ("nvidia-h100-80gb", 26),
}
G2_L4S = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}  # g2-standard-N: its L4s
PROJECT_METRICS = ("GPUS_ALL_REGIONS", "CPUS_ALL_REGIONS")
DEFAULT_LIMITS: dict[str, float] = {
    "CPUS": 100_000.0,
    "INSTANCES": 100_000.0,
    "PREEMPTIBLE_CPUS": 0.0,
    **{f: 100_000.0 for f in FAMILY_CPU_METRICS.values()},
    **{m: 100_000.0 for m in GPU_METRICS.values()},
    **{f"PREEMPTIBLE_{m}": 0.0 for m in GPU_METRICS.values()},
    "GPUS_ALL_REGIONS": 100_000.0,
    "CPUS_ALL_REGIONS": 100_000.0,
}
_SIZE_RE = re.compile(r"-(\d+)(g?)$")


def region_of(zone: str) -> str:
    """`us-east1` for `us-east1-b`. Pure."""
    return zone.rsplit("-", 1)[0]


def machine_shape(machine_type: str, accelerators: list[dict[str, Any]]) -> tuple[int, dict]:
    """(vCPUs, {accelerator type: count}) of an instance of `machine_type` (a URL or name)
    with `guestAccelerators`. Pure."""
    name = machine_type.rsplit("/", 1)[-1]
    gpus: dict[str, int] = {}
    for acc in accelerators:
        kind = str(acc.get("acceleratorType") or "").rsplit("/", 1)[-1]
        gpus[kind] = gpus.get(kind, 0) + int(acc.get("acceleratorCount") or 0)
    match = _SIZE_RE.search(name)
    size = int(match[1]) if match else 2  # e2-micro, e2-small, ...: shared-core, 2 vCPUs
    series = name[: match.start()] if match else name
    if match and match[2] == "g" and series in BUILT_IN_GPUS:
        kind, per_gpu = BUILT_IN_GPUS[series]
        gpus[kind] = gpus.get(kind, 0) + size
        return per_gpu * size, gpus
    if series == "g2-standard":
        gpus["nvidia-l4"] = gpus.get("nvidia-l4", 0) + G2_L4S.get(size, 1)
    return size, gpus


class QuotasMixin:
    """Quota bookkeeping and the projects.get route (see the module docstring)."""

    _state: State

    def _limit(self, scope: str, metric: str) -> float:
        """The limit of `metric` in region `scope` (scripted for it, else for every region,
        else the default), or of the project's `metric` (scope "global")."""
        limits = self._state.account.limits
        keys = [(GLOBAL, metric)] if scope == GLOBAL else [(scope, metric), (EVERY_REGION, metric)]
        for key in keys:
            if key in limits:
                return limits[key]
        return DEFAULT_LIMITS.get(metric, 100_000.0)

    def _charges(self, region: str, inst: dict[str, Any]) -> dict[tuple[str, str], float]:
        """What `inst` counts against: (region or "global", metric) -> amount."""
        scheduling = inst.get("scheduling") or {}
        spot = scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible")
        machine = str(inst.get("machineType") or "")
        vcpus, gpus = machine_shape(machine, inst.get("guestAccelerators") or [])

        def metric(regular: str) -> str:
            twin = f"PREEMPTIBLE_{regular}"
            return twin if spot and self._limit(region, twin) > 0 else regular

        family = machine.rsplit("/", 1)[-1].split("-", 1)[0]
        cpu = FAMILY_CPU_METRICS.get(family, "CPUS")
        out: dict[tuple[str, str], float] = {
            (region, metric(cpu) if cpu == "CPUS" else cpu): float(vcpus),
            (region, "INSTANCES"): 1.0,
            (GLOBAL, "CPUS_ALL_REGIONS"): float(vcpus),
        }
        for kind, count in gpus.items():
            if kind in GPU_METRICS and count:
                key = (region, metric(GPU_METRICS[kind]))
                out[key] = out.get(key, 0.0) + count
                out[(GLOBAL, "GPUS_ALL_REGIONS")] = out.get((GLOBAL, "GPUS_ALL_REGIONS"), 0) + count
        return out

    def _usage(self, project: str) -> dict[tuple[str, str], float]:
        """Every (scope, metric)'s usage in `project`: its instances' charges, plus the extra."""
        used = dict(self._state.account.extra_usage)
        for (p, zone, _), inst in self._state.instances.items():
            if p != project or inst.get("status") == "TERMINATED":
                continue
            for key, amount in self._charges(region_of(zone), inst).items():
                used[key] = used.get(key, 0.0) + amount
        return used

    def _quota_lines(self, project: str, scope: str) -> list[dict[str, Any]]:
        """The `quotas[]` of a region (or of the project, scope "global"): the default metrics
        and every scripted one."""
        used = self._usage(project)
        if scope == GLOBAL:
            base = list(PROJECT_METRICS)
            scripted = {m for (s, m) in self._state.account.limits if s == GLOBAL}
        else:
            base = [m for m in DEFAULT_LIMITS if m not in PROJECT_METRICS]
            scripted = {
                m
                for (s, m) in self._state.account.limits
                if s in (scope, EVERY_REGION) and m not in PROJECT_METRICS
            }
        return [
            {"metric": m, "limit": self._limit(scope, m), "usage": used.get((scope, m), 0.0)}
            for m in [*base, *sorted(scripted - set(base))]
        ]

    def _insert_fault(self, project: str, zone: str, inst: dict[str, Any]) -> Fault | None:
        """How the insert of `inst` fails by the account's rules, else None (call before the
        instance is stored): ZONE_RESOURCE_POOL_EXHAUSTED while its zone is sold out (for Spot
        VMs only, or for all), persistently, as GCE answers a stocked-out zone ("Resource
        errors", cloud.google.com/compute/docs/resource-error); else QUOTA_EXCEEDED for the
        first quota it would take over its limit (the region's first, then the project's)."""
        sold_out = self._state.account.sold_out
        scheduling = inst.get("scheduling") or {}
        spot = scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))
        for where in (zone, EVERY_REGION):
            if where in sold_out and (spot or not sold_out[where]):
                return Fault("ZONE_RESOURCE_POOL_EXHAUSTED")
        used = self._usage(project)
        charges = self._charges(region_of(zone), inst)
        for (scope, metric), amount in sorted(charges.items(), key=lambda kv: kv[0][0] == GLOBAL):
            limit = self._limit(scope, metric)
            if used.get((scope, metric), 0.0) + amount > limit:
                return Fault("QUOTA_EXCEEDED", metric=metric, limit=limit, scope=scope)
        return None

    def _get_project(
        self, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        project = params["project"]
        return {
            "kind": "compute#project",
            "id": str(1_000_000 + zlib.crc32(project.encode()) % 1_000_000),
            "name": project,
            "selfLink": f"{API_ROOT}/projects/{project}",
            "quotas": self._quota_lines(project, GLOBAL),
            "defaultNetworkTier": "PREMIUM",
        }
